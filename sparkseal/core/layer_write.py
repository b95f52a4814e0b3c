"""Write one OCI layer's entries deterministically: the uncompressed tar, its gzip or zstd blob, a descriptor.

The tar is POSIX ustar: entries sorted by path, every parent directory written explicitly (0755), owner
0:0 (a dirs spec may give a directory another owner) with empty user and group names, mtime
SOURCE_DATE_EPOCH, no hard links, no device files. A pax header is written only for a path, link target or
size that ustar cannot hold, and then holds only that record.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sparkseal.core.layer_plan import DIR, LINK, Entry
from sparkseal.core.oci import LAYER_MEDIA_TYPES
from sparkseal.core.pgzip import BLOCK_SIZE, DICTIONARY_SIZE, ParallelGzipWriter
from sparkseal.core.pzstd import BLOCK_SIZE as ZSTD_BLOCK_SIZE
from sparkseal.core.pzstd import LEVEL as ZSTD_LEVEL
from sparkseal.core.pzstd import ParallelZstdWriter, describe
from sparkseal.core.tar import Digesting, TarWriter, Writable

# gzip level of layer blobs. On the whole linux/arm64 image (bench/results/compression.md, "The level of a
# whole image") level 1 takes 0.45x the CPU time of level 6 for a 6.5% larger image: the torch layer, most of
# the bytes, is compiled code that no level compresses much. Builds run far more often than pulls.
GZIP_LEVEL = 1
# What the blob's bytes depend on besides the tar (the worker count is not among them): recorded in the
# layer's descriptor so a rebuild can use the same settings. A zstd blob's also names the library.
COMPRESSION = {"format": "gzip", "level": GZIP_LEVEL, "block_size": BLOCK_SIZE, "dictionary": DICTIONARY_SIZE}
ZSTD_COMPRESSION = {
    "format": "zstd",
    "level": ZSTD_LEVEL,
    "block_size": ZSTD_BLOCK_SIZE,
    "frames": "per block",
}


def write_tar(entries: Iterable[Entry], stream: Writable, digests: dict[Path, str] | None = None) -> None:
    """Write ``entries`` (from ``LayerPlan.entries``, modes decided) as a complete tar to ``stream``.

    ``digests``, when given, receives the sha256 of every file written, by source path.
    """
    writer = TarWriter(stream)
    for entry in entries:
        assert entry.mode is not None
        if entry.kind == DIR:
            writer.directory(entry.path, entry.mode, entry.uid, entry.gid)
        elif entry.kind == LINK:
            writer.symlink(entry.path, entry.target)
        else:
            assert entry.source is not None
            digest = writer.file(entry.path, entry.mode, entry.source, sha256=digests is not None)
            if digests is not None and digest is not None:
                digests[entry.source] = digest
    writer.close()


def write_layer(
    entries: Iterable[Entry],
    tar_path: Path | None,
    blob_path: Path,
    digests: dict[Path, str] | None = None,
    zstandard: Any = None,
) -> dict[str, object]:
    """Write the blob (and the plain tar, when ``tar_path`` is given) in one pass; return the descriptor.

    Each file is read once: ``digests`` (see ``write_tar``) gets the content digests in the same pass.

    The blob is gzip unless ``zstandard`` (the imported python-zstandard module) is given. The gzip stream
    has mtime 0, no file name and level GZIP_LEVEL, so its bytes depend only on the tar and on the zlib of
    the Python that runs the action (the host python3 of the build toolchain); a zstd blob's depend on the
    tar and the locked zstandard wheel (``sparkseal.core.pzstd``). Either is compressed on every CPU the
    action may use, in blocks whose bytes do not depend on that number.
    """
    workers = len(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:
        blob = Digesting(stack.enter_context(blob_path.open("wb")))
        if zstandard is None:
            compressed: Writable = ParallelGzipWriter(blob, GZIP_LEVEL, workers=workers)
            settings: dict[str, object] = COMPRESSION
        else:
            compressed = ParallelZstdWriter(blob, ZSTD_LEVEL, workers, zstandard)
            settings = {**ZSTD_COMPRESSION, "library": describe(zstandard)}
        stack.enter_context(compressed)  # type: ignore[arg-type]
        plain = [stack.enter_context(tar_path.open("wb"))] if tar_path is not None else []
        tar = Digesting(*plain, compressed)
        write_tar(entries, tar, digests)
    return {
        "diff_id": tar.digest,
        "digest": blob.digest,
        "mediaType": LAYER_MEDIA_TYPES[str(settings["format"])],
        "size": blob.size,
        "compression": settings,
    }
