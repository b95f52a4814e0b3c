"""Action: unpack the ``vllm/`` package of the locked sdist into a tree and check its commit id."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparkseal.core.repo_names import apparent_text
from sparkseal.core.sdist import SdistError, unpack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sdist", type=Path, required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--commit", required=True, help="locked commit (full or abbreviated)")
    parser.add_argument("--out", type=Path, required=True, help="output tree (an empty directory)")
    args = parser.parse_args(argv)
    try:
        unpack(args.sdist, args.out, args.version, args.commit)
    except SdistError as exc:
        print(f"sparkseal: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
