"""The members of the archives ``sparkseal scan`` finds under its PATHS: wheels, zips, sdists, tars, .debs.

A secret inside a wheel or an sdist is as leaked as one beside it, but a compressed archive's bytes hide
it from every rule; so the scan opens them and scans their members (``sparkseal.core.scan``). Which
archive a file is, is told by its name (``.whl``, ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``,
``.tar.bz2``/``.tbz2``, ``.tar.xz``/``.txz``, ``.tar.zst``/``.tzst``, ``.deb``), never sniffed from its
bytes: a torch checkpoint or a ``.jar`` is a zip too, and opening every zip-shaped file would change what
the scan reads without anyone asking for it.

Nothing here writes a member anywhere: each regular member is handed out as a stream with its name, and
the caller decides where its bytes go (the scan writes them below a private scratch directory under a
name of its own, so an absolute member path or one with ``..`` is only ever a label). Links, directories
and devices are skipped, never followed. An archive that would unpack to more than
:data:`MAX_UNPACKED_BYTES`, or (past :data:`RATIO_FROM_BYTES`) to more than :data:`MAX_COMPRESSION_RATIO`
times its own size, is refused before the member that crosses the limit is read: a zip as a whole from
its directory, before any member; a tar member by member, from each header, since a compressed tar
states its size nowhere else. Every failure is an :class:`ArchiveError` naming the archive, the format
its name promised, and what went wrong.

Standard library only, besides the zstandard module for ``.tar.zst`` (``sparkseal.core.pzstd``).
"""

from __future__ import annotations

import io
import lzma
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sparkseal.core.debian_rootfs import DebError, read_ar
from sparkseal.core.pzstd import ZstdUnavailable, load_zstandard
from sparkseal.core.pzstd import reader as zstd_reader

# How many archives deep the scan opens: an archive under PATH is level 1, a wheel inside it level 2, ...
# An archive nested deeper is not opened: it is scanned as a file, whose bytes only our own rules read
# (Kingfisher, told not to extract archives, skips a file that looks like one).
MAX_ARCHIVE_DEPTH = 3
# What one archive found under PATH may unpack in all, its nested archives included. A torch wheel with
# its CUDA libraries unpacks to a few GiB; many times that is a bomb, or at least no scan to wait for.
MAX_UNPACKED_BYTES = 16 << 30
# Unpacked bytes per byte of archive. Text compresses 5-10x and shared objects 2-4x; a run of one byte
# compresses 1000x (deflate) or more (bzip2, xz, zstd), which is what a bomb is made of.
MAX_COMPRESSION_RATIO = 100
# The ratio is judged only past this many unpacked bytes: a small archive of repetitive text may
# compress 200x and is harmless.
RATIO_FROM_BYTES = 16 << 20


class ArchiveError(Exception):
    """An archive cannot be read, or is refused as a bomb; the message names it and its expected format."""


@dataclass(frozen=True)
class ArchiveKind:
    """A format the scan opens: how messages call it, its container and (of a tar) its compression."""

    description: str
    container: str  # "zip", "tar" or "deb"
    compression: str = ""  # of a tar: "", "gz", "bz2", "xz" or "zst"


_TAR_KINDS = {
    "": ArchiveKind("a tar archive", "tar"),
    "gz": ArchiveKind("a gzip-compressed tar archive", "tar", "gz"),
    "bz2": ArchiveKind("a bzip2-compressed tar archive", "tar", "bz2"),
    "xz": ArchiveKind("an xz-compressed tar archive", "tar", "xz"),
    "zst": ArchiveKind("a zstd-compressed tar archive", "tar", "zst"),
}
# By the end of a file's name, compared in lower case.
KINDS: dict[str, ArchiveKind] = {
    ".whl": ArchiveKind("a wheel (a zip archive)", "zip"),
    ".zip": ArchiveKind("a zip archive", "zip"),
    ".deb": ArchiveKind("a Debian package (an ar archive with a data.tar member)", "deb"),
    ".tar.gz": _TAR_KINDS["gz"],
    ".tgz": _TAR_KINDS["gz"],
    ".tar.bz2": _TAR_KINDS["bz2"],
    ".tbz2": _TAR_KINDS["bz2"],
    ".tar.xz": _TAR_KINDS["xz"],
    ".txz": _TAR_KINDS["xz"],
    ".tar.zst": _TAR_KINDS["zst"],
    ".tzst": _TAR_KINDS["zst"],
    ".tar": _TAR_KINDS[""],
}
# A .deb's data member: data.tar or data.tar.<compression> (dpkg writes gz, xz and zst, older ones bz2).
_DEB_DATA = {
    "data.tar": "",
    "data.tar.gz": "gz",
    "data.tar.bz2": "bz2",
    "data.tar.xz": "xz",
    "data.tar.zst": "zst",
}

