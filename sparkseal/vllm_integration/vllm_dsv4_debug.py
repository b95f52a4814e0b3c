"""A debug switch for DeepSeek V4 decode on our class: find the first layer whose output holds NaN.

With ``SPARKSEAL_SPARSE_MLA_V4_DEBUG=DIR`` (off by default; run the server with ``--enforce-eager``: the check
synchronises), every decode call of our V4 class is checked after the kernel ran. For a call whose output
holds a NaN row, the log says which rows, whether the query rows were NaN already (the NaN came from an
earlier layer), what vLLM's own class (the base class, FlashMLA's on an H200) and the float32 reference
(:func:`sparkseal.kernels.sparse_mla_ref.sparse_mla_decode_ref`) give for the same inputs, and the largest
ue8m0 scale byte among the records the rows read; the inputs themselves (query rows, index rows, lengths,
attention sink, and the cache pages the rows name, renumbered) are saved to ``DIR`` for replay on any
machine. At most ``MAX_DUMPS`` calls are dumped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from sparkseal.kernels.sparse_mla_ref import V4_DATA_BYTES, V4_FP8, V4_SCALE_BYTES, sparse_mla_decode_ref

DEBUG_ENV = "SPARKSEAL_SPARSE_MLA_V4_DEBUG"
MAX_DUMPS = 8

logger = logging.getLogger("vllm.sparkseal")
_state = {"calls": 0, "dumps": 0}


def debug_dir(environ: dict[str, str] | os._Environ = os.environ) -> Path | None:
    value = environ.get(DEBUG_ENV, "").strip()
    return Path(value) if value else None


def compact_cache(cache: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pages ``indices`` name (every in-range entry, valid or not), contiguous, and indices renumbered.

    Entries outside ``[0, num_slots)`` are kept as they are (still out of range of the smaller cache).
    """
    pages3 = cache.squeeze(2) if cache.dim() == 4 else cache
    num_pages, page_size, _ = pages3.shape
    num_slots = num_pages * page_size
    idx = rows2d(indices).to(torch.int64)
    in_range = (idx >= 0) & (idx < num_slots)
    page = torch.div(idx.clamp(0, num_slots - 1), page_size, rounding_mode="floor")
    used = torch.unique(page[in_range])
    if used.numel() == 0:
        used = torch.zeros(1, dtype=torch.int64, device=idx.device)
    new_page = torch.searchsorted(used, page)
    renumbered = torch.where(in_range, new_page * page_size + idx % page_size, idx)
    return pages3[used].contiguous().view(torch.uint8), renumbered.to(torch.int32)


def rows2d(indices: torch.Tensor) -> torch.Tensor:
    """``[T, K]`` index rows from ``[T, K]`` or FlashMLA's ``[T, 1, K]``."""
    return indices.reshape(indices.shape[0], indices.shape[-1])


