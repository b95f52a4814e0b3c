"""The credentials Bazel's repository rules read: per host, from the index URL or a netrc file.

The password is made at test time and every message is checked not to contain it.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from sparkseal.fetch import credentials


def test_index_credentials_apply_to_its_own_host_only(no_netrc: None) -> None:
    index = "http://u:p@127.0.0.1:8080/simple"
    assert credentials.bazel_auth("http://127.0.0.1:8080/packages/a.whl", index) == {
        "http://127.0.0.1:8080/packages/a.whl": {"type": "basic", "login": "u", "password": "p"}
    }
    assert credentials.bazel_auth("http://127.0.0.1:9090/packages/a.whl", index) == {}
    assert credentials.bazel_auth("http://files.internal/a.whl", index) == {}


def test_netrc_gives_credentials_per_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine files.internal login bob password b0b\n")
    monkeypatch.setenv("NETRC", str(netrc))
    auth = credentials.bazel_auth("https://files.internal/a.whl", "https://index.internal/simple")
    assert auth == {"https://files.internal/a.whl": {"type": "basic", "login": "bob", "password": "b0b"}}
    assert credentials.bazel_auth("https://other.internal/a.whl", None) == {}


def test_credentials_helper_for_mirror_urls(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    netrc = tmp_path / "netrc"
    mirror_secret = "mirror-" + secrets.token_hex(4)
    netrc.write_text(f"machine mirror.internal login apt password {mirror_secret}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("PIP_INDEX_URL", "https://index.internal/simple")
    urls = ["https://mirror.internal/pool/a.deb", "https://x:y@other.internal/pool/b.deb"]
    assert credentials.main(urls) == 0
    assert json.loads(capsys.readouterr().out) == {
        urls[0]: {
            "url": urls[0],
            "auth": {urls[0]: {"type": "basic", "login": "apt", "password": mirror_secret}},
        },
        urls[1]: {
            "url": "https://other.internal/pool/b.deb",
            "auth": {"https://other.internal/pool/b.deb": {"type": "basic", "login": "x", "password": "y"}},
        },
    }
