"""Layer scan speed before and after a change of the scanner, on a large real input (torch layer or wheel).

Takes a layer blob the image build wrote, or builds one layer tar with sparkseal's tar writer from the
unpacked wheel(s) as the image build would write them below /opt/venv. Then runs ``scan_layer_stream``
over it twice: with the scan module of ``--before`` (a git revision; before the rule catalogue landed it
ran our hand-kept rules only, and it is called that way) and with the working tree's (our rules plus the
locked Kingfisher catalogue). Times are CPU seconds of this process and its children (the scanner runs as
a child; robust against other load on the machine) and wall seconds; the Kingfisher rule database is
compiled once before the timed run (the image build's first layer pays that once, ~15 s).

    ~/.cache/sparkseal/venv/bin/python bench/scan.py --before main --wheel torch-...whl --out OUT.md
    ~/.cache/sparkseal/venv/bin/python bench/scan.py --before main \\
        --layer-blob bazel-bin/layer_torch_linux_x86_64.tar.gz --out OUT.md
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.util
import inspect
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compression import build_tar
from sparkseal.scan import scanner as scan
from sparkseal.scan.catalogue import Catalogue

REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _module_at(revision: str, work: Path) -> ModuleType:
    """The scan module as it was at ``revision``, imported under another name.

    ``sparkseal/scan/scanner.py``; before the scan left the pure core ``sparkseal/core/scan.py``; before
    the package layout of ``core`` ``sparkseal/audit/scan.py``.
    """
    for path in ("sparkseal/scan/scanner.py", "sparkseal/core/scan.py", "sparkseal/audit/scan.py"):
        shown = subprocess.run(
            ["git", "show", f"{revision}:{path}"], cwd=REPO, capture_output=True, check=False
        )
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(
            f"bench/scan.py: {revision}: expected sparkseal/scan/scanner.py, sparkseal/core/scan.py or "
            "sparkseal/audit/scan.py"
        )
    source = shown.stdout
    path = work / "scan_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("scan_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _uncompressed_size(blob: Path) -> int:
    with gzip.open(blob, "rb") as stream:
        return sum(len(chunk) for chunk in iter(lambda: stream.read(1 << 20), b""))


def _describe_input(args: argparse.Namespace, mb: float, files: int) -> str:
    if args.wheel:
        wheels = ", ".join(w.name for w in args.wheel)
        return (
            f"Input: one uncompressed layer tar written by sparkseal's tar writer from {wheels} unpacked "
            f"below /opt/venv: {mb:,.0f} MB, {files:,} files."
        )
    blob = args.layer_blob
    return (
        f"Input: the layer blob {blob.name} ({blob.stat().st_size / 1e6:,.0f} MB gzip, {mb:,.0f} MB of tar, "
        f"{files:,} files), read as the layer scan action reads it."
    )


def _takes_catalogue(module: ModuleType) -> bool:
    """Revisions before the catalogue scan with our rules alone (two parameters)."""
    return "catalogue" in inspect.signature(module.scan_layer_stream).parameters


def _timed(run) -> tuple[float, float, int, Counter[str]]:  # type: ignore[no-untyped-def]
    cpu, wall = _cpu(), time.perf_counter()
    files, findings = run()
    return _cpu() - cpu, time.perf_counter() - wall, files, Counter(f.rule for f in findings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheel", type=Path, action="append", help="a wheel to unpack into a layer tar")
    source.add_argument("--layer-blob", type=Path, help="a layer blob the image build wrote (.tar.gz)")
    parser.add_argument("--before", default="main", help="git revision of the scan before (default main)")
    parser.add_argument("--out", type=Path, required=True, help="markdown result file")
    args = parser.parse_args(argv)
    catalogue = Catalogue.find()
    with tempfile.TemporaryDirectory(prefix="sparkseal-bench-scan-") as scratch:
        work = Path(scratch)
        tar = build_tar(args.wheel, work) if args.wheel else args.layer_blob
        size = tar.stat().st_size if args.wheel else _uncompressed_size(tar)
        before = _module_at(args.before, work)
        catalogue.scan([work / "scan_before.py"], {str((work / "scan_before.py").resolve()): "warm-up"})
        extra = (catalogue,) if _takes_catalogue(before) else ()
        with tar.open("rb") as stream:
            old = _timed(lambda: before.scan_layer_stream(stream, "layer", *extra))
        with tar.open("rb") as stream:
            new = _timed(lambda: scan.scan_layer_stream(stream, "layer", catalogue))
    mb = size / 1e6
    with_catalogue = f"our rules + {catalogue.describe()['name']} {catalogue.version}"
    rows = [
        ("before", f"`{args.before}`: {with_catalogue if extra else 'our hand-kept rules'}", old),
        ("after", f"working tree: {with_catalogue}", new),
    ]
    rule_counts = {
        "before": len(before.RULES) + (len(catalogue.rules) if extra else 0),
        "after": len(scan.RULES) + len(catalogue.rules),
    }
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"
    )
    lines = [
        f"# Layer scan speed: `{args.before}` against the working tree",
        "",
        f"Command: `{' '.join([Path(sys.executable).name, 'bench/scan.py', *(argv or sys.argv[1:])])}`",
        "",
        f"Machine: {machine}; Python {platform.python_version()}. Date: {datetime.date.today().isoformat()}.",
        "",
        _describe_input(args, mb, new[2]),
        "",
        "| scan | rules | CPU s | MB/s (CPU) | wall s | MB/s (wall) | findings by rule |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for key, what, (cpu, wall, _files, counts) in rows:
        found = ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items())) or "none"
        lines.append(
            f"| {what} | {rule_counts[key]} | {cpu:.1f} | {mb / cpu:.0f} | {wall:.1f} | {mb / wall:.0f} "
            f"| {found} |"
        )
    lines += ["", f"After/before: {new[0] / old[0]:.2f}x the CPU time, {new[1] / old[1]:.2f}x the wall time."]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
