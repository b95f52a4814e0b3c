"""Write the configuration of a tiny DeepSeek-V4-shaped model (no download needed), and of its DSpark draft.

vLLM v0.25.1 serves ``DeepseekV4ForCausalLM`` with ``vllm/models/deepseek_v4``: every layer attends a
128-token sliding window in DeepSeek V4's 584-byte fp8 records, and (per ``compress_ratios``) a second
cache of every 4th token chosen by a lightning indexer (C4A) or of every 128th token (C128A), with an
attention sink; the hidden state is carried in ``hc_mult`` hyper-connection streams. The attention
shapes here are V4's own (head_dim 512 with 64 RoPE dims, 128-token window, indexer 64 heads of 128);
the widths around them are small. ``--heads`` is the attention heads per rank (V4-Flash: 64, padded by
vLLM's FlashMLA class to 64 or 128); ``--topk`` the indexer's row width. Experts are block-fp8
(``expert_dtype`` fp8, as DeepSeek-V4-Flash-Base) so the model runs on an H200.

``--dspark`` also writes ``draft/config.json``, the configuration of V4's DSpark draft
(``vllm/models/deepseek_v4/nvidia/dspark.py``, ``DSparkDeepseekV4ForCausalLM``). That draft is made of
V4 decoder layers built from the *target's* configuration (vLLM builds them under the target's model
config), and reads its own keys from the draft configuration, which for a real DeepSeek V4 is the
target checkpoint's own ``config.json`` (``speculative.py`` uses the target when ``model`` is left out).
The draft written here is therefore the target's configuration plus DSpark's keys:

- ``dspark_target_layer_ids``: the target layers whose outputs feed the draft (vLLM taps the output of
  layer ``i`` for each id, ``eagle3_utils.py``; the draft's ``main_proj`` takes their concatenation);
- ``dspark_markov_rank``: the Markov head's rank; ``dspark_noise_token_id``: the token of the block's
  positions after the anchor (``spec_decode/utils.py``'s parallel-drafting token);
- ``n_mtp_layers``: the number of draft layers (vLLM's default is 3, as V4's DSpark checkpoints have);
- ``num_nextn_predict_layers`` 1 (the target has 0): vLLM's speculative config turns every
  ``deepseek_v4`` draft configuration into an MTP one first, with ``n_predict`` from this key, and then
  requires ``num_speculative_tokens`` to be at most ``n_predict`` or a multiple of it; 0 would divide by
  zero, and V4-DSpark's own 3 refuses the 5 tokens ``bench/live/serve.py`` asks for;
- ``dspark_block_size``: documentation only (vLLM 0.25.1 reads the block from ``num_speculative_tokens``).

``num_hidden_layers`` must stay the target's: the draft's layers are named ``layers.{num_hidden_layers
+ i}``, after the target's, and vLLM refuses a duplicate layer name. vLLM replaces the draft's
``architectures`` by ``DSparkDraftModel``. The draft ships no weights (``--load-format dummy``); it
shares the target's embedding and LM head.

``--hidden`` is the hidden size (default 512, the size of every run recorded so far). vLLM 0.25.1's fused
hyper-connection kernel for steps of at most 16 tokens (``mhc_fused_tilelang``) gives each of its 256
threads ``hidden / split / 256`` elements (split 8 or 4, ``fused_mhc_uncovered``), rounded down: at 512
it writes none of the new residual (bench/results/vllm_backend.md 6b, 7). 2048 is the smallest size it
covers; DeepSeek V4's own sizes are covered. Our series' patch 0004 sends the uncovered steps to vLLM's
separate kernels, so a vLLM built by this repository serves 512 too.

    python3 bench/vllm_backend/model_dsv4.py --out /tmp/dsv4 --heads 16 --topk 512 [--hidden 2048] [--dspark]
    # -> /tmp/dsv4/target/config.json (and draft/config.json); vLLM serves it with --load-format dummy
    # --skip-tokenizer-init, the draft with --speculative-config '{"method": "dspark", "model":
    # "/tmp/dsv4/draft", "num_speculative_tokens": 5, "attention_backend": "CUSTOM"}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 4096
HIDDEN_SIZE = 512
MAX_POSITIONS = 8192
# The DSpark draft (see the module's docstring).
DSPARK_LAYERS = 3
DSPARK_TARGET_LAYER_IDS = [3, 4, 5]  # the last three of the target's six, as V4-DSpark taps its last three
DSPARK_MARKOV_RANK = 32
DSPARK_NOISE_TOKEN_ID = VOCAB_SIZE - 1  # never drawn by live-check's prompts (token ids 100..999)
DSPARK_BLOCK_SIZE = 5  # = bench/live/serve.py's NUM_SPECULATIVE_TOKENS
DSPARK_NUM_NEXTN_PREDICT_LAYERS = 1


# vLLM 0.25.1 (vllm/model_executor/kernels/mhc/tilelang.py, tilelang_kernels.py): the fused mHC kernel of
# steps of at most 16 tokens splits the hidden size 8 ways (fewer than 8 tokens, hidden size <= 4096) or 4
# ways, over blocks of 256 threads, each thread taking (hidden // split) // 256 elements.
MHC_FUSED_THREADS = 256
MHC_FUSED_SPLITS = (8, 4)


def fused_mhc_uncovered(hidden: int) -> list[int]:
    """The splits of vLLM 0.25.1's small-step fused mHC kernel that leave part of ``hidden`` unwritten
    (empty when every element of the new residual is written)."""
    return [
        split
        for split in MHC_FUSED_SPLITS
        if (split != 8 or hidden <= 4096)
        and (hidden // split) // MHC_FUSED_THREADS * MHC_FUSED_THREADS * split != hidden
    ]


def config(heads: int, topk: int, hidden: int = HIDDEN_SIZE) -> dict:
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
        "hidden_size": hidden,
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


def draft_config(target: dict) -> dict:
    """V4's DSpark draft for ``target``: the target's configuration plus DSpark's keys (module docstring)."""
    return {
        **target,
        "num_nextn_predict_layers": DSPARK_NUM_NEXTN_PREDICT_LAYERS,
        "n_mtp_layers": DSPARK_LAYERS,
        "dspark_target_layer_ids": list(DSPARK_TARGET_LAYER_IDS),
        "dspark_markov_rank": DSPARK_MARKOV_RANK,
        "dspark_noise_token_id": DSPARK_NOISE_TOKEN_ID,
        "dspark_block_size": DSPARK_BLOCK_SIZE,
    }


