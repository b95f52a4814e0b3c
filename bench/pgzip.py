"""Layer compression: one gzip stream against the block-parallel writer the layer action uses.

Compresses one uncompressed layer tar at GZIP_LEVEL with Python's gzip module (one stream, what layers used
before) and with ``sparkseal.core.pgzip.ParallelGzipWriter`` on 1 and on every available CPU; checks that
the two parallel runs wrote the same bytes and that both decompress to the tar; writes a markdown table.

    python3 bench/pgzip.py --tar /tmp/layer_vllm.tar --out bench/results/pgzip.md
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import platform
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkseal.core.layer_write import GZIP_LEVEL
from sparkseal.core.pgzip import BLOCK_SIZE, ParallelGzipWriter

CHUNK = 1 << 20


def _feed(tar: Path, writer: io.RawIOBase | gzip.GzipFile | ParallelGzipWriter) -> None:
    with tar.open("rb") as source:
        while chunk := source.read(CHUNK):
            writer.write(chunk)


def single(tar: Path) -> bytes:
    target = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=target, mtime=0) as gz:
        _feed(tar, gz)
    return target.getvalue()


def parallel(tar: Path, workers: int) -> bytes:
    target = io.BytesIO()
    with ParallelGzipWriter(target, GZIP_LEVEL, workers) as gz:
        _feed(tar, gz)
    return target.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tar", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    size = args.tar.stat().st_size
    rows = []
    blobs = {}
    for name, run in (
        ("gzip module, one stream", lambda: single(args.tar)),
        ("ParallelGzipWriter, 1 thread", lambda: parallel(args.tar, 1)),
        (f"ParallelGzipWriter, {cpus} threads", lambda: parallel(args.tar, cpus)),
    ):
        wall, cpu = time.monotonic(), time.process_time()
        blob = run()
        rows.append((name, len(blob), time.monotonic() - wall, time.process_time() - cpu))
        blobs[name] = blob
        if zlib.decompress(blob, 16 + zlib.MAX_WBITS) != args.tar.read_bytes():
            raise SystemExit(f"{name}: does not decompress to {args.tar}")
    one, many = blobs["ParallelGzipWriter, 1 thread"], blobs[f"ParallelGzipWriter, {cpus} threads"]
    base_size, base_wall = rows[0][1], rows[0][2]
    lines = [
        "# Layer compression: one gzip stream against block-parallel gzip",
        "",
        f"Command: `python3 bench/pgzip.py --tar {args.tar} --out {args.out}`",
        "",
        f"Machine: {platform.machine()}, {cpus} CPUs available to the process, "
        f"Python {platform.python_version()} (zlib {zlib.ZLIB_RUNTIME_VERSION}). "
        f"Input: {args.tar.name}, {size:,} bytes. Level {GZIP_LEVEL}, blocks of {BLOCK_SIZE:,} bytes. "
        "One run each, in this order.",
        "",
        "| writer | compressed bytes | size / one stream | wall s | CPU s | wall / one stream |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, length, wall, cpu in rows:
        ratio, speed = length / base_size, wall / base_wall
        lines.append(f"| {name} | {length:,} | {ratio:.4f} | {wall:.1f} | {cpu:.1f} | {speed:.2f} |")
    lines += [
        "",
        f"1 thread and {cpus} threads wrote the same bytes: {one == many}"
        f" (sha256 {hashlib.sha256(many).hexdigest()[:16]}…); every output decompressed to the tar.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if one == many else 1


if __name__ == "__main__":
    sys.exit(main())
