"""Write the configuration of a tiny Qwen3 target and a matching Qwen3 DSpark draft (no download needed).

vLLM serves them with ``--load-format dummy`` (random weights, drawn with a fixed seed per parameter, so
two servers of the same model compute the same function) and ``--skip-tokenizer-init`` (prompts are token
ids), so no weights, tokenizer or hub access are needed. vLLM's dummy weights are uniform in +-1e-3, norms
included, which makes greedy completions degenerate (they settle into two alternating tokens);
``--weights`` instead writes seeded ``model.safetensors`` files (normal, std 0.02, norms 1: the usual
initialisation), so completions vary token by token and a lossless check compares something (needs torch
and safetensors; serve with ``--load-format safetensors``). The draft is vLLM v0.25.1's ``Qwen3DSparkModel``
(``vllm/model_executor/models/qwen3_dspark.py``): a DFlash Qwen3 backbone fed with the target's hidden
states at ``dflash_config.target_layer_ids``, plus the low-rank Markov head; method ``dspark`` runs it on
vLLM's V2 GPU model runner with the DSpark speculator our first patch fixes. The draft shares the target's
embedding and LM head (it ships neither), as DSpark checkpoints do.

    python3 bench/live/test_model.py --out /tmp/sparkseal-model [--weights]
    # -> /tmp/sparkseal-model/target/config.json, /tmp/sparkseal-model/draft/config.json (+ model.safetensors)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Small enough to start in seconds, large enough to exercise multi-block KV caches, GQA and CUDA graphs.
VOCAB_SIZE = 4096
HIDDEN_SIZE = 256
HEAD_DIM = 64
MAX_POSITIONS = 8192
BLOCK_SIZE = 5  # the draft's block: serve.py's num_speculative_tokens
MASK_TOKEN_ID = VOCAB_SIZE - 1  # never drawn by the prompts (token ids 100..999 by default)
INIT_STD = 0.02
WEIGHT_SEED = 20261201


def _common(max_positions: int = MAX_POSITIONS) -> dict:
    return {
        "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
    }


def target_config(max_positions: int = MAX_POSITIONS) -> dict:
    return {**_common(max_positions), "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4}


def draft_config(max_positions: int = MAX_POSITIONS) -> dict:
    return {
        **_common(max_positions),
        "architectures": ["Qwen3DSparkModel"],
        "num_hidden_layers": 2,
        "target_hidden_size": HIDDEN_SIZE,
        "markov_rank": 32,
        "block_size": BLOCK_SIZE,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": [1, 2]},
    }


def _layer_shapes(config: dict, prefix: str) -> dict[str, tuple[int, ...]]:
    """Hugging Face Qwen3 decoder-layer parameter names and shapes (vLLM's loaders stack q/k/v, gate/up)."""
    hidden, heads, kv_heads = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    head_dim, inter = config["head_dim"], config["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(config["num_hidden_layers"]):
        layer = f"{prefix}layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            layer + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            layer + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            layer + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            layer + "self_attn.q_norm.weight": (head_dim,),
            layer + "self_attn.k_norm.weight": (head_dim,),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def weight_shapes(name: str, config: dict) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes: the target as Hugging Face writes Qwen3, the draft as DSpark ships it.

    The draft's names have no ``model.`` prefix and it ships no embedding or LM head (vLLM's
    ``Qwen3DSparkForCausalLM.load_weights`` adds the prefix and shares the target's).
    """
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    if name == "target":
        return {
            "model.embed_tokens.weight": (vocab, hidden),
            **_layer_shapes(config, "model."),
            "model.norm.weight": (hidden,),
            "lm_head.weight": (vocab, hidden),
        }
    features = len(config["dflash_config"]["target_layer_ids"]) * config["target_hidden_size"]
    return {
        **_layer_shapes(config, ""),
        "fc.weight": (hidden, features),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
        "markov_head.markov_w1.weight": (vocab, config["markov_rank"]),
        "markov_head.markov_w2.weight": (vocab, config["markov_rank"]),
    }


def write_weights(path: Path, shapes: dict[str, tuple[int, ...]], seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for key in sorted(shapes):
        if key.endswith("norm.weight"):
            tensors[key] = torch.ones(shapes[key], dtype=torch.bfloat16)
        else:
            values = torch.randn(shapes[key], generator=generator, dtype=torch.float32) * INIT_STD
            tensors[key] = values.to(torch.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})


def write(out: Path, weights: bool = False, max_positions: int = MAX_POSITIONS) -> list[Path]:
    """The two configurations (and with ``weights`` their seeded weights) under ``out``; ``max_positions``
    stretches the context (the reference validation serves 1,048,576 tokens): rope needs no scaling for
    that, the weights are the same."""
    written = []
    configs = (("target", target_config(max_positions)), ("draft", draft_config(max_positions)))
    for index, (name, config) in enumerate(configs):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "config.json"
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        written.append(path)
        if weights:
            write_weights(folder / "model.safetensors", weight_shapes(name, config), WEIGHT_SEED + index)
            written.append(folder / "model.safetensors")
    return written


def stretch(folder: Path, max_positions: int) -> list[Path]:
    """Rewrite ``max_position_embeddings`` of both configurations under ``folder``; nothing else changes.
    Rope (the default kind, no scaling) computes any position, so the weights serve the longer context as
    they are; a missing configuration is an error naming it."""
    written = []
    for name in ("target", "draft"):
        path = folder / name / "config.json"
        if not path.is_file():
            raise SystemExit(f"{path}: no such configuration")
        config = json.loads(path.read_text())
        config["max_position_embeddings"] = max_positions
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="folder for target/ and draft/")
    parser.add_argument(
        "--stretch",
        type=Path,
        metavar="DIR",
        help="instead: set max_position_embeddings (--max-positions) in DIR/target and DIR/draft's configs, "
        "weights untouched (a trained pair served at a longer context)",
    )
    parser.add_argument("--weights", action="store_true", help="also write seeded model.safetensors files")
    parser.add_argument(
        "--max-positions", type=int, default=MAX_POSITIONS, help="max_position_embeddings (%(default)s)"
    )
    args = parser.parse_args(argv)
    if args.stretch is not None:
        for path in stretch(args.stretch, args.max_positions):
            print(path)
        return 0
    if args.out is None:
        parser.error("give --out DIR (or --stretch DIR)")
    for path in write(args.out, args.weights, args.max_positions):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
