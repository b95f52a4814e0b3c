"""The maintained secret-rule catalogue: Kingfisher (``kingfisher-bin``), run over files our scan walks.

A hand-kept list of vendor token formats falls behind (it missed Hugging Face tokens, the leak ML images
have most). Kingfisher ships several hundred maintained rules (the Betterleaks catalogue, successor of
gitleaks', and Google's Veles rules) compiled for Vectorscan, so running it is also faster than matching
each rule with Python's ``re``. The binary comes from a hash-locked wheel: ``.ci/requirements-trust.txt``
for ``sparkseal scan``, ``third_party/scan/scanner.lock.json`` for the image build.

Findings are redacted here and the scanner's own report (which holds the secrets) lives only in a private
scratch directory that is removed before the scan returns.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

NAME = "kingfisher"
SCANNER_ENV = "SPARKSEAL_SCANNER"

# Every flag below, and why:
_SCAN_FLAGS = (
    "--no-validate",  # never send a found secret to its provider; build actions have no network either
    "--no-update-check",  # the version is the locked one
    "--git-history=none",  # the files as given, not a repository's history
    "--no-extract-archives",  # members are scanned as the image holds them, as our own rules do
    "--max-file-size=0",  # no size limit: torch's shared libraries exceed the default 256 MB
    "--no-dedup",  # one finding per file, so the allow-list can name each path
    "--no-ignore",  # inline "ignore" comments in upstream files do not silence a rule; the allow-list does
    "--format=json",
    "--quiet",
)
# Exit statuses of a completed scan: none found, findings, validated findings.
_EXIT_OK = (0, 200, 205)
_SHOWN = 4  # characters of a secret a finding shows, as our own token rules did


class CatalogueError(Exception):
    """The scanner cannot be found or run, or answers what cannot be read; the message says which."""


@dataclass(frozen=True)
class CatalogueFinding:
    """One match of a catalogue rule, already redacted."""

    path: str
    line: int | None
    rule: str
    match: str


def redact(snippet: str) -> str:
    """The first few characters of a match and its length (``hf_a***(37 chars)``), on one line."""
    text = " ".join(snippet.split())
    return f"{text[:_SHOWN]}***({len(text)} chars)"


class Catalogue:
    """The Kingfisher binary at ``binary``: its version, its rule ids, and scans of files."""

    def __init__(self, binary: Path, rule_cache: Path | None = None, jobs: int | None = None) -> None:
        self.binary = binary
        # Compiling the rules for Vectorscan takes ~15 s; the compiled database is cached (keyed by the
        # scanner on its rules) so that later runs and later batches start in ~2 s.
        self.rule_cache = rule_cache or Path(tempfile.gettempdir()) / f"sparkseal-{NAME}-rule-cache"
        self.jobs = jobs or min(8, os.cpu_count() or 1)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise CatalogueError(f"{binary}: expected the {NAME} executable, found no executable file")

    @classmethod
    def find(cls, explicit: Path | None = None) -> Catalogue:
        """The scanner at ``explicit``, else at ``$SPARKSEAL_SCANNER``, else the installed ``kingfisher``."""
        if explicit is None and os.environ.get(SCANNER_ENV):
            explicit = Path(os.environ[SCANNER_ENV])
        if explicit is not None:
            return cls(explicit)
        try:
            import kingfisher  # type: ignore[import-untyped]
        except ImportError:
            raise CatalogueError(
                f"no secret scanner: expected the kingfisher-bin package (`make tools` installs it from "
                f".ci/requirements-trust.txt) or --scanner/{SCANNER_ENV} naming the {NAME} binary, found none"
            ) from None
        return cls(Path(kingfisher.get_binary_path()))

    def _run(self, args: Sequence[str], home: Path) -> subprocess.CompletedProcess[bytes]:
        # HOME is private scratch: the scanner writes nothing of ours and reads no user configuration.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LC_ALL": "C.UTF-8"}
        try:
            return subprocess.run([str(self.binary), *args], capture_output=True, env=env, check=False)
        except OSError as error:
            raise CatalogueError(f"{self.binary}: cannot run: {error.strerror}") from None

    @cached_property
    def version(self) -> str:
        """The scanner's version (``2.14.0``)."""
        with tempfile.TemporaryDirectory(prefix="sparkseal-scanner-") as home:
            done = self._run(["--version"], Path(home))
        match = re.fullmatch(rf"{NAME} (\S+)\s*", done.stdout.decode("utf-8", "replace"))
        if done.returncode != 0 or match is None:
            raise CatalogueError(
                f"{self.binary} --version: expected '{NAME} VERSION', found {done.stdout[:80]!r} "
                f"(exit {done.returncode})"
            )
        return match[1]

    @cached_property
    def rules(self) -> dict[str, str]:
        """Every rule id of the catalogue and its description, as ``rules list`` names them."""
        with tempfile.TemporaryDirectory(prefix="sparkseal-scanner-") as home:
            done = self._run(["rules", "list", "--format=json", "--no-update-check"], Path(home))
        try:
            listed = json.loads(done.stdout)
            rules = {str(r["id"]): str(r.get("name", "")) for r in listed}
        except (ValueError, TypeError, KeyError) as error:
            raise CatalogueError(
                f"{self.binary} rules list: expected a JSON list of rules, "
                f"found {done.stdout[:80]!r}: {error}"
            ) from None
        if done.returncode != 0 or not rules:
            raise CatalogueError(f"{self.binary} rules list: exit {done.returncode}, {len(rules)} rules")
        return rules

    def describe(self) -> dict[str, object]:
        """What reports and the provenance record about the scanner."""
        return {"name": NAME, "rules": len(self.rules), "version": self.version}

    def scan(self, targets: Sequence[Path], names: Mapping[str, str]) -> list[CatalogueFinding]:
        """Scan ``targets`` (files or directories); a finding's path is ``names[absolute path]``.

        A file the scanner reports that ``names`` does not hold is an error: nothing is reported under a
        scratch path.
        """
        if not targets:
            return []
        with tempfile.TemporaryDirectory(prefix="sparkseal-scanner-") as scratch:
            home = Path(scratch)
            report = home / "report.json"
            args = [
                *_SCAN_FLAGS,
                f"--jobs={self.jobs}",
                f"--output={report}",
                f"--rule-cache-dir={self.rule_cache}",
            ]
            # Absolute paths only: a relative one such as "s3" would be read as a scan subcommand.
            paths = [str(target.resolve()) for target in targets]
            done = self._run(["scan", *args, "--", *paths], home)
            if done.returncode not in _EXIT_OK or not report.is_file():
                # The scanner's stderr names files and rules, never a match: keep its last lines.
                tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
                raise CatalogueError(f"{NAME} scan failed (exit {done.returncode}): {' | '.join(tail)}")
            try:
                found = json.loads(report.read_bytes()).get("findings") or []
                results = [_finding(item, names) for item in found]
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                raise CatalogueError(
                    f"{NAME} scan: its JSON report has an unexpected shape: {error!r}"
                ) from None
        return results


def _finding(item: dict[str, Any], names: Mapping[str, str]) -> CatalogueFinding:
    where = item["finding"]
    path = names[str(Path(where["path"]).resolve())]
    line = where.get("line")
    return CatalogueFinding(
        path=path,
        line=int(line) if line is not None else None,
        rule=str(item["rule"]["id"]),
        match=redact(str(where.get("snippet", ""))),
    )
