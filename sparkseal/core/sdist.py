"""Unpacking the ``vllm/`` package of the locked sdist into a tree, with its commit id checked.

Shared by the vllm_source_tree action and `sparkseal lock vllm` (which checks that the patches still apply).
"""

from __future__ import annotations

import tarfile
import zlib
from pathlib import Path

from sparkseal.core.commit import CommitMismatch, check_commit, commit_id_from_version_file
from sparkseal.core.paths import UnsafePath, check_relative
from sparkseal.core.tree import normalised_mode

PACKAGE = "vllm"
VERSION_FILE = "vllm/_version.py"


class SdistError(Exception):
    """The sdist is unsafe, malformed, or not the locked release."""


def _extract(archive: tarfile.TarFile, sdist: Path, top: str, out: Path) -> tuple[str | None, int]:
    """Write the regular files under ``<top>/vllm/``; return the ``_version.py`` text and the count."""
    written = 0
    version_text: str | None = None
    for member in archive:
        where = f"{sdist}: member {member.name!r}"
        try:
            rel = check_relative(member.name, where)
        except UnsafePath as exc:
            raise SdistError(str(exc)) from exc
        if rel.parts[0] != top:
            raise SdistError(f"{where}: expected every member under {top}/ (the locked version)")
        if member.issym() or member.islnk():
            raise SdistError(f"{where}: links are not allowed (points to {member.linkname!r})")
        if not (member.isfile() or member.isdir()):
            raise SdistError(f"{where}: only regular files and directories are allowed")
        inner = rel.parts[1:]
        if not inner or inner[0] != PACKAGE or member.isdir():
            continue
        source = archive.extractfile(member)
        assert source is not None
        data = source.read()
        target = out.joinpath(*inner)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(normalised_mode(member.mode))
        written += 1
        if "/".join(inner) == VERSION_FILE:
            version_text = data.decode("utf-8")
    return version_text, written


def unpack(sdist: Path, out: Path, version: str, commit: str) -> int:
    """Extract ``<name>-<version>/vllm/**`` into ``out``; return the number of files written."""
    top = f"{PACKAGE}-{version}"
    try:
        with tarfile.open(sdist, "r:*") as archive:
            version_text, written = _extract(archive, sdist, top, out)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise SdistError(f"{sdist}: not a readable tar archive: {exc}") from exc
    if written == 0:
        raise SdistError(f"{sdist}: no files under {top}/{PACKAGE}/")
    if version_text is None:
        raise SdistError(f"{sdist}: {top}/{VERSION_FILE} is missing; cannot check the locked commit")
    where = f"{sdist}: {top}/{VERSION_FILE}"
    try:
        check_commit(commit_id_from_version_file(version_text, where), commit, where)
    except CommitMismatch as exc:
        raise SdistError(str(exc)) from exc
    return written
