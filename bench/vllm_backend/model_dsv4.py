"""Write the configuration of a tiny DeepSeek-V4-shaped model (no download needed).

vLLM v0.25.1 serves ``DeepseekV4ForCausalLM`` with ``vllm/models/deepseek_v4``: every layer attends a
128-token sliding window in DeepSeek V4's 584-byte fp8 records, and (per ``compress_ratios``) a second
cache of every 4th token chosen by a lightning indexer (C4A) or of every 128th token (C128A), with an
attention sink; the hidden state is carried in ``hc_mult`` hyper-connection streams. The attention
shapes here are V4's own (head_dim 512 with 64 RoPE dims, 128-token window, indexer 64 heads of 128);
the widths around them are small. ``--heads`` is the attention heads per rank (V4-Flash: 64, padded by
vLLM's FlashMLA class to 64 or 128); ``--topk`` the indexer's row width. Experts are block-fp8
(``expert_dtype`` fp8, as DeepSeek-V4-Flash-Base) so the model runs on an H200.

    python3 bench/vllm_backend/model_dsv4.py --out /tmp/dsv4 --heads 16 --topk 512
    # -> /tmp/dsv4/target/config.json; vLLM serves it with --load-format dummy --skip-tokenizer-init
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 4096
HIDDEN_SIZE = 512
MAX_POSITIONS = 8192


def config(heads: int, topk: int) -> dict:
    # Window-only, C4A and C128A layers, each twice.
    ratios = [0, 4, 128, 0, 4, 128]
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        "expert_dtype": "fp8",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "scale_fmt": "ue8m0",
        },
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "moe_intermediate_size": 256,
        "num_hidden_layers": len(ratios),
        "num_attention_heads": heads,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 256,
        "o_lora_rank": 256,
        "o_groups": 4,
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": MAX_POSITIONS,
        "sliding_window": 128,
        "rope_theta": 10000,
        "compress_rope_theta": 160000,
        "rope_scaling": {
            "type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "num_nextn_predict_layers": 0,
        "compress_ratios": ratios,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": topk,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "num_hash_layers": 1,
        "tie_word_embeddings": False,
    }


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for target/config.json")
    parser.add_argument("--heads", type=int, default=16, choices=(16, 32, 64, 128))
    parser.add_argument("--topk", type=int, default=512, help="index_topk, a multiple of 64")
    args = parser.parse_args(argv)
    target = args.out / "target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config(args.heads, args.topk), indent=2) + "\n")
    print(target / "config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
