"""The layers' gzip level: what each level costs to write and what it saves on the wire, for a whole image.

For every layer blob of a built image (the ``layer_*_PLATFORM.tar.gz`` outputs of ``bazel build
//:image_PLATFORM``), the tar is decompressed once to a scratch file, then compressed at each level with the
writer the layer action uses (``sparkseal.core.pgzip.ParallelGzipWriter``, one thread, so the CPU seconds are
the work itself and do not depend on the machine's load) into a sink that only counts and hashes. The level
the image was built with must give back the built blob's bytes: that checks that this is the action's
compressor and not another. Writes a markdown table: per layer and in total, compressed bytes and CPU seconds
at each level, and each level against the image's.

    python3 bench/gzip_levels.py --bin BAZEL_BIN --platform linux_aarch64 --levels 1 3 6 --out FILE.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkseal.core.pgzip import ParallelGzipWriter
from sparkseal.core.tar import Digesting

CHUNK = 1 << 20


def decompress(blob: Path, tar: Path) -> int:
    """The blob's tar into ``tar``; its size."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    size = 0
    with blob.open("rb") as source, tar.open("wb") as target:
        while chunk := source.read(CHUNK):
            plain = inflater.decompress(chunk)
            size += target.write(plain)
        size += target.write(inflater.flush())
    return size


def compress(tar: Path, level: int) -> tuple[int, str, float]:
    """Compressed size, sha256 and CPU seconds of ``tar`` at ``level`` (one worker)."""
    sink = Digesting()  # counts and hashes, keeps nothing
    cpu = time.process_time()
    with tar.open("rb") as source, ParallelGzipWriter(sink, level, 1) as gz:  # type: ignore[arg-type]
        while chunk := source.read(CHUNK):
            gz.write(chunk)
    return sink.size, sink.digest, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bin", type=Path, required=True, help="bazel-bin of a workspace with the image")
    parser.add_argument("--platform", default="linux_aarch64")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 3, 6])
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    layers = sorted(args.bin.glob(f"layer_*_{args.platform}.tar.gz"))
    if not layers:
        raise SystemExit(f"{args.bin}: no layer_*_{args.platform}.tar.gz: build //:image_{args.platform}")
    rows = []
    for blob in layers:
        record = json.loads(blob.with_name(blob.name.removesuffix(".tar.gz") + ".json").read_text())
        built = record["compression"]["level"]
        with tempfile.NamedTemporaryFile(dir=args.scratch, suffix=".tar") as scratch:
            tar = Path(scratch.name)
            plain = decompress(blob, tar)
            figures = {}
            for level in sorted(set(args.levels) | {built}):
                size, digest, cpu = compress(tar, level)
                figures[level] = (size, cpu)
                if level == built and (digest, size) != (record["digest"], blob.stat().st_size):
                    raise SystemExit(f"{blob}: level {level} gave {digest}, the build {record['digest']}")
                print(f"{blob.name}: level {level}: {size:,} B, {cpu:.1f} CPU s", file=sys.stderr, flush=True)
        rows.append((blob.name.removesuffix(".tar.gz"), plain, built, figures))
    built = rows[0][2]
    levels = sorted(rows[0][3])
    head = " | ".join(f"level {lv} MB | level {lv} CPU s" for lv in levels)
    lines = [
        f"Command: `python3 bench/gzip_levels.py --bin BAZEL_BIN --platform {args.platform} "
        f"--levels {' '.join(map(str, args.levels))} --out {args.out}`",
        "",
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs; "
        f"Python {platform.python_version()}, zlib {zlib.ZLIB_RUNTIME_VERSION}; one compressing thread, "
        f"CPU seconds of this process. The level-{built} row of each layer reproduced the built blob.",
        "",
        f"| layer | tar MB | {head} |",
        "|---|---:|" + "---:|---:|" * len(levels),
    ]
    total_plain = sum(r[1] for r in rows)
    totals = {lv: (sum(r[3][lv][0] for r in rows), sum(r[3][lv][1] for r in rows)) for lv in levels}
    for name, plain, _, figures in rows:
        cells = " | ".join(f"{figures[lv][0] / 1e6:,.1f} | {figures[lv][1]:.1f}" for lv in levels)
        lines.append(f"| {name} | {plain / 1e6:,.1f} | {cells} |")
    cells = " | ".join(f"**{totals[lv][0] / 1e6:,.1f}** | **{totals[lv][1]:.1f}**" for lv in levels)
    lines.append(f"| **image** | **{total_plain / 1e6:,.1f}** | {cells} |")
    lines += [
        "",
        f"| level | image MB | against level {built} | CPU s | against level {built} |",
        "|---:|---:|---:|---:|---:|",
    ]
    for lv in levels:
        size, cpu = totals[lv]
        lines.append(
            f"| {lv} | {size / 1e6:,.1f} | {size / totals[built][0]:.3f} | {cpu:.1f} "
            f"| {cpu / totals[built][1]:.3f} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
