"""The workspace status command on real git checkouts made here: commit, clean or dirty, the remote."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparkseal.core.source import Source, parse_status
from sparkseal.fetch import workspace_status

TOKEN = "glpat-0123456789SECRET"


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=b@example.org", "-c", "user.name=b", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "BUILD").write_text("# top\n")
    (root / ".gitignore").write_text("bazel-*\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "first")
    return root


def _printed(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Source, str]:
    assert workspace_status.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out
    return parse_status(out, "stdout"), out


def test_a_clean_checkout_with_a_token_in_its_remote(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _git(checkout, "remote", "add", "origin", f"https://oauth2:{TOKEN}@gitlab.example.org/acme/sparkseal.git")
    (checkout / "bazel-out").mkdir()  # ignored: no change
    found, out = _printed(checkout, capsys)
    assert found == Source(
        commit=_git(checkout, "rev-parse", "HEAD"),
        tree="clean",
        uri="git+https://gitlab.example.org/acme/sparkseal.git@refs/heads/main",
    )
    assert TOKEN not in out


@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_any_change_git_would_list_makes_the_tree_dirty(
    checkout: Path, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    if change == "modified":
        (checkout / "BUILD").write_text("# changed\n")
    elif change == "untracked":
        (checkout / "extra.bzl").write_text("X = 1\n")
    else:
        (checkout / "new.txt").write_text("x\n")
        _git(checkout, "add", "new.txt")
    found, _ = _printed(checkout, capsys)
    assert (found.tree, found.commit) == ("dirty", _git(checkout, "rev-parse", "HEAD"))


def test_without_remote_or_branch(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found, _ = _printed(checkout, capsys)
    assert (found.uri, found.uri_unknown) == (
        None,
        "the checkout has no remote (or several and none is origin)",
    )
    _git(checkout, "remote", "add", "upstream", "git@github.com:acme/sparkseal.git")
    _git(checkout, "checkout", "-q", "--detach")
    found, _ = _printed(checkout, capsys)
    assert found.uri == "git+ssh://github.com/acme/sparkseal.git"  # detached: no ref to name


def test_outside_git_the_source_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found, out = _printed(tmp_path, capsys)
    assert found == Source(unknown="the workspace is not a git checkout")
    assert out == "STABLE_SPARKSEAL_SOURCE_UNKNOWN the workspace is not a git checkout\n"
    _git(tmp_path, "init", "-q")
    assert _printed(tmp_path, capsys)[0] == Source(unknown="the git checkout has no commit yet")
