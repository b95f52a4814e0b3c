"""Benchmark: building our vLLM wheel with Bazel, cold and warm, and the physical floor beside it.

    python3 bench/vllm_wheel.py [--platform linux_aarch64] [--runs 3] [--out bench/results/vllm_wheel.md]

Each row is the median of ``--runs`` builds (wall clock, Bazel server start included where the output base
is new). "cold, empty download cache" uses a fresh repository cache, so it includes the downloads from
the configured index; "cold, warm download cache" a fresh output base with the shared cache; "no-op" a
second build in the same output base; "one patch edited" appends a comment line to the first patch.
The physical floor is reading the upstream wheel and writing the same number of bytes, in one process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_CACHE = Path.home() / ".cache" / "sparkseal" / "repository"


def bazel(root: Path, output_base: Path, cache: Path, *args: str) -> float:
    """Run one Bazel command; return its wall time in seconds (fails loudly on error)."""
    command = ["bazel", f"--output_base={output_base}", args[0], f"--repository_cache={cache}", *args[1:]]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed:\n{proc.stderr[-4000:]}")
    return elapsed


def shutdown(root: Path, output_base: Path) -> None:
    subprocess.run(
        ["bazel", f"--output_base={output_base}", "shutdown"], cwd=root, capture_output=True, check=False
    )


def clone(into: Path) -> Path:
    """Copy the checkout (without Bazel's links and caches) to ``into``."""
    skip = {".git", "__pycache__", ".ruff_cache", ".pytest_cache", ".gpu_trees"}
    shutil.copytree(
        REPO, into, ignore=lambda d, names: [n for n in names if n.startswith("bazel-") or n in skip]
    )
    return into


def physical_floor(wheel: Path) -> float:
    """Read the upstream wheel and write as many bytes, with a sha256 over them: the I/O floor."""
    start = time.monotonic()
    data = wheel.read_bytes()
    hashlib.sha256(data).hexdigest()
    with tempfile.NamedTemporaryFile() as out:
        out.write(data)
        out.flush()
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="linux_aarch64", choices=["linux_aarch64", "linux_x86_64"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "vllm_wheel.md")
    args = parser.parse_args()
    target = f"//third_party/vllm:wheel_{args.platform}"
    lock = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
    rows: dict[str, list[float]] = {}
    digests: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="sparkseal-bench-") as scratch:
        tmp = Path(scratch)
        for run in range(args.runs):
            root = clone(tmp / f"clone{run}")
            cache = tmp / f"cache{run}" if run == 0 else SHARED_CACHE
            ob = tmp / f"ob{run}"
            key = "cold, empty download cache" if run == 0 else "cold, warm download cache"
            rows.setdefault(key, []).append(bazel(root, ob, cache, "build", target))
            rows.setdefault("no-op", []).append(bazel(root, ob, cache, "build", target))
            patch = sorted((root / "patches/vllm").glob("*.patch"))[0]
            patch.write_text(patch.read_text().replace("Reason:", "Reason: (edited by the benchmark)", 1))
            rows.setdefault("one patch edited", []).append(bazel(root, ob, cache, "build", target))
            patch_out = ob / "execroot" / "sparkseal" / "bazel-out"
            wheel = next(patch_out.glob(f"*/bin/third_party/vllm/wheel_{args.platform}/*.whl"))
            digests.add(hashlib.sha256(wheel.read_bytes()).hexdigest())
            shutdown(root, ob)
        upstream = (
            SHARED_CACHE / "content_addressable" / "sha256" / lock["wheels"][args.platform]["sha256"] / "file"
        )
        rows["physical floor (read + hash + write the upstream wheel)"] = [
            physical_floor(upstream) for _ in range(args.runs)
        ]
    medians = {key: statistics.median(values) for key, values in rows.items()}
    cold = medians["cold, warm download cache"]
    lines = [
        f"# Building our vLLM wheel ({target})",
        "",
        f"Command: `python3 bench/vllm_wheel.py --platform {args.platform} --runs {args.runs}`",
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"{platform.freedesktop_os_release().get('PRETTY_NAME', platform.system())}; "
        f"{datetime.now(UTC).date().isoformat()}",
        "",
        "| scenario | median s | runs (s) | vs cold (warm cache) |",
        "|---|---:|---|---:|",
    ]
    for key, values in rows.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {key} | {medians[key]:.1f} | {runs} | {medians[key] / cold:.2f} |")
    lines += [
        "",
        f"Wheel sha256 after the same patch edit, in every clone: {', '.join(sorted(digests))}",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
