"""Replay the decode calls saved by ``SPARKSEAL_SPARSE_MLA_V4_DEBUG`` (``vllm_integration/vllm_dsv4_debug``).

Each saved call holds one V4 layer's query rows, index rows, lengths, attention sink and the cache pages the
rows read. On a GPU this runs our kernel on them under every QK path, shared-memory cap and split choice,
and the float32 reference on any machine, and prints, per row: NaN in our output (real heads only) per
variant, NaN in the reference, the entries each cache row uses (in range and before its length), the
entries before the length that point outside the cache, the query's largest magnitude, and the e4m3 NaN
bytes among the records the row reads. That tells a kernel fault (the reference is finite where ours is
not) from bad inputs (the reference is NaN too, or the query already is).

    python3 bench/vllm_backend/replay_nan.py DUMP.pt [DUMP.pt ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sparkseal.kernels.sparse_mla_ref import V4_DATA_BYTES, V4_FP8, sparse_mla_decode_ref


def row_stats(cache: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor | None) -> list[str]:
    """Per row: used entries, entries before the length outside the cache, e4m3 NaN bytes read."""
    num_pages, page_size, _ = cache.shape
    num_slots = num_pages * page_size
    idx = indices.reshape(indices.shape[0], indices.shape[-1]).to(torch.int64)
    before = torch.ones_like(idx, dtype=torch.bool)
    if lengths is not None:
        before = torch.arange(idx.shape[1]).unsqueeze(0) < lengths.to(torch.int64).unsqueeze(1)
    in_range = (idx >= 0) & (idx < num_slots)
    flat = cache.reshape(num_pages, -1)
    out = []
    for t in range(idx.shape[0]):
        slots = idx[t][before[t] & in_range[t]]
        page, offset = slots // page_size, slots % page_size
        nan_bytes = 0
        if slots.numel():
            start = offset * V4_DATA_BYTES
            cols = start.unsqueeze(1) + torch.arange(448)
            data = flat[page.unsqueeze(1).expand_as(cols), cols]
            nan_bytes = int(((data & 0x7F) == 0x7F).sum())
        outside = int((before[t] & (idx[t] >= num_slots)).sum())
        out.append(f"used {slots.numel()} outside {outside} nan-bytes {nan_bytes}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dumps", nargs="+", type=Path)
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    if gpu:
        from sparkseal.kernels.sparse_mla import sparse_mla_decode
    for path in args.dumps:
        d = torch.load(path)
        heads = d["heads"]
        print(
            f"== {path.name}: {d['prefix']}, {d['q'].shape[0]} rows, {heads} real heads of {d['q'].shape[1]}"
        )
        ref, _ = sparse_mla_decode_ref(
            d["q"].float(),
            d["cache"],
            d["indices"].reshape(d["indices"].shape[0], -1),
            d["softmax_scale"],
            V4_FP8,
            topk_length=d["topk_length"],
            extra_cache=d["extra_cache"],
            extra_indices=None
            if d["extra_indices"] is None
            else d["extra_indices"].reshape(d["q"].shape[0], -1),
            extra_topk_length=d["extra_topk_length"],
            attn_sink=d["attn_sink"],
        )
        saved = torch.isnan(d["ours"][:, :heads].float()).flatten(1).any(1)
        variants: dict[str, torch.Tensor] = {}
        if gpu:
            dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
            for qk in ("auto", "bf16", "fp8", "fp8x2"):
                for smem in (0, 101376):
                    for splits in (0, 1):
                        try:
                            out, _ = sparse_mla_decode(
                                q=dev["q"],
                                cache=dev["cache"],
                                indices=dev["indices"],
                                softmax_scale=dev["softmax_scale"],
                                layout=V4_FP8.name,
                                topk_length=dev["topk_length"],
                                extra_cache=dev["extra_cache"],
                                extra_indices=dev["extra_indices"],
                                extra_topk_length=dev["extra_topk_length"],
                                attn_sink=dev["attn_sink"],
                                num_splits=splits,
                                max_smem_bytes=smem,
                                qk=qk,
                            )
                        except Exception as error:  # a variant the kernel refuses is reported, not fatal
                            print(f"  {qk}/smem{smem}/splits{splits}: refused: {error}")
                            continue
                        variants[f"{qk}/{smem}/{splits}"] = (
                            torch.isnan(out[:, :heads].float()).flatten(1).any(1).cpu()
                        )
        swa = row_stats(d["cache"], d["indices"], d["topk_length"])
        extra = (
            row_stats(d["extra_cache"], d["extra_indices"], d["extra_topk_length"])
            if d["extra_cache"] is not None
            else ["-"] * len(swa)
        )
        for t in range(d["q"].shape[0]):
            q = d["q"][t, :heads].float()
            bad = [name for name, nan in variants.items() if bool(nan[t])]
            ref_nan = bool(torch.isnan(ref[t, :heads]).any())
            print(
                f"  row {t}: saved NaN {bool(saved[t])}; reference NaN {ref_nan}; "
                f"variants NaN {len(bad)}/{len(variants)} {bad[:4]}; q amax {q.abs().max().item():.3g} "
                f"q non-finite {int((~torch.isfinite(q)).sum())}; window {swa[t]}; extra {extra[t]}"
            )
        if d["attn_sink"] is not None:
            sink = d["attn_sink"][:heads]
            print(f"  attn_sink[:heads] min {sink.min().item():.3g} max {sink.max().item():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
