"""What the logs say: the server log's failures, the plugin's cross-rank module check, the ranks' NCCL."""

from __future__ import annotations

import re
from pathlib import Path

from sparkseal.core.nccl import NcclLogError, RankLog, first_divergence, parse_log
from sparkseal.live_check.config import Options
from sparkseal.live_check.report import Report

# What a healthy server never logs. Each pattern names the failure it stands for.
LOG_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("traceback", re.compile(r"^Traceback \(most recent call last\):")),
    (
        "engine-dead",
        re.compile(r"EngineDeadError|Engine core .*(?:died|dead)|EngineCore encountered a fatal error"),
    ),
    ("rpc-timeout", re.compile(r"RPC call to \S+ timed out|TimeoutError: RPC|rpc.*timed out", re.IGNORECASE)),
    (
        "nccl-error",
        re.compile(r"NCCL error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|NCCL WARN"),
    ),
    ("illegal-memory-access", re.compile(r"illegal memory access|cudaErrorIllegalAddress", re.IGNORECASE)),
    ("out-of-memory", re.compile(r"CUDA out of memory|OutOfMemoryError|cudaErrorMemoryAllocation")),
)


def scan_log(path: Path) -> list[tuple[str, int, str]]:
    """(pattern name, line number, line) for every line of the server log that names a failure."""
    hits = []
    with path.open(encoding="utf-8", errors="replace") as stream:
        for number, line in enumerate(stream, start=1):
            for name, pattern in LOG_PATTERNS:
                if pattern.search(line):
                    hits.append((name, number, line.rstrip()[:300]))
                    break
    return hits


def log_step(report: Report, options: Options) -> None:
    with report.timed("server-log", ok=True) as step:
        if options.log is None:
            step.skipped = "no server log (--log FILE)"
            return
        hits = scan_log(options.log)
        counts: dict[str, int] = {}
        for name, _, _ in hits:
            counts[name] = counts.get(name, 0) + 1
        step.figures = {"lines_matched": len(hits), "by_kind": counts}
        for name in counts:
            first = next(hit for hit in hits if hit[0] == name)
            report.flag(step, name, f"{options.log}:{first[1]}: {name} ({counts[name]} line(s)): {first[2]}")


# The sparkseal vLLM plugin's line (sparkseal/vllm_integration/plugin.py), as vLLM's logging prints it.
MODULE_CHECK = re.compile(
    r"sparkseal: rank (?P<rank>\d+) of (?P<ranks>\d+): (?P<modules>.+) identical on every rank "
    r"\(digest (?P<digest>[0-9a-f]+)\)"
)


def module_check_step(report: Report, options: Options) -> None:
    required = options.require_module_check or options.nccl_logs is not None
    with report.timed("module-check", ok=True) as step:
        if options.log is None:
            step.skipped = "no server log (--log FILE)"
            return
        seen: dict[int, tuple[int, str]] = {}
        with options.log.open(encoding="utf-8", errors="replace") as stream:
            for line in stream:
                match = MODULE_CHECK.search(line)
                if match:
                    seen[int(match["rank"])] = (int(match["ranks"]), match["digest"])
        if not seen:
            if required:
                report.flag(
                    step,
                    "did-not-run",
                    f"module check: {options.log} has no line of the sparkseal plugin's cross-rank check "
                    "(is the sparkseal wheel installed beside vLLM, and VLLM_PLUGINS unset or naming "
                    "sparkseal?)",
                )
            else:
                step.skipped = "the server log shows no cross-rank module check"
            return
        world = {ranks for ranks, _ in seen.values()}
        digests = {digest for _, digest in seen.values()}
        step.figures = {"ranks": sorted(seen), "world_size": sorted(world), "digest": sorted(digests)}
        missing = sorted(set(range(max(world))) - set(seen))
        if len(world) > 1 or len(digests) > 1 or missing:
            report.flag(
                step,
                "incomplete",
                f"module check: ranks {sorted(seen)} reported (world sizes {sorted(world)}, digests "
                f"{sorted(digests)}); missing ranks {missing}",
            )


def nccl_step(report: Report, options: Options) -> None:
    with report.timed("nccl", ok=True) as step:
        if options.nccl_logs is None:
            step.skipped = "no NCCL logs (--nccl-logs DIR)"
            return
        logs: list[RankLog] = []
        try:
            for path in sorted(p for p in options.nccl_logs.iterdir() if p.is_file()):
                log = parse_log(path)
                if log.collectives:  # the API server and the engine core run no collective
                    logs.append(log)
        except NcclLogError as error:
            report.flag(step, "unreadable", f"nccl: {error}")
            return
        positions = [log.position for log in logs]
        if len(logs) < 2 or None in positions or len(set(positions)) != len(positions):
            named = ", ".join(f"{log.path.name} (rank {log.position})" for log in logs) or "none"
            report.flag(
                step,
                "ranks",
                f"nccl: expected one log with collectives per rank, at least two, in {options.nccl_logs}; "
                f"found {named}",
            )
            return
        logs.sort(key=lambda log: log.position or 0)
        step.figures = {
            "ranks": len(logs),
            "collectives_per_rank": [len(log.collectives) for log in logs],
            "p2p_per_rank": [log.p2p for log in logs],
            "logs": [log.path.name for log in logs],
        }
        divergence = first_divergence(logs)
        if divergence is None:
            return
        index = divergence.index
        step.figures["first_divergence"] = {"index": index, "fields": list(divergence.fields)}
        described = "; ".join(
            f"rank {log.position}: "
            + (
                f"{log.path.name}:{log.collectives[index].line} {log.collectives[index].record.describe()}"
                if index < len(log.collectives)
                else f"{log.path.name} ends after {len(log.collectives)} collectives"
            )
            for log in logs
        )
        report.flag(
            step,
            "divergence",
            f"nccl: the ranks diverge at collective #{index} (differs in: {', '.join(divergence.fields)}): "
            f"{described}",
        )
