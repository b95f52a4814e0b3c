"""Disk use of a test run, reported at its end: how far it grew above the start (the peak, sampled every
few seconds, and the test running then) and the tests that left the most behind.

Why: CI has a fixed disk (about 80 GB free on a fresh machine) and ``make test`` builds two GB10-class
images, vLLM wheels and Bazel output bases; a run that runs out of space fails far from its cause. The
summary says where the space went, so a change that costs disk shows in the run that makes it.

Each file system is counted once (the repository's, the temporary directory's, ``/var/tmp``'s and the
cache's may be one or several), by its used bytes as ``statvfs`` reports them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GB = 1e9
SAMPLE_SECONDS = 2.0
SHOWN = 10
# Tests that left less than this are not listed.
LISTED_BYTES = int(0.01 * GB)


def filesystems(paths: Iterable[Path]) -> list[Path]:
    """One existing path per file system among ``paths`` (the first given for each device)."""
    seen: dict[int, Path] = {}
    for path in paths:
        while not path.exists():
            path = path.parent
        seen.setdefault(path.stat().st_dev, path)
    return list(seen.values())


def used_bytes(paths: Iterable[Path]) -> int:
    """Bytes in use on the file systems of ``paths`` together (each given once, see ``filesystems``)."""
    return sum(shutil.disk_usage(path).used for path in paths)


@dataclass
class DiskRecord:
    """What a run did to the disk: ``start`` bytes used when it began, the ``peak`` seen with the test
    running then (``peak_test``), and per test the bytes it left behind (used after its teardown minus
    used before its setup)."""

    start: int
    peak: int = 0
    peak_test: str = "(between tests)"
    left: dict[str, int] = field(default_factory=dict)
    current: str = "(between tests)"

    def sample(self, used: int) -> None:
        if used > self.peak:
            self.peak, self.peak_test = used, self.current

    def lines(self, end: int, free: int) -> list[str]:
        """The summary: growth at the peak and at the end, free space at the end, the largest leavers."""
        lines = [
            f"peak {(self.peak - self.start) / GB:+.1f} GB above the start, during {self.peak_test}",
            f"end {(end - self.start) / GB:+.1f} GB above the start; {free / GB:.1f} GB free",
        ]
        largest = sorted(self.left.items(), key=lambda item: -item[1])[:SHOWN]
        lines += [f"{size / GB:+7.2f} GB  {test}" for test, size in largest if size >= LISTED_BYTES]
        return lines


class DiskUsage:
    """The plugin: samples in a daemon thread, and records each test's growth around it."""

    def __init__(self, paths: list[Path], usage: Callable[[list[Path]], int] = used_bytes) -> None:
        self.paths = paths
        self.usage = usage
        self.record = DiskRecord(start=usage(paths))
        self.record.sample(self.record.start)
        self.before: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="disk-usage", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_SECONDS):
            self.record.sample(self.usage(self.paths))

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.thread.start()

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.record.current = nodeid
        self.before[nodeid] = self.usage(self.paths)

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        used = self.usage(self.paths)
        self.record.sample(used)
        self.record.left[nodeid] = used - self.before.pop(nodeid, used)
        self.record.current = "(between tests)"

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        self.stop.set()
        end = self.usage(self.paths)
        self.record.sample(end)
        free = sum(shutil.disk_usage(path).free for path in self.paths)
        terminalreporter.write_sep("=", "disk use (sparkseal)")
        for line in self.record.lines(end, free):
            terminalreporter.write_line(line)


def watched_paths(repo: Path) -> list[Path]:
    """The file systems a run writes to: the checkout, the temporary directories, the user's cache and
    podman's storage."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    podman = Path("/var/lib/containers")
    return filesystems([repo, Path(tempfile.gettempdir()), Path("/var/tmp"), cache, podman])
