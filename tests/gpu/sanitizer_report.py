"""Reading compute-sanitizer's text output: the summaries and racecheck's reports.

Pure Python (no torch, no GPU), so that ``tests/unit/test_sanitizer_report.py`` checks it on sample text.
The formats are those compute-sanitizer 2025.x prints, every line after its ``=========`` prefix:

- every tool but racecheck ends with ``ERROR SUMMARY: N errors`` (``1 error``);
- racecheck ends with ``RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)``;
- racecheck's analysis reports (``--racecheck-report analysis``, the default), one per racing access
  pair group::

      Error: Race reported between Write access at kernel(int *)+0x90 in file.cu:13
          and Read access at kernel(int *)+0xa0 in file.cu:14 [2048 hazards]

  (older releases wrote the location as ``0x90 in file.cu:13:kernel(int *)``);
- racecheck's hazard reports (``--racecheck-report hazard``), one per hazard::

      Error: Potential RAW hazard detected at __shared__ 0x40 in block (0, 0, 0) :
          Write Thread (70, 0, 0) at kernel(int *)+0x90 in file.cu:13
          Read Thread (3, 0, 0) at kernel(int *)+0xa0 in file.cu:14
          Current Value : 5, Incoming Value : 9
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

_PREFIX = re.compile(r"^=+ ?")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_RACE_HEAD = re.compile(r"^(Error|Warning|Info): Race reported between (\w+) access at (.+)$")
_RACE_MORE = re.compile(r"^and (\w+) access at (.+?)(?: \[(\d+) hazards?\])?$")
_HAZARD_HEAD = re.compile(
    r"^(Error|Warning|Info): Potential (\w+) hazard detected(?: \([^)]*\))? at (__\w+__) 0x([0-9a-fA-F]+)"
    r" in block \(([^)]*)\)"
)
_HAZARD_ACCESS = re.compile(r"^(\w+) Thread \((\d+),\s*(\d+),\s*(\d+)\)(?: \(block rank \d+\))? at (.+)$")
_NEW_LOCATION = re.compile(r"^(?P<function>.+?)\+0x(?P<offset>[0-9a-fA-F]+)(?: in (?P<source>.+))?$")
_OLD_LOCATION = re.compile(r"^0x(?P<offset>[0-9a-fA-F]+) in (?:(?P<source>[^:]+:\d+):)?(?P<function>.+)$")


def _lines(text: str) -> list[str]:
    """The lines of ``text`` without compute-sanitizer's ``=========`` prefix and the indentation."""
    return [_PREFIX.sub("", line).strip() for line in text.splitlines()]


def error_summary(text: str) -> int | None:
    """The error count of the last ``ERROR SUMMARY`` line, or None when there is none."""
    found = _ERROR_SUMMARY.findall(text)
    return int(found[-1]) if found else None


@dataclasses.dataclass(frozen=True)
class RaceSummary:
    displayed: int
    errors: int
    warnings: int


def racecheck_summary(text: str) -> RaceSummary | None:
    """The counts of the last ``RACECHECK SUMMARY`` line, or None when there is none."""
    found = _RACE_SUMMARY.findall(text)
    if not found:
        return None
    displayed, errors, warnings = (int(n) for n in found[-1])
    return RaceSummary(displayed, errors, warnings)


@dataclasses.dataclass(frozen=True)
class Location:
    """Where an access was: its function (as printed), the offset in it and the source line if known."""

    function: str
    offset: int | None
    source: str | None

    @property
    def kernel(self) -> str:
        """The function's bare name: no return type, namespaces, template arguments or parameters."""
        return kernel_name(self.function)


def parse_location(text: str) -> Location:
    """``kernel(int *)+0x90 in file.cu:13``, ``kernel+0x90``, or ``0x90 in file.cu:13:kernel(int *)``."""
    text = text.strip()
    match = _NEW_LOCATION.match(text)
    if match:
        return Location(match["function"].strip(), int(match["offset"], 16), match["source"])
    match = _OLD_LOCATION.match(text)
    if match:
        return Location(match["function"].strip(), int(match["offset"], 16), match["source"])
    return Location(text, None, None)


def kernel_name(function: str) -> str:
    """``void ns::kernel<0, 32>(ns::Args)`` -> ``kernel``."""
    cut = len(function)
    for stop in ("<", "("):
        at = function.find(stop)
        if at >= 0:
            cut = min(cut, at)
    head = function[:cut].strip()
    head = head.split()[-1] if head else head
    return head.split("::")[-1]


