"""The secret scan of one layer's files, where they lie, before the layer action writes anything.

The layer action's files are scanned for secrets and private data (``sparkseal.scan.scanner``:
our rules and the locked Kingfisher catalogue's) before anything is written, where they lie: the
installed wheels in the scratch directory, the inputs through their sandbox links (the catalogue reads
hard links to them). Reading them there costs a fraction of decompressing the written layer again. A
finding the allow-list (``--scan-allow``, the image's: paths inside the image, entries for other layers
expected not to match) does not cover fails the action: the findings are printed redacted and no
output is written, so Bazel caches nothing for a layer that leaks. A clean layer also writes
``--scan-report``, which names the scanner.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sparkseal.core.layer_plan import FILE, Entry, LayerError
from sparkseal.scan.catalogue import Catalogue
from sparkseal.scan.scanner import load_allowlist, scan_files
from sparkseal.scan.secret_rules import apply_allowlist


def scan_entries(
    entries: Iterable[Entry], label: str, scanner: Path, allow: Path | None, workdir: Path
) -> dict[str, object]:
    """Scan the layer's files; return the clean report, or raise ``LayerError`` listing the findings."""
    catalogue = Catalogue(scanner)
    described = catalogue.describe()
    allowed = load_allowlist(allow, catalogue) if allow is not None else []
    files = ((entry.source, entry.path) for entry in entries if entry.kind == FILE and entry.source)
    count, findings = scan_files(files, catalogue, label, workdir)
    report = apply_allowlist(findings, allowed)
    if not report.clean:
        lines = "".join(f"\n  {finding.location()}: {finding.match}" for finding in report.findings)
        raise LayerError(
            f"layer {label}: expected no secrets or private data, found {len(report.findings)} "
            f"(allow-list: {allow or 'none'}; add an entry with a reason if a match is not a secret):{lines}"
        )
    return {
        "allowed": len(report.allowed),
        "files": count,
        "findings": 0,
        "layer": label,
        "scanner": described,
    }
