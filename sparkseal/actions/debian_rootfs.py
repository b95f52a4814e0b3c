"""Action: unpack the locked .debs into a root file system tree (``sparkseal.install.debian_rootfs``).

The image's base layer unpacks the .debs inside its own action, so no image build writes this tree; the
``debian_rootfs`` target builds it to inspect the base OS, or for a layer of another rule that wants a tree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparkseal.core.deb import DROP_POLICIES, DebError
from sparkseal.core.repo_names import apparent_text
from sparkseal.install.debian_rootfs import build_rootfs


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of the action; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", type=Path, required=True, help="the Debian lock the .debs come from")
    parser.add_argument("--out", type=Path, required=True, help="output tree (an empty directory)")
    parser.add_argument("--links", type=Path, required=True, help="output JSON list of symlinks")
    parser.add_argument("--dirs", type=Path, required=True, help="output JSON list of directories")
    parser.add_argument("--exclude", choices=sorted(DROP_POLICIES), default="slim")
    parser.add_argument("debs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        count = build_rootfs(args.debs, args.lock, args.out, args.links, args.dirs, args.exclude)
    except (DebError, OSError, UnicodeDecodeError) as exc:
        print(f"deb_rootfs: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    print(f"deb_rootfs: {count} packages unpacked into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
