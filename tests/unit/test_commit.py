"""Reading the commit id of a vLLM release from vllm/_version.py, and matching it against the lock."""

from __future__ import annotations

import pytest

from sparkseal.core.commit import CommitMismatch, check_commit, commit_id_from_version_file
from tests.fixtures_vllm import version_file

FULL = "752a3a504485790a2e8491cacbb35c137339ad34"
WHERE = "sdist.tar.gz: vllm-0.25.1/vllm/_version.py"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (version_file("0.25.1", "752a3a504").decode(), "752a3a504"),
        ("__commit_id__ = commit_id = 'g752a3a504'\n", "752a3a504"),
        (f"commit_id = '{FULL}'\n", FULL),
        ('__commit_id__ = "gabcdef1"\n', "abcdef1"),
        ("commit_id: str\n__commit_id__: str\nx = 1\ncommit_id = 'g1234567'\n", "1234567"),
        ("commit_id = None\n__commit_id__ = commit_id = 'g89abcdef'\n", "89abcdef"),
        ("obj.commit_id = 'gdeadbee0'\ncommit_id = 'g0123456'\n", "0123456"),
    ],
)
def test_commit_id_from_version_file(text: str, expected: str) -> None:
    assert commit_id_from_version_file(text, WHERE) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("__version__ = '0.25.1'\n", "no commit_id assignment found"),
        ("__commit_id__ = commit_id = None\n", "no commit_id assignment found"),
        ("commit_id: str = 'g752a3a504'\n", "no commit_id assignment found"),
        ("commit_id = 'g12345'\n", "commit_id 'g12345' is not a git commit id"),
        ("commit_id = 'gABCDEF12'\n", "commit_id 'gABCDEF12' is not a git commit id"),
        ("commit_id = 'v0.25.1'\n", "commit_id 'v0.25.1' is not a git commit id"),
        ("commit_id = ''\n", "commit_id '' is not a git commit id"),
    ],
)
def test_commit_id_errors(text: str, problem: str) -> None:
    with pytest.raises(CommitMismatch) as info:
        commit_id_from_version_file(text, WHERE)
    assert str(info.value) == f"{WHERE}: {problem}"


def test_unparsable_version_file() -> None:
    with pytest.raises(CommitMismatch) as info:
        commit_id_from_version_file("commit_id = (\n", WHERE)
    assert str(info.value).startswith(f"{WHERE}: cannot parse: ")


@pytest.mark.parametrize(
    ("found", "locked"),
    [(FULL, FULL), (FULL[:9], FULL), (FULL, FULL[:9]), (FULL[:7], FULL[:12]), (FULL[:12], FULL[:7])],
)
def test_check_commit_accepts_prefixes(found: str, locked: str) -> None:
    check_commit(found, locked, WHERE)


@pytest.mark.parametrize(
    ("found", "locked"),
    [
        ("752a3a505", FULL),
        (FULL, "752a3a505"),
        ("0" + FULL[1:], FULL),
        (FULL[:9], "a" * 40),
        (FULL[:9], FULL[1:]),
    ],
)
def test_check_commit_rejects_other_commits(found: str, locked: str) -> None:
    with pytest.raises(CommitMismatch) as info:
        check_commit(found, locked, WHERE)
    assert str(info.value) == f"{WHERE}: commit id is {found!r}, but the lock expects commit {locked!r}"


@pytest.mark.parametrize("locked", ["", "7", "752a3a"])
def test_check_commit_refuses_a_lock_too_short_to_name_a_commit(locked: str) -> None:
    # git never abbreviates below 7 hex digits; a shorter (or empty) lock would match almost anything.
    with pytest.raises(CommitMismatch) as info:
        check_commit(FULL[:9], locked, WHERE)
    assert str(info.value).startswith(f"{WHERE}: ")
    assert repr(locked) in str(info.value)