def write(out: Path, heads: int, topk: int, dspark: bool = False, hidden: int = HIDDEN_SIZE) -> list[Path]:
    """Write ``out/target/config.json`` (and with ``dspark``, ``out/draft/config.json``); return the paths."""
    target = config(heads, topk, hidden)
    configs = {"target": target}
    if dspark:
        configs["draft"] = draft_config(target)
    written = []
    for name, values in configs.items():
        path = out / name / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for target/config.json")
    parser.add_argument("--heads", type=int, default=16, choices=(16, 32, 64, 128))
    parser.add_argument("--topk", type=int, default=512, help="index_topk, a multiple of 64")
    parser.add_argument("--dspark", action="store_true", help="also write draft/config.json (DSpark draft)")
    parser.add_argument(
        "--hidden",
        type=int,
        default=HIDDEN_SIZE,
        help=f"hidden size, a multiple of 256 (default {HIDDEN_SIZE})",
    )
    args = parser.parse_args(argv)
    if args.hidden <= 0 or args.hidden % 256:
        parser.error(f"--hidden: expected a positive multiple of 256, got {args.hidden}")
    uncovered = fused_mhc_uncovered(args.hidden)
    if uncovered:
        print(
            f"model_dsv4: hidden size {args.hidden}: vLLM 0.25.1's fused mHC kernel (steps of at most 16 "
            f"tokens) leaves part of the new residual unwritten at split {'/'.join(map(str, uncovered))} "
            "(patch 0004 of our series routes such steps to the separate kernels)",
            file=sys.stderr,
        )
    for path in write(args.out, args.heads, args.topk, args.dspark, args.hidden):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
