"""Downloads of a looked-up file: verified against the index's sha256, reused, refused, from a public or a
private loopback index."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from sparkseal.fetch.download import download
from sparkseal.fetch.index import FetchError, lookup
from tests.servers.fixture_index import LOGIN, FixtureIndex, with_credentials
from tests.unit.test_index import FILES, SDIST


def test_download_verifies_and_reuses(tmp_path: Path) -> None:
    with FixtureIndex(FILES) as idx:
        file = lookup(SDIST, idx.url)
        path, sha, reused = download(file, tmp_path)
        assert (path, sha, reused, path.read_bytes()) == (tmp_path / SDIST, file.sha256, False, FILES[SDIST])
        assert download(file, tmp_path) == (path, sha, True)
        assert idx.requests[f"/packages/{SDIST}"] == 1


def test_download_replaces_a_stale_cached_file(tmp_path: Path) -> None:
    (tmp_path / SDIST).write_bytes(b"stale")
    with FixtureIndex(FILES) as idx:
        path, _, reused = download(lookup(SDIST, idx.url), tmp_path)
    assert (reused, path.read_bytes()) == (False, FILES[SDIST])


def test_download_rejects_wrong_bytes(tmp_path: Path) -> None:
    with FixtureIndex(FILES, served_bytes_override={SDIST: b"tampered"}) as idx:
        file = lookup(SDIST, idx.url)
        with pytest.raises(FetchError) as caught:
            download(file, tmp_path)
        actual = hashlib.sha256(b"tampered").hexdigest()
        assert str(caught.value) == (
            f"{SDIST}: downloaded from {file.url} has sha256 {actual}, "
            f"but the index {idx.page_url('pkg')} lists {file.sha256}"
        )
    assert list(tmp_path.iterdir()) == []


def test_download_reports_http_errors(tmp_path: Path) -> None:
    with FixtureIndex(FILES) as idx:
        file = lookup(SDIST, idx.url)
        missing = replace(file, url=idx.file_url("gone.tar.gz"), sha256=None)
        with pytest.raises(FetchError) as caught:
            download(missing, tmp_path)
    assert str(caught.value) == f"{SDIST}: cannot download {missing.url}: HTTP Error 404: Not Found"
    assert list(tmp_path.iterdir()) == []


# --- a private index -----------------------------------------------------------------------------


def test_index_with_credentials_in_the_url_fetches_and_verifies(
    no_netrc: None, password: str, tmp_path: Path
) -> None:
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx:
        index = with_credentials(idx.url, LOGIN, password)
        file = lookup(SDIST, index)
        assert file.url == idx.file_url(SDIST)  # the listed URL carries no credentials
        path, sha256, reused = download(file, tmp_path, index)
        expected = (FILES[SDIST], hashlib.sha256(FILES[SDIST]).hexdigest(), False)
        assert (path.read_bytes(), sha256, reused) == expected
        assert idx.authorized == {"/simple/pkg/": 1, f"/packages/{SDIST}": 1}


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
