"""The end of a check that was given the server's pid: SIGTERM, its exit, then idle GPUs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sparkseal.live_check.client import RequestFailed
from sparkseal.live_check.config import Options
from sparkseal.live_check.report import Report


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (exited, its parent not yet told) has stopped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def teardown_step(report: Report, options: Options, progress: Callable[[str], None]) -> bool:
    """SIGTERM to ``--teardown-pid`` (vLLM's own clean shutdown), then wait for it to exit. True when the
    server is gone. It is never killed: a server that does not stop is a finding the operator looks at."""
    with report.timed("teardown", ok=True) as step:
        pid = options.teardown_pid
        if pid is None:
            step.skipped = "no --teardown-pid: live-check leaves the server running"
            return False
        step.figures = {"pid": pid, "signal": "SIGTERM"}
        progress(f"teardown: SIGTERM to the server, pid {pid} ...")
        try:
            if not _running(pid):
                raise ProcessLookupError
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            report.flag(step, "not-running", f"teardown: pid {pid} had already exited before the teardown")
            return True
        deadline = time.monotonic() + options.teardown_timeout
        start = time.monotonic()
        while _running(pid):
            if time.monotonic() > deadline:
                report.flag(
                    step,
                    "still-running",
                    f"teardown: pid {pid} still runs {options.teardown_timeout:g} s after SIGTERM "
                    "(--teardown-timeout); it was not killed",
                )
                return False
            time.sleep(min(0.1, options.idle_poll))
        step.figures["exit_s"] = round(time.monotonic() - start, 3)
        return True


def _read_gpus(smi: str) -> list[tuple[str, float | None, float | None]]:
    """(index, memory.used MiB, utilization.gpu %) per GPU; None where the GPU does not report it (a GB10's
    unified memory has no memory.used: ``[N/A]``)."""
    command = [smi, "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RequestFailed("nvidia-smi", f"gpu idle: {smi} failed: {error}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:300]
        raise RequestFailed("nvidia-smi", f"gpu idle: {smi} exited {done.returncode}: {said}")

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    gpus = []
    for line in done.stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3:
            raise RequestFailed(
                "nvidia-smi", f"gpu idle: {smi}: expected index, memory, utilisation: {line!r}"
            )
        gpus.append((cells[0], number(cells[1]), number(cells[2])))
    if not gpus:
        raise RequestFailed("nvidia-smi", f"gpu idle: {smi} lists no GPU")
    return gpus


def _busy(gpus: list[tuple[str, float | None, float | None]], options: Options) -> list[str]:
    """Each figure above its idle threshold, named with the threshold."""
    said = []
    for index, memory, utilization in gpus:
        if memory is not None and memory > options.idle_memory_mib:
            said.append(
                f"GPU {index} memory.used {memory:g} MiB > --idle-memory-mib {options.idle_memory_mib:g}"
            )
        if utilization is not None and utilization > options.idle_utilization:
            said.append(
                f"GPU {index} utilization.gpu {utilization:g} % > --idle-utilization "
                f"{options.idle_utilization:g}"
            )
    return said


def gpu_idle_step(report: Report, options: Options, progress: Callable[[str], None], stopped: bool) -> None:
    """After the teardown, every GPU's memory and utilisation back to idle, polled until --idle-timeout."""
    with report.timed("gpu-idle", ok=True) as step:
        if options.teardown_pid is None:
            step.skipped = "no --teardown-pid: a serving GPU is not idle"
            return
        if not stopped:
            step.skipped = "the server did not stop"
            return
        smi = shutil.which("nvidia-smi")
        if smi is None:
            step.skipped = "no nvidia-smi on PATH: the GPUs' memory and utilisation cannot be read here"
            return
        progress(f"gpu idle: polling nvidia-smi for up to {options.idle_timeout:g} s ...")
        start = time.monotonic()
        while True:
            try:
                gpus = _read_gpus(smi)
            except RequestFailed as error:
                report.flag(step, error.kind, str(error))
                return
            busy = _busy(gpus, options)
            elapsed = time.monotonic() - start
            if not busy or elapsed >= options.idle_timeout:
                break
            time.sleep(options.idle_poll)
        step.figures = {
            "gpus": [{"index": i, "memory_used_mib": m, "utilization_pct": u} for i, m, u in gpus],
            "idle_memory_mib": options.idle_memory_mib,
            "idle_utilization": options.idle_utilization,
        }
        unreported = [i for i, m, u in gpus if m is None or u is None]
        if unreported:
            step.figures["not_reported_by_gpus"] = unreported
        if all(m is None and u is None for _, m, u in gpus):
            report.flag(
                step, "unreadable", f"gpu idle: {smi} reports neither memory.used nor utilization.gpu"
            )
            return
        if busy:
            report.flag(
                step,
                "busy",
                f"gpu idle: {options.idle_timeout:g} s after teardown (--idle-timeout): {'; '.join(busy)}",
            )
            return
        step.figures["idle_after_s"] = round(time.monotonic() - start, 3)
