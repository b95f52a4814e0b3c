"""Action: the secret and private-data scan of one image layer, run by the image build.

``scan_layer --blob LAYER.tar.gz --layer LABEL --scanner KINGFISHER --allow ALLOW.json --report OUT.json``
streams the layer tar through ``sparkseal.core.scan`` (the rules of ``sparkseal scan``: ours and the locked
Kingfisher catalogue's), drops the findings the allow-list covers, and writes a small JSON report that
names the scanner and its version. Any finding left fails the action, and with it the image: the
findings are printed (redacted, as ``sparkseal scan`` prints them) and no report is written, so Bazel caches
nothing for a layer that leaks.

The allow-list is the image's (``third_party/scan/image-allow.json``): its entries name paths inside the
image (``opt/venv/...``) and are written for the whole image, so entries for other layers are expected not
to match here and are not reported as unused.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from sparkseal.core.catalogue import Catalogue, CatalogueError
from sparkseal.core.scan import ScanInputError, apply_allowlist, load_allowlist, scan_layer_stream


def main(argv: list[str] | None = None) -> int:
    """Scan ``--blob``; write ``--report`` when clean, else print the findings and return 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blob", type=Path, required=True, help="layer tar, compressed or not")
    parser.add_argument("--layer", required=True, help="name of the layer in messages (its label)")
    parser.add_argument("--scanner", type=Path, required=True, help="the locked kingfisher binary")
    parser.add_argument("--allow", type=Path, help="allow-list JSON (none: every finding fails)")
    parser.add_argument("--report", type=Path, required=True, help="JSON report to write when clean")
    args = parser.parse_args(argv)
    try:
        catalogue = Catalogue(args.scanner)
        scanner = catalogue.describe()
        allow = load_allowlist(args.allow, catalogue) if args.allow else []
        with open(args.blob, "rb") as stream:
            files, findings = scan_layer_stream(stream, args.layer, catalogue)
    except (CatalogueError, ScanInputError, OSError, tarfile.TarError) as error:
        print(f"scan_layer: {args.blob}: {error}", file=sys.stderr)
        return 1
    report = apply_allowlist(findings, allow)
    if not report.clean:
        lines = [f"  {finding.location()}: {finding.match}" for finding in report.findings]
        allow_name = args.allow or "no allow-list"
        print(
            f"scan_layer: layer {args.layer}: expected no findings, found {len(report.findings)} "
            f"(allow-list: {allow_name}; add an entry with a reason if a match is not a secret):",
            *lines,
            sep="\n",
            file=sys.stderr,
        )
        return 1
    summary = {
        "allowed": len(report.allowed),
        "files": files,
        "findings": 0,
        "layer": args.layer,
        "scanner": scanner,
    }
    args.report.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
