"""Every sparse-MLA layer, every step: our backend against vLLM's FLASHMLA_SPARSE on the same inputs.

Runs one vLLM engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with
``--attention-backend CUSTOM`` (our backend) and eager execution, and wraps our backend's classes so
that vLLM's own ``FlashMLASparseMetadataBuilder`` and ``FlashMLASparseImpl`` are built beside ours from
the same arguments. At each call of ``forward_mqa`` both run on the same query, the same cache (which
vLLM has just written) and the same indexer rows, and the script records, per layer and step:

- whether our global slot ids equal those of vLLM's ``triton_convert_req_index_to_global_index``;
- the relative error of our output against FlashMLA's (all rows, and the worst row), for decode rows
  (query length 1) and prefill rows separately.

The thresholds are those of the kernel's own GPU tests (``tests/gpu/test_sparse_mla_gpu.py``): relative
error < 1e-2 overall, < 3e-2 for the worst row. Results go to ``--out`` as JSON; the exit status is 1
when any call breaks them.

    python3 bench/vllm_backend/compare.py --model /tmp/dsv32-h16/target --kv-cache-dtype fp8_ds_mla \\
        --out /tmp/compare-h16-fp8.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REL_LIMIT = 1e-2
ROW_LIMIT = 3e-2
PROMPT_LENGTHS = (37, 300, 700, 1500, 2600, 64, 1, 1200)


def install_shadow(records: list[dict[str, Any]]) -> None:
    """Wrap our backend's builder and implementation so vLLM's FlashMLA runs beside them."""
    import numpy as np
    import torch
    from vllm.v1.attention.backends.mla.flashmla_sparse import (
        FlashMLASparseImpl,
        FlashMLASparseMetadataBuilder,
    )
    from vllm.v1.attention.backends.mla.sparse_utils import triton_convert_req_index_to_global_index

    from sparkseal.vllm_integration import sparse_mla_vllm
    from sparkseal.vllm_integration import vllm_backend as ours

    builder_init = ours.SparksealSparseMLAMetadataBuilder.__init__
    build = ours.SparksealSparseMLAMetadataBuilder.build
    impl_init = ours.SparksealSparseMLAImpl.__init__
    forward = ours.SparksealSparseMLAImpl.forward_mqa
    steps = {"n": 0}

    def shadow_builder_init(self, kv_cache_spec, layer_names, vllm_config, device):  # type: ignore[no-untyped-def]
        builder_init(self, kv_cache_spec, layer_names, vllm_config, device)
        self.reference = FlashMLASparseMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)

    def shadow_build(self, common_prefix_len, common_attn_metadata, fast_build=False):  # type: ignore[no-untyped-def]
        cm = common_attn_metadata
        metadata = build(self, common_prefix_len, cm, fast_build)
        metadata.reference = self.reference.build(common_prefix_len, cm, fast_build)
        lengths = np.diff(np.asarray(cm.query_start_loc_cpu, dtype=np.int64))
        metadata.decode_rows = torch.from_numpy(np.repeat(lengths == 1, lengths))
        steps["n"] += 1
        metadata.step = steps["n"]
        return metadata

    def shadow_impl_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        impl_init(self, *args, **kwargs)
        self.reference = FlashMLASparseImpl(*args, **kwargs)

    def shadow_forward(self, q, cache, metadata, layer):  # type: ignore[no-untyped-def]
        out, _ = forward(self, q, cache, metadata, layer)
        theirs, _ = self.reference.forward_mqa(q, cache, metadata.reference, layer)
        tokens = out.shape[0]
        positions = self.topk_indices_buffer[:tokens]
        slots, lengths = sparse_mla_vllm.to_global_slots(
            metadata.req_id_per_token[:tokens], metadata.block_table, positions, metadata.block_size
        )
        vllm_slots = triton_convert_req_index_to_global_index(
            metadata.reference.req_id_per_token[:tokens],
            metadata.block_table,
            positions,
            BLOCK_SIZE=metadata.block_size,
            NUM_TOPK_TOKENS=positions.shape[1],
        )
        record: dict[str, Any] = {
            "layer": getattr(layer, "layer_name", "?"),
            "step": metadata.step,
            "tokens": tokens,
            "topk": positions.shape[1],
            "slots_equal": bool(torch.equal(slots, vllm_slots)),
            "valid_slots": int((slots >= 0).sum()),
            "tail_after_length": int(
                ((slots >= 0) & (torch.arange(slots.shape[1], device=slots.device) >= lengths[:, None]))
                .sum()
                .item()
            ),
        }
        decode_rows = metadata.decode_rows[:tokens].to(out.device)
        for kind, rows in (("decode", decode_rows), ("prefill", ~decode_rows)):
            a = out[rows].float()
            b = theirs[: out.shape[0]][rows].float()
            live = b.flatten(1).norm(dim=1) > 0
            a, b = a[live], b[live]
            if a.shape[0] == 0:
                continue
            diff = (a - b).flatten(1)
            rel = (diff.norm() / b.norm().clamp(min=1e-30)).item()
            row = (diff.norm(dim=1) / b.flatten(1).norm(dim=1).clamp(min=1e-30)).max().item()
            record[kind] = {"rows": int(a.shape[0]), "rel": rel, "worst_row": row}
        records.append(record)
        return out, None

    ours.SparksealSparseMLAMetadataBuilder.__init__ = shadow_builder_init
    ours.SparksealSparseMLAMetadataBuilder.build = shadow_build
    ours.SparksealSparseMLAImpl.__init__ = shadow_impl_init
    ours.SparksealSparseMLAImpl.forward_mqa = shadow_forward


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "calls": len(records),
        "layers": sorted({r["layer"] for r in records}),
        "steps": len({r["step"] for r in records}),
        "slots_equal": all(r["slots_equal"] for r in records),
        "tail_after_length": sum(r["tail_after_length"] for r in records),
    }
    for kind in ("decode", "prefill"):
        found = [r[kind] for r in records if kind in r]
        summary[kind] = {
            "calls": len(found),
            "rows": sum(f["rows"] for f in found),
            "max_rel": max((f["rel"] for f in found), default=None),
            "max_worst_row": max((f["worst_row"] for f in found), default=None),
        }
    ok = summary["slots_equal"] and summary["tail_after_length"] == 0 and summary["decode"]["calls"] > 0
    for kind in ("decode", "prefill"):
        if summary[kind]["calls"]:
            ok = ok and summary[kind]["max_rel"] < REL_LIMIT and summary[kind]["max_worst_row"] < ROW_LIMIT
    summary["pass"] = ok
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--kv-cache-dtype", default="fp8_ds_mla", choices=("fp8_ds_mla", "auto"))
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    records: list[dict[str, Any]] = []
    install_shadow(records)
    started = time.monotonic()
    llm = LLM(
        model=str(args.model),
        skip_tokenizer_init=True,
        load_format="dummy",
        attention_backend="CUSTOM",
        kv_cache_dtype=args.kv_cache_dtype,
        enforce_eager=True,
        max_model_len=args.max_model_len,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=True,
        gpu_memory_utilization=0.4,
        seed=0,
    )
    startup = time.monotonic() - started
    rng = random.Random(20261201)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(100, 4000) for _ in range(n)]) for n in PROMPT_LENGTHS
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)
    outputs = llm.generate(prompts, params)
    summary = summarise(records)
    summary.update(
        model=str(args.model),
        kv_cache_dtype=args.kv_cache_dtype,
        prompt_lengths=list(PROMPT_LENGTHS),
        generated=[len(o.outputs[0].token_ids) for o in outputs],
        startup_s=round(startup, 1),
        limits={"rel": REL_LIMIT, "worst_row": ROW_LIMIT},
    )
    args.out.write_text(json.dumps({"summary": summary, "records": records}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
