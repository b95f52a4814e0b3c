"""The ``sparkseal verify`` flow: first build, varied rebuild, comparison, report.

With ``against``, the published digest takes the place of the first build: the rebuilt target's digest
(its ``.digest`` output for an image or a PEX, else the sha256 of its one output file) must equal it.

Every target with such a digest gets a verdict that other tools read: a SLSA Verification Summary
Attestation (``sparkseal.audit.verification_summary``) in the report directory, signed when a key is given.
The report's last line is the verdict, ``PASSED`` or ``FAILED``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparkseal.audit import verification_summary as vsa
from sparkseal.audit.compare import Difference, compare_outputs
from sparkseal.audit.provenance_sign import sign_payload
from sparkseal.audit.rebuild import (
    Build,
    RebuildError,
    first_build,
    make_scratch,
    second_build,
    sha256_file,
    workspace_status,
)
from sparkseal.core.source import describe


@dataclass
class VerifyResult:
    """What was built, how the second build differed, and every difference found."""

    targets: list[str]
    variations: dict[str, str]
    artifacts: dict[str, int] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)
    against: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    report_dir: str = ""
    source: str = ""  # what the workspace status says of the checkout (sparkseal.core.source.describe)
    attestations: list[str] = field(default_factory=list)  # the VSAs written (and their envelopes)

    @property
    def ok(self) -> bool:
        """True when nothing differs."""
        return not self.differences

    @property
    def verdict(self) -> str:
        """``PASSED`` when nothing differs, else ``FAILED``."""
        return vsa.PASSED if self.ok else vsa.FAILED


def primary_digest(outputs: dict[str, Path], target: str) -> str:
    """The one digest that names a target's result: its ``.digest`` file, else its only output file."""
    digests = [p for rel, p in outputs.items() if rel.endswith(".digest") and p.is_file()]
    if len(digests) == 1:
        return digests[0].read_text(encoding="ascii").strip()
    files = [p for p in outputs.values() if p.is_file()]
    if not digests and len(outputs) == 1 and len(files) == 1:
        return sha256_file(files[0])
    raise RebuildError(
        f"{target}: expected one .digest output or one output file to compare with --against, "
        f"found {len(digests)} .digest file(s) among {len(outputs)} outputs"
    )


def _target_outputs(build: Build, target: str) -> dict[str, Path]:
    for label, outputs in build.outputs.items():
        if label.lstrip("@") == target.lstrip("@"):
            return outputs
    raise RebuildError(f"{build.workspace}: the build reported no outputs for {target}")


def remove_tree(path: Path) -> None:
    """Remove a directory that Bazel left read-only."""

    def writable(function, name, _info):
        parent = os.path.dirname(name)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR)
        if os.path.isdir(name) and not os.path.islink(name):
            os.chmod(name, os.stat(name).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        function(name)

    if path.exists():
        shutil.rmtree(path, onerror=writable)


def _verified_digest(first: Build | None, target: str, against: str | None) -> str | None:
    """The digest of the artifact under verification: the published one, else the first build's; None for a
    target without one digest (its outputs are still compared, but no summary names it)."""
    if against:
        return against
    assert first is not None
    try:
        return primary_digest(_target_outputs(first, target), target)
    except RebuildError:
        return None


def verify(
    workspace: Path,
    targets: list[str],
    against: str | None,
    report_dir: Path,
    keep: bool,
    scratch_parent: Path | None,
    bazel_args: list[str] | None = None,
    key: Path | None = None,
) -> VerifyResult:
    """Build, rebuild with variations, compare, write each target's VSA (signed with ``key``, if given);
    raise :class:`RebuildError` when a build fails. ``bazel_args`` go to both builds."""
    started = time.monotonic()
    scratch = make_scratch(scratch_parent)
    report_dir.mkdir(parents=True, exist_ok=True)
    bazel_args = list(bazel_args or [])
    source, status = workspace_status(workspace)
    verdicts = []
    try:
        first = None if against else first_build(workspace, targets, scratch, bazel_args)
        second = second_build(workspace, targets, scratch, bazel_args, status)
        shutil.copy(scratch / "second.log", report_dir / "second-build.log")
        result = VerifyResult(targets, second.variations, report_dir=str(report_dir), source=describe(source))
        for target in targets:
            rebuilt = _target_outputs(second, target)
            result.artifacts[target] = len(rebuilt)
            digest = _verified_digest(first, target, against)
            if against:
                actual = primary_digest(rebuilt, target)
                result.against = {"expected": against, "actual": actual}
                found = []
                if actual != against:
                    found = [
                        Difference(target, [f"expected {against} (published), actual {actual} (rebuilt)"])
                    ]
            else:
                assert first is not None
                target_dir = report_dir / re.sub(r"[^A-Za-z0-9._-]+", "_", target).strip("_")
                found = compare_outputs(_target_outputs(first, target), rebuilt, target_dir)
            result.differences += found
            if digest is not None:
                verdicts.append(
                    vsa.Verdict(
                        target,
                        digest,
                        source,
                        bazel_args,
                        second.variations,
                        against,
                        [{"artifact": d.artifact, "detail": d.detail, "layers": d.layers} for d in found],
                    )
                )
    finally:
        if not keep:
            remove_tree(scratch)
    verified_at = vsa.timestamp()
    for verdict in verdicts:
        path = vsa.write(verdict, report_dir, verified_at)
        result.attestations.append(str(path))
        if key is not None:
            envelope = path.with_name(path.name.removesuffix(".json") + ".dsse.json")
            result.attestations.append(str(sign_payload(path.read_bytes(), key, envelope)))
    result.seconds = round(time.monotonic() - started, 1)
    return result


def render(result: VerifyResult, as_json: bool) -> str:
    """Text or JSON report of a verify run."""
    if as_json:
        return json.dumps(
            {**asdict(result), "ok": result.ok, "verdict": result.verdict}, indent=2, sort_keys=True
        )
    lines = [result.source] if result.source else []
    lines.append(f"rebuilt {' '.join(result.targets)} with these variations:")
    lines += [f"  {name}: {change}" for name, change in result.variations.items()]
    for difference in result.differences:
        lines.append(f"DIFFERS {difference.artifact}")
        lines += [f"  {line}" for line in difference.detail]
        lines += [f"  report: {report}" for report in difference.reports]
    lines += [f"verification summary: {path}" for path in result.attestations]
    count = sum(result.artifacts.values())
    if result.ok:
        what = f"digest {result.against['actual']} as published" if result.against else f"{count} outputs"
        lines.append(f"PASSED: identical: {what} ({result.seconds} s)")
    else:
        lines.append(
            f"FAILED: {len(result.differences)} difference(s) ({result.seconds} s); reports in "
            f"{result.report_dir}"
        )
    return "\n".join(lines)
