"""Copying and listing of source trees inside build actions (regular files only, normalised modes)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from sparkseal.core.determinism import DIR_MODE, EXEC_MODE, FILE_MODE, SOURCE_DATE_EPOCH

# Bazel hands every input file to an action as mode 0555, so a tree's own bits say nothing: content
# decides instead. ELF objects and scripts with a shebang are the files that are run.
_EXECUTABLE_MAGIC = (b"\x7fELF", b"#!")


def content_mode(source: Path) -> int:
    """0755 when the file starts with an ELF magic or ``#!``, else 0644."""
    with source.open("rb") as stream:
        head = stream.read(4)
    return EXEC_MODE if head.startswith(_EXECUTABLE_MAGIC) else FILE_MODE


def normalised_mode(mode: int) -> int:
    """Map any permission bits to the two modes our outputs use."""
    return EXEC_MODE if mode & 0o111 else FILE_MODE


def list_files(root: Path) -> list[str]:
    """Return the sorted POSIX paths of the files under ``root``; fail on anything else.

    Input trees are read through the sandbox, which presents each file as a symlink to the real one, so
    links to regular files are followed here. Trees we write never contain links: the unpack, patch and
    overlay steps refuse to create them, and ``copy_tree`` writes plain files.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_file():
                raise ValueError(f"{path}: not a regular file")
            found.append(path.relative_to(root).as_posix())
    return sorted(found)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy the regular files of ``src`` into ``dst`` with writable, normalised modes."""
    for rel in list_files(src):
        source = src / rel
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        os.chmod(target, normalised_mode(source.stat().st_mode))


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [*dirnames, *sorted(filenames)]:
            yield Path(dirpath) / name


def normalize_tree(root: Path) -> None:
    """Give every entry under ``root`` a fixed mode and mtime; fail on anything but files and directories."""
    for path in _walk(root):
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            path.chmod(DIR_MODE)
        elif stat.S_ISREG(mode):
            path.chmod(EXEC_MODE if mode & 0o111 else FILE_MODE)
        else:
            raise ValueError(f"{path}: expected a regular file or directory, found mode {oct(mode)}")
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
    os.utime(root, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
