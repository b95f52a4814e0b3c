"""Write the configuration of a tiny Qwen3 target and a matching Qwen3 DSpark draft (no download needed).

vLLM serves them with ``--load-format dummy`` (random weights, drawn with a fixed seed per parameter, so
two servers of the same model compute the same function) and ``--skip-tokenizer-init`` (prompts are token
ids), so no weights, tokenizer or hub access are needed. The draft is vLLM v0.25.1's ``Qwen3DSparkModel``
(``vllm/model_executor/models/qwen3_dspark.py``): a DFlash Qwen3 backbone fed with the target's hidden
states at ``dflash_config.target_layer_ids``, plus the low-rank Markov head; method ``dspark`` runs it on
vLLM's V2 GPU model runner with the DSpark speculator our first patch fixes. The draft shares the target's
embedding and LM head (it ships neither), as DSpark checkpoints do.

    python3 bench/live/test_model.py --out /tmp/sparkseal-model
    # -> /tmp/sparkseal-model/target/config.json, /tmp/sparkseal-model/draft/config.json
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
MASK_TOKEN_ID = VOCAB_SIZE - 1  # never drawn by the prompts (token ids 100..999 by default)


def _common() -> dict:
    return {
        "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
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


def target_config() -> dict:
    return {**_common(), "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4}


def draft_config() -> dict:
    return {
        **_common(),
        "architectures": ["Qwen3DSparkModel"],
        "num_hidden_layers": 2,
        "target_hidden_size": HIDDEN_SIZE,
        "markov_rank": 32,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": [1, 2]},
    }


def write(out: Path) -> list[Path]:
    written = []
    for name, config in (("target", target_config()), ("draft", draft_config())):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "config.json"
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for target/ and draft/")
    args = parser.parse_args(argv)
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