# What a corrupt member's bytes raise while they are read, by container and decompressor.
_READ_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    NotImplementedError,  # a zip compression method Python does not implement
    RuntimeError,  # a zip member that needs a password
    ValueError,
)


def archive_kind(name: str) -> ArchiveKind | None:
    """The archive format ``name`` promises by its suffix, or None for a file scanned as bytes."""
    lowered = name.lower()
    return next((kind for suffix, kind in KINDS.items() if lowered.endswith(suffix)), None)


def member_name(name: str) -> str:
    """A member's name as findings show it: without ``./`` or a leading ``/``; ``..`` is kept, as a label."""
    return name.removeprefix("./").lstrip("/")


@dataclass
class Budget:
    """The bytes one archive under PATH has unpacked so far, its nested archives' members included."""

    used: int = 0


@dataclass(frozen=True)
class Member:
    """A regular member of an archive: its name, its size, and a stream of its bytes (read it once)."""

    name: str
    size: int
    stream: IO[bytes]


def _unreadable(shown: str, kind: ArchiveKind, error: BaseException, what: str = "") -> ArchiveError:
    detail = str(error) or type(error).__name__
    where = f" (member {what})" if what else ""
    return ArchiveError(f"{shown}: expected {kind.description}, cannot read it{where}: {detail}")


def _admit(shown: str, packed: int, unpacked: int, budget: Budget, extra: int, what: str) -> None:
    """Refuse an archive whose members (``what``) would unpack past a limit, before they are read."""
    total = budget.used + extra
    if total > MAX_UNPACKED_BYTES:
        raise ArchiveError(
            f"{shown}: refused as an archive bomb, not unpacked: {what} would bring what it unpacks to "
            f"{total} bytes, over the limit of {MAX_UNPACKED_BYTES} bytes (MAX_UNPACKED_BYTES)"
        )
    if unpacked > RATIO_FROM_BYTES and unpacked > MAX_COMPRESSION_RATIO * max(packed, 1):
        raise ArchiveError(
            f"{shown}: refused as an archive bomb, not unpacked: {what} would unpack to {unpacked} bytes "
            f"from {packed}, {unpacked // max(packed, 1)} times its size, over the limit of "
            f"{MAX_COMPRESSION_RATIO} times (MAX_COMPRESSION_RATIO)"
        )


class _Guarded(io.RawIOBase):
    """A member's stream whose corrupt bytes raise :class:`ArchiveError` (named), not a format's own error.

    The caller writes what it reads: an error of that write (a full disk) must stay what it is, so the
    conversion happens here, around the read alone.
    """

    def __init__(
        self,
        stream: IO[bytes],
        shown: str,
        kind: ArchiveKind,
        name: str,
        errors: tuple[type[BaseException], ...],
    ) -> None:
        super().__init__()
        self._stream, self._shown, self._kind, self._name, self._errors = stream, shown, kind, name, errors

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except self._errors as error:
            raise _unreadable(self._shown, self._kind, error, self._name) from error

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _zip_members(path: Path, shown: str, kind: ArchiveKind, budget: Budget) -> Iterator[Member]:
    try:
        archive = zipfile.ZipFile(path)
    except _READ_ERRORS as error:
        raise _unreadable(shown, kind, error) from error
    with archive:
        entries = [
            info
            for info in archive.infolist()
            if not info.is_dir() and not stat.S_ISLNK(info.external_attr >> 16)  # links are not followed
        ]
        declared = sum(info.file_size for info in entries)
        # The directory states every size: a bomb is refused before its first member is read. zipfile
        # reads no more than a member's stated size, so the sizes cannot lie about what is unpacked.
        _admit(shown, path.stat().st_size, declared, budget, declared, f"its {len(entries)} members")
        for info in entries:
            if info.flag_bits & 0x1:
                raise ArchiveError(
                    f"{shown}: expected {kind.description}, cannot read it (member {info.filename}): "
                    "the member is encrypted, so its content cannot be scanned"
                )
            try:
                stream = archive.open(info)
            except _READ_ERRORS as error:
                raise _unreadable(shown, kind, error, info.filename) from error
            with stream:
                budget.used += info.file_size
                yield Member(
                    member_name(info.filename),
                    info.file_size,
                    _Guarded(stream, shown, kind, info.filename, _READ_ERRORS),
                )


