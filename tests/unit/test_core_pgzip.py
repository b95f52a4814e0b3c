"""The parallel gzip writer: the same output whatever the threads and write sizes; gzip readers read it."""

from __future__ import annotations

import gzip
import io
import random
import subprocess
import zlib

import pytest

from sparkseal.core.pgzip import DICTIONARY_SIZE, ParallelGzipWriter


def _data(size: int, seed: int = 5) -> bytes:
    rng = random.Random(seed)
    words = [bytes(rng.randrange(97, 123) for _ in range(rng.randrange(2, 9))) for _ in range(400)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + (b" " if rng.random() < 0.9 else rng.randbytes(3))
    return bytes(out[:size])


def _compress(data: bytes, workers: int, chunks: list[int], block: int = 64 << 10, level: int = 6) -> bytes:
    target = io.BytesIO()
    with ParallelGzipWriter(target, level, workers, block_size=block) as writer:
        offset = 0
        for size in chunks:
            writer.write(data[offset : offset + size])
            offset += size
        writer.write(data[offset:])
    return target.getvalue()


@pytest.mark.parametrize("size", [0, 1, DICTIONARY_SIZE, 64 << 10, (64 << 10) + 1, 1_000_003])
def test_same_bytes_for_any_worker_count_and_write_split(size: int) -> None:
    data = _data(size)
    reference = _compress(data, 1, [])
    assert gzip.decompress(reference) == data
    for workers, chunks in ((2, [7, 70_000]), (4, [1] * 10 + [65_536]), (8, [size // 3, size // 3])):
        assert _compress(data, workers, chunks) == reference


def test_gzip_and_zlib_readers_agree_and_the_header_has_no_time_or_name() -> None:
    data = _data(700_000)
    blob = _compress(data, 3, [])
    assert blob[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    assert zlib.decompress(blob, 16 + zlib.MAX_WBITS) == data
    gunzip = subprocess.run(["gzip", "-dc"], input=blob, capture_output=True, check=True)
    assert gunzip.stdout == data
    assert int.from_bytes(blob[-8:-4], "little") == zlib.crc32(data)
    assert int.from_bytes(blob[-4:], "little") == len(data)


def test_blocks_lose_little_against_one_stream() -> None:
    data = _data(2_000_000)
    single = gzip.compress(data, compresslevel=6, mtime=0)
    blocked = _compress(data, 2, [], block=1 << 20)
    assert len(blocked) <= len(single) * 1.01, (len(blocked), len(single))


def test_bad_settings_and_writes_after_close_are_refused() -> None:
    with pytest.raises(ValueError, match=r"workers >= 1 and block_size >= 32768: got 0, 1048576"):
        ParallelGzipWriter(io.BytesIO(), 6, 0)
    writer = ParallelGzipWriter(io.BytesIO(), 6, 1)
    writer.close()
    with pytest.raises(ValueError, match="write to a closed ParallelGzipWriter"):
        writer.write(b"x")
