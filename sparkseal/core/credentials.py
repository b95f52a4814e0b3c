"""Credentials from a netrc file, the one reader of it: private indexes, Debian mirrors and registries.

The fetch helpers (``sparkseal.fetch.credentials``) and the push action (``sparkseal.actions.oci_push``) read
the file pip and curl read, the same way, and show credentials nowhere: :class:`Credentials` prints as
``***`` and a netrc parse error names the file and line, never the token it stopped at.

Standard library only: repository rules run this module with the host ``python3``.
"""

from __future__ import annotations

import base64
import netrc
import os
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
