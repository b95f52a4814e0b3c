"""Fixtures of the unit tests of a private index (credentials in its URL or a netrc file).

The password is made at test time so that every message can be checked not to contain it; no netrc file of
the machine's user is read unless a test writes its own.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest


@pytest.fixture
def password() -> str:
    """A fresh password for a private ``FixtureIndex`` (``basic_auth=(LOGIN, password)``)."""
    return "pw-" + secrets.token_hex(8)


@pytest.fixture
def no_netrc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No netrc file of the machine's user is read."""
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
