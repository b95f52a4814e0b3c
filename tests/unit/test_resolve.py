"""`python -m sparkseal.fetch.resolve`: the URL (and, for a private index, the auth) Bazel downloads a locked
file from, checked against the lock's sha256, from a loopback PEP 691 index."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.fetch import resolve
from tests.servers.fixture_index import LOGIN, FixtureIndex, with_credentials
from tests.unit.test_index import FILES, SDIST, WHEEL

REPO = Path(__file__).resolve().parents[2]


def test_resolve_prints_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    with FixtureIndex(FILES) as idx:
        sha = hashlib.sha256(FILES[SDIST]).hexdigest()
        assert resolve.main(["--sha256", sha.upper(), "--index", idx.url, SDIST]) == 0
        out, err = capsys.readouterr()
        assert (out, err) == (idx.file_url(SDIST) + "\n", "")


def test_resolve_hash_differs_from_lock(capsys: pytest.CaptureFixture[str]) -> None:
    locked = "ab" * 32
    with FixtureIndex(FILES) as idx:
        assert resolve.main(["--sha256", locked, "--index", idx.url, SDIST]) == 1
        out, err = capsys.readouterr()
        actual = hashlib.sha256(FILES[SDIST]).hexdigest()
        assert out == ""
        assert err == (
            f"sparkseal: {SDIST}: the index {idx.page_url('pkg')} lists sha256 {actual}, "
            f"but the lock expects {locked}\n"
        )


def test_resolve_not_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with FixtureIndex(FILES, unlisted={WHEEL}) as idx:
        assert resolve.main(["--sha256", "0" * 64, "--index", idx.url, WHEEL]) == 1
        assert (
            capsys.readouterr().err
            == f"sparkseal: {WHEEL} is not listed by the index {idx.page_url('pkg')}\n"
        )


def test_resolve_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with FixtureIndex(FILES) as idx:
        url = idx.url
    assert resolve.main(["--sha256", "0" * 64, "--index", url, SDIST]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sparkseal: {SDIST}: index unreachable: {url}/pkg/: ")
    assert err.count("\n") == 1


def test_resolve_passes_a_file_the_index_lists_no_hash_for(capsys: pytest.CaptureFixture[str]) -> None:
    with FixtureIndex(FILES, listed_sha256_override={SDIST: None}) as idx:
        assert resolve.main(["--sha256", "0" * 64, "--index", idx.url, SDIST]) == 0
        assert capsys.readouterr().out == idx.file_url(SDIST) + "\n"


def test_resolve_rejects_a_malformed_sha256(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        resolve.main(["--sha256", "xyz", SDIST])
    assert caught.value.code == 2
    assert "argument --sha256: expected 64 hex digits, got 'xyz'" in capsys.readouterr().err


def test_resolve_as_a_program_with_the_index_from_the_environment() -> None:
    with FixtureIndex(FILES) as idx:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PIP_INDEX_URL": idx.url}
        sha = hashlib.sha256(FILES[WHEEL]).hexdigest()
        done = subprocess.run(
            [sys.executable, "-m", "sparkseal.fetch.resolve", "--sha256", sha, WHEEL],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, idx.file_url(WHEEL) + "\n", "")


# --- a private index -----------------------------------------------------------------------------


def test_resolve_gives_bazel_the_url_and_auth_apart(
    no_netrc: None, password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = hashlib.sha256(FILES[SDIST]).hexdigest()
    with FixtureIndex(FILES, basic_auth=(LOGIN, password)) as idx:
        index = with_credentials(idx.url, LOGIN, password)
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
            "PIP_INDEX_URL": with_credentials(idx.url, LOGIN, password + "x"),
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
