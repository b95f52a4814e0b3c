"""Train a tiny Qwen3 target on the Python standard library, its tokenizer, and its DSpark draft.

No weights can be downloaded onto the GPU machine, and a random draft accepts nothing (1 in 19,060 in the
earlier live runs), so a measurement of DSpark's speed-up needs a target and a draft trained here. Code is
predictable, which speculative decoding likes, and the standard library's sources are on every machine
with Python. Everything is deterministic: files in sorted order, fixed seeds, a fixed number of steps, and
the weights are rebuilt by this script (never committed); their sha256 go into ``manifest.json``.

1. Corpus: the ``.py`` files of the running Python's standard library (``sysconfig``'s ``stdlib``, without
   site-packages), sorted by path; one file in ten (by the sha256 of its path) is held out for prompts.
2. Tokenizer: byte-level BPE (the ``tokenizers`` library) trained on the rest; ``<|pad|>``, ``<|bos|>``,
   ``<|eos|>`` are ids 0-2 and ``<|mask|>``, the draft's mask token, comes last.
3. Target: ``Qwen3ForCausalLM`` at ``bench/live/test_model.py``'s size, next-token loss on windows of the
   training files.
4. Draft data: the target's own greedy continuations (bf16, as served) of training-text prompts, since
   the draft must predict what the target will say, not what the text says.
5. Draft: ``Qwen3DSparkModel`` on the target's states after ``TARGET_LAYER_IDS``, several query blocks per
   sequence, each row's loss weighted by how early it sits in the block (a row is only accepted when the
   rows before it are); the mask token's embedding is learnt too and written into the target's embedding
   row for it, which the draft shares and the target never reads.
6. Check: greedy drafting with the exported bf16 weights on held-out prompts, walked the way vLLM verifies
   (``tiny_qwen3.speculative_walk``): the accepted tokens per draft step the served draft should reach.

    python3 bench/live/train_dspark.py --out /tmp/sparkseal-dspark
    # -> target/{config.json,model.safetensors}, draft/{config.json,model.safetensors}, tokenizer.json,
    #    prompts.json (held-out token-id prompts), manifest.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before CUDA starts

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_qwen3 import (
    DSparkDraft,
    Qwen3Target,
    Shape,
    accepted_prefix,
    draft_blocks,
    save_safetensors,
    speculative_walk,
    teacher_forced_logits,
)

SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")
MASK = "<|mask|>"
TARGET_LAYERS = 4
DRAFT_LAYERS = 2
TARGET_LAYER_IDS = (1, 3)  # residual stream after the 2nd and the last target layer
MARKOV_RANK = 64
BLOCK = 5  # num_speculative_tokens served
MAX_POSITIONS = 8192
SEED = 20261203


@dataclass(frozen=True)
class Plan:
    """Sizes and step counts; the defaults are the recorded run (a few minutes on one H200)."""

    corpus_bytes: int = 24 << 20
    target_steps: int = 3000
    target_batch: int = 32
    target_window: int = 512
    target_lr: float = 2e-3
    # Run 3's draft saw 4,096 continuations of 256 tokens about 90 times each and memorised them (weighted
    # loss 0.44 on them, 3.32 on fresh ones): 16 times as many, shorter, so each is seen about 6 times.
    draft_prompts: int = 65536
    draft_prompt_tokens: int = 64
    draft_new_tokens: int = 96
    # The share of those continuations sampled at temperature 1 (the rest greedy): the target's outputs at
    # the temperatures it serves, so probabilistic drafting learns the target's distribution too.
    draft_sampled: float = 0.5
    draft_steps: int = 6000
    draft_batch: int = 64
    draft_anchors: int = 24
    draft_lr: float = 2e-3
    row_decay: float = 4.0  # row j weighs exp(-j / row_decay)
    heldout_prompts: int = 96
    prompt_tokens: int = 128
    check_new_tokens: int = 128


SMOKE = Plan(
    corpus_bytes=2 << 20,
    target_steps=3,
    target_batch=2,
    target_window=64,
    draft_prompts=8,
    draft_prompt_tokens=16,
    draft_new_tokens=24,
    draft_sampled=0.5,
    draft_steps=3,
    draft_batch=2,
    draft_anchors=3,
    heldout_prompts=4,
    prompt_tokens=16,
    check_new_tokens=12,
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus(root: Path, limit: int) -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's sources in path order, up to ``limit`` bytes."""
    files = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] in ("site-packages", "dist-packages") or "__pycache__" in relative:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if total + len(text) > limit:
            break
        files.append((relative, text))
        total += len(text)
    return files


