"""The command-line options of ``sparkseal scan``, beside the secret scan they run."""

from __future__ import annotations

import argparse
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


def add_commands(commands: argparse._SubParsersAction) -> None:
    """The ``scan`` command: its help states the archive limits from the module that enforces them."""
    from sparkseal.core.archives import (
        HEADERS,
        KINDS,
        MAX_ARCHIVE_DEPTH,
        MAX_HEADER_BYTES,
        MAX_MEMBERS,
        MAX_SCAN_MEMBERS,
        OUTSIDE,
    )
    from sparkseal.scan.scanner import DEFAULT_ALLOW, DEFAULT_IMAGE_ALLOW
    from sparkseal.scan.secret_rules import RULES

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
        "'symbolic links' too, and each archive's own bytes as well: the bytes of a zip outside its members "
        f"(its comment, data prepended, appended or between members) by both rule sets, as ARCHIVE!{OUTSIDE} "
        "for the catalogue, the whole archive by our rules; the bytes of a tar (a .deb's data.tar too) that "
        "are no member's data (its headers: every pax record, GNU long names, owner, group and link fields; "
        "the padding after each member; entries of a type no reader knows) by both rule sets, as "
        f"ARCHIVE!{HEADERS}, a finding at the line of the tar decompressed (not in --image layers); a "
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
        help=f"allow-list JSON for everything scanned (default, from the current directory when present: "
        f"{DEFAULT_ALLOW} for the files, {DEFAULT_IMAGE_ALLOW} for --image, the list the image build's "
        "layer scans read)",
    )
    scan.add_argument(
        "--scanner",
        type=Path,
        default=None,
        help="the kingfisher binary (default: $SPARKSEAL_SCANNER, else the installed kingfisher-bin package)",
    )
    scan.add_argument("--json", action="store_true", help="print a JSON report")
    scan.set_defaults(handler=_scan, parser=scan)
