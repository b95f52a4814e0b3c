"""Credentials for private indexes: ``user:password@`` in the index URL, else a netrc entry for the host.

CI systems reach private indexes with credentials in ``PIP_INDEX_URL`` or in a netrc file, the two ways
pip itself accepts. This module is the one place that reads them. Every URL that reaches a message goes
through :func:`redact` first, and the credentials travel beside the URL (an ``Authorization`` header
here, the ``auth`` argument of Bazel's download in the repository rules), never inside it, so neither a
message, a log, a lock, the provenance nor the SBOM can carry them.

Standard library only: repository rules run this module with the host ``python3``.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request

from sparkseal.core.credentials import REDACTED, Credentials, CredentialsError, from_netrc


def _netloc(parts: urllib.parse.SplitResult) -> str:
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    return host if parts.port is None else f"{host}:{parts.port}"


def _split(url: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as error:
        raise ValueError("its port is not a number") from error
    return parts


def redact(url: str) -> str:
    """``url`` with any user name and password replaced by ``***`` (safe to print)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{REDACTED}@{parts.netloc.rpartition('@')[2]}"))


def split_credentials(url: str) -> tuple[str, Credentials | None]:
    """Split ``url`` into the URL without user name and password, and those credentials (if any)."""
    parts = _split(url)
    if "@" not in parts.netloc:
        return url, None
    clean = urllib.parse.urlunsplit(parts._replace(netloc=_netloc(parts)))
    login = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    return clean, Credentials(login, password, "the index URL")


def for_url(url: str, index: str | None = None) -> Credentials | None:
    """The credentials to send with a request for ``url``.

    Those of the index URL apply to every URL on the index's host and port (so files the index serves
    from its own host are fetched with them, as pip does); any other host is looked up in the netrc file.
    """
    parts = _split(url)
    if parts.scheme not in ("http", "https"):
        return None
    if index is not None:
        index_parts = _split(index)
        _, index_credentials = split_credentials(index)
        if index_credentials is not None and _netloc(index_parts) == _netloc(parts):
            return index_credentials
    if "@" in parts.netloc:
        return split_credentials(url)[1]
    return from_netrc(parts.hostname or "")


def request(
    url: str, index: str | None = None, headers: dict[str, str] | None = None
) -> urllib.request.Request:
    """A request for ``url`` (credentials removed from it) carrying the credentials :func:`for_url` finds.

    The ``Authorization`` header is not passed on to a redirect's target, which may be another host.
    """
    clean, _ = split_credentials(url)
    found = for_url(url, index)
    req = urllib.request.Request(clean, headers=headers or {})
    if found is not None:
        req.add_unredirected_header("Authorization", found.header())
    return req


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
    from sparkseal.fetch.index import FetchError, index_url

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
