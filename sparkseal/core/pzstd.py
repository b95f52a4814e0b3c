"""A zstd writer that compresses on several threads and writes the same bytes whatever their number.

The input is cut into blocks of ``BLOCK_SIZE`` bytes; each block becomes one zstd frame of its own (with its
content size and checksum), and the frames are written in input order. A zstd stream may hold several
frames, which every reader decompresses one after the other, so the result reads back as the input. Its
bytes depend on the input, the block size, the level and the zstd library only: not on how many threads
ran, nor on how the input was split into ``write`` calls. zstd's own multi-threaded mode does not promise
that for every way of calling it (its issue 2327: the result could depend on the worker count), hence
frames of our own, cut and ordered as ``sparkseal.core.pgzip`` cuts gzip's blocks
(``sparkseal.core.blocks``).

The library is python-zstandard, whose C extension bundles libzstd: the build actions import the locked
wheel of the build host (``rules/private/host_wheel.bzl``, given as ``site``), never a package of the
build machine, so an upgraded machine cannot change a blob's bytes behind a cached digest.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from sparkseal.core.blocks import BlockWriter

# 8 MiB blocks: on a vLLM layer's tar, frames of 8 MiB at level 3 are 0.25% larger than one frame
# (1 MiB: 2.6%), and a block is enough work to keep a thread busy.
BLOCK_SIZE = 8 << 20
# Level 3 (zstd's default): 6x less CPU than gzip level 6 for a smaller blob (bench/results/compression.md).
LEVEL = 3
# The first bytes of every zstd frame (RFC 8878).
MAGIC = b"\x28\xb5\x2f\xfd"


class ZstdUnavailable(Exception):
    """The zstandard module cannot be imported; the message says where it was looked for."""


def load_zstandard(site: Path | None = None) -> Any:
    """Import python-zstandard, from ``site`` (an unpacked locked wheel) first when given."""
    if site is not None:
        if not (site / "zstandard" / "__init__.py").is_file():
            raise ZstdUnavailable(f"{site}: expected the unpacked zstandard wheel (zstandard/__init__.py)")
        entry = str(site.absolute())
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        return importlib.import_module("zstandard")
    except ImportError as error:
        where = str(site) if site is not None else "the Python path"
        raise ZstdUnavailable(
            f"zstd layers need the zstandard module, which {where} does not provide ({error}); "
            f"install the locked version (third_party/zstd/zstandard.lock.json)"
        ) from error


def describe(zstandard: Any) -> str:
    """The library that decides a blob's bytes, for the layer's recorded settings."""
    return f"python-zstandard {zstandard.__version__} (zstd {'.'.join(map(str, zstandard.ZSTD_VERSION))})"


class ParallelZstdWriter(BlockWriter):
    """A binary stream: ``write`` plain bytes, ``close`` writes the last frame (the target stays open)."""

    def __init__(
        self, target: BinaryIO, level: int, workers: int, zstandard: Any, block_size: int = BLOCK_SIZE
    ) -> None:
        super().__init__(target, workers, block_size)
        self._level = level
        self._zstandard = zstandard

    def _task(self, block: bytes, last: bool) -> Callable[[], bytes]:
        return partial(self._frame, block)

    def _frame(self, block: bytes) -> bytes:
        # A compressor per frame: a ZstdCompressor may not be shared between threads. The last block is
        # empty only for an empty input, whose one empty frame is still a valid zstd stream.
        compressor = self._zstandard.ZstdCompressor(
            level=self._level, write_checksum=True, write_content_size=True
        )
        return compressor.compress(block)


def reader(stream: BinaryIO, zstandard: Any) -> BinaryIO:
    """The decompressed bytes of a zstd ``stream`` of one or more frames, as a readable stream."""
    result: BinaryIO = zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return result
