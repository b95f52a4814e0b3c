"""Repository-rule helper: print the patch files a ``series`` lists, one per line, after checking it."""

from __future__ import annotations

import sys
from pathlib import Path

from sparkseal.core.patchset import PatchError, read_series


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m sparkseal.fetch.series SERIES", file=sys.stderr)
        return 2
    try:
        patches = read_series(Path(args[0]))
    except (PatchError, OSError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    for patch in patches:
        print(patch.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
