"""Credentials for private indexes, Debian mirrors and registries: the one reader of them.

Two sources, the two pip itself accepts: ``user:password@`` in the index URL, else a netrc entry for
the host (the file pip and curl read, read the same way). The fetch helpers (the index lookup, the
download, ``sparkseal.fetch.credentials`` for Bazel's downloads) and the push action
(``sparkseal.actions.oci_push``) all come here, and show credentials nowhere: :class:`Credentials` prints
as ``***``, every URL that reaches a message goes through :func:`redact` first, a request carries them in
an ``Authorization`` header beside the URL, never inside it (``sparkseal.fetch.index.request``, which the
download uses too: the request belongs to the network side, above this pure reader), and a netrc parse
error names the file and line, never the token it stopped at.

Standard library only: repository rules run this module with the host ``python3``.
"""

from __future__ import annotations

import base64
import netrc
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

# What a message shows in place of a URL's user name and password.
REDACTED = "***"


class CredentialsError(Exception):
    """The netrc file cannot be read; the message names the file, never its content."""


@dataclass(frozen=True)
class Credentials:
    """A login and password for HTTP basic authentication, and where they came from."""

    login: str
    password: str
    source: str  # "the index URL" or the netrc file's path, for messages

    def header(self) -> str:
        """The value of the ``Authorization`` header."""
        token = base64.b64encode(f"{self.login}:{self.password}".encode()).decode("ascii")
        return f"Basic {token}"

    def __repr__(self) -> str:
        return f"Credentials(login={REDACTED!r}, password={REDACTED!r}, source={self.source!r})"


def netrc_path() -> Path | None:
    """The netrc file pip and curl would read: ``NETRC``, else ``~/.netrc``; None when there is none."""
    named = os.environ.get("NETRC", "").strip()
    if named:
        return Path(named)
    home = os.environ.get("HOME", "").strip()
    return Path(home) / ".netrc" if home else None


def from_netrc(host: str, path: Path | None = None) -> Credentials | None:
    """The netrc entry for ``host`` (else the ``default`` entry), or None without file or entry."""
    path = path if path is not None else netrc_path()
    if path is None or not path.is_file():
        return None
    try:
        entries = netrc.netrc(str(path))
    except netrc.NetrcParseError as error:
        # The parser's own message quotes the offending token, which may be a password: name the line only.
        raise CredentialsError(f"{path}: not a readable netrc file (line {error.lineno})") from None
    except OSError as error:
        raise CredentialsError(f"{path}: cannot read the netrc file: {error.strerror}") from None
    entry = entries.authenticators(host)
    if entry is None:
        return None
    login, _account, password = entry
    return Credentials(login or "", password or "", str(path))


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
