"""The training forward of the tiny target and its DSpark draft (bench/live/tiny_qwen3.py), on CPU.

The draft is only worth training if its forward is the function vLLM evaluates. These tests hold the
batched training forward to a plain transcription of vLLM v0.25.1's DSpark steps (written here with
slicing and an explicit softmax, no masks), check the checkpoint names against the ones vLLM's loaders
took in the live runs (bench/live/test_model.py), and run the whole training pipeline at toy size. The
GPU test (tests/test_dspark_draft_gpu.py) holds the same forward to vLLM's own draft.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "live"
sys.path.insert(0, str(BENCH))

import test_model  # noqa: E402 (bench/live/test_model.py)
import tiny_qwen3  # noqa: E402
from tiny_qwen3 import (  # noqa: E402
    DSparkDraft,
    Qwen3Target,
    Shape,
    accepted_prefix,
    apply_rope,
    rope_tables,
    speculative_walk,
    teacher_forced_logits,
)

SHAPE = Shape(vocab_size=97, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8)
MASK_ID = 96
BLOCK = 5


def _models(seed: int = 0) -> tuple[Qwen3Target, DSparkDraft]:
    torch.manual_seed(seed)
    target = Qwen3Target(SHAPE, 3)
    draft = DSparkDraft(SHAPE, 2, (0, 2), 8, MASK_ID)
    for module in (target, draft):
        for name, parameter in module.named_parameters():
            with torch.no_grad():
                # Norm weights away from 1, so that a norm applied twice or not at all shows.
                if name.endswith("norm.weight"):
                    parameter.uniform_(0.5, 1.5)
                else:
                    parameter.normal_(0.0, 0.3)
    return target.double().eval(), draft.double().eval()


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + SHAPE.rms_norm_eps) * weight


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(x.shape[0], heads, SHAPE.head_dim)  # [T, heads, d]


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = rope_tables(positions[None], SHAPE.head_dim, SHAPE.rope_theta)
    return apply_rope(x.transpose(0, 1)[None], cos.double(), sin.double())[0].transpose(0, 1)


def _vllm_block(
    target: Qwen3Target, draft: DSparkDraft, tokens: list[int], anchor: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One DSpark step as vLLM v0.25.1 runs it, written out: (final hidden [BLOCK, H], greedy drafts).

    combine_hidden_states (fc) -> precompute_and_store_context_kv (hidden_norm, each layer's k/v
    projection, k_norm, RoPE at the context positions; no input_layernorm) -> query rows [anchor, mask, ...]
    at positions anchor.. -> layers attending to context (< anchor) and all query rows -> norm -> LM head
    -> left-to-right Markov greedy sampling.
    """
    ids = torch.tensor([tokens])
    _, aux = target(ids, draft.target_layer_ids)
    context = torch.cat(aux, dim=-1)[0, :anchor]
    context = _rms(context @ draft.fc.weight.T, draft.hidden_norm.weight)
    context_pos = torch.arange(anchor)
    query_ids = torch.tensor([tokens[anchor]] + [MASK_ID] * (BLOCK - 1))
    query_pos = anchor + torch.arange(BLOCK)
    x = target.model.embed_tokens.weight[query_ids]
    group = SHAPE.num_heads // SHAPE.num_kv_heads
    for layer in draft.layers:
        attn = layer.self_attn
        ctx_k = _rope(_rms(_heads(context @ attn.k_proj.weight.T, 2), attn.k_norm.weight), context_pos)
        ctx_v = _heads(context @ attn.v_proj.weight.T, 2)
        h = _rms(x, layer.input_layernorm.weight)
        q = _rope(_rms(_heads(h @ attn.q_proj.weight.T, 4), attn.q_norm.weight), query_pos)
        k = _rope(_rms(_heads(h @ attn.k_proj.weight.T, 2), attn.k_norm.weight), query_pos)
        v = _heads(h @ attn.v_proj.weight.T, 2)
        keys, values = torch.cat((ctx_k, k)), torch.cat((ctx_v, v))
        out = []
        for head in range(SHAPE.num_heads):
            scores = q[:, head] @ keys[:, head // group].T * SHAPE.head_dim**-0.5
            out.append(torch.softmax(scores, dim=-1) @ values[:, head // group])
        x = x + torch.cat(out, dim=-1) @ attn.o_proj.weight.T
        h = _rms(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        x = x + (torch.nn.functional.silu(h @ mlp.gate_proj.weight.T) * (h @ mlp.up_proj.weight.T)) @ (
            mlp.down_proj.weight.T
        )
    hidden = _rms(x, draft.norm.weight)
    base = hidden @ target.lm_head.weight.T
    prev = tokens[anchor]
    drafts = []
    for row in range(BLOCK):
        bias = draft.markov_head.markov_w2.weight @ draft.markov_head.markov_w1.weight[prev]
        prev = int((base[row] + bias).argmax())
        drafts.append(prev)
    return hidden, torch.tensor(drafts)


def test_checkpoint_names_and_shapes_are_the_ones_vllm_loaded():
    """The test model's checkpoints loaded in vLLM in the live runs; ours must have the same names."""
    target_config, draft_config = test_model.target_config(), test_model.draft_config()
    target, draft = tiny_qwen3.build(target_config, draft_config)
    for module, name, config in ((target, "target", target_config), (draft, "draft", draft_config)):
        ours = {key: tuple(value.shape) for key, value in module.state_dict().items()}
        assert ours == test_model.weight_shapes(name, config)


def test_blocks_of_the_training_forward_equal_vllms_steps_one_by_one():
    target, draft = _models()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, MASK_ID, (2, 23), generator=generator)
    anchors = torch.tensor([[3, 9, 17], [5, 6, 12]])
    with torch.no_grad():
        _, aux = target(tokens, draft.target_layer_ids)
        hidden = draft.block_hidden(target.model.embed_tokens, aux, tokens, anchors, BLOCK)
        drafts = draft.propose(target.lm_head(hidden), tokens.gather(1, anchors))
        for b in range(2):
            for k, anchor in enumerate(anchors[b].tolist()):
                want_hidden, want_drafts = _vllm_block(target, draft, tokens[b].tolist(), anchor)
                # RMSNorm computes in float32, as vLLM's does; the transcription in float64.
                torch.testing.assert_close(hidden[b, k], want_hidden, rtol=1e-4, atol=1e-5)
                assert drafts[b, k].tolist() == want_drafts.tolist()


def test_a_block_sees_the_context_before_its_anchor_and_nothing_after():
    target, draft = _models()
    tokens = torch.randint(0, MASK_ID, (1, 20), generator=torch.Generator().manual_seed(2))
    anchor = torch.tensor([[8]])
    with torch.no_grad():
        _, aux = target(tokens, draft.target_layer_ids)
        base = draft.block_hidden(target.model.embed_tokens, aux, tokens, anchor, BLOCK)
        later = [a.clone() for a in aux]
        for a in later:
            a[:, 8:] += 1.0  # the anchor's own target state and everything after it
        same = draft.block_hidden(target.model.embed_tokens, later, tokens, anchor, BLOCK)
        earlier = [a.clone() for a in aux]
        earlier[0][:, 7] += 1.0
        moved = draft.block_hidden(target.model.embed_tokens, earlier, tokens, anchor, BLOCK)
    torch.testing.assert_close(same, base)
    assert not torch.allclose(moved, base)


def test_query_rows_attend_to_each_other_both_ways():
    """Non-causal: the first row (the anchor) changes when a later row's embedding does."""
    target, draft = _models()
    tokens = torch.randint(0, MASK_ID - 1, (1, 16), generator=torch.Generator().manual_seed(3))
    anchor = torch.tensor([[6]])
    with torch.no_grad():
        _, aux = target(tokens, draft.target_layer_ids)
        base = draft.block_hidden(target.model.embed_tokens, aux, tokens, anchor, BLOCK)
        other = draft.block_hidden(
            target.model.embed_tokens, aux, tokens, anchor, BLOCK, mask_embedding=torch.ones(32).double()
        )
    assert not torch.allclose(base[0, 0, 0], other[0, 0, 0])


def test_markov_drafting_feeds_back_its_own_tokens():
    draft = DSparkDraft(SHAPE, 1, (0,), 4, MASK_ID)
    with torch.no_grad():
        # markov_w1 embeds token t as e_(t mod 4); markov_w2 maps e_i to a large logit for token 10 * i + 1.
        draft.markov_head.markov_w1.weight.zero_()
        draft.markov_head.markov_w2.weight.zero_()
        for t in range(SHAPE.vocab_size):
            draft.markov_head.markov_w1.weight[t, t % 4] = 1.0
        for i in range(4):
            draft.markov_head.markov_w2.weight[10 * i + 1, i] = 100.0
    base = torch.zeros(1, BLOCK, SHAPE.vocab_size)
    drafted = draft.propose(base, torch.tensor([2]))
    # 2 -> e_2 -> 21 -> e_1 -> 11 -> e_3 -> 31 -> e_3 -> 31 ...
    assert drafted.tolist() == [[21, 11, 31, 31, 31]]


def test_training_rows_use_the_true_previous_token_and_the_next_as_label():
    draft = DSparkDraft(SHAPE, 1, (0,), 4, MASK_ID)
    tokens = torch.arange(40).view(2, 20)
    anchors = torch.tensor([[0, 10], [3, 14]])
    hidden = torch.zeros(2, 2, BLOCK, SHAPE.hidden_size)
    with torch.no_grad():
        draft.markov_head.markov_w1.weight.copy_(torch.eye(SHAPE.vocab_size, 4))
        draft.markov_head.markov_w2.weight.copy_(torch.eye(SHAPE.vocab_size, 4))
    logits, labels = teacher_forced_logits(
        draft, hidden, torch.nn.Linear(32, 97, bias=False), tokens, anchors
    )
    assert labels[0, 0].tolist() == [1, 2, 3, 4, 5]
    assert labels[1, 1].tolist() == [35, 36, 37, 38, 39]
    # prev of row j is tokens[anchor + j]: with identity tables, token t < 4 biases logit t.
    assert logits[0, 0, :4].argmax(-1).tolist() == [0, 1, 2, 3]


def test_accepted_prefix_and_the_verification_walk():
    drafts = torch.tensor([[1, 2, 3, 4, 5], [1, 9, 3, 4, 5], [7, 2, 3, 4, 5]])
    truth = torch.tensor([1, 2, 3, 4, 5]).expand(3, -1)
    assert accepted_prefix(drafts, truth).tolist() == [5, 1, 0]
    # Anchored at 10: accept 2 -> next anchor 13 (accept 5) -> 19 (0) -> 20 (0) -> 21 (4) -> 26, past 22.
    accepted = [2, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 4, 4]
    assert speculative_walk(accepted, 10, 22) == [2, 5, 0, 0, 4]


def test_cached_generation_is_the_full_forwards_greedy_choice():
    target, _ = _models()
    prompts = torch.randint(0, MASK_ID, (3, 7), generator=torch.Generator().manual_seed(4))
    out = target.generate(prompts, 6)
    with torch.no_grad():
        for step in range(6):
            hidden, _ = target(out[:, : 7 + step])
            assert torch.equal(target.lm_head(hidden[:, -1]).argmax(-1), out[:, 7 + step])


def test_safetensors_round_trip_and_equal_bytes(tmp_path: Path):
    tensors = {
        "b.weight": torch.randn(3, 4).to(torch.bfloat16),
        "a.weight": torch.arange(6, dtype=torch.float32).view(2, 3),
    }
    tiny_qwen3.save_safetensors(tensors, tmp_path / "one.safetensors")
    tiny_qwen3.save_safetensors(dict(reversed(tensors.items())), tmp_path / "two.safetensors")
    assert (tmp_path / "one.safetensors").read_bytes() == (tmp_path / "two.safetensors").read_bytes()
    loaded = tiny_qwen3.load_safetensors(tmp_path / "one.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor)
    header_size = int.from_bytes((tmp_path / "one.safetensors").read_bytes()[:8], "little")
    assert header_size % 8 == 0


def test_the_pipeline_at_toy_size_writes_loadable_checkpoints(tmp_path: Path):
    pytest.importorskip("tokenizers")
    import train_dspark

    assert train_dspark.main(["--out", str(tmp_path), "--smoke"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for name, digest in manifest["sha256"].items():
        assert train_dspark.sha256(tmp_path / name) == digest
    draft_config = json.loads((tmp_path / "draft" / "config.json").read_text())
    mask_id = draft_config["dflash_config"]["mask_token_id"]
    assert mask_id == manifest["mask_token_id"] < draft_config["vocab_size"]
    prompts = json.loads((tmp_path / "prompts.json").read_text())["prompts"]
    assert prompts and all(len(p) == train_dspark.SMOKE.prompt_tokens for p in prompts)
    assert not {mask_id, 0, 1, 2} & {token for prompt in prompts for token in prompt}
    target, draft = tiny_qwen3.load_models(tmp_path, dtype=torch.float32)
    assert draft.mask_token_id == mask_id
    # The learnt mask embedding lives in the target's embedding, which the served draft shares.
    assert target.model.embed_tokens.weight[mask_id].abs().sum() > 0
    check = manifest["offline_check"]
    assert 0.0 <= check["acceptance_rate"] <= 1.0 and check["draft_steps"] > 0
    # The block the draft was trained on is what live-check --draft-config holds a server to.
    assert draft_config["block_size"] == train_dspark.BLOCK == 5
    uncertainty = manifest["target_on_heldout"]
    assert uncertainty["mean_entropy_nats"] >= 0 and 0 < uncertainty["mean_top1_probability"] <= 1
    assert manifest["plan"]["draft_sampled"] == 0.5


def test_sampled_generation_is_repeatable_and_temperature_zero_is_greedy():
    torch.manual_seed(0)
    target = tiny_qwen3.Qwen3Target(
        tiny_qwen3.Shape(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16
        ),
        1,
    )
    prompts = torch.randint(0, 64, (3, 5))
    with torch.no_grad():
        greedy = target.generate(prompts, 6)
        assert torch.equal(target.generate(prompts, 6, temperature=0.0), greedy)
        one = target.generate(prompts, 6, 1.0, torch.Generator().manual_seed(7))
        two = target.generate(prompts, 6, 1.0, torch.Generator().manual_seed(7))
    assert torch.equal(one, two) and torch.equal(one[:, :5], prompts)
    assert not torch.equal(one, greedy)


def test_stretch_sets_the_context_of_both_configurations_and_nothing_else(tmp_path: Path):
    test_model.write(tmp_path)
    before = {name: json.loads((tmp_path / name / "config.json").read_text()) for name in ("target", "draft")}
    assert test_model.main(["--stretch", str(tmp_path), "--max-positions", "1048576"]) == 0
    for name, config in before.items():
        after = json.loads((tmp_path / name / "config.json").read_text())
        assert after == {**config, "max_position_embeddings": 1_048_576}
    with pytest.raises(SystemExit, match=r"absent/target/config\.json: no such configuration"):
        test_model.stretch(tmp_path / "absent", 1_048_576)


def test_without_out_or_stretch_there_is_nothing_to_write(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as raised:
        test_model.main([])
    assert raised.value.code == 2
    assert capsys.readouterr().err.endswith("error: give --out DIR (or --stretch DIR)\n")