def _scale_bytes(cache: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """The 7 ue8m0 scale bytes of every record a row reads (valid entries only), ``[N, 7]``."""
    num_pages, page_size, _ = cache.shape
    idx = rows2d(indices).to(torch.int64)
    valid = (idx >= 0) & (idx < num_pages * page_size)
    if lengths is not None:
        columns = torch.arange(idx.shape[1], device=idx.device)
        valid &= columns.unsqueeze(0) < lengths.to(idx.device).unsqueeze(1)
    slots = idx[valid]
    flat = cache.reshape(num_pages, -1)
    page, offset = slots // page_size, slots % page_size
    start = page_size * V4_DATA_BYTES + offset * V4_SCALE_BYTES
    cols = start.unsqueeze(1) + torch.arange(7, device=idx.device)
    return flat[page.unsqueeze(1).expand_as(cols), cols]


def _rows(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def check(
    layer: Any,
    args: dict[str, Any],
    q: torch.Tensor,
    output: torch.Tensor,
    base_decode: Any,
    base_args: tuple[Any, ...],
    out_dir: Path,
) -> None:
    """Check one decode call's output for NaN rows; on NaN, compare and dump (module docstring).

    Only the layer's real heads are checked (vLLM pads the query heads with zeros and drops the padded
    heads' output). A failure of the comparison itself is logged, never raised: the debug switch must not
    change what the server does.
    """
    if output.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    _state["calls"] += 1
    heads = int(getattr(layer, "n_local_heads", output.shape[1]))
    out_nan = torch.isnan(output[:, :heads].float()).flatten(1).any(1)
    if not bool(out_nan.any()):
        return
    q_nan = torch.isnan(q[:, :heads].float()).flatten(1).any(1)
    logger.warning(
        "sparkseal debug: %s call %d: output NaN rows %s of %d (%d real heads); query NaN rows %s; "
        "lengths %s, extra lengths %s",
        layer.prefix,
        _state["calls"],
        _rows(out_nan),
        output.shape[0],
        heads,
        _rows(q_nan),
        None if args["topk_length"] is None else args["topk_length"].tolist(),
        None if args["extra_topk_length"] is None else args["extra_topk_length"].tolist(),
    )
    try:
        _compare_and_dump(layer, args, output, heads, base_decode, base_args, out_dir)
    except Exception as error:
        logger.warning("sparkseal debug: %s: comparison failed: %r", layer.prefix, error)


def _compare_and_dump(
    layer: Any,
    args: dict[str, Any],
    output: torch.Tensor,
    heads: int,
    base_decode: Any,
    base_args: tuple[Any, ...],
    out_dir: Path,
) -> None:
    swa, swa_idx = compact_cache(args["cache"], args["indices"])
    extra = extra_idx = None
    if args["extra_cache"] is not None:
        extra, extra_idx = compact_cache(args["extra_cache"], args["extra_indices"])
    cpu = {
        "prefix": layer.prefix,
        "heads": heads,
        "q": args["q"].cpu(),
        "cache": swa.cpu(),
        "indices": swa_idx.cpu(),
        "topk_length": None if args["topk_length"] is None else args["topk_length"].cpu(),
        "extra_cache": None if extra is None else extra.cpu(),
        "extra_indices": None if extra_idx is None else extra_idx.cpu(),
        "extra_topk_length": None if args["extra_topk_length"] is None else args["extra_topk_length"].cpu(),
        "attn_sink": None if args["attn_sink"] is None else args["attn_sink"].cpu(),
        "softmax_scale": float(args["softmax_scale"]),
        "max_smem_bytes": args["max_smem_bytes"],
        "ours": output.cpu(),
    }
    if _state["dumps"] < MAX_DUMPS:
        _state["dumps"] += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{_state['dumps']:02d}-{layer.prefix.replace('/', '_')}.pt"
        torch.save(cpu, path)
        logger.warning("sparkseal debug: inputs saved to %s", path)
    vllm_out = torch.zeros_like(output)
    base_decode(*base_args, output=vllm_out)
    vllm_nan = torch.isnan(vllm_out[:, :heads].float()).flatten(1).any(1)
    ref_out, _ = sparse_mla_decode_ref(
        args["q"].float(),
        swa,
        swa_idx,
        float(args["softmax_scale"]),
        V4_FP8,
        topk_length=args["topk_length"],
        extra_cache=extra,
        extra_indices=extra_idx,
        extra_topk_length=args["extra_topk_length"],
        attn_sink=args["attn_sink"],
    )
    ref_nan = torch.isnan(ref_out[:, :heads]).flatten(1).any(1)
    scales = [_scale_bytes(swa, swa_idx, args["topk_length"])]
    if extra is not None:
        scales.append(_scale_bytes(extra, extra_idx, args["extra_topk_length"]))
    top_scale = max((int(s.max()) for s in scales if s.numel()), default=-1)
    ours = output[:, :heads].float()
    finite = ~(torch.isnan(ours).flatten(1).any(1) | vllm_nan)
    diff = (ours - vllm_out[:, :heads].float())[finite].abs().max().item() if bool(finite.any()) else None
    logger.warning(
        "sparkseal debug: %s: vLLM's class NaN rows %s; float32 reference NaN rows %s; max |ours - vLLM's| "
        "on rows finite in both %s; largest ue8m0 scale byte read %d",
        layer.prefix,
        _rows(vllm_nan),
        _rows(ref_nan),
        diff,
        top_scale,
    )
