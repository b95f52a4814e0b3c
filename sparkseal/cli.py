"""The ``sparkseal`` command: argument parsing only; the work is done by the sparkseal packages.

Exit status: 0 all good, 1 a finding (or a failed fetch), 2 a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable


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
    ("sparkseal.scan", _options("sparkseal.scan.options")),
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
