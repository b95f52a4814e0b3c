"""A Debian binary package (.deb) as sparkseal reads it: its ``ar`` members, its member tars, and what an
unpacked root leaves out of its data.

Three readers share it: the secret scan streams a .deb's members from disk (``sparkseal.core.archives``),
the root-file-system builder unpacks the image's base OS (``sparkseal.install.debian_rootfs``) and the
toolchain root the actions' interpreter and compilers (``sparkseal.fetch.toolchain_root``). One reader of
the container gives one answer to "which bytes are this package's data": a .deb whose ``ar`` headers are
malformed, whose sizes are not plain decimals or run past its end, or that holds two members of one name
(``dpkg-deb`` unpacks the first ``data.tar``, a reader by name either one) is refused by all three alike.

It opens no tar itself, since the tar reader that bounds what a header may state is the scan's
(``sparkseal.core.archives``, which reads a .deb's headers here): the scan streams a member tar through
it from disk, and the unpackers open one read whole with it (``sparkseal.install.debian_rootfs``).

Standard library only: the toolchain root runs it on the host's ``python3``.
"""

from __future__ import annotations

import bz2
import fnmatch
import gzip
import lzma
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

AR_MAGIC = b"!<arch>\n"
# An ar member header: name (16 bytes), mtime (12), uid (6), gid (6), mode (8), size (10), "`\n".
AR_HEADER = 60
_SIZE = slice(48, 58)
_END = b"`\n"

# The compressions of a .deb's member tars, by what follows ``.tar`` in the member's name (dpkg-deb writes
# gz, xz and zst, older versions bz2, and none with -Znone), in the order messages list them.
COMPRESSIONS = ("", "gz", "bz2", "xz", "zst")
# Those the unpackers decompress in memory with the standard library: zstd needs the zstandard module,
# which the host's python3 that runs the toolchain root lacks, and no locked .deb uses it.
_INFLATE: dict[str, Callable[[bytes], bytes]] = {
    "": bytes,
    "gz": gzip.decompress,
    "bz2": bz2.decompress,
    "xz": lzma.decompress,
}


class DebError(Exception):
    """A .deb is malformed or unsafe to unpack, clashes with another, or is not the locked one."""


@dataclass(frozen=True)
class ArMember:
    """One member of an ``ar`` archive: its name, where its header and its bytes start, and its size."""

    name: str
    header: int
    start: int
    size: int


def ar_members(raw: IO[bytes], where: str) -> Iterator[ArMember]:
    """The members of the ``ar`` archive ``raw`` (seekable), in archive order, read from their headers.

    Every member is checked before it is handed out: the magic, each header's length and terminator, a
    size of decimal digits that ends within the archive, and a name no earlier member has. A failure is
    a :class:`DebError` that starts with ``where``.
    """
    magic = raw.read(len(AR_MAGIC))
    if magic != AR_MAGIC:
        raise DebError(f"{where}: expected an ar archive starting with {AR_MAGIC!r}, got {magic!r}")
    total = raw.seek(0, 2)
    seen: dict[str, int] = {}
    offset = len(AR_MAGIC)
    while offset < total:
        raw.seek(offset)
        header = raw.read(AR_HEADER)
        if len(header) != AR_HEADER or header[-2:] != _END:
            raise DebError(f"{where}: truncated or corrupt ar header at byte {offset}")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        field = header[_SIZE].rstrip(b" ")
        if not field.isdigit():  # bytes.isdigit: ASCII digits only, no sign, no inner space
            raise DebError(f"{where}: member {name!r}: bad size field {header[_SIZE]!r}")
        size = int(field)
        start = offset + AR_HEADER
        if start + size > total:
            raise DebError(f"{where}: member {name!r} claims {size} bytes, only {total - start} remain")
        if name in seen:
            raise DebError(
                f"{where}: two members named {name!r} (their ar headers at bytes {seen[name]} and "
                f"{offset}); refused, since which one an unpacker reads is not ours to choose"
            )
        seen[name] = offset
        yield ArMember(name, offset, start, size)
        offset = start + size + (size & 1)


