"""A zstd writer that compresses on several threads and writes the same bytes whatever their number.

The input is cut into blocks of ``BLOCK_SIZE`` bytes; each block becomes one zstd frame of its own (with its
content size and checksum), and the frames are written in input order. A zstd stream may hold several
frames, which every reader decompresses one after the other, so the result reads back as the input. Its
bytes depend on the input, the block size, the level and the zstd library only: not on how many threads
ran, nor on how the input was split into ``write`` calls. zstd's own multi-threaded mode does not promise
that for every way of calling it (its issue 2327: the result could depend on the worker count), hence
frames of our own, as ``sparkseal.core.pgzip`` does for gzip. python-zstandard releases the GIL while it
compresses, so threads give real parallelism.

The library is python-zstandard, whose C extension bundles libzstd: the build actions import the locked
wheel of the build host (``rules/private/host_wheel.bzl``, given as ``site``), never a package of the
build machine, so an upgraded machine cannot change a blob's bytes behind a cached digest.
"""

from __future__ import annotations

import collections
import concurrent.futures
import importlib
import sys
from pathlib import Path
from typing import Any, BinaryIO

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
            f"install the locked version (third_party/python/zstandard.lock.json)"
        ) from error


def describe(zstandard: Any) -> str:
    """The library that decides a blob's bytes, for the layer's recorded settings."""
    return f"python-zstandard {zstandard.__version__} (zstd {'.'.join(map(str, zstandard.ZSTD_VERSION))})"


class ParallelZstdWriter:
    """A binary stream: ``write`` plain bytes, ``close`` writes the last frame (the target stays open)."""

    def __init__(
        self, target: BinaryIO, level: int, workers: int, zstandard: Any, block_size: int = BLOCK_SIZE
    ) -> None:
        if workers < 1 or block_size < 1:
            raise ValueError(f"workers >= 1 and block_size >= 1: got {workers}, {block_size}")
        self._target = target
        self._level = level
        self._zstandard = zstandard
        self._block_size = block_size
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        self._pending: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
        self._limit = 2 * workers
        self._buffer = bytearray()
        self._frames = 0
        self._closed = False

    def _frame(self, block: bytes) -> bytes:
        # A compressor per frame: a ZstdCompressor may not be shared between threads.
        compressor = self._zstandard.ZstdCompressor(
            level=self._level, write_checksum=True, write_content_size=True
        )
        return compressor.compress(block)

    def _submit(self, block: bytes) -> None:
        self._frames += 1
        self._pending.append(self._pool.submit(self._frame, block))
        while len(self._pending) > self._limit:
            self._target.write(self._pending.popleft().result())

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed ParallelZstdWriter")
        self._buffer += data
        while len(self._buffer) >= self._block_size:
            block = bytes(self._buffer[: self._block_size])
            del self._buffer[: self._block_size]
            self._submit(block)
        return len(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._buffer or not self._frames:
                # The rest; an empty input still becomes one (empty) frame, a valid zstd stream.
                self._submit(bytes(self._buffer))
            while self._pending:
                self._target.write(self._pending.popleft().result())
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ParallelZstdWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)


def reader(stream: BinaryIO, zstandard: Any) -> BinaryIO:
    """The decompressed bytes of a zstd ``stream`` of one or more frames, as a readable stream."""
    result: BinaryIO = zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return result
