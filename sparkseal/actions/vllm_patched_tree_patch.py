"""Action: copy the previous tree and apply exactly one patch of the series to the copy."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparkseal.core.patchset import PatchError, apply_patch
from sparkseal.core.tree import copy_tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", type=Path, required=True, help="tree before this patch")
    parser.add_argument("--patch", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="tree after this patch (empty directory)")
    args = parser.parse_args(argv)
    try:
        copy_tree(args.src, args.out)
        apply_patch(args.out, args.patch)
    except (PatchError, ValueError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