def _tar_members(
    raw: IO[bytes], packed: int, shown: str, kind: ArchiveKind, compression: str, budget: Budget
) -> Iterator[Member]:
    errors = _READ_ERRORS
    if compression == "zst":
        try:
            zstandard = load_zstandard()
        except ZstdUnavailable as error:
            raise ArchiveError(
                f"{shown}: expected {kind.description}, cannot open it: the zstandard module cannot be "
                f"imported ({error.__cause__}); install it (the locked version is named in "
                "third_party/zstd/zstandard.lock.json) to scan zstd archives"
            ) from error
        errors = (*errors, zstandard.ZstdError)
        source: IO[bytes] = zstd_reader(raw, zstandard)  # type: ignore[arg-type]
        mode = "r|"
    else:
        source, mode = raw, f"r|{compression}"
    try:
        tar = tarfile.open(fileobj=source, mode=mode)  # noqa: SIM115 - closed below
    except errors as error:
        raise _unreadable(shown, kind, error) from error
    unpacked = 0
    with tar:
        members = iter(tar)
        while True:
            try:
                member = next(members)
            except StopIteration:
                return
            except errors as error:
                raise _unreadable(shown, kind, error) from error
            if not member.isfile():  # directories, links (not followed), devices
                continue
            name = member_name(member.name)
            # Only the headers read so far state sizes: judged member by member, before each is read.
            _admit(shown, packed, unpacked + member.size, budget, member.size, f"its members up to {name}")
            unpacked += member.size
            budget.used += member.size
            try:
                stream = tar.extractfile(member)
            except errors as error:
                raise _unreadable(shown, kind, error, name) from error
            assert stream is not None  # a regular member always has content
            yield Member(name, member.size, _Guarded(stream, shown, kind, name, errors))


def _deb_members(path: Path, shown: str, kind: ArchiveKind, budget: Budget) -> Iterator[Member]:
    """The members of a .deb's data.tar, read with the rootfs builder's ar reader (the .deb in memory).

    Its tar reader is not used: it decompresses a whole member in memory with no limit, where the scan
    must refuse a bomb before unpacking it, and it does not read zstd (Ubuntu's .debs).
    """
    try:
        members = read_ar(path.read_bytes(), shown)
    except (DebError, OSError) as error:
        detail = str(error).removeprefix(f"{shown}: ")  # the reader names the file too
        raise ArchiveError(f"{shown}: expected {kind.description}, cannot read it: {detail}") from error
    data = sorted(name for name in members if name.startswith("data.tar"))
    if len(data) != 1 or data[0] not in _DEB_DATA:
        raise ArchiveError(
            f"{shown}: expected {kind.description}, cannot read it: expected one member of "
            f"{', '.join(_DEB_DATA)}, found {data or 'none'} among {sorted(members)}"
        )
    content, compression = members[data[0]], _DEB_DATA[data[0]]
    tar = ArchiveKind(f"a Debian package whose {data[0]} is {_TAR_KINDS[compression].description}", "tar")
    yield from _tar_members(io.BytesIO(content), len(content), shown, tar, compression, budget)


def members(path: Path, shown: str, kind: ArchiveKind, budget: Budget) -> Iterator[Member]:
    """The regular members of the archive at ``path`` (named ``shown`` in messages), in archive order.

    Each member's stream must be read before the next member is asked for (tars are read as streams).
    """
    if kind.container == "zip":
        yield from _zip_members(path, shown, kind, budget)
    elif kind.container == "deb":
        yield from _deb_members(path, shown, kind, budget)
    else:
        with path.open("rb") as raw:
            yield from _tar_members(raw, path.stat().st_size, shown, kind, kind.compression, budget)
