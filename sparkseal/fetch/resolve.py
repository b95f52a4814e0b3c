"""Turn a locked filename into its download URL on the configured index.

Used by repository rules: ``python3 -m sparkseal.fetch.resolve --sha256 HEX FILENAME`` prints the URL and
exits 0; on failure it prints one line beginning ``sparkseal: `` to stderr and exits 1. The download itself
(and the final sha256 check) is left to Bazel's downloader.
"""

from __future__ import annotations

import argparse
import re
import sys

from sparkseal.fetch.index import FetchError, lookup


def resolve(filename: str, sha256: str, index: str | None = None) -> str:
    """Return the download URL of ``filename``; fail if the index lists a sha256 other than ``sha256``."""
    file = lookup(filename, index)
    if file.sha256 is not None and file.sha256 != sha256.lower():
        raise FetchError(
            f"{filename}: the index {file.page_url} lists sha256 {file.sha256}, but the lock expects {sha256}"
        )
    return file.url


def _sha256_arg(value: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise argparse.ArgumentTypeError(f"expected 64 hex digits, got {value!r}")
    return value.lower()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python3 -m sparkseal.fetch.resolve",
        description="Print the download URL of a locked artifact, as listed by the package index.",
    )
    parser.add_argument("--sha256", required=True, type=_sha256_arg, help="the locked sha256 of the file")
    parser.add_argument("--index", help="index URL (default: PIP_INDEX_URL, then pip's configuration)")
    parser.add_argument("filename", help="the locked filename, e.g. vllm-0.25.1.tar.gz")
    args = parser.parse_args(argv)
    try:
        url = resolve(args.filename, args.sha256, args.index)
    except FetchError as exc:
        message = " ".join(str(exc).split())
        print(f"sparkseal: {message}", file=sys.stderr)
        return 1
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