def read_members(deb: Path) -> dict[str, bytes]:
    """Every ``ar`` member of the .deb at ``deb`` by name, read whole (the unpackers' locked packages)."""
    with deb.open("rb") as raw:
        listed = list(ar_members(raw, str(deb)))
        members = {}
        for member in listed:
            raw.seek(member.start)
            members[member.name] = raw.read(member.size)
    return members


def tar_member(names: Iterable[str], stem: str, where: str, supported: Iterable[str] = COMPRESSIONS) -> str:
    """The name of the one ``STEM.tar[.COMPRESSION]`` member among ``names`` (``data`` or ``control``).

    ``supported`` are the compressions the caller reads; a member of another is refused by name.
    """
    names = sorted(names)
    found = [name for name in names if name.startswith(f"{stem}.tar")]
    accepted = [f"{stem}.tar" + (f".{c}" if c else "") for c in supported]
    if len(found) != 1:
        raise DebError(
            f"{where}: expected one member of {', '.join(accepted)}, found {found or 'none'} among {names}"
        )
    if found[0] not in accepted:
        raise DebError(f"{where}: {found[0]} is not supported (expected one of {', '.join(accepted)})")
    return found[0]


def compression(member: str) -> str:
    """The compression of a member tar, by its name: ``data.tar.xz`` -> ``xz``, ``data.tar`` -> ``""``."""
    return member.partition(".tar")[2].removeprefix(".")


def inflated(members: dict[str, bytes], stem: str, where: str) -> tuple[str, bytes]:
    """The one ``STEM.tar[.gz|.bz2|.xz]`` member of a .deb read whole: its name and its tar's bytes."""
    name = tar_member(members, stem, where, _INFLATE)
    try:
        return name, _INFLATE[compression(name)](members[name])
    except (lzma.LZMAError, OSError, EOFError, zlib.error, ValueError) as exc:
        raise DebError(f"{where}: {name}: cannot read: {exc}") from exc


@dataclass(frozen=True)
class DropPolicy:
    """What an unpacked root leaves out of its packages' data: what lies below ``folders``, except the
    paths ``keep`` matches (``fnmatch`` over the whole path, ``*`` spanning ``/``).

    A folder itself stays (a directory of the root, its mode and owner recorded): only what it holds is
    dropped. Paths are relative to the root, as a package's data tar names them.
    """

    folders: tuple[str, ...]
    keep: tuple[str, ...] = ()

    def drops(self, path: PurePosixPath) -> bool:
        """Whether ``path`` is left out."""
        text = path.as_posix()
        if not any(text.startswith(folder + "/") for folder in self.folders):
            return False
        return not any(fnmatch.fnmatchcase(text, pattern) for pattern in self.keep)


# What no program of the image or the build reads: documentation, manuals, translations and the
# packaging tools' notes. Both roots drop these; each variant adds its own.
_DOCUMENTATION = (
    "usr/share/doc",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/locale",
    "usr/share/man",
)
# The named variants. ``slim`` (the image's base OS, ``debian_rootfs(exclude = ...)``) drops what
# Debian's own slim container images drop and keeps every copyright file, which the licences require of
# a root that ships. ``toolchain`` (the actions' interpreter and compilers, never shipped) keeps no
# copyright and drops the bug-report, debugger and shell-completion scripts too, so that the repository
# and the action inputs stay small. ``none`` keeps everything.
DROP_POLICIES: dict[str, DropPolicy] = {
    "none": DropPolicy(()),
    "slim": DropPolicy(
        tuple(sorted((*_DOCUMENTATION, "usr/share/groff", "usr/share/linda"))), ("usr/share/doc/*/copyright",)
    ),
    "toolchain": DropPolicy(
        tuple(sorted((*_DOCUMENTATION, "usr/share/bash-completion", "usr/share/bug", "usr/share/gdb")))
    ),
}
