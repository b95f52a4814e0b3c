"""NCCL debug logs as records: one rank's collective sequence, normalised, and the first divergence.

NCCL logs every collective it enqueues when run with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL``. Current
releases (``src/enqueue.cc``, ``ncclEnqueueCheck``) write, after a ``host:pid:tid [cudaDev] NCCL INFO``
prefix (and, when ``NCCL_DEBUG_TIMESTAMP_LEVELS`` selects INFO, a ``[date time]`` stamp before it)::

    AllReduce: opCount 3 sendbuff 0x7f.. recvbuff 0x7f.. count 1024 datatype 7 op 0 root 0 comm 0x55..
        [nranks=2] stream 0x55..                                                   (one line in the log)

``opCount`` is hexadecimal (``%lx``), ``count`` is the element count of the call, ``datatype`` and ``op``
are NCCL's enum values, and the bracketed number of the prefix is the CUDA device, not the rank. Each
collective record is normalised to (operation, opCount, count, datatype, op, root, nranks, communicator),
the communicator numbered by its first appearance in the log (``comm#0``); pointers, host names, pids,
tids, devices and timestamps are dropped. Point-to-point records (``Send``/``Recv``) differ between peers
by nature: they are counted, not compared. The logs are given in rank order, one process per log.

Which rank wrote a log: NCCL names it in the line that completes a communicator's set-up
(``ncclCommInitRank... comm 0x.. rank R nranks N cudaDev D ... - Init COMPLETE``, written when
``NCCL_DEBUG_SUBSYS`` includes ``INIT``); a log with only ``COLL`` lines is placed by its CUDA device
(the bracketed number), which is the rank when each process drives the GPU of its own index, as vLLM's
workers do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# ncclDataType_t and ncclRedOp_t of nccl.h.
DATATYPES = (
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "float8e4m3",
    "float8e5m2",
)
REDUCTIONS = ("sum", "prod", "max", "min", "avg")
P2P = frozenset({"Send", "Recv"})

_PREFIX = re.compile(
    r"^(?:\[[^\]]*\] )?(?P<host>\S+?):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?P<msg>.*)$"
)
_INIT = re.compile(r"\brank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>\d+)\b.* Init COMPLETE")
_COLL = re.compile(
    r"^(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
    r"datatype (?P<datatype>-?\d+) op (?P<redop>-?\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
    r"\[nranks=(?P<nranks>\d+)\] stream \S+"
)


class NcclLogError(Exception):
    """A log cannot be used: unreadable, several processes in one file, or no records at all."""


@dataclass(frozen=True)
class Record:
    """One collective as the log names it, without pointers or process identity."""

    op: str
    op_count: int
    count: int
    datatype: int
    reduction: int
    root: int
    nranks: int
    comm: int  # order of first appearance of the communicator in this log

    def describe(self) -> str:
        """A readable one-line form (enum values named)."""
        dtype = (
            DATATYPES[self.datatype] if 0 <= self.datatype < len(DATATYPES) else f"datatype {self.datatype}"
        )
        red = REDUCTIONS[self.reduction] if 0 <= self.reduction < len(REDUCTIONS) else f"op {self.reduction}"
        return (
            f"{self.op} opCount {self.op_count:x} count {self.count} {dtype} {red} root {self.root} "
            f"nranks {self.nranks} comm#{self.comm}"
        )


@dataclass(frozen=True)
class Entry:
    """A record with the line it came from."""

    line: int
    record: Record


@dataclass
class RankLog:
    """The parsed log of one rank."""

    path: Path
    collectives: list[Entry] = field(default_factory=list)
    p2p: int = 0
    rank: int | None = None  # from an ``Init COMPLETE`` line
    device: int | None = None  # the CUDA device of the line prefix

    @property
    def position(self) -> int | None:
        """The rank this log belongs to: the one NCCL named, else the CUDA device."""
        return self.rank if self.rank is not None else self.device


@dataclass(frozen=True)
class Divergence:
    """The first index at which the ranks' collective sequences differ, and the fields that differ."""

    index: int
    fields: tuple[str, ...]


def parse_log(path: Path) -> RankLog:
    """Read one rank's log; fail if it holds lines of more than one process."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise NcclLogError(f"{path}: cannot read the log: {error.strerror}") from error
    log = RankLog(path)
    comms: dict[str, int] = {}
    pids: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        prefix = _PREFIX.match(line)
        if prefix is None:
            continue
        pids.add(prefix["pid"])
        if log.device is None:
            log.device = int(prefix["dev"])
        init = _INIT.search(prefix["msg"])
        if init is not None and log.rank is None:
            log.rank = int(init["rank"])
        found = _COLL.match(prefix["msg"])
        if found is None:
            continue
        if found["op"] in P2P:
            log.p2p += 1
            continue
        record = Record(
            op=found["op"],
            op_count=int(found["opcount"], 16),
            count=int(found["count"]),
            datatype=int(found["datatype"]),
            reduction=int(found["redop"]),
            root=int(found["root"]),
            nranks=int(found["nranks"]),
            comm=comms.setdefault(found["comm"], len(comms)),
        )
        log.collectives.append(Entry(number, record))
    if len(pids) > 1:
        raise NcclLogError(
            f"{path}: expected the lines of one process, found pids {', '.join(sorted(pids, key=int))} "
            "(write one log per rank, e.g. NCCL_DEBUG_FILE=DIR/rank.%h.%p.log)"
        )
    return log


def first_divergence(logs: list[RankLog]) -> Divergence | None:
    """The first index where the records differ or a sequence has ended early."""
    length = max(len(log.collectives) for log in logs)
    for index in range(length):
        records = [log.collectives[index].record if index < len(log.collectives) else None for log in logs]
        if len(set(records)) > 1:
            present = [r for r in records if r is not None]
            if len(present) < len(records):
                return Divergence(index, ("missing",))
            names = [f for f in Record.__dataclass_fields__ if len({getattr(r, f) for r in present}) > 1]
            return Divergence(index, tuple(names))
    return None
