"""Writing a file atomically: on an error the old file stays, and nothing half-written is left beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkseal.core import files


def test_write_atomically_leaves_the_old_file_on_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "vllm.lock.json"
    lock.write_text("old\n")

    def fail(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomically(lock, "new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["vllm.lock.json"]
    assert lock.read_text() == "old\n"
