"""Credentials in a URL or a netrc file: split off, redacted, and a broken netrc named without its content.

How the fetch programs use them against a private index: test_index.py, test_download.py, test_resolve.py and
test_fetch_credentials.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkseal.core.credentials import CredentialsError, for_url, redact, split_credentials


def test_strip_and_redact_percent_encoded_credentials() -> None:
    url = "https://ci%40corp:p%3Ass@index.internal:8443/simple"
    clean, found = split_credentials(url)
    assert clean == "https://index.internal:8443/simple"
    assert found is not None and (found.login, found.password) == ("ci@corp", "p:ss")
    assert redact(url) == "https://***@index.internal:8443/simple"
    assert "p:ss" not in repr(found) and "ci@corp" not in repr(found)
    plain = "https://index.internal/simple"
    assert split_credentials(plain) == (plain, None)


def test_broken_netrc_is_named_without_its_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine files.internal login bob password\nS3cr3tToken extra\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with pytest.raises(CredentialsError) as caught:
        for_url("https://files.internal/a.whl")
    assert str(caught.value).startswith(f"{netrc}: not a readable netrc file (line ")
    assert "S3cr3t" not in str(caught.value)
