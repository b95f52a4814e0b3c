"""The ``sparkseal`` command: argument parsing only; the work is done by the sparkseal packages.

Exit status: 0 all good, 1 a finding (or a failed fetch), 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

DEFAULT_VLLM_LOCK = Path("third_party/vllm/vllm.lock.json")
DEFAULT_VLLM_SERIES = Path("patches/vllm/series")


def _default_download_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sparkseal" / "downloads"


def _version_arg(value: str) -> str:
    if not re.fullmatch(r"\d+(\.\d+)*([a-z0-9.]*)", value):
        raise argparse.ArgumentTypeError(f"expected a release version such as 0.25.1, got {value!r}")
    return value


def _lock_vllm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.fetch.lock_vllm import lock_vllm

    if not args.lock.parent.is_dir():
        parser.error(f"--lock {args.lock}: directory {args.lock.parent} does not exist")
    series = args.series
    if series is not None and not series.is_file():
        parser.error(f"--series {series}: no such file")
    if series is None:
        if DEFAULT_VLLM_SERIES.is_file():
            series = DEFAULT_VLLM_SERIES
        else:
            print(f"note: no patch series at {DEFAULT_VLLM_SERIES}; the patch check is skipped")
    return lock_vllm(args.version, args.lock, series, args.download_dir, args.index)


def _add_lock(commands: argparse._SubParsersAction) -> None:
    lock = commands.add_parser("lock", help="write a lock file from the package index")
    kinds = lock.add_subparsers(dest="kind", metavar="KIND", required=True)
    vllm = kinds.add_parser(
        "vllm",
        help="lock a vLLM release (sdist, linux_aarch64 and linux_x86_64 wheels, commit)",
        description="Lock a vLLM release: the sdist and the manylinux aarch64/x86_64 wheels with the sha256 "
        "the index lists, and the commit recorded in the sdist. Then report which patches of the series "
        "no longer apply to the release's tree (the patches are not changed).",
    )
    vllm.add_argument("--version", required=True, type=_version_arg, help="the release, e.g. 0.25.1")
    vllm.add_argument(
        "--lock",
        type=Path,
        default=DEFAULT_VLLM_LOCK,
        help=f"lock file to write (default: {DEFAULT_VLLM_LOCK})",
    )
    vllm.add_argument(
        "--series",
        type=Path,
        default=None,
        help=f"patch series to check (default: {DEFAULT_VLLM_SERIES}, skipped if absent)",
    )
    vllm.add_argument(
        "--download-dir",
        type=Path,
        default=_default_download_dir(),
        help="where the sdist is kept; a file already there is reused when its sha256 matches the index "
        "(default: $XDG_CACHE_HOME/sparkseal/downloads)",
    )
    vllm.add_argument("--index", help="index URL (default: PIP_INDEX_URL, then pip's configuration)")
    vllm.set_defaults(handler=_lock_vllm, parser=vllm)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the ``sparkseal`` command with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="sparkseal", description="Hermetic, bit-reproducible build of a DSpark-enabled vLLM."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_lock(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``sparkseal`` command; return its exit status."""
    args = build_parser().parse_args(argv)
    return args.handler(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
