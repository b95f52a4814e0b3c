"""Repository-rule helper for error reports: download a URL to scratch space and print its sha256.

When Bazel's verified download fails, its result says only ``success = False``. This second client (Python's
urllib) tells the two causes apart for the error message: a digest other than the locked one is a real
mismatch; the locked digest means the file is fine and Bazel's own transfer failed (a proxy, TLS, a cut
transfer). The scratch copy is deleted; nothing reaches the repository cache.
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
