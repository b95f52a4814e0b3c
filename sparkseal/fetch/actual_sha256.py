"""Repository-rule helper for error reports: download a URL to scratch space and print its sha256.

Bazel's downloader rejects a file whose sha256 differs from the lock but does not say what it got, and
refuses the same URL again within one fetch; this names the actual hash for the error message. The
scratch copy is deleted; nothing reaches the repository cache.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from sparkseal.fetch.download import download
from sparkseal.fetch.index import FetchError, IndexFile


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python3 -m sparkseal.fetch.actual_sha256 FILENAME URL", file=sys.stderr)
        return 2
    filename, url = args
    with tempfile.TemporaryDirectory(prefix="sparkseal-verify-") as scratch:
        try:
            _, sha256, _ = download(IndexFile(filename, url, None, url), Path(scratch))
        except FetchError as exc:
            print(f"sparkseal: {exc}", file=sys.stderr)
            return 1
    print(sha256)
    return 0


if __name__ == "__main__":
    sys.exit(main())
