"""Benchmark of the sparse-MLA decode kernel: TFLOP/s and GB/s against the roofline and PyTorch.

    SPARKSEAL_KERNELS_LIB=/path/to/libsparkseal_kernels.so python bench/sparse_mla.py

For each decode shape (batch x heads x topk x cache layout) the kernel is captured in a CUDA
graph, 20 calls per graph over rotating index sets that address disjoint cache rows (so that the
rows of consecutive calls do not sit in L2), and timed by graph replay with CUDA events (median of
5 replays). The baseline is PyTorch gathering the selected bf16 rows and running einsum + softmax,
timed the same way. The roofline uses a device copy bandwidth and a bf16 matrix-product rate
measured in the same run. A markdown table goes to bench/results/sparse_mla.md.

Each shape runs twice: with the device's shared-memory limit, and as the "GB10 proxy" with the
kernel's shared memory capped at 101376 bytes per CTA (the SM120/SM121 limit), which selects the
configurations a GB10 runs. The proxy rows carry the speed goals (GOALS); ``--json`` keeps the
rows, and ``--before`` reads such a file from an earlier library on the same machine to fill the
goals table's "before" column.

The fp8 layouts have three QK^T paths (``qk``: bf16 dequantisation, e4m3 with q as one or two
e4m3 terms); the proxy rows and the accuracy table run each of ``--qk-modes``, the device-limit
rows the library's default ("auto").
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkseal.kernels import sparse_mla
from sparkseal.kernels.sparse_mla_ref import (
    LAYOUTS,
    PAGE_SIZE,
    V_DIM,
    Layout,
    random_cache,
    sparse_mla_decode_ref,
)

CALLS_PER_GRAPH = 20
REPLAYS = 5
CACHE_SLOTS = 8192 * PAGE_SIZE  # 524288 rows: 306 MB (V4), 344 MB (V3.2 fp8), 604 MB (bf16)
GB10_SMEM = 101376  # SM120/SM121 shared memory per block: the "GB10 proxy" rows' cap


@dataclasses.dataclass(frozen=True)
class Goal:
    """A speed goal for one GB10-proxy shape: ``metric`` is "TFLOP/s", "% of copy" or "µs"."""

    layout: str
    batch: int
    heads: int
    topk: int
    metric: str
    target: float


GOALS = (
    Goal("v4_fp8", 64, 128, 2048, "TFLOP/s", 250.0),
    Goal("v4_fp8", 256, 128, 2048, "TFLOP/s", 250.0),
    Goal("v4_fp8", 64, 64, 512, "TFLOP/s", 200.0),
    Goal("v4_fp8", 256, 16, 2048, "% of copy", 65.0),
    Goal("v4_fp8", 1, 128, 2048, "µs", 15.0),
)


@dataclasses.dataclass
class Row:
    layout: str
    batch: int
    heads: int
    topk: int
    us: float
    tflops: float
    gbps: float
    roofline_pct: float
    bound: str
    base_us: float | None
    plan: str
    max_smem: int = 0
    qk: str = "auto"


def _time_graph(fn: Callable[[int], object], rotations: int) -> float:
    """Median seconds of one call of ``fn(i)``, from graph replays of CALLS_PER_GRAPH calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(rotations, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            fn(i % rotations)
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / CALLS_PER_GRAPH)
    del graph
    return sorted(times)[len(times) // 2]


def measure_ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s) of the current GPU."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    src.random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    stop.record()
    stop.synchronize()
    bandwidth = 2 * src.numel() * 10 / (start.elapsed_time(stop) / 1e3)
    del src, dst
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start.record()
    for _ in range(10):
        a @ b
    stop.record()
    stop.synchronize()
    flops = 2 * n**3 * 10 / (start.elapsed_time(stop) / 1e3)
    return bandwidth, flops


