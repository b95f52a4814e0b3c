"""The ``sparkseal`` command: argument parsing only; the work is done by the sparkseal packages.

Exit status: 0 all good, 1 a finding (or a failed fetch), 2 a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path


def _scan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.scan.catalogue import Catalogue, CatalogueError
    from sparkseal.scan.scanner import ScanInputError, render, run_scan

    try:
        catalogue = Catalogue.find(args.scanner)
        report = run_scan(args.paths, args.image, args.allow, catalogue=catalogue)
    except CatalogueError as error:
        parser.error(str(error))
    except ScanInputError as error:
        parser.error(str(error))
    print(render(report, args.json))
    return 0 if report.clean else 1


def _add_scan(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.archives import (
        KINDS,
        MAX_ARCHIVE_DEPTH,
        MAX_HEADER_BYTES,
        MAX_MEMBERS,
        MAX_SCAN_MEMBERS,
    )
    from sparkseal.core.secret_rules import RULES
    from sparkseal.scan.scanner import DEFAULT_ALLOW

    scan = commands.add_parser(
        "scan",
        help="scan the repository or an OCI image for secrets and private data",
        description="Scan files for private keys, API tokens and other vendor secrets (the maintained rule "
        "catalogue of the Kingfisher scanner, from the hash-locked kingfisher-bin package), and for "
        "passwords, private IPv4 addresses, home directories and key files (our own rules). Without PATHS "
        "and --image: the files of the git checkout in the current directory (tracked and "
        "untracked-not-ignored; bazel-* and .git skipped). --image reads every layer of an OCI layout "
        f"directory, OCI archive or docker archive. Archives among the files ({', '.join(KINDS)}) are "
        f"opened, {MAX_ARCHIVE_DEPTH} levels deep: a finding inside one is named ARCHIVE!member, and a "
        "corrupt archive or a bomb is an error (exit 2). Every member's bytes are scanned, a zip's "
        "'symbolic links' too, and each archive's own bytes as well (a zip comment, appended data); a "
        "tar must be read whole: data past its end (after its end blocks or a zero block, in a second gzip "
        f"member) is refused, as is a tar header over {MAX_HEADER_BYTES} bytes, an archive of more than "
        f"{MAX_MEMBERS} entries or a scan of more than {MAX_SCAN_MEMBERS} archive entries (exit 2). "
        f"Our rules: {', '.join(RULES)}. Findings are exit 1; each prints as file:line:rule with the match "
        "redacted.",
    )
    scan.add_argument("paths", nargs="*", type=Path, metavar="PATHS", help="files or directories to scan")
    scan.add_argument("--image", type=Path, help="OCI layout directory, OCI archive or docker archive")
    scan.add_argument(
        "--allow",
        type=Path,
        default=None,
        help=f"allow-list JSON (default: {DEFAULT_ALLOW} of the current directory, when present)",
    )
    scan.add_argument(
        "--scanner",
        type=Path,
        default=None,
        help="the kingfisher binary (default: $SPARKSEAL_SCANNER, else the installed kingfisher-bin package)",
    )
    scan.add_argument("--json", action="store_true", help="print a JSON report")
    scan.set_defaults(handler=_scan, parser=scan)


def _options(module: str, adder: str = "add_commands") -> Callable[[argparse._SubParsersAction], None]:
    """``adder`` of a package's options module (a command's options live beside the code they configure),
    imported only when the parser is built with that package installed."""

    def add(commands: argparse._SubParsersAction) -> None:
        getattr(importlib.import_module(module), adder)(commands)

    return add


# Each command and the package that implements it. The image's sparkseal wheel ships sparkseal.core and
# the packages that run in the image only (sparkseal/BUILD), so there the commands of the others are not
# offered.
_COMMANDS = (
    ("sparkseal.fetch", _options("sparkseal.fetch.options")),
    ("sparkseal.audit", _options("sparkseal.audit.options", "add_verify")),
    ("sparkseal.integrity", _options("sparkseal.integrity.options")),
    ("sparkseal.scan", _add_scan),
    ("sparkseal.audit", _options("sparkseal.audit.options", "add_nccl_diff")),
    ("sparkseal.live_check", _options("sparkseal.live_check.options")),
    ("sparkseal.audit", _options("sparkseal.audit.options", "add_provenance")),
)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the ``sparkseal`` command with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="sparkseal", description="Hermetic, bit-reproducible build of a DSpark-enabled vLLM."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for package, add in _COMMANDS:
        if importlib.util.find_spec(package) is not None:
            add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``sparkseal`` command; return its exit status."""
    args = build_parser().parse_args(argv)
    return args.handler(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