@dataclasses.dataclass(frozen=True)
class Access:
    kind: str  # "Write" or "Read" (as racecheck names them)
    location: Location
    hazards: int | None = None  # analysis reports: the hazards between this access and the first one


@dataclasses.dataclass(frozen=True)
class RaceReport:
    """One analysis report: a first access and the accesses that race with it."""

    severity: str
    accesses: tuple[Access, ...]

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(access.kind for access in self.accesses)

    @property
    def kernels(self) -> frozenset[str]:
        return frozenset(access.location.kernel for access in self.accesses)

    @property
    def hazards(self) -> int:
        return sum(access.hazards or 0 for access in self.accesses)

    def __str__(self) -> str:
        first, *rest = self.accesses
        lines = [f"{self.severity}: Race reported between {first.kind} access at {first.location.function}"]
        lines += [f"    and {a.kind} access at {a.location.function} [{a.hazards} hazards]" for a in rest]
        return "\n".join(lines)


def parse_race_reports(text: str) -> list[RaceReport]:
    """Every analysis report of a racecheck output, in order (other lines between reports are skipped)."""
    reports: list[RaceReport] = []
    severity: str | None = None
    accesses: list[Access] = []

    def flush() -> None:
        if severity is not None:
            reports.append(RaceReport(severity, tuple(accesses)))

    for line in _lines(text):
        head = _RACE_HEAD.match(line)
        if head:
            flush()
            severity = head[1]
            accesses = [Access(head[2], parse_location(head[3]))]
            continue
        more = _RACE_MORE.match(line) if severity is not None else None
        if more:
            accesses.append(Access(more[1], parse_location(more[2]), int(more[3]) if more[3] else None))
    flush()
    return reports


@dataclasses.dataclass(frozen=True)
class HazardAccess:
    kind: str  # "Write" or "Read"
    thread: tuple[int, int, int]
    location: Location


@dataclasses.dataclass(frozen=True)
class Hazard:
    """One hazard report: its type (RAW, WAR, WAW), memory space, address, block and the two accesses."""

    severity: str
    type: str
    space: str
    address: int
    block: str
    accesses: tuple[HazardAccess, ...]

    def __str__(self) -> str:
        parts = [f"{self.severity}: {self.type} at {self.space} 0x{self.address:x} in block ({self.block})"]
        parts += [f"{a.kind} thread {a.thread} at {a.location.function}" for a in self.accesses]
        return "; ".join(parts)


def parse_hazards(text: str) -> list[Hazard]:
    """Every hazard report of a racecheck output (``--racecheck-report hazard`` or ``all``), in order.

    A hazard's access lines are the ``<Kind> Thread (x, y, z) at ...`` lines after its head line; other
    lines (values, backtraces, analysis reports) are skipped.
    """
    hazards: list[Hazard] = []
    head: re.Match[str] | None = None
    accesses: list[HazardAccess] = []

    def flush() -> None:
        if head is not None:
            hazards.append(
                Hazard(head[1], head[2], head[3], int(head[4], 16), head[5].strip(), tuple(accesses))
            )

    for line in _lines(text):
        match = _HAZARD_HEAD.match(line)
        if match:
            flush()
            head, accesses = match, []
            continue
        access = _HAZARD_ACCESS.match(line) if head is not None else None
        if access:
            thread = (int(access[2]), int(access[3]), int(access[4]))
            accesses.append(HazardAccess(access[1], thread, parse_location(access[5])))
    flush()
    return hazards


# The hazards a handover through shared memory may show, if the tool does not see the barrier that
# orders them: a producer's write against a consumer's read, either way round.
HANDOVER_SIGNATURES = frozenset(
    {
        "RAW __shared__: Read by consumer, Write by producer",
        "WAR __shared__: Read by consumer, Write by producer",
    }
)


def hazard_signature(hazard: Hazard, is_producer: Callable[[int], bool]) -> str:
    """``"RAW __shared__: Read by consumer, Write by producer"``: the hazard's type, memory space and its
    accesses with the role of each thread (``is_producer(threadIdx.x)``), in a fixed order."""
    accesses = sorted(
        f"{a.kind} by {'producer' if is_producer(a.thread[0]) else 'consumer'}" for a in hazard.accesses
    )
    return f"{hazard.type} {hazard.space}: {', '.join(accesses)}"


def outside(hazards: list[Hazard], kernel: str) -> list[Hazard]:
    """The hazards with an access outside ``kernel``."""
    return [h for h in hazards if any(a.location.kernel != kernel for a in h.accesses)]
