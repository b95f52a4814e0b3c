"""Credentials for Bazel's downloads: the ``auth`` argument of ``repository_ctx.download`` for each URL.

CI systems reach private indexes with credentials in ``PIP_INDEX_URL`` or in a netrc file, the two ways
pip itself accepts; ``sparkseal.core.credentials`` reads both (and ``sparkseal.fetch.index.request``
builds the requests the index lookup and the download send with them). Here they are handed to
repository rules, which download with Bazel's own downloader: beside the URL (``auth``), never inside it,
so neither a message, a log, a lock, the provenance nor the SBOM can carry them. The index whose
credentials apply comes from ``sparkseal.fetch.index``; nothing there imports this module, so the two
never import each other.

Standard library only: repository rules run this module with the host ``python3``.
"""

from __future__ import annotations

import json
import sys

from sparkseal.core.credentials import CredentialsError, for_url, redact, split_credentials
from sparkseal.fetch.index import FetchError, index_url


def bazel_auth(url: str, index: str | None = None) -> dict[str, dict[str, str]]:
    """The ``auth`` argument of ``repository_ctx.download``: ``{url: {type, login, password}}`` or ``{}``."""
    clean, _ = split_credentials(url)
    found = for_url(url, index)
    if found is None:
        return {}
    return {clean: {"type": "basic", "login": found.login, "password": found.password}}


def main(argv: list[str] | None = None) -> int:
    """``python3 -m sparkseal.fetch.credentials URL...``: what Bazel's download needs for each URL.

    Prints one JSON object, ``{URL: {"url": URL without credentials, "auth": AUTH}}``, for repository
    rules that download from hosts other than the index (the Debian mirrors apt names). The output goes
    to the rule, never to the terminal; a failure prints one ``sparkseal:`` line to stderr and exits 1.
    """
    urls = sys.argv[1:] if argv is None else argv
    try:
        index: str | None = index_url()
    except FetchError:
        index = None
    answer = {}
    for url in urls:
        try:
            answer[url] = {"auth": bazel_auth(url, index), "url": split_credentials(url)[0]}
        except (CredentialsError, ValueError) as error:
            print(f"sparkseal: {redact(url)}: {error}", file=sys.stderr)
            return 1
    print(json.dumps(answer, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
