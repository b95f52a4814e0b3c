"""DeepSeek V4 decode: our derived attention class against vLLM's FlashMLA class, on the same rows.

Both sides are vLLM 0.25.1's code: ``DeepseekV4FlashMLAAttention._forward_decode`` (FlashMLA's fp8
sparse decode kernel) and the class our patch and ``sparkseal.vllm_integration.vllm_dsv4`` derive from it for
``--attention-backend CUSTOM`` (our kernel). Each case builds what vLLM's metadata builders hand a V4
layer at a decode step: a window cache of 64-token pages padded to 576-byte multiples, the window rows
(``decode_swa_indices`` / ``decode_swa_lens``), and per layer type the second cache: none (window
only), C4A (the indexer's per-request rows, mapped through the block table by vLLM's
``compute_global_topk_indices_and_lens``) or C128A (precomputed global rows over 2-record pages). The
attention sink is set for the real heads and ``-inf`` for the padded ones, as vLLM's weights leave it.

Per case: the relative error of each side against the float32 reference
(``sparkseal.kernels.sparse_mla_ref``) and against each other, after an eager call and after a CUDA-graph
replay of our class with new rows written into the captured buffers; and, unless ``--no-timing``, the
time of one layer call of each side replayed from a CUDA graph. Our side is timed twice in the same
run: the class as it is, writing vLLM's buffer with ``sparkseal::sparse_mla_decode_into`` (``ours µs``),
and on the same rows (``SparksealDecode.sparkseal_decode_args``) the path before that op, the allocating
op and ``output.copy_`` (``ours copy µs``), so the two differ only in the copy. Needs a capability
9.0 GPU (FlashMLA), vLLM and the kernel library; prints a markdown table and writes ``--out`` JSON.

    python3 bench/vllm_backend/dsv4_decode.py --out dsv4.json [--quick] [--max-smem 101376]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

GB10_SMEM = 101376
WINDOW = 128
V4_BLOCK = 256  # tokens per block of V4's compressed caches (64 C4A records, 2 C128A records)


@dataclasses.dataclass(frozen=True)
class Case:
    ratio: int  # 1: window only, 4: C4A, 128: C128A
    heads: int  # padded heads the kernel sees (FlashMLA: 64 or 128)
    real_heads: int
    requests: int
    tokens_per_request: int  # > 1: speculative decode rows
    extra_topk: int  # C4A: index_topk; C128A: row width
    context: int  # tokens per request (sets the compressed cache size)
    max_smem: int = 0

    def __str__(self) -> str:
        kind = {1: "window", 4: "C4A", 128: "C128A"}[self.ratio]
        text = f"{kind} h{self.heads} B{self.requests}x{self.tokens_per_request}"
        if self.ratio != 1:
            text += f" topk{self.extra_topk}"
        return text + (" cap" if self.max_smem else "")


def cases(quick: bool, max_smem: int) -> list[Case]:
    base = [
        Case(1, 64, 16, 4, 1, 0, 4096),
        Case(4, 64, 16, 8, 1, 512, 16384),
        Case(4, 128, 128, 16, 2, 512, 65536),
        Case(128, 64, 64, 8, 1, 128, 16384),
        Case(128, 128, 128, 4, 4, 1024, 131072),
    ]
    if not quick:
        base += [
            Case(4, 128, 128, 64, 1, 512, 65536),
            Case(4, 64, 64, 128, 1, 512, 32768),
            Case(128, 128, 128, 64, 1, 1024, 131072),
        ]
    if max_smem:
        base = [dataclasses.replace(c, max_smem=max_smem) for c in base]
    return base


def _rows(gen: torch.Generator, tokens: int, width: int, high: int, lengths: torch.Tensor) -> torch.Tensor:
    """int32 ``[tokens, width]``: random entries below ``high`` first, ``-1`` from each row's length on."""
    rows = torch.randint(0, high, (tokens, width), generator=gen, device="cuda", dtype=torch.int32)
    keep = torch.arange(width, device="cuda")[None, :] < lengths[:, None]
    return torch.where(keep, rows, torch.full_like(rows, -1))


