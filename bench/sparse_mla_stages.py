"""Where the sparse-MLA decode kernel's time goes: timed whole and with one stage compiled out.

    python bench/sparse_mla_stages.py [--arch sm_90a] [--out bench/results/sparse_mla_stages.md]

Builds the library from ``kernels_sm121/csrc`` as it is and once per stage with that stage compiled
out, by ``#ifndef SPARKSEAL_BENCH_SKIP_<STAGE>`` guards inserted into a copy of the sources. Then it times
the GB10-proxy goal shapes of ``bench/sparse_mla.py`` (``GOALS``, shared memory capped at 101376
bytes, ``qk=bf16``) with each library, one process per library, the same way that bench does.

Stages of the bf16 QK^T kernels' main loops (``sparse_mla_kernel.cuh``, and the warp-specialised
``sparse_mla_ws.cuh`` that V4's 32-head GB10 configuration runs): ``dequant`` (the staged fp8
records into the bf16 K tile), ``load`` (the cp.async copies of every tile after the first few in
flight), ``s`` (S = Q K^T) and ``pv`` (O += P V); and ``combine``, the launch of the split-combine
kernel (``sparse_mla.cu``; only calls with several splits have one). What a variant saves bounds what
its stage costs where stages do not overlap; the variants' outputs are wrong by construction and only
timed. Needs nvcc and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kernel_variant import CSRC, build_library  # noqa: E402

KERNEL = "sparse_mla_kernel.cuh"
HOST = "sparse_mla.cu"

WS = "sparse_mla_ws.cuh"

# Each stage: where it is, as (file, the first and the last text of the statements it compiles out);
# a stage of both bf16 kernels (the single-role and the warp-specialised one) has a place in each.
STAGES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "dequant": (
        (KERNEL, "    dequant_tile(stage);", "dequant_tile(stage);"),
        (WS, "        dequant_record_scaled<L, Cfg::kPTPK>(", "part, scales[s]);"),
    ),
    "load": (
        (
            KERNEL,
            "    if (refill) issue_tile(it + kStages, stage, loc);",
            "issue_tile(it + kStages, stage, loc);",
        ),
        (WS, "        if (h + kSlots < n_half) issue(h + kSlots, s);", "issue(h + kSlots, s);"),
    ),
    "s": (
        (
            KERNEL,
            "#pragma unroll\n    for (int kc = 0; kc < Cfg::kKC; ++kc) {\n      uint32_t a_frag[4];",
            "mma_bf16(s_acc[acc][2 * np + 1], a_frag, b[2], b[3]);\n        }\n      }\n    }",
        ),
    ),
    "pv": (
        (
            KERNEL,
            "#pragma unroll\n    for (int kc = 0; kc < Cfg::kNT / 16; ++kc) {",
            "mma_bf16(o_acc[2 * np + 1], a_frag, b[2], b[3]);\n      }\n    }",
        ),
    ),
    "combine": (
        (
            HOST,
            "  if (pl.num_splits > 1) {\n    const int64_t pairs",
            'return fail_cuda(err, "sparse_mla_combine_kernel launch");\n  }',
        ),
    ),
}

FILES = sorted({place[0] for places in STAGES.values() for place in places})


def guarded(text: str, stage: str, name: str | None = None) -> str:
    """``text`` (file ``name``, by default the stage's first) with the stage's statements there inside
    ``#ifndef SPARKSEAL_BENCH_SKIP_<STAGE>``."""
    places = [place for place in STAGES[stage] if name is None or place[0] == name]
    name, start, end = places[0]
    where = f"bench/sparse_mla_stages.py: kernels_sm121/csrc/{name}"
    if text.count(start) != 1:
        raise SystemExit(
            f"{where}: expected the stage {stage!r} to start once at {start!r}, found it "
            f"{text.count(start)} times; update STAGES"
        )
    i = text.index(start)
    j = text.find(end, i)
    if j < 0:
        raise SystemExit(
            f"{where}: expected the stage {stage!r} to end at {end!r} after its start; update STAGES"
        )
    j += len(end)
    macro = f"SPARKSEAL_BENCH_SKIP_{stage.upper()}"
    return f"{text[:i]}#ifndef {macro}\n{text[i:j]}\n#endif\n{text[j:]}"


def stages_in(name: str) -> list[str]:
    """The stages with a place in ``kernels_sm121/csrc/<name>``."""
    return [stage for stage, places in STAGES.items() if any(place[0] == name for place in places)]


def guarded_file(name: str, text: str) -> str:
    """``text`` of ``kernels_sm121/csrc/<name>`` with the guards of all its stages."""
    for stage in stages_in(name):
        text = guarded(text, stage, name)
    return text


def _bench() -> ModuleType:
    """bench/sparse_mla.py (imports torch): its goal shapes, timing and GB10 shared-memory cap."""
    sys.path.insert(0, str(REPO / "bench"))
    import sparse_mla

    return sparse_mla


def time_shapes() -> list[dict[str, object]]:
    """The goal shapes timed with the library of SPARKSEAL_KERNELS_LIB (run in a child process)."""
    import torch

    bench = _bench()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    caches = {}
    for goal in bench.GOALS:
        layout = bench.LAYOUTS[goal.layout]
        if goal.layout not in caches:
            caches[goal.layout] = bench.random_cache(
                layout, bench.CACHE_SLOTS // bench.PAGE_SIZE, generator=gen, device="cuda"
            )
        row = bench.bench_shape(
            layout,
            caches[goal.layout],
            goal.batch,
            goal.heads,
            goal.topk,
            (1.0, 1.0),
            gen,
            None,
            max_smem=bench.GB10_SMEM,
            qk="bf16",
        )
        rows.append(
            {
                "shape": f"{goal.layout}, B={goal.batch}, h={goal.heads}, topk {goal.topk}",
                "us": row.us,
                "plan": row.plan,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a", help="the one GPU target to build (default sm_90a)")
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "sparse_mla_stages.md")
    parser.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.time_only:
        print(json.dumps(time_shapes()))
        return 0
    if shutil.which(args.nvcc) is None:
        print(
            f"bench/sparse_mla_stages.py: --nvcc {args.nvcc}: expected the CUDA compiler (a program on PATH "
            "or its path), found none",
            file=sys.stderr,
        )
        return 1
    import torch

    if not torch.cuda.is_available():
        print("bench/sparse_mla_stages.py: expected a CUDA GPU, torch sees none", file=sys.stderr)
        return 1
    bench = _bench()
    command = shlex.join(["python", "bench/sparse_mla_stages.py", *(sys.argv[1:] if argv is None else argv)])
    variants = ["full", *STAGES]
    with tempfile.TemporaryDirectory(prefix="sparse-mla-stages-") as tmp:
        work = Path(tmp)
        src = work / "csrc"
        shutil.copytree(CSRC, src)
        for name in FILES:
            (src / name).write_text(guarded_file(name, (src / name).read_text()))
        with concurrent.futures.ThreadPoolExecutor(len(variants)) as pool:
            jobs = {
                name: pool.submit(
                    build_library,
                    src,
                    work / f"{name}.so",
                    args.nvcc,
                    args.arch,
                    [] if name == "full" else [f"-DSPARKSEAL_BENCH_SKIP_{name.upper()}"],
                )
                for name in variants
            }
            for job in jobs.values():
                job.result()
        results = {}
        for name in variants:
            child = subprocess.run(
                [sys.executable, __file__, "--time-only"],
                env={**os.environ, "SPARKSEAL_KERNELS_LIB": str(work / f"{name}.so")},
                capture_output=True,
                text=True,
                check=False,
            )
            if child.returncode != 0:
                print(
                    f"bench/sparse_mla_stages.py: timing the library without {name!r} failed "
                    f"(exit {child.returncode}):\n{child.stderr}",
                    file=sys.stderr,
                )
                return 1
            results[name] = json.loads(child.stdout.splitlines()[-1])
            print(name, [round(r["us"], 1) for r in results[name]], flush=True)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    about = subprocess.run([args.nvcc, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([0-9.]+)", about)
    nvcc_version = release.group(1) if release else about.strip().splitlines()[-1]
    lines = [
        "# Sparse-MLA decode: where a tile's time goes (GB10 proxy)",
        "",
        f"- Command: `{command}`",
        f"- Machine: {torch.cuda.get_device_name()}, {sms} SMs, nvcc {nvcc_version}, "
        f"`-gencode` for {args.arch}; "
        f"{datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        "- Each stage's column: the library built without that stage (µs, and the change against the full "
        "library; a change within about 2% is noise). The stages of the main loop, then the split combine; "
        "the last column adds the savings up. "
        f"Shared memory capped at {bench.GB10_SMEM} bytes per CTA (the configurations a GB10 selects), "
        "QK^T on bf16; "
        "timing as in `bench/sparse_mla.py` (median of CUDA-graph replays).",
        "",
        "| shape | plan | full µs | " + " | ".join(f"without {s}" for s in STAGES) + " | sum of savings |",
        "|---|---|---:|" + "---:|" * (len(STAGES) + 1),
    ]
    for i, full in enumerate(results["full"]):
        cells, saved = [], 0.0
        for stage in STAGES:
            us = results[stage][i]["us"]
            saved += full["us"] - us
            cells.append(f"{us:.1f} ({100 * (us - full['us']) / full['us']:+.0f}%)")
        lines.append(
            f"| {full['shape']} | {full['plan']} | {full['us']:.1f} | "
            + " | ".join(cells)
            + f" | {100 * saved / full['us']:.0f}% |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
