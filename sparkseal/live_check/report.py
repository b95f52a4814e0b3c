"""The live check's report: its steps, their figures and findings, and the text or JSON it prints."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Finding:
    check: str
    kind: str
    message: str


@dataclass
class Step:
    name: str
    ok: bool
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # long lists: in the JSON report only
    seconds: float = 0.0  # wall time of the step itself


@dataclass
class Report:
    url: str
    model: str = ""
    profile: str | None = None
    steps: list[Step] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    @contextmanager
    def timed(self, name: str, ok: bool) -> Iterator[Step]:
        """A new step, appended now (the report keeps the order the steps ran in), timed around the block."""
        step = Step(name, ok=ok)
        self.steps.append(step)
        start = time.monotonic()
        try:
            yield step
        finally:
            step.seconds = round(time.monotonic() - start, 3)

    def flag(self, step: Step, kind: str, message: str) -> None:
        """A finding of ``step``: the step fails, and the finding is reported under its name."""
        step.ok = False
        self.findings.append(Finding(step.name, kind, message))


@contextmanager
def heartbeat(progress: Callable[[str], None], label: str, interval: float) -> Iterator[None]:
    """``label`` now, then every ``interval`` seconds with the time so far, until the block ends: one
    request of a long prompt runs for minutes, and a silent check cannot be told from a stuck one."""
    progress(f"{label} ...")
    start = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            progress(f"{label}: {time.monotonic() - start:.0f} s elapsed")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def render(report: Report, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {
                "url": report.url,
                "model": report.model,
                "profile": report.profile,
                "ok": report.ok,
                "steps": [
                    {k: v for k, v in asdict(step).items() if k != "details" or v} for step in report.steps
                ],
                "findings": [asdict(finding) for finding in report.findings],
            },
            indent=2,
            sort_keys=True,
        )
    profile = f", profile {report.profile}" if report.profile else ""
    lines = [f"live-check {report.url} (model {report.model or '?'}{profile})"]
    for step in report.steps:
        if step.skipped:
            lines.append(f"  {step.name:<14} skipped: {step.skipped}")
            continue
        figures = ", ".join(f"{key} {value}" for key, value in step.figures.items())
        verdict = "ok" if step.ok else "FINDING"
        lines.append(f"  {step.name:<14} {verdict} ({step.seconds:.3f} s){': ' + figures if figures else ''}")
    for finding in report.findings:
        lines.append(f"finding: {finding.message}")
    lines.append("result: pass" if report.ok else f"result: {len(report.findings)} finding(s)")
    return "\n".join(lines)