def held_out(relative: str) -> bool:
    return hashlib.sha256(relative.encode()).digest()[0] % 10 == 0


def train_tokenizer(texts: list[str], vocab_size: int):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens([MASK])
    if tokenizer.get_vocab_size() > vocab_size:
        raise SystemExit(f"tokenizer: {tokenizer.get_vocab_size()} tokens, more than {vocab_size}")
    return tokenizer


def init_weights(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Normal(0, 0.02) for every matrix, ones for norms, drawn in parameter-name order from ``generator``."""
    for name, parameter in sorted(module.named_parameters()):
        with torch.no_grad():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                values = torch.randn(parameter.shape, generator=generator) * 0.02
                parameter.copy_(values.to(parameter.device))


def optimizer(parameters: list[tuple[str, torch.nn.Parameter]], lr: float, cuda: bool) -> torch.optim.AdamW:
    """AdamW with weight decay on the layers' matrices only: embeddings, norms and the Markov tables keep
    their scale (an unused row, such as the mask token's, must not decay towards zero)."""
    decay = [p for n, p in parameters if p.ndim == 2 and "embed" not in n and "markov_w1" not in n]
    rest = [p for n, p in parameters if not (p.ndim == 2 and "embed" not in n and "markov_w1" not in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=cuda)


def schedule(step: int, steps: int, lr: float) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_target(
    stream: torch.Tensor, shape: Shape, plan: Plan, device: torch.device, generator: torch.Generator
) -> tuple[Qwen3Target, list[float]]:
    target = Qwen3Target(shape, TARGET_LAYERS).to(device)
    init_weights(target, generator)
    params = list(target.named_parameters())
    opt = optimizer(params, plan.target_lr, device.type == "cuda")
    window = torch.arange(plan.target_window + 1, device=device)
    losses = []
    for step in range(plan.target_steps):
        starts = torch.randint(
            0, len(stream) - plan.target_window - 1, (plan.target_batch,), generator=generator
        )
        batch = stream[starts.to(device)[:, None] + window]
        for group in opt.param_groups:
            group["lr"] = schedule(step, plan.target_steps, plan.target_lr)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            hidden, _ = target(batch[:, :-1])
            logits = target.lm_head(hidden)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        if step % 250 == 0 or step == plan.target_steps - 1:
            losses.append(round(loss.item(), 4))
            log(f"target step {step}: loss {losses[-1]}")
    return target, losses


def bf16_copy(target: Qwen3Target, shape: Shape) -> Qwen3Target:
    served = Qwen3Target(shape, TARGET_LAYERS).to(next(target.parameters()).device)
    served.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in target.state_dict().items()})
    served = served.to(torch.bfloat16).eval()
    for parameter in served.parameters():
        parameter.requires_grad_(False)
    return served


def generate(
    served: Qwen3Target,
    prompts: torch.Tensor,
    new_tokens: int,
    chunk: int = 1024,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    return torch.cat(
        [
            served.generate(prompts[i : i + chunk], new_tokens, temperature, generator)
            for i in range(0, len(prompts), chunk)
        ]
    )


def draft_data(served: Qwen3Target, prompts: torch.Tensor, plan: Plan) -> torch.Tensor:
    """The target's own continuations of ``prompts``: the first share greedy, the rest sampled at temperature
    1 from a generator on the device seeded from ``SEED`` (the same sequences on every run of one device)."""
    sampled = round(len(prompts) * plan.draft_sampled)
    greedy = generate(served, prompts[: len(prompts) - sampled], plan.draft_new_tokens)
    if not sampled:
        return greedy
    device_generator = torch.Generator(device=prompts.device).manual_seed(SEED + 1)
    hot = generate(
        served,
        prompts[len(prompts) - sampled :],
        plan.draft_new_tokens,
        temperature=1.0,
        generator=device_generator,
    )
    return torch.cat([greedy, hot])


@torch.no_grad()
def target_uncertainty(served: Qwen3Target, sequences: torch.Tensor, prompt_tokens: int) -> dict[str, float]:
    """How predictable the target is on held-out text it continued itself: its mean entropy (nats) and the
    mean probability of its own greedy token over the generated positions. A draft sampled at temperature 1
    can at best match that distribution; greedy acceptance has no such bound."""
    hidden, _ = served(sequences[:, :-1])
    logits = served.lm_head(hidden)[:, prompt_tokens - 1 :].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return {
        "mean_entropy_nats": round(entropy.mean().item(), 4),
        "mean_top1_probability": round(log_probs.max(-1).values.exp().mean().item(), 4),
    }


def train_draft(
    served: Qwen3Target,
    sequences: torch.Tensor,
    prompt_tokens: int,
    shape: Shape,
    mask_id: int,
    plan: Plan,
    generator: torch.Generator,
) -> tuple[DSparkDraft, torch.Tensor, list[float]]:
    device = sequences.device
    draft = DSparkDraft(shape, DRAFT_LAYERS, TARGET_LAYER_IDS, MARKOV_RANK, mask_id).to(device)
    init_weights(draft, generator)
    mask_embedding = torch.nn.Parameter(served.model.embed_tokens.weight[mask_id].float().clone())
    params = [*draft.named_parameters(), ("mask_embedding", mask_embedding)]
    opt = optimizer(params, plan.draft_lr, device.type == "cuda")
    weights = torch.exp(-torch.arange(BLOCK, device=device, dtype=torch.float32) / plan.row_decay)
    weights = weights / weights.sum()
    length = sequences.shape[1]
    losses = []
    for step in range(plan.draft_steps):
        rows = torch.randint(0, len(sequences), (plan.draft_batch,), generator=generator).to(device)
        tokens = sequences[rows]
        # Anchors in the generated part: the first draft step anchors at the first generated token.
        anchors = torch.randint(
            prompt_tokens, length - BLOCK, (plan.draft_batch, plan.draft_anchors), generator=generator
        ).to(device)
        for group in opt.param_groups:
            group["lr"] = schedule(step, plan.draft_steps, plan.draft_lr)
        with torch.no_grad():
            _, aux = served(tokens, TARGET_LAYER_IDS)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            hidden = draft.block_hidden(
                served.model.embed_tokens, aux, tokens, anchors, BLOCK, mask_embedding=mask_embedding
            )
            logits, labels = teacher_forced_logits(draft, hidden, served.lm_head, tokens, anchors)
        per_row = F.cross_entropy(logits.float().flatten(0, 2), labels.flatten(), reduction="none")
        loss = (per_row.view(-1, BLOCK) * weights).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        if step % 250 == 0 or step == plan.draft_steps - 1:
            losses.append(round(loss.item(), 4))
            log(f"draft step {step}: loss {losses[-1]}")
    return draft, mask_embedding.detach(), losses


@torch.no_grad()
def offline_acceptance(
    served: Qwen3Target, draft: DSparkDraft, sequences: torch.Tensor, prompt_tokens: int, new_tokens: int
) -> dict[str, float]:
    """Greedy drafts of the exported bf16 models at every anchor, walked as vLLM verifies them."""
    steps: list[int] = []
    first_right = 0
    anchors_seen = 0
    for row in range(len(sequences)):
        tokens = sequences[row : row + 1]
        anchors = torch.arange(prompt_tokens, prompt_tokens + new_tokens, device=tokens.device)[None]
        drafts = draft_blocks(served, draft, tokens, anchors, BLOCK)
        truth = tokens[0, anchors[0, :, None] + 1 + torch.arange(BLOCK, device=tokens.device)]
        accepted = accepted_prefix(drafts[0], truth)
        first_right += int((drafts[0, :, 0] == truth[:, 0]).sum())
        anchors_seen += anchors.shape[1]
        steps += speculative_walk(accepted.tolist(), prompt_tokens, prompt_tokens + new_tokens)
    return {
        "draft_steps": len(steps),
        "accepted_per_step": round(sum(steps) / len(steps), 3),
        "acceptance_rate": round(sum(steps) / (BLOCK * len(steps)), 4),
        "first_token_right": round(first_right / anchors_seen, 4),
    }


def configs(shape: Shape, mask_id: int) -> tuple[dict, dict]:
    """config.json of target and draft, as bench/live/test_model.py writes them, for these weights."""
    common = {
        "model_type": "qwen3",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "pad_token_id": SPECIALS.index("<|pad|>"),
        "bos_token_id": SPECIALS.index("<|bos|>"),
        "eos_token_id": SPECIALS.index("<|eos|>"),
        "dtype": "bfloat16",
    }
    target = {**common, "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": TARGET_LAYERS}
    draft = {
        **common,
        "architectures": ["Qwen3DSparkModel"],
        "num_hidden_layers": DRAFT_LAYERS,
        "target_hidden_size": shape.hidden_size,
        "markov_rank": MARKOV_RANK,
        # The block the draft was trained on: the speculative-token count to serve it with
        # (`sparkseal live-check --draft-config` holds the server to it).
        "block_size": BLOCK,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": list(TARGET_LAYER_IDS)},
    }
    return target, draft


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def heldout_prompts(
    files: list[tuple[str, list[int]]], count: int, length: int
) -> list[tuple[str, int, list[int]]]:
    """``count`` windows of ``length`` tokens from held-out files, round-robin over the files, at offsets
    derived from each file's path (deterministic, spread through the file rather than its header)."""
    usable = [(name, ids) for name, ids in files if len(ids) >= 2 * length]
    if not usable:
        raise SystemExit(f"no held-out file has {2 * length} tokens")
    prompts = []
    round_ = 0
    while len(prompts) < count:
        for name, ids in usable:
            if len(prompts) == count:
                break
            seed = int.from_bytes(hashlib.sha256(f"{name}:{round_}".encode()).digest()[:4], "big")
            offset = seed % (len(ids) - length)
            prompts.append((name, offset, ids[offset : offset + length]))
        round_ += 1
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for a test of the pipeline on CPU")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else Plan()
    started = time.monotonic()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator().manual_seed(SEED)
    shape = Shape()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.monotonic() - started - sum(timings.values()), 1)

    files = corpus(args.stdlib, plan.corpus_bytes)
    fingerprint = hashlib.sha256()
    for name, text in files:
        fingerprint.update(name.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
    train_files = [(n, t) for n, t in files if not held_out(n)]
    test_files = [(n, t) for n, t in files if held_out(n)]
    log(
        f"corpus: {len(files)} files ({len(train_files)} train, {len(test_files)} held out) "
        f"from {args.stdlib}"
    )
    tokenizer = train_tokenizer([t for _, t in train_files], shape.vocab_size)
    mask_id = tokenizer.token_to_id(MASK)
    eos = SPECIALS.index("<|eos|>")
    train_ids = [tokenizer.encode(text).ids for _, text in train_files]
    stream = torch.tensor([i for ids in train_ids for i in [*ids, eos]], dtype=torch.int64, device=device)
    test_ids = [(name, tokenizer.encode(text).ids) for name, text in test_files]
    log(f"tokenizer: {tokenizer.get_vocab_size()} tokens, mask {mask_id}; {len(stream)} training tokens")
    lap("corpus_and_tokenizer_s")

    target, target_losses = train_target(stream, shape, plan, device, generator)
    served = bf16_copy(target, shape)
    del target
    lap("target_s")

    starts = torch.randint(
        0, len(stream) - plan.draft_prompt_tokens, (plan.draft_prompts,), generator=generator
    )
    prompts = stream[starts.to(device)[:, None] + torch.arange(plan.draft_prompt_tokens, device=device)]
    sequences = draft_data(served, prompts, plan)
    log(f"draft data: {tuple(sequences.shape)} tokens, {plan.draft_sampled:.0%} sampled at temperature 1")
    lap("draft_data_s")

    draft, mask_embedding, draft_losses = train_draft(
        served, sequences, plan.draft_prompt_tokens, shape, mask_id, plan, generator
    )
    lap("draft_s")

    # Export: bf16 checkpoints; the learnt mask embedding becomes the target's embedding row for the mask.
    target_state = {k: v.to(torch.bfloat16) for k, v in served.state_dict().items()}
    target_state["model.embed_tokens.weight"][mask_id] = mask_embedding.to(torch.bfloat16)
    draft_state = {k: v.to(torch.bfloat16) for k, v in draft.state_dict().items()}
    target_config, draft_config = configs(shape, mask_id)
    for name, config, state in (
        ("target", target_config, target_state),
        ("draft", draft_config, draft_state),
    ):
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_safetensors(state, folder / "model.safetensors")
    tokenizer.save(str(args.out / "tokenizer.json"))

    # The check runs the exported weights, as vLLM loads them.
    served.load_state_dict({k: v.float() for k, v in target_state.items()})
    served = served.to(torch.bfloat16)
    exported = DSparkDraft(shape, DRAFT_LAYERS, TARGET_LAYER_IDS, MARKOV_RANK, mask_id).to(device)
    exported.load_state_dict(draft_state)
    exported = exported.to(torch.bfloat16).eval()
    chosen = heldout_prompts(test_ids, plan.heldout_prompts, plan.prompt_tokens)
    if any(token in (*range(len(SPECIALS)), mask_id) for _, _, ids in chosen for token in ids):
        raise SystemExit("a held-out prompt holds a special token")
    held = torch.tensor([ids for _, _, ids in chosen], dtype=torch.int64, device=device)
    continued = generate(served, held, plan.check_new_tokens + BLOCK + 1)
    check = offline_acceptance(served, exported, continued, plan.prompt_tokens, plan.check_new_tokens)
    log(f"offline check on held-out prompts: {check}")
    uncertainty = target_uncertainty(served, continued, plan.prompt_tokens)
    log(f"the target on held-out prompts: {uncertainty}")
    lap("check_s")
    (args.out / "prompts.json").write_text(
        json.dumps(
            {
                "format": "sparkseal-prompts/1",
                "source": "held-out standard-library files, token ids of tokenizer.json",
                "prompts": [ids for _, _, ids in chosen],
                "origin": [[name, offset] for name, offset, _ in chosen],
            }
        )
        + "\n"
    )
    files_out = ["target/config.json", "target/model.safetensors", "draft/config.json"]
    files_out += ["draft/model.safetensors", "tokenizer.json", "prompts.json"]
    manifest = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "stdlib": str(args.stdlib),
        "corpus": {
            "files": len(files),
            "held_out_files": len(test_files),
            "bytes": sum(len(t) for _, t in files),
            "sha256": fingerprint.hexdigest(),
            "training_tokens": len(stream),
        },
        "plan": asdict(plan),
        "seed": SEED,
        "mask_token_id": mask_id,
        "target_layer_ids": list(TARGET_LAYER_IDS),
        "target_loss": target_losses,
        "draft_loss": draft_losses,
        "offline_check": check,
        "target_on_heldout": uncertainty,
        "timings_s": timings,
        "sha256": {name: sha256(args.out / name) for name in files_out},
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"done in {time.monotonic() - started:.0f} s: {json.dumps(manifest['sha256'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
