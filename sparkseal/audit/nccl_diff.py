"""Compare the collective sequences of NCCL debug logs across ranks (``sparkseal nccl-diff``).

The logs are read and normalised by :mod:`sparkseal.core.nccl` (which says what NCCL writes and what is
kept of it); this module makes the report: equal counts per rank, or the first divergence with the records
around it on every rank.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkseal.core.nccl import Divergence, Entry, NcclLogError, RankLog, first_divergence, parse_log

__all__ = ["DiffResult", "NcclLogError", "diff_logs", "render"]


@dataclass
class DiffResult:
    """The parsed logs and the first divergence (``None`` when every sequence is the same)."""

    logs: list[RankLog]
    divergence: Divergence | None
    context: int


def diff_logs(paths: list[Path], context: int = 3) -> DiffResult:
    """Parse every log (rank order) and find the first divergence."""
    if context < 0:
        raise NcclLogError(f"--context {context}: expected 0 or more records")
    logs = [parse_log(path) for path in paths]
    if not any(log.collectives for log in logs):
        raise NcclLogError(
            f"no collective records in {', '.join(map(str, paths))}: were they written with "
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL?"
        )
    return DiffResult(logs, first_divergence(logs), context)


def _window(result: DiffResult, log: RankLog) -> list[tuple[int, Entry | None]]:
    assert result.divergence is not None
    index = result.divergence.index
    last = max(len(other.collectives) for other in result.logs) - 1
    span = range(max(0, index - result.context), min(last, index + result.context) + 1)
    return [(i, log.collectives[i] if i < len(log.collectives) else None) for i in span]


def _json(result: DiffResult) -> dict[str, Any]:
    ranks = []
    for rank, log in enumerate(result.logs):
        entry: dict[str, Any] = {"rank": rank, "log": str(log.path), "collectives": len(log.collectives)}
        entry["p2p"] = log.p2p
        if result.divergence is not None:
            entry["context"] = [
                {"index": i, "line": e.line, "record": asdict(e.record)}
                if e
                else {"index": i, "record": None}
                for i, e in _window(result, log)
            ]
        ranks.append(entry)
    divergence = None
    if result.divergence is not None:
        divergence = {"index": result.divergence.index, "fields": list(result.divergence.fields)}
    return {"equal": result.divergence is None, "divergence": divergence, "ranks": ranks}


def render(result: DiffResult, as_json: bool) -> str:
    """The report: equal counts, or the first divergence with context per rank (text or JSON)."""
    if as_json:
        return json.dumps(_json(result), indent=2, sort_keys=True)
    logs = result.logs
    if result.divergence is None:
        lines = [f"{len(logs)} ranks, {len(logs[0].collectives)} collectives each, identical sequences"]
        lines.extend(
            f"rank {r} ({log.path}): {log.p2p} send/recv records not compared" for r, log in enumerate(logs)
        )
        return "\n".join(lines)
    div = result.divergence
    lines = [f"divergence at collective #{div.index} (differs in: {', '.join(div.fields)})"]
    for rank, log in enumerate(logs):
        lines.append(f"rank {rank} ({log.path}): {len(log.collectives)} collectives")
        for index, entry in _window(result, log):
            mark = ">" if index == div.index else " "
            text = (
                f"line {entry.line}: {entry.record.describe()}" if entry else "(no record: the log ends here)"
            )
            lines.append(f"  {mark} #{index} {text}")
    return "\n".join(lines)
