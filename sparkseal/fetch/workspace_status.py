"""Bazel's workspace status command: which commit of which repository this build is made from.

``.bazelrc`` runs it before every build (``--workspace_status_command``; Bazel runs it in the workspace
root with the caller's environment, under Bazel 4.2.3 and 7.7.1 alike) and writes what it prints into
its stable status file, which the provenance action reads (``sparkseal.core.source`` has the keys and
says why only that action reads them). It asks git:

* the commit: ``git rev-parse --verify HEAD``;
* the tree: ``dirty`` when ``git status --porcelain`` lists anything (a change, a staged file, or an
  untracked file that is not ignored: the build reads those too), else ``clean``;
* the repository: the remote of the checked-out branch, else ``origin``, else the only remote, with any
  credential dropped (``sparkseal.core.source.repository_uri``), ``@refs/heads/BRANCH`` appended when a
  branch is checked out; no usable remote is recorded with the reason.

Outside a git checkout, or without git, it prints why the source is unknown; it always exits 0 (a
failing status command fails the whole build). Standard library only: it runs on the host ``python3``.

    python3 -m sparkseal.fetch.workspace_status [--root DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from sparkseal.core.source import CLEAN, DIRTY, Source, repository_uri, source_uri


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )


def _remote_name(root: Path, branch: str | None) -> str | None:
    """The remote of ``branch`` (``branch.NAME.remote``), else ``origin``, else the only remote."""
    if branch is not None:
        configured = _git(root, "config", "--get", f"branch.{branch}.remote").stdout.strip()
        if configured and configured != ".":
            return configured
    remotes = _git(root, "remote").stdout.split()
    if "origin" in remotes:
        return "origin"
    return remotes[0] if len(remotes) == 1 else None


def read_source(root: Path) -> Source:
    """What git says of the checkout at ``root``."""
    if shutil.which("git") is None:
        return Source(unknown="git is not on PATH, so nothing recorded the commit")
    head = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    if head.returncode != 0:
        inside = _git(root, "rev-parse", "--is-inside-work-tree").stdout.strip() == "true"
        reason = "the git checkout has no commit yet" if inside else "the workspace is not a git checkout"
        return Source(unknown=reason)
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    if status.returncode != 0:
        return Source(unknown=f"git status failed ({status.returncode}), so the tree's state is unknown")
    tree = DIRTY if status.stdout.strip() else CLEAN
    ref = _git(root, "symbolic-ref", "-q", "HEAD").stdout.strip() or None
    branch = ref.removeprefix("refs/heads/") if ref and ref.startswith("refs/heads/") else None
    name = _remote_name(root, branch)
    if name is None:
        uri, reason = None, "the checkout has no remote (or several and none is origin)"
    else:
        uri, reason = repository_uri(_git(root, "remote", "get-url", name).stdout)
    return Source(
        commit=head.stdout.strip(),
        tree=tree,
        uri=source_uri(uri, ref) if uri else None,
        uri_unknown=reason if uri is None else None,
    )


def main(argv: list[str] | None = None) -> int:
    """Print the source keys, one ``KEY value`` line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: .)")
    args = parser.parse_args(argv)
    for line in read_source(args.root).status_lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
