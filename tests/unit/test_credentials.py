"""Private indexes: credentials in the index URL or a netrc file, against a loopback index with basic auth.

The password is made at test time and every message is checked not to contain it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.core.credentials import CredentialsError, for_url, redact, split_credentials
from sparkseal.fetch import credentials, resolve
from sparkseal.fetch.download import download
from sparkseal.fetch.index import FetchError, list_files, lookup
from tests.servers.fixture_index import FixtureIndex

REPO = Path(__file__).resolve().parents[2]
SDIST = "pkg-1.0.tar.gz"
FILES = {SDIST: b"sdist bytes\n", "pkg-1.0-py3-none-any.whl": b"wheel bytes\n"}
LOGIN = "ci-reader"


@pytest.fixture
def password() -> str:
    return "pw-" + secrets.token_hex(8)


@pytest.fixture
def no_netrc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No netrc file of the machine's user is read."""
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def _with_credentials(url: str, login: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{login}:{password}@{rest}"


# --- URLs -----------------------------------------------------------------------------------------


def test_strip_and_redact_percent_encoded_credentials() -> None:
    url = "https://ci%40corp:p%3Ass@index.internal:8443/simple"
    clean, found = split_credentials(url)
    assert clean == "https://index.internal:8443/simple"
    assert found is not None and (found.login, found.password) == ("ci@corp", "p:ss")
    assert redact(url) == "https://***@index.internal:8443/simple"
    assert "p:ss" not in repr(found) and "ci@corp" not in repr(found)
    plain = "https://index.internal/simple"
    assert split_credentials(plain) == (plain, None)


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


def test_broken_netrc_is_named_without_its_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine files.internal login bob password\nS3cr3tToken extra\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with pytest.raises(CredentialsError) as caught:
        for_url("https://files.internal/a.whl")
    assert str(caught.value).startswith(f"{netrc}: not a readable netrc file (line ")
    assert "S3cr3t" not in str(caught.value)


# --- the index lookup against a private index -----------------------------------------------------


def test_index_without_credentials_names_the_index(no_netrc: None, password: str) -> None:
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx, pytest.raises(FetchError) as caught:
        list_files("pkg", idx.url)
    assert str(caught.value) == (
        f"index answered HTTP 401 Unauthorized for {idx.url}/pkg/: the index needs credentials; give them "
        "in the index URL (https://USER:PASSWORD@127.0.0.1/...) or in a netrc entry for 127.0.0.1 "
        "(NETRC or ~/.netrc)"
    )


def test_index_with_credentials_in_the_url_fetches_and_verifies(
    no_netrc: None, password: str, tmp_path: Path
) -> None:
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx:
        index = _with_credentials(idx.url, LOGIN, password)
        file = lookup(SDIST, index)
        assert file.url == idx.file_url(SDIST)  # the listed URL carries no credentials
        path, sha256, reused = download(file, tmp_path, index)
        expected = (FILES[SDIST], hashlib.sha256(FILES[SDIST]).hexdigest(), False)
        assert (path.read_bytes(), sha256, reused) == expected
        assert idx.authorized == {"/simple/pkg/": 1, f"/packages/{SDIST}": 1}


def test_index_with_a_wrong_password_fails_without_printing_it(no_netrc: None, password: str) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx, pytest.raises(FetchError) as caught:
        lookup(SDIST, _with_credentials(idx.url, LOGIN, wrong))
    message = str(caught.value)
    assert message == (
        f"{SDIST}: index answered HTTP 401 Unauthorized for http://***@{idx.url.split('://')[1]}/pkg/: "
        "the credentials sent were refused (check the password for 127.0.0.1)"
    )
    assert wrong not in message and password not in message and LOGIN not in message


def test_index_with_credentials_from_netrc(
    monkeypatch: pytest.MonkeyPatch, password: str, tmp_path: Path
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1\n  login {LOGIN}\n  password {password}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx:
        path, _, _ = download(lookup(SDIST, idx.url), tmp_path, idx.url)
        assert path.read_bytes() == FILES[SDIST]
        assert idx.authorized[f"/packages/{SDIST}"] == 1


def test_index_url_with_credentials_and_a_port_is_not_a_crash(no_netrc: None) -> None:
    with FixtureIndex(FILES) as idx:
        url = idx.url
    with pytest.raises(FetchError) as caught:
        list_files("pkg", _with_credentials(url, "user", "secret"))
    message = str(caught.value)
    assert message.startswith(f"index unreachable: http://***@{url.split('://')[1]}/pkg/: ")
    assert "secret" not in message and "user" not in message


def test_a_port_that_is_not_a_number_is_a_clear_error(no_netrc: None) -> None:
    with pytest.raises(FetchError) as caught:
        list_files("pkg", "http://user:secret@index.internal:port/simple")
    assert str(caught.value) == "index URL http://***@index.internal:port/simple: its port is not a number"


# --- what repository rules read ------------------------------------------------------------------


def test_resolve_gives_bazel_the_url_and_auth_apart(
    no_netrc: None, password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = hashlib.sha256(FILES[SDIST]).hexdigest()
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx:
        index = _with_credentials(idx.url, LOGIN, password)
        assert resolve.main(["--bazel-auth", "--sha256", sha, "--index", index, SDIST]) == 0
        out, err = capsys.readouterr()
        url = idx.file_url(SDIST)
        assert json.loads(out) == {
            "url": url,
            "auth": {url: {"type": "basic", "login": LOGIN, "password": password}},
        }
        assert err == ""


def test_resolve_failure_prints_no_credentials(no_netrc: None, password: str) -> None:
    sha = hashlib.sha256(FILES[SDIST]).hexdigest()
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PIP_INDEX_URL": _with_credentials(idx.url, LOGIN, password + "x"),
        }
        done = subprocess.run(
            [sys.executable, "-m", "sparkseal.fetch.resolve", "--bazel-auth", "--sha256", sha, SDIST],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    assert done.returncode == 1 and done.stdout == ""
    assert "HTTP 401 Unauthorized" in done.stderr and "credentials sent were refused" in done.stderr
    assert password not in done.stderr and LOGIN not in done.stderr


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
