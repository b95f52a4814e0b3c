"""Ordered parallel compression of fixed blocks: what the gzip and zstd layer writers share.

A writer cuts its input into blocks of a fixed size, compresses them on a pool of threads and writes the
results in input order, holding at most twice the thread count of blocks in flight. A block is cut only
once more input follows it, so the last block (empty only for an empty input) is known as the last. The
boundaries depend on the input and the block size alone, not on how the input was split into ``write``
calls, and each block's bytes depend on that block (and what the writer carries from the one before):
the output does not depend on the thread count. zlib and libzstd release the GIL while they compress,
so threads give real parallelism.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable
from typing import BinaryIO


class BlockWriter:
    """A binary stream: ``write`` plain bytes, ``close`` writes the rest (the target stays open).

    Subclasses say what a block becomes (``_task``) and may watch the plain bytes (``_plain``) and end
    the stream (``_trailer``).
    """

    def __init__(self, target: BinaryIO, workers: int, block_size: int) -> None:
        if workers < 1 or block_size < 1:
            raise ValueError(f"workers >= 1 and block_size >= 1: got {workers}, {block_size}")
        self._target = target
        self._block_size = block_size
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        self._pending: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
        self._limit = 2 * workers
        self._buffer = bytearray()
        self._closed = False

    def _task(self, block: bytes, last: bool) -> Callable[[], bytes]:
        """The work that compresses ``block``, run on the pool; called in input order."""
        raise NotImplementedError

    def _plain(self, data: bytes | bytearray | memoryview) -> None:
        """Sees every plain byte, in order (a checksum of the whole input)."""

    def _trailer(self) -> bytes:
        """Bytes that end the stream, after the last block."""
        return b""

    def _submit(self, block: bytes, last: bool) -> None:
        self._pending.append(self._pool.submit(self._task(block, last)))
        while len(self._pending) > self._limit:
            self._target.write(self._pending.popleft().result())

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError(f"write to a closed {type(self).__name__}")
        self._plain(data)
        self._buffer += data
        while len(self._buffer) > self._block_size:
            block = bytes(self._buffer[: self._block_size])
            del self._buffer[: self._block_size]
            self._submit(block, last=False)
        return len(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._submit(bytes(self._buffer), last=True)
            while self._pending:
                self._target.write(self._pending.popleft().result())
            self._target.write(self._trailer())
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BlockWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