def _padded_cache(packed: torch.Tensor) -> torch.Tensor:
    """``packed`` ``[pages, page_size, 584]`` in a buffer whose pages are padded to 576-byte multiples."""
    pages, page_size, record = packed.shape
    stride = -(-page_size * record // 576) * 576
    buffer = torch.zeros(pages, stride, dtype=torch.uint8, device=packed.device)
    buffer[:, : page_size * record] = packed.view(pages, -1)
    return buffer[:, : page_size * record].view(pages, page_size, record)


def build(case: Case, seed: int) -> SimpleNamespace:
    """The inputs of one decode step of one layer, as vLLM 0.25.1's V4 metadata builders make them."""
    from sparkseal.kernels.sparse_mla_ref import V4_FP8, random_cache

    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = case.requests * case.tokens_per_request
    req = torch.arange(case.requests, device="cuda", dtype=torch.int32).repeat_interleave(
        case.tokens_per_request
    )
    swa_pages = case.requests * 2 + 4
    swa = _padded_cache(random_cache(V4_FP8, swa_pages, generator=gen, device="cuda"))
    swa_lens = torch.randint(1, WINDOW + 1, (tokens,), generator=gen, device="cuda", dtype=torch.int32)
    swa_lens[0] = WINDOW
    step = SimpleNamespace(
        case=case,
        tokens=tokens,
        q=(torch.randn(tokens, case.heads, V4_FP8.q_dim, generator=gen, device="cuda") * 0.5).to(
            torch.bfloat16
        ),
        swa=swa,
        swa_indices=_rows(gen, tokens, WINDOW, swa_pages * 64, swa_lens).view(tokens, 1, WINDOW),
        swa_lens=swa_lens,
        req=req,
        extra=None,
        topk_buffer=None,
        block_table=None,
        c128a_indices=None,
        c128a_lens=None,
    )
    step.q[:, case.real_heads :] = 0  # vLLM pads the query with zero heads
    sink = torch.full((case.heads,), float("-inf"), device="cuda")
    sink[: case.real_heads] = torch.randn(case.real_heads, generator=gen, device="cuda")
    step.sink = sink
    blocks = -(-case.context // V4_BLOCK)
    if case.ratio == 4:
        page_size = V4_BLOCK // 4
        pages = case.requests * blocks + 3
        step.extra = _padded_cache(
            random_cache(V4_FP8, pages, generator=gen, device="cuda", page_size=page_size)
        )
        perm = torch.randperm(pages, generator=gen, device="cuda")[: case.requests * blocks]
        step.block_table = perm.view(case.requests, blocks).to(torch.int32)
        lengths = torch.randint(
            1, case.extra_topk + 1, (tokens,), generator=gen, device="cuda", dtype=torch.int32
        )
        step.topk_buffer = _rows(gen, tokens, case.extra_topk, case.context // 4, lengths)
    elif case.ratio == 128:
        page_size = V4_BLOCK // 128
        pages = case.requests * blocks + 3
        step.extra = _padded_cache(
            random_cache(V4_FP8, pages, generator=gen, device="cuda", page_size=page_size)
        )
        lengths = torch.randint(
            0, case.extra_topk + 1, (tokens,), generator=gen, device="cuda", dtype=torch.int32
        )
        lengths[0] = case.extra_topk
        step.c128a_lens = lengths
        step.c128a_indices = _rows(gen, tokens, case.extra_topk, pages * page_size, lengths).view(
            tokens, 1, -1
        )
    return step


def layer(cls: type, step: SimpleNamespace, max_smem: int) -> torch.nn.Module:
    """An instance of a V4 attention class carrying only what ``_forward_decode`` reads."""
    obj = object.__new__(cls)
    torch.nn.Module.__init__(obj)
    obj.prefix = "model.layers.0.attn"
    obj.compress_ratio = step.case.ratio
    obj.scale = 512**-0.5
    obj.padded_heads = step.case.heads
    obj.attn_sink = torch.nn.Parameter(step.sink, requires_grad=False)
    obj.swa_cache_layer = SimpleNamespace(kv_cache=step.swa)
    obj.topk_indices_buffer = step.topk_buffer
    obj.sparkseal_max_smem_bytes = max_smem
    return obj


def metadata(step: SimpleNamespace) -> tuple[SimpleNamespace, SimpleNamespace | None]:
    """Fresh ``(swa_metadata, attn_metadata)``; FlashMLA plans its tiles on the first call of each."""
    from vllm.v1.attention.ops.flashmla import get_mla_metadata

    swa = SimpleNamespace(
        num_decodes=step.case.requests,
        num_decode_tokens=step.tokens,
        is_valid_token=torch.ones(step.tokens, dtype=torch.bool, device="cuda"),
        token_to_req_indices=step.req,
        decode_swa_indices=step.swa_indices,
        decode_swa_lens=step.swa_lens,
        tile_sched_swaonly=get_mla_metadata()[0],
        tile_sched_c4a=get_mla_metadata()[0],
        tile_sched_c128a=get_mla_metadata()[0],
    )
    if step.case.ratio == 1:
        return swa, None
    attn = SimpleNamespace(
        block_size=V4_BLOCK,
        block_table=step.block_table,
        c128a_global_decode_topk_indices=step.c128a_indices,
        c128a_decode_topk_lens=step.c128a_lens,
    )
    return swa, attn


def decode(obj: torch.nn.Module, step: SimpleNamespace, meta: tuple, out: torch.Tensor) -> None:
    swa, attn = meta
    obj._forward_decode(q=step.q, kv_cache=step.extra, swa_metadata=swa, attn_metadata=attn,
                        swa_only=step.case.ratio == 1, output=out)  # fmt: skip


def _decode_args(obj: torch.nn.Module, step: SimpleNamespace, meta: tuple, out: torch.Tensor) -> dict:
    swa, attn = meta
    return obj.sparkseal_decode_args(step.q, step.extra, swa, attn, step.case.ratio == 1, out.shape[1])


def copy_decode(obj: torch.nn.Module, step: SimpleNamespace, meta: tuple, out: torch.Tensor) -> None:
    """Our decode before the in-place op: the allocating op, then a copy into vLLM's buffer."""
    from sparkseal.kernels.sparse_mla import sparse_mla_decode

    out.copy_(sparse_mla_decode(**_decode_args(obj, step, meta, out))[0])


def reference(step: SimpleNamespace) -> torch.Tensor:
    """Float32 result of the same rows, with the C4A rows mapped through the block table by our PyTorch
    conversion (``sparse_mla_vllm.to_global_slots``), not vLLM's Triton kernel the classes call."""
    from sparkseal.kernels.sparse_mla_ref import V4_FP8, sparse_mla_decode_ref
    from sparkseal.vllm_integration.sparse_mla_vllm import to_global_slots

    extra = {}
    if step.case.ratio == 4:
        slots, lengths = to_global_slots(step.req, step.block_table, step.topk_buffer, step.extra.shape[1])
        extra = {"extra_cache": step.extra, "extra_indices": slots, "extra_topk_length": lengths}
    elif step.case.ratio == 128:
        extra = {
            "extra_cache": step.extra,
            "extra_indices": step.c128a_indices.squeeze(1),
            "extra_topk_length": step.c128a_lens,
        }
    out, _ = sparse_mla_decode_ref(step.q, step.swa, step.swa_indices.squeeze(1), 512**-0.5, V4_FP8,
                                   topk_length=step.swa_lens, attn_sink=step.sink, **extra)  # fmt: skip
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(relative error over all rows, worst row's relative error) of ``a`` against ``b``."""
    diff = a.float() - b.float()
    whole = (diff.norm() / b.float().norm().clamp(min=1e-30)).item()
    rows = (diff.norm(dim=-1) / b.float().norm(dim=-1).clamp(min=1e-30)).flatten().max().item()
    return whole, rows


def captured(fn) -> torch.cuda.CUDAGraph:  # type: ignore[no-untyped-def]
    """A CUDA graph of ``fn``, after one warm-up call on a side stream (Triton compiles there)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_time(fn, replays: int = 200) -> float:  # type: ignore[no-untyped-def]
    """Microseconds per replay of a CUDA graph of ``fn``."""
    graph = captured(fn)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / replays


def run_case(case: Case, seed: int, timing: bool) -> dict:
    from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention

    from sparkseal.vllm_integration.vllm_dsv4 import attention_class

    ours_cls = attention_class(DeepseekV4FlashMLAAttention)
    step = build(case, seed)
    theirs = layer(DeepseekV4FlashMLAAttention, step, 0)
    ours = layer(ours_cls, step, case.max_smem)
    ref = reference(step)
    out_theirs = torch.zeros_like(step.q)
    out_ours = torch.zeros_like(step.q)
    decode(theirs, step, metadata(step), out_theirs)
    decode(ours, step, metadata(step), out_ours)
    out_copy = torch.zeros_like(step.q)
    copy_decode(ours, step, metadata(step), out_copy)
    torch.cuda.synchronize()
    row = {
        "case": str(case),
        **dataclasses.asdict(case),
        "ours_vs_ref": rel(out_ours, ref),
        "flashmla_vs_ref": rel(out_theirs, ref),
        "ours_vs_flashmla": rel(out_ours, out_theirs),
        "in_place_vs_copy": rel(out_ours, out_copy),
    }
    # Our class in a CUDA graph: capture, write the next step's rows into the same buffers, replay.
    meta = metadata(step)
    graph_out = torch.zeros_like(step.q)
    graph = captured(lambda: decode(ours, step, meta, graph_out))
    nxt = build(case, seed + 1)
    for name in ("q", "swa_indices", "swa_lens", "topk_buffer", "c128a_indices", "c128a_lens"):
        if getattr(step, name) is not None:
            getattr(step, name).copy_(getattr(nxt, name))
    graph_out.zero_()
    graph.replay()
    eager = torch.zeros_like(step.q)
    decode(ours, step, metadata(step), eager)
    torch.cuda.synchronize()
    row["graph_replay_vs_eager"] = rel(graph_out, eager)
    row["graph_replay_vs_ref"] = rel(graph_out, reference(step))
    if timing:
        meta_theirs = metadata(step)
        decode(theirs, step, meta_theirs, out_theirs)  # FlashMLA plans its tiles once, outside the graph
        row["flashmla_us"] = graph_time(lambda: decode(theirs, step, meta_theirs, out_theirs))
        row["ours_us"] = graph_time(lambda: decode(ours, step, meta, out_ours))
        row["ours_copy_us"] = graph_time(lambda: copy_decode(ours, step, meta, out_copy))
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| case | ours vs ref (rel / worst row) | FlashMLA vs ref | ours vs FlashMLA | graph replay vs eager "
        "| FlashMLA µs | ours µs | ours copy µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = "{:.2e} / {:.2e}".format
        keys = ("flashmla_us", "ours_us", "ours_copy_us")
        times = " | ".join(f"{r[k]:.1f}" if k in r else "—" for k in keys)
        lines.append(
            f"| {r['case']} | {f(*r['ours_vs_ref'])} | {f(*r['flashmla_vs_ref'])} "
            f"| {f(*r['ours_vs_flashmla'])} | {f(*r['graph_replay_vs_eager'])} | {times} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="the five cases of the GPU test only")
    parser.add_argument(
        "--max-smem", type=int, default=0, help=f"cap our kernel's shared memory ({GB10_SMEM}: GB10)"
    )
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print(
            "dsv4_decode.py: needs a capability 9.0 GPU (FlashMLA's V4 decode is the reference)",
            file=sys.stderr,
        )
        return 2
    rows = [
        run_case(c, args.seed + i, not args.no_timing) for i, c in enumerate(cases(args.quick, args.max_smem))
    ]
    doc = {"device": torch.cuda.get_device_name(), "max_smem": args.max_smem, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
