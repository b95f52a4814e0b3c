"""sparkseal/core/digests.py: the parallel file hashing every check of installed trees uses."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sparkseal.core import digests


def test_sha256_files_keeps_the_order_of_the_paths_for_any_number_of_threads(tmp_path: Path) -> None:
    # Sizes around the read size, so some files take several reads and finish after later, smaller ones.
    sizes = [0, 1, 2047, 2048, digests._CHUNK - 1, digests._CHUNK, 3 * digests._CHUNK + 5, *range(100, 160)]
    paths = []
    for index, size in enumerate(sizes):
        path = tmp_path / f"f{index:03}"
        path.write_bytes(bytes([index % 251]) * size)
        paths.append(path)
    paths.reverse()
    expected = [hashlib.sha256(path.read_bytes()).hexdigest() for path in paths]
    assert digests.sha256_files(paths, jobs=1) == expected
    assert digests.sha256_files(paths, jobs=8) == expected
    assert digests.sha256_files(paths) == expected
    assert digests.sha256_files([], jobs=4) == []


def test_sha256_files_names_a_missing_file_and_refuses_zero_threads(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    with pytest.raises(FileNotFoundError) as error:
        digests.sha256_files([tmp_path / "a", tmp_path / "absent"], jobs=2)
    assert error.value.filename == str(tmp_path / "absent")
    with pytest.raises(ValueError, match=r"^jobs: expected at least 1 thread, got 0$"):
        digests.sha256_files([tmp_path / "a"], jobs=0)


def test_usable_cpus_is_at_least_one() -> None:
    assert 1 <= digests.usable_cpus() <= (os.cpu_count() or 1)