def _index_sets(batch: int, topk: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Index tensors over disjoint random slices of the cache (as many as fit, at most 20)."""
    per_call = batch * topk
    sets = max(1, min(CALLS_PER_GRAPH, CACHE_SLOTS // per_call))
    perm = torch.randperm(CACHE_SLOTS, generator=gen, device="cuda").to(torch.int32)
    if per_call > CACHE_SLOTS:
        perm = perm.repeat((per_call + CACHE_SLOTS - 1) // CACHE_SLOTS)
    return [perm[i * per_call : (i + 1) * per_call].view(batch, topk) for i in range(sets)]


def bench_baseline(bf16_rows: torch.Tensor, batch: int, heads: int, topk: int, gen: torch.Generator) -> float:
    """Microseconds of the PyTorch gather + einsum decode on bf16 rows ``[slots, 576]``."""
    q = torch.randn(batch, heads, bf16_rows.shape[1], device="cuda", generator=gen).to(torch.bfloat16)
    index_sets = [idx.long() for idx in _index_sets(batch, topk, gen)]
    scale = bf16_rows.shape[1] ** -0.5

    def baseline(i: int) -> object:
        rows = bf16_rows[index_sets[i]]  # [B, topk, 576]
        scores = torch.einsum("bhd,bkd->bhk", q, rows).float() * scale
        probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
        return torch.einsum("bhk,bkd->bhd", probs, rows[..., :V_DIM])

    return _time_graph(baseline, len(index_sets)) * 1e6


def bench_shape(
    layout: Layout,
    cache: torch.Tensor,
    batch: int,
    heads: int,
    topk: int,
    ceilings: tuple[float, float],
    gen: torch.Generator,
    base_us: float | None,
    max_smem: int = 0,
    qk: str = "auto",
) -> Row:
    """Time the kernel on one shape."""
    q = torch.randn(batch, heads, layout.q_dim, device="cuda", generator=gen).to(torch.bfloat16)
    index_sets = _index_sets(batch, topk, gen)
    scale = layout.q_dim**-0.5

    def kernel(i: int) -> object:
        return sparse_mla.sparse_mla_decode(
            q, cache, index_sets[i], softmax_scale=scale, layout=layout.name, max_smem_bytes=max_smem, qk=qk
        )

    seconds = _time_graph(kernel, len(index_sets))
    flops = 2.0 * batch * heads * topk * (layout.q_dim + V_DIM)
    moved = batch * topk * (layout.record_bytes + 4) + batch * heads * (layout.q_dim * 2 + V_DIM * 2 + 4)
    bandwidth, peak = ceilings
    floor = max(flops / peak, moved / bandwidth)
    bound = "memory" if moved / bandwidth >= flops / peak else "compute"

    p = sparse_mla.plan(q, cache, index_sets[0], layout.name, max_smem_bytes=max_smem, qk=qk)
    plan = (
        f"{p.heads_per_cta}h x {p.keys_per_tile}k, {p.threads_per_cta} thr, {p.num_splits} split, "
        f"{p.num_ctas} CTAs"
    )
    return Row(
        layout.name,
        batch,
        heads,
        topk,
        seconds * 1e6,
        flops / seconds / 1e12,
        moved / seconds / 1e9,
        100.0 * floor / seconds,
        bound,
        base_us,
        plan,
        max_smem,
        sparse_mla.QK_NAMES[p.qk_mode],
    )


@dataclasses.dataclass
class Accuracy:
    qk: str
    layout: str
    batch: int
    heads: int
    topk: int
    max_smem: int
    plan: str
    rel: float  # ||out - ref|| / ||ref|| over all rows
    worst_row: float  # the largest per-row relative error
    lse_err: float  # the largest absolute lse error


ACCURACY_SHAPES = ((1, 128, 2048), (8, 64, 2048))  # (batch, heads, topk): with and without splits


def measure_accuracy(layout: Layout, max_smem: int, gen: torch.Generator, qk: str = "auto") -> list[Accuracy]:
    """The kernel against the float32 reference (sparse_mla_ref) on random latents, 20% -1 indices."""
    results = []
    cache = random_cache(layout, 64, generator=gen, device="cuda")
    slots = 64 * PAGE_SIZE
    for batch, heads, topk in ACCURACY_SHAPES:
        q = torch.randn(batch, heads, layout.q_dim, device="cuda", generator=gen).to(torch.bfloat16)
        idx = torch.randint(0, slots, (batch, topk), device="cuda", generator=gen, dtype=torch.int32)
        drop = torch.rand(batch, topk, device="cuda", generator=gen) < 0.2
        idx = torch.where(drop, torch.full_like(idx, -1), idx)
        scale = layout.q_dim**-0.5
        out, lse = sparse_mla.sparse_mla_decode(
            q, cache, idx, softmax_scale=scale, layout=layout.name, max_smem_bytes=max_smem, qk=qk
        )
        ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, scale, layout)
        diff = out.float() - ref_out
        p = sparse_mla.plan(q, cache, idx, layout.name, max_smem_bytes=max_smem, qk=qk)
        results.append(
            Accuracy(
                sparse_mla.QK_NAMES[p.qk_mode],
                layout.name,
                batch,
                heads,
                topk,
                max_smem,
                f"{p.heads_per_cta}h x {p.keys_per_tile}k, {p.num_splits} split",
                (diff.norm() / ref_out.norm()).item(),
                (diff.norm(dim=-1) / ref_out.norm(dim=-1)).max().item(),
                (lse - ref_lse).abs().max().item(),
            )
        )
    return results


def _accuracy_table(results: list[Accuracy]) -> list[str]:
    lines = [
        "| layout | QK^T | batch | heads | topk | shared memory | plan | out rel. error | worst row "
        "| lse max error |",
        "|---|---|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for a in results:
        smem = f"<= {a.max_smem}" if a.max_smem else "device limit"
        lines.append(
            f"| {a.layout} | {a.qk} | {a.batch} | {a.heads} | {a.topk} | {smem} | {a.plan} | {a.rel:.2e} | "
            f"{a.worst_row:.2e} | {a.lse_err:.2e} |"
        )
    return lines


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "| layout | QK^T | batch | heads | topk | µs | TFLOP/s | GB/s | % roofline | bound | baseline µs "
        "| speed-up | plan |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        base = f"{r.base_us:.1f}" if r.base_us is not None else "-"
        speedup = f"{r.base_us / r.us:.1f}x" if r.base_us is not None else "-"
        lines.append(
            f"| {r.layout} | {r.qk} | {r.batch} | {r.heads} | {r.topk} | {r.us:.1f} | {r.tflops:.1f} | "
            f"{r.gbps:.0f} | {r.roofline_pct:.0f} | {r.bound} | {base} | {speedup} | {r.plan} |"
        )
    return lines


def _goal_value(goal: Goal, row: Row, bandwidth: float) -> float:
    if goal.metric == "TFLOP/s":
        return row.tflops
    if goal.metric == "% of copy":
        return 100.0 * row.gbps * 1e9 / bandwidth
    return row.us


def _goal_met(goal: Goal, value: float) -> bool:
    return value <= goal.target if goal.metric == "µs" else value >= goal.target


def _find(rows: list[Row], layout: str, batch: int, heads: int, topk: int, qk: str | None) -> Row | None:
    key = (layout, batch, heads, topk)
    return next(
        (r for r in rows if (r.layout, r.batch, r.heads, r.topk) == key and (qk is None or r.qk == qk)), None
    )


def _modes(rows: list[Row]) -> list[str]:
    """The QK^T paths present in ``rows``, in the order of QK_MODES."""
    present = {r.qk for r in rows}
    return [name for name in sparse_mla.QK_MODES if name in present]


def _goals_table(proxy: list[Row], before: list[Row], bandwidth: float) -> list[str]:
    """Goals against the GB10-proxy rows of this run, one column per QK^T path (and the ``--before``
    run's value, whatever path that library ran)."""
    modes = _modes(proxy)
    lines = [
        "| shape (GB10 proxy) | metric | goal | before | " + " | ".join(modes) + " | met by |",
        "|---|---|---:|---:|" + "---:|" * len(modes) + "---|",
    ]
    for goal in GOALS:
        shape = f"{goal.layout}, B={goal.batch}, h={goal.heads}, topk {goal.topk}"
        bound = "<=" if goal.metric == "µs" else ">="
        old = _find(before, goal.layout, goal.batch, goal.heads, goal.topk, None)
        cells = [f"{_goal_value(goal, old, bandwidth):.1f}" if old is not None else "-"]
        met = []
        for mode in modes:
            row = _find(proxy, goal.layout, goal.batch, goal.heads, goal.topk, mode)
            if row is None:
                cells.append("not run")
                continue
            value = _goal_value(goal, row, bandwidth)
            cells.append(f"{value:.1f}")
            if _goal_met(goal, value):
                met.append(mode)
        met_text = ", ".join(met) or "none"
        lines.append(
            f"| {shape} | {goal.metric} | {bound} {goal.target:g} | " + " | ".join(cells) + f" | {met_text} |"
        )
    return lines


def _speedup_lines(proxy: list[Row], before: list[Row]) -> list[str]:
    """Per QK^T path: the range and geometric mean of before / after time over the proxy rows."""
    lines = []
    for mode in _modes(proxy):
        ratios = []
        for r in proxy:
            if r.qk != mode:
                continue
            old = _find(before, r.layout, r.batch, r.heads, r.topk, None)
            if old is not None:
                ratios.append((old.us / r.us, r))
        if not ratios:
            continue
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        lo, lo_row = min(ratios, key=lambda t: t[0])
        hi, _ = max(ratios, key=lambda t: t[0])
        lines.append(
            f"- {mode}: {lo:.2f}x to {hi:.2f}x (geometric mean {geo:.2f}x) over {len(ratios)} rows; lowest: "
            f"{lo_row.layout} h={lo_row.heads} topk {lo_row.topk} batch {lo_row.batch}."
        )
    return lines


def _markdown(
    rows: list[Row],
    proxy: list[Row],
    before: list[Row],
    accuracy: list[Accuracy],
    ceilings: tuple[float, float],
    command: str,
    max_smem: int,
) -> str:
    bandwidth, peak = ceilings
    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    smem_note = (
        f"shared memory capped at {max_smem} bytes per CTA"
        if max_smem
        else "the device's shared-memory limit"
    )
    lines = [
        "# Sparse-MLA decode benchmark",
        "",
        f"- Command: `{command}`",
        f"- Machine: {props.name}, {props.multi_processor_count} SMs, CUDA {torch.version.cuda}, "
        f"torch {torch.__version__}",
        f"- Date: {now}",
        f"- Ceilings measured in this run: copy {bandwidth / 1e12:.2f} TB/s (read + write), "
        f"bf16 matmul 8192^3 {peak / 1e12:.0f} TFLOP/s",
        f"- Time: median of {REPLAYS} CUDA-graph replays of {CALLS_PER_GRAPH} calls over rotating, disjoint "
        "index sets (random slots of a 524288-row cache).",
        "- FLOP = 2 x batch x heads x topk x (q width + 512); bytes = the selected cache records + indices + "
        "q + out + lse. Roofline % = max(FLOP / matmul rate, bytes / copy bandwidth) / time.",
        "- Baseline (every row): PyTorch gather of the selected rows of a bf16 (576-wide) cache + einsum + "
        "float softmax at the same batch, heads and topk, timed the same way.",
    ]
    if accuracy:
        lines += [
            "",
            "## Accuracy against the float32 reference",
            "",
            "bf16 q (the e4m3 QK^T paths quantise it inside the kernel), the cache's records as stored (fp8 "
            "values with their scales, or bf16), against `sparse_mla_decode_ref` in float32 on the same "
            "inputs (random latents, 20% of the indices -1).",
            "",
            *_accuracy_table(accuracy),
        ]
    if rows:
        lines += ["", f"## Kernel configurations: {smem_note}", "", *_table(rows)]
    if proxy:
        lines += [
            "",
            f"## GB10 proxy: shared memory capped at {GB10_SMEM} bytes per CTA",
            "",
            "The configurations a GB10 (SM121, 99 KiB per block) selects, run on this machine in the same "
            "run. This machine has more SMs, bandwidth and shared memory per SM (two such CTAs can share "
            "an SM here, one on a GB10), so the rows rank configurations, not GB10 speeds.",
            "",
            *_table(proxy),
            "",
            "### Goals (GB10 proxy rows)",
            "",
            '"% of copy" = GB/s over the copy bandwidth above; "before" = the `--before` rows '
            + ("(an earlier library, same machine and call)." if before else "(none given).")
            + " One column per QK^T path.",
            "",
            *_goals_table(proxy, before, bandwidth),
        ]
        if before:
            lines += [
                "",
                "Over the GB10-proxy rows, before / after speed per QK^T path:",
                "",
                *_speedup_lines(proxy, before),
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "sparse_mla.md"
    )
    parser.add_argument("--layouts", default="v4_fp8,v32_fp8,v32_bf16")
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--heads", default="16,32,64,128")
    parser.add_argument("--topks", default="512,2048")
    parser.add_argument("--no-baseline", action="store_true", help="skip the PyTorch baseline")
    parser.add_argument(
        "--max-smem",
        type=int,
        default=0,
        help="cap the kernel's shared memory of the main rows (101376: the GB10 configurations)",
    )
    parser.add_argument(
        "--proxy-layouts",
        default="v4_fp8,v32_fp8",
        help=f"layouts that also run as GB10-proxy rows (max_smem_bytes={GB10_SMEM}); empty: none",
    )
    parser.add_argument("--proxy-only", action="store_true", help="run only the GB10-proxy rows")
    parser.add_argument(
        "--qk-modes",
        default="bf16,fp8,fp8x2",
        help="QK^T paths of the fp8 layouts' proxy rows and accuracy rows (the device-limit rows run 'auto')",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--before", type=Path, help="JSON rows of an earlier library (goals' before column)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/sparse_mla.py: no CUDA GPU", file=sys.stderr)
        return 1
    command = shlex.join(["python", "bench/sparse_mla.py", *(sys.argv[1:] if argv is None else argv)])
    gen = torch.Generator(device="cuda").manual_seed(0)
    ceilings = measure_ceilings()
    print(
        f"ceilings: copy {ceilings[0] / 1e12:.2f} TB/s, bf16 matmul {ceilings[1] / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    shapes = [
        (batch, heads, topk)
        for topk in map(int, args.topks.split(","))
        for heads in map(int, args.heads.split(","))
        for batch in map(int, args.batches.split(","))
    ]
    baselines: dict[tuple[int, int, int], float] = {}
    if not args.no_baseline:
        bf16 = LAYOUTS["v32_bf16"]
        bf16_rows = random_cache(bf16, CACHE_SLOTS // PAGE_SIZE, generator=gen, device="cuda").view(
            -1, bf16.q_dim
        )
        for shape in shapes:
            baselines[shape] = bench_baseline(bf16_rows, *shape, gen)
            print(
                f"baseline  B={shape[0]:4d} h={shape[1]:4d} k={shape[2]:5d} {baselines[shape]:9.1f} us",
                flush=True,
            )
        del bf16_rows
        torch.cuda.empty_cache()
    rows: list[Row] = []
    proxy: list[Row] = []
    accuracy: list[Accuracy] = []
    proxy_layouts = {name for name in args.proxy_layouts.split(",") if name}
    qk_modes = [mode for mode in args.qk_modes.split(",") if mode]
    for name in args.layouts.split(","):
        layout = LAYOUTS[name]
        fp8 = layout.cache_dtype == torch.uint8
        caps: list[tuple[int, list[Row], list[str]]] = []
        if not args.proxy_only:
            caps.append((args.max_smem, rows, ["auto"]))
        if name in proxy_layouts:
            caps.append((GB10_SMEM, proxy, qk_modes if fp8 else ["auto"]))
        if not caps:
            continue
        for cap, _, _ in caps:
            for mode in qk_modes if fp8 else ["auto"]:
                for a in measure_accuracy(layout, cap, gen, mode):
                    accuracy.append(a)
                    print(
                        f"accuracy {name:9s} {a.qk:5s} smem<={cap or 'dev':>6} B={a.batch} h={a.heads} "
                        f"k={a.topk}: out rel {a.rel:.2e}, worst row {a.worst_row:.2e}, "
                        f"lse {a.lse_err:.2e} [{a.plan}]",
                        flush=True,
                    )
        cache = random_cache(layout, CACHE_SLOTS // PAGE_SIZE, generator=gen, device="cuda")
        for cap, out, modes in caps:
            for mode in modes:
                for shape in shapes:
                    row = bench_shape(layout, cache, *shape, ceilings, gen, baselines.get(shape), cap, mode)
                    out.append(row)
                    print(
                        f"{name:9s} {row.qk:5s} smem<={cap or 'dev':>6} B={row.batch:4d} h={row.heads:4d} "
                        f"k={row.topk:5d} {row.us:9.1f} us {row.tflops:6.1f} TFLOP/s {row.gbps:6.0f} GB/s "
                        f"{row.roofline_pct:4.0f}% [{row.plan}]",
                        flush=True,
                    )
        del cache
        torch.cuda.empty_cache()
    before = [Row(**r) for r in json.loads(args.before.read_text())["proxy"]] if args.before else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(_markdown(rows, proxy, before, accuracy, ceilings, command, args.max_smem))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "rows": [dataclasses.asdict(r) for r in rows],
                    "proxy": [dataclasses.asdict(r) for r in proxy],
                }
            )
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
