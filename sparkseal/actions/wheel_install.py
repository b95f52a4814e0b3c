"""Action: install a set of wheels into a ``/opt/venv`` tree output (``sparkseal.install.venv``).

The image does not use it (its wheel layers install into a scratch directory that only the layer's tar
keeps); it is the rule for a build that wants the installed files themselves, e.g. to inspect them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkseal.core.repo_names import apparent_text
from sparkseal.core.wheels import PLATFORMS, WheelError
from sparkseal.install.venv import DEFAULT_PREFIX, InstallError, install_wheels, read_replaces


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    parser.add_argument("--platform", required=True, choices=PLATFORMS, help="target wheel platform")
    parser.add_argument("--installer", type=Path, required=True, help="the locked installer wheel")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"venv path in the image ({DEFAULT_PREFIX})")
    parser.add_argument("--no-pyvenv-cfg", action="store_true", help="leave pyvenv.cfg to another layer")
    parser.add_argument("--out", type=Path, required=True, help="output tree (empty directory)")
    parser.add_argument("--wheel", type=Path, action="append", default=[], help="a wheel to install")
    parser.add_argument("--replaces", type=Path, help="JSON policy: which project may replace whose files")
    args = parser.parse_args(argv)
    try:
        replaces = read_replaces(args.replaces) if args.replaces else {}
        install_wheels(
            args.wheel, args.out, args.platform, args.installer, args.prefix, not args.no_pyvenv_cfg, replaces
        )
    except (InstallError, WheelError, ValueError) as exc:
        print(f"sparkseal: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
