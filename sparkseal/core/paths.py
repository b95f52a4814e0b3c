"""Path safety shared by every action that writes into a tree: nothing may escape its root."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath


class UnsafePath(Exception):
    """A relative path is absolute, climbs out with ``..``, or passes through a symlink."""


def check_relative(path: str, where: str) -> PurePosixPath:
    """Return ``path`` as a normalised relative POSIX path, or raise ``UnsafePath`` naming ``where``."""
    if not path:
        raise UnsafePath(f"{where}: empty path")
    if "\\" in path or "\0" in path:
        raise UnsafePath(f"{where}: path {path!r} contains a backslash or NUL byte")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise UnsafePath(f"{where}: absolute path {path!r} is not allowed")
    if any(part == ".." for part in pure.parts):
        raise UnsafePath(f"{where}: path {path!r} escapes its root through '..'")
    parts = [p for p in pure.parts if p != "."]
    if not parts:
        raise UnsafePath(f"{where}: path {path!r} names the root itself")
    return PurePosixPath(*parts)


def resolve_inside(root: Path, rel: PurePosixPath, where: str) -> Path:
    """Join ``rel`` to ``root``, refusing any existing symlink on the way (the target itself included)."""
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise UnsafePath(
                f"{where}: {rel} passes through the symlink {current.relative_to(root)} "
                f"(-> {os.readlink(current)}); symlinks are not allowed in the tree"
            )
    return current
