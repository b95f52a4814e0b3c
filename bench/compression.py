"""Layer compression: gzip (Python's zlib, as the layer action uses it) against the zstd command.

Builds one layer tar with sparkseal's tar writer from unpacked wheels (the real vLLM wheel, and a torch wheel
when one is at hand), then compresses it with gzip levels 1/6/9 and zstd levels 3/10/19, one thread each,
and decompresses each result with the gzip / zstd commands. Times are CPU seconds of the compressing
process (robust against other load on the machine) and wall seconds; decompression is timed as CPU
seconds of the ``gzip -dc`` / ``zstd -dc`` commands. Also checks that zstd gives the same
bytes for one and two worker threads, which a build action would need.

    /usr/bin/python3 bench/compression.py --wheel bazel-bin/third_party/vllm/wheel_linux_x86_64/vllm-*.whl \\
        --wheel /opt/wheels/torch-*.whl --out bench/results/compression.md
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkseal.core.layer_plan import plan_layer
from sparkseal.core.layer_write import write_tar
from sparkseal.core.tar import CHUNK

GZIP_LEVELS = (1, 6, 9)
ZSTD_LEVELS = (3, 10, 19)


@dataclass
class Result:
    """One compressor at one level."""

    method: str
    level: int
    size: int
    cpu_s: float
    wall_s: float
    decompress_cpu_s: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_tar(wheels: list[Path], work: Path) -> Path:
    """Unpack ``wheels`` under ``work`` and write them as one layer tar below /opt/venv/site-packages."""
    trees = []
    for wheel in wheels:
        tree = work / wheel.name
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tree)
        trees.append((tree, "/opt/venv/lib/python3.11/site-packages"))
    tar = work / "layer.tar"
    with tar.open("wb") as stream:
        write_tar(plan_layer(trees=trees), stream)
    return tar


def _decompress_cpu_s(command: list[str], blob: Path) -> float:
    start = _children_cpu()
    with blob.open("rb") as stream:
        subprocess.run(command, stdin=stream, stdout=subprocess.DEVNULL, check=True)
    return _children_cpu() - start


def run_gzip(tar: Path, level: int, out: Path) -> Result:
    """Compress ``tar`` the way the layer action does (mtime 0, no name) at ``level``."""
    cpu, wall = time.process_time(), time.perf_counter()
    with (
        tar.open("rb") as source,
        out.open("wb") as sink,
        gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=sink, mtime=0) as gz,
    ):
        while chunk := source.read(CHUNK):
            gz.write(chunk)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Result("gzip", level, out.stat().st_size, cpu, wall, _decompress_cpu_s(["gzip", "-dc"], out))


def run_zstd(zstd: str, tar: Path, level: int, out: Path, threads: int = 1) -> Result:
    """Compress ``tar`` with the zstd command at ``level`` with ``threads`` workers."""
    cpu, wall = _children_cpu(), time.perf_counter()
    subprocess.run(
        [zstd, "-q", "-f", f"-{level}", f"-T{threads}", "--no-progress", str(tar), "-o", str(out)],
        check=True,
    )
    cpu, wall = _children_cpu() - cpu, time.perf_counter() - wall
    return Result("zstd", level, out.stat().st_size, cpu, wall, _decompress_cpu_s([zstd, "-dc"], out))


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def report(command: str, wheels: list[Path], tar_size: int, results: list[Result], notes: list[str]) -> str:
    """The results page in Markdown."""
    mb = 1e6
    lines = [
        "# Layer compression: gzip vs zstd",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {_os_name()}; "
        f"Python {platform.python_version()} (zlib {zlib.ZLIB_RUNTIME_VERSION}); {_zstd_version()}. "
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d')}.",
        "",
        "Input: one layer tar written by `sparkseal.actions.oci_layer` from the unpacked "
        + ", ".join(f"`{w.name}`" for w in wheels)
        + f": {tar_size / mb:,.0f} MB.",
        "",
        "| method | level | compressed MB | ratio | CPU s | MB/s (CPU) | wall s | decompress CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.method} | {r.level} | {r.size / mb:,.1f} | {tar_size / r.size:.3f} | {r.cpu_s:.1f} | "
            f"{tar_size / mb / r.cpu_s:.0f} | {r.wall_s:.1f} | {r.decompress_cpu_s:.1f} |"
        )
    lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _zstd_version() -> str:
    zstd = shutil.which("zstd")
    if zstd is None:
        return "no zstd command"
    return subprocess.run([zstd, "-V"], capture_output=True, text=True, check=True).stdout.strip("*\n ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", action="append", type=Path, required=True, help="wheel to unpack")
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)
    command = f"{sys.executable} bench/compression.py " + " ".join(
        [*(f"--wheel {w}" for w in args.wheel), f"--out {args.out}"]
    )
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        work = Path(scratch)
        tar = build_tar(args.wheel, work)
        tar_size = tar.stat().st_size
        print(f"layer tar: {tar_size / 1e6:,.0f} MB", flush=True)
        results = []
        for level in GZIP_LEVELS:
            results.append(run_gzip(tar, level, work / f"gzip-{level}"))
            print(results[-1], flush=True)
        notes = []
        zstd = shutil.which("zstd")
        if zstd is None:
            notes.append("zstd: not measured (no zstd command on this machine).")
        else:
            for level in ZSTD_LEVELS:
                results.append(run_zstd(zstd, tar, level, work / f"zstd-{level}"))
                print(results[-1], flush=True)
            run_zstd(zstd, tar, ZSTD_LEVELS[0], work / "zstd-T2", threads=2)
            same = _sha(work / "zstd-T2") == _sha(work / f"zstd-{ZSTD_LEVELS[0]}")
            notes.append(
                f"zstd -{ZSTD_LEVELS[0]} with -T1 and -T2: {'identical' if same else 'different'} bytes."
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(command, args.wheel, tar_size, results, notes), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
