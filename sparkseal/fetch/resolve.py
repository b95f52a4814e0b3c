"""Turn a locked filename into its download URL on the configured index.

``python3 -m sparkseal.fetch.resolve --sha256 HEX FILENAME`` prints the URL and exits 0; on failure it
prints one line beginning ``sparkseal: `` to stderr and exits 1. Repository rules add ``--bazel-auth``: the
answer is then a JSON object ``{"url": URL, "auth": AUTH}``, where AUTH is the ``auth`` argument of
``repository_ctx.download`` (the index's credentials or a netrc entry for the file's host; the URL itself
never carries them). The download itself (and the final sha256 check) is left to Bazel's downloader.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from sparkseal.core.credentials import CredentialsError
from sparkseal.fetch.credentials import bazel_auth
from sparkseal.fetch.index import FetchError, index_url, lookup


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
    parser.add_argument(
        "--bazel-auth",
        action="store_true",
        help='print {"url": URL, "auth": AUTH} for repository_ctx.download instead of the URL alone',
    )
    parser.add_argument("filename", help="the locked filename, e.g. vllm-0.25.1.tar.gz")
    args = parser.parse_args(argv)
    try:
        index = args.index if args.index is not None else index_url()
        url = resolve(args.filename, args.sha256, index)
        auth = bazel_auth(url, index) if args.bazel_auth else {}
    except (FetchError, CredentialsError) as exc:
        message = " ".join(str(exc).split())
        print(f"sparkseal: {message}", file=sys.stderr)
        return 1
    print(json.dumps({"auth": auth, "url": url}, sort_keys=True) if args.bazel_auth else url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
