"""Write the configuration of a tiny DeepSeek-V3.2-shaped model (no download needed).

vLLM v0.25.1 serves ``DeepseekV32ForCausalLM`` with its ``deepseek_v2`` model class
(``DeepseekV3ForCausalLM``; ``vllm/model_executor/models/registry.py``): MLA attention whose layers each
have a lightning indexer choosing ``index_topk`` context tokens per query token, the sparse-MLA
attention our backend replaces, and a DeepSeek MoE. The attention and indexer shapes are DeepSeek
V3.2's own (kv_lora_rank 512, rope 64, nope 128, v 128, indexer 64 heads of 128); the widths around
them are small so the model starts in seconds. ``--heads`` sets the attention heads the backend sees
(V3.2 has 128; 16 is what each rank of an 8-way tensor-parallel deployment sees) and ``--topk`` the
indexer's row width (V3.2: 2048).

vLLM serves it with ``--load-format dummy`` and ``--skip-tokenizer-init`` (prompts are token ids).

    python3 bench/vllm_backend/model.py --out /tmp/dsv32-h16 --heads 16 --topk 512
    # -> /tmp/dsv32-h16/target/config.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 4096
HIDDEN_SIZE = 512
MAX_POSITIONS = 8192


def config(heads: int, topk: int, layers: int) -> dict:
    return {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 1024,
        "moe_intermediate_size": 256,
        "num_hidden_layers": layers,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "moe_layer_freq": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": 256,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "index_topk": topk,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for target/config.json")
    parser.add_argument("--heads", type=int, default=16, choices=(16, 32, 64, 128))
    parser.add_argument("--topk", type=int, default=512, help="index_topk, a multiple of 64")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    target = args.out / "target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(
        json.dumps(config(args.heads, args.topk, args.layers), indent=2) + "\n"
    )
    print(target / "config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
