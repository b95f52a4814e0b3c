"""The run's disk report (tests/disk_usage.py): the peak and the test running then, what each test left."""

from __future__ import annotations

from pathlib import Path

from tests.disk_usage import GB, DiskRecord, DiskUsage, filesystems


def test_the_peak_names_the_test_running_when_it_was_sampled() -> None:
    record = DiskRecord(start=10 * int(GB))
    record.current = "tests/a.py::test_small"
    record.sample(11 * int(GB))
    record.current = "tests/b.py::test_big"
    record.sample(25 * int(GB))
    record.current = "tests/c.py::test_after"
    record.sample(12 * int(GB))
    assert (record.peak, record.peak_test) == (25 * int(GB), "tests/b.py::test_big")
    lines = record.lines(end=12 * int(GB), free=3 * int(GB))
    assert lines[0] == "peak +15.0 GB above the start, during tests/b.py::test_big"
    assert lines[1] == "end +2.0 GB above the start; 3.0 GB free"


def test_each_test_is_charged_what_it_left_after_its_teardown() -> None:
    g = int(GB)
    used = iter([100 * g, 100 * g, 160 * g, 160 * g, 150 * g, 150 * g])  # start, then before/after per test

    plugin = DiskUsage([Path("/")], usage=lambda paths: next(used))
    plugin.pytest_runtest_logstart("t1", None)
    plugin.pytest_runtest_logfinish("t1", None)
    plugin.pytest_runtest_logstart("t2", None)
    plugin.pytest_runtest_logfinish("t2", None)
    assert plugin.record.left == {"t1": 60 * g, "t2": -10 * g}
    # Only growth is listed, largest first.
    assert plugin.record.lines(end=150 * g, free=0)[2:] == [" +60.00 GB  t1"]


def test_one_path_per_file_system_and_missing_paths_counted_by_their_parent(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    paths = filesystems([tmp_path / "a", tmp_path / "missing" / "deeper", tmp_path])
    assert paths == [tmp_path / "a"]
