"""The members of the archives ``sparkseal scan`` finds under its PATHS: wheels, zips, sdists, tars, .debs.

A secret inside a wheel or an sdist is as leaked as one beside it, but a compressed archive's bytes hide
it from every rule; so the scan opens them and scans their members (``sparkseal.scan.scanner``). Which
archive a file is, is told by its name (``.whl``, ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``,
``.tar.bz2``/``.tbz2``, ``.tar.xz``/``.txz``, ``.tar.zst``/``.tzst``, ``.deb``), never sniffed from its
bytes: a torch checkpoint or a ``.jar`` is a zip too, and opening every zip-shaped file would change what
the scan reads without anyone asking for it.

Nothing here writes a member anywhere: each regular member is handed out as a stream with its name, and
the caller decides where its bytes go (the scan writes them below a private scratch directory under a
name of its own, so an absolute member path or one with ``..`` is only ever a label). A tar's links,
directories and devices are skipped, never followed; a zip member flagged as a link is handed out like any
other, since its bytes are data to an unzip that ignores the flag; a .deb's members besides its data.tar
(the control tar of its maintainer scripts) are handed out whole. A tar is read whole (what follows its
reader's end must be zeros), its headers judged before they are read (:data:`MAX_HEADER_BYTES`), and
entries are counted per archive and per scan (:data:`MAX_MEMBERS`, :data:`MAX_SCAN_MEMBERS`); its bytes
that are no member's data (headers, padding) are handed to the caller's :class:`Skipped` as they are read.
An archive that would unpack to more than :data:`MAX_UNPACKED_BYTES`, or (past :data:`RATIO_FROM_BYTES`)
to more than :data:`MAX_COMPRESSION_RATIO`
times its own size, is refused before the member that crosses the limit is read: a zip as a whole from
its directory, before any member; a tar member by member, from each header, since a compressed tar
states its size nowhere else. Every failure is an :class:`ArchiveError` naming the archive, the format
its name promised, and what went wrong.

Standard library only, besides the zstandard module for ``.tar.zst`` (``sparkseal.core.pzstd``).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sparkseal.core.deb import ArMember, DebError, ar_members, compression, tar_member
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
# Entries (members of any type: files, directories, links; a tar's extension headers are not entries)
# one archive found under PATH may hold, its nested archives' entries included, and one scan in all.
# Each entry costs a header parse and (a file) a scratch copy and a scanner input, and Python's tar
# reader keeps every header it has read: a few KB of compressed empty files would otherwise buy hours
# and gigabytes. A torch wheel has about 15,000 entries, a Debian root file system about 60,000.
MAX_MEMBERS = 250_000
MAX_SCAN_MEMBERS = 1_000_000
# Bytes of one tar extension header (pax ``x``/``g``, GNU long name/link ``L``/``K``), judged from its
# own header block before its content is read; and of all the extension headers in front of one entry,
# and of all the global (``g``) headers of one archive, which the tar reader keeps for the rest of it.
# A path is at most 4096 bytes on Linux; extended attributes (ACLs, capabilities) fit easily too.
MAX_HEADER_BYTES = 1 << 20


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
class Tally:
    """The archive entries one scan has read so far, over every archive it opened."""

    members: int = 0


@dataclass
class Budget:
    """What one archive under PATH has unpacked so far, its nested archives' members included.

    ``scan`` is shared by every archive of one scan, for :data:`MAX_SCAN_MEMBERS`.
    """

    used: int = 0
    members: int = 0
    scan: Tally = field(default_factory=Tally)
    skipped: int = 0  # bytes of its tars that are no member's data, handed out as HEADERS


def _enter(shown: str, budget: Budget, position: int, where: str) -> None:
    """Count one entry (the ``position``-th of ``shown``) before it is read; refuse past a member limit."""
    budget.members += 1
    budget.scan.members += 1
    if budget.members > MAX_MEMBERS:
        raise ArchiveError(
            f"{shown}: refused, not read further: member {position}{where} would bring the entries of the "
            f"archive to {budget.members}, over the limit of {MAX_MEMBERS} (MAX_MEMBERS)"
        )
    if budget.scan.members > MAX_SCAN_MEMBERS:
        raise ArchiveError(
            f"{shown}: refused, not read further: member {position}{where} would bring the archive entries "
            f"of this scan to {budget.scan.members}, over the limit of {MAX_SCAN_MEMBERS} (MAX_SCAN_MEMBERS)"
        )


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
    """Every member but directories, whatever its mode: a zip "symbolic link" holds bytes like any member,
    and an unzip that ignores the flag writes them as a file, so they are scanned, never followed.
    """
    try:
        with path.open("rb") as raw:
            records = end_records(raw)
    except _READ_ERRORS as error:
        raise _unreadable(shown, kind, error) from error
    # The count its end records state, judged before the directory is read into memory; the directory
    # itself is counted again below, since the records' count is not what zipfile reads.
    stated = records.entries
    if budget.members + stated > MAX_MEMBERS or budget.scan.members + stated > MAX_SCAN_MEMBERS:
        _limit_members(shown, budget, stated, "its end record")
    try:
        archive = zipfile.ZipFile(path)
    except _READ_ERRORS as error:
        raise _unreadable(shown, kind, error) from error
    with archive:
        listed = archive.infolist()
        _limit_members(shown, budget, len(listed), "its directory")
        entries = [info for info in listed if not info.is_dir()]
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


# The name, after ``ARCHIVE!``, under which the bytes of an archive that no member covers are handed to
# the catalogue (``sparkseal.scan.scanner``): a finding there reads ``ARCHIVE!(bytes outside the members)``.
# In parentheses and with spaces, as no packaging tool names a file.
OUTSIDE = "(bytes outside the members)"
_LOCAL_HEADER = 30  # a zip local file header's fixed part; its name and extra field follow
_LOCAL_SIGNATURE = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"  # the optional signature of a data descriptor (12 bytes without it, 16 with)

# A zip's end records (APPNOTE.TXT 4.3.14-4.3.16), little-endian, each led by its signature:
# the end of central directory record (disk numbers, entries on this disk and in all, directory size and
# offset, comment length; its comment follows it, up to 65535 bytes);
_END = struct.Struct("<4sHHHHIIH")
_END_SIGNATURE = b"PK\x05\x06"
_MAX_COMMENT = 0xFFFF
# the zip64 end of central directory locator, just before it (the disk of the zip64 record, the record's
# offset, the number of disks);
_LOCATOR = struct.Struct("<4sIQI")
_LOCATOR_SIGNATURE = b"PK\x06\x07"
# the zip64 end of central directory record, before the locator: its size less its first 12 bytes, the
# versions made by and needed, disk numbers, entries on this disk and in all, directory size and offset.
# Its fixed part: what follows it up to the locator would be a v2 "extensible data sector" (see
# :func:`_zip64_records` for why none is accepted).
_END64 = struct.Struct("<4sQHHIIQQQQ")
_END64_SIGNATURE = b"PK\x06\x06"


@dataclass(frozen=True)
class EndRecords:
    """A zip's end records as its own bytes state them (:func:`end_records`); ranges are ``[start, end)``.

    ``directory`` is where a reader finds the central directory: its stated size, ending where the end
    records begin (the zip64 record, else the classic one). zipfile reads it there too, whatever offset
    the records state: the difference is data prepended to the archive, which shifts every member's offset
    alike. ``offset`` is that stated offset, from the start of the archive as written.
    """

    size: int  # of the whole file
    classic: tuple[int, int]  # the end of central directory record, without its comment
    comment: tuple[int, int]  # the comment, as long as its record states, cut at the end of the file
    locator: tuple[int, int] | None  # the zip64 end of central directory locator, if the zip has one
    zip64: tuple[int, int] | None  # the zip64 end of central directory record (its fixed part)
    directory: tuple[int, int]
    entries: int  # the entries the records state in all: the zip64 record's where there is one
    offset: int

    @property
    def structure(self) -> list[tuple[int, int]]:
        """The directory and each end record, in file order: a zip's structure, its comment not included."""
        return [part for part in (self.directory, self.zip64, self.locator, self.classic) if part is not None]


def end_records(raw: IO[bytes]) -> EndRecords:
    """The end records of the zip in the seekable ``raw``, read from its bytes per APPNOTE 4.3.14-4.3.16.

    Not from zipfile's private ``_EndRecData``: its fields are no interface, and they changed within one
    Python (Debian's 3.11.2-6+deb12u9 places a zip64 archive's end at its zip64 record, deb12u6 and 3.11.7
    at its classic record, and only the newer validates the zip64 records), so ranges taken from them
    differed by revision. What is read here is what every revision's zipfile reads where it opens the
    zip, so the directory lies where zipfile reads it, and anything a revision would read otherwise is
    refused:

    The classic record is found as zipfile finds it: at the last 22 bytes if they hold one stating no
    comment, else at the last signature within the last 22 + 65535 bytes (65535 is the longest comment;
    3.11's zipfile searches one byte further back, newer ones do not: a record found only there is refused).
    Its comment length is not required to reach the end of the file, as zipfile requires nothing of it:
    shorter, the rest is data appended to the archive; longer, the comment is cut at the end of the
    file. The two stay outside the members either way, so nothing depends on which it is.

    A zip64 locator is one right before the classic record, as zipfile looks for none elsewhere; its
    zip64 record must lie right before it, whole and consistent (:func:`_zip64_records`). Every failure
    is a :class:`zipfile.BadZipFile` saying which record states what, and what was expected.
    """
    size = raw.seek(0, io.SEEK_END)
    start = _find_end(raw, size)
    raw.seek(start)
    _, _, _, this_disk, total, length, offset, comment = _END.unpack(raw.read(_END.size))
    classic = (start, start + _END.size)
    comment_range = (classic[1], min(classic[1] + comment, size))
    if start >= _LOCATOR.size:
        raw.seek(start - _LOCATOR.size)
        locator = raw.read(_LOCATOR.size)
        if locator.startswith(_LOCATOR_SIGNATURE):
            return _zip64_records(raw, size, classic, comment_range, (this_disk, total, length, offset))
    if length > start:
        raise zipfile.BadZipFile(
            f"its end of central directory record (at byte {start}) states a central directory of {length} "
            f"bytes, expected at most the {start} bytes before the record"
        )
    return EndRecords(size, classic, comment_range, None, None, (start - length, start), total, offset)


def _find_end(raw: IO[bytes], size: int) -> int:
    """Where the classic end record starts, found as zipfile finds it (see :func:`end_records`)."""
    if size >= _END.size:
        raw.seek(size - _END.size)
        last = raw.read(_END.size)
        if last.startswith(_END_SIGNATURE) and last.endswith(b"\0\0"):
            return size - _END.size
    window = max(size - _END.size - _MAX_COMMENT, 0)
    raw.seek(window)
    tail = raw.read()
    found = tail.rfind(_END_SIGNATURE)
    if found < 0:
        raise zipfile.BadZipFile(
            f"File is not a zip file: expected an end of central directory record (signature "
            f"{_END_SIGNATURE!r}) in its last {len(tail)} bytes, found none"
        )
    if len(tail) - found < _END.size:
        raise zipfile.BadZipFile(
            f"File is not a zip file: its last end of central directory record signature, at byte "
            f"{window + found}, is followed by {len(tail) - found - 4} bytes, expected the record's "
            f"{_END.size - 4}"
        )
    return window + found


def _zip64_records(
    raw: IO[bytes],
    size: int,
    classic: tuple[int, int],
    comment: tuple[int, int],
    stated: tuple[int, int, int, int],
) -> EndRecords:
    """The end records of a zip whose classic record (``stated``: entries on this disk and in all,
    directory size and offset) follows a zip64 locator: its zip64 record must be consistent, or refused.

    The record must lie right before the locator, its fixed part alone: deb12u6's zipfile reads it there
    and nowhere else, deb12u9's first where the locator points (then there), so both read the same record
    only if the locator points at it, or (data prepended to the archive) before it at no other zip64
    record. The checks deb12u9 makes are made here for every revision: a single disk, a record of 56
    bytes, and a directory that ends where the locator places the record. A classic record's field holds
    the zip64 record's value or the placeholder that defers to it (APPNOTE 4.4.1.4): a reader that takes
    the classic value must not see another archive.
    """
    locator = classic[0] - _LOCATOR.size
    raw.seek(locator)
    _, disk, pointed, disks = _LOCATOR.unpack(raw.read(_LOCATOR.size))
    named = f"its zip64 end of central directory locator (at byte {locator})"
    if disk != 0:
        raise zipfile.BadZipFile(
            f"{named} places the zip64 end record on disk {disk}, expected disk 0: zipfiles that span "
            "multiple disks are not supported"
        )
    if disks > 1:
        raise zipfile.BadZipFile(
            f"{named} states {disks} disks, expected 1: zipfiles that span multiple disks are not supported"
        )
    record = locator - _END64.size
    if record < 0:
        raise zipfile.BadZipFile(
            f"{named} is preceded by {locator} bytes, expected at least the {_END64.size} of the zip64 end "
            "of central directory record"
        )
    raw.seek(record)
    fields = raw.read(_END64.size)
    if not fields.startswith(_END64_SIGNATURE):
        raise zipfile.BadZipFile(
            f"{named} is not preceded by a zip64 end of central directory record: expected its signature "
            f"{_END64_SIGNATURE!r} at byte {record}, found {fields[:4]!r}"
        )
    _, length, _, _, disk, disk_start, this_disk, total, dir_size, dir_offset = _END64.unpack(fields)
    named64 = f"its zip64 end of central directory record (at byte {record})"
    if length != _END64.size - 12:
        raise zipfile.BadZipFile(
            f"{named64} states a size of {length} bytes after its first 12, expected {_END64.size - 12}: an "
            "extensible data sector is not supported"
        )
    if (disk, disk_start) != (0, 0):
        raise zipfile.BadZipFile(
            f"{named64} states disk {disk}, its directory starting on disk {disk_start}, expected disk 0 "
            "for both: zipfiles that span multiple disks are not supported"
        )
    if this_disk != total:
        raise zipfile.BadZipFile(
            f"{named64} states {this_disk} entries on this disk and {total} in all, expected the same "
            "count on an archive of one disk"
        )
    if pointed > record:
        raise zipfile.BadZipFile(
            f"{named} places the zip64 end record at byte {pointed}, expected byte {record}, where it lies "
            "(or before it, by the bytes prepended to the archive)"
        )
    if dir_offset + dir_size != pointed:
        raise zipfile.BadZipFile(
            f"{named64} states a central directory ending at byte {dir_offset + dir_size} (offset "
            f"{dir_offset} + size {dir_size}), expected byte {pointed}, where its locator places the record"
        )
    if pointed != record:
        raw.seek(pointed)
        if raw.read(len(_END64_SIGNATURE)) == _END64_SIGNATURE:
            raise zipfile.BadZipFile(
                f"{named} places the zip64 end record at byte {pointed}, where another one starts, expected "
                f"byte {record} (or bytes prepended to the archive before it, but no zip64 record): Python "
                "revisions differ on which of the two they read"
            )
    expected = (("entries on this disk", this_disk, 0xFFFF), ("entries in all", total, 0xFFFF))
    expected += (("directory size", dir_size, 0xFFFFFFFF), ("directory offset", dir_offset, 0xFFFFFFFF))
    for (what, value, placeholder), classic_value in zip(expected, stated, strict=True):
        if classic_value not in (value, placeholder):
            raise zipfile.BadZipFile(
                f"its end of central directory record (at byte {classic[0]}) states {classic_value} as its "
                f"{what}, expected {value} as its zip64 end record states, or {placeholder:#x} to defer to it"
            )
    return EndRecords(
        size,
        classic,
        comment,
        (locator, classic[0]),
        (record, locator),
        (record - dir_size, record),
        total,
        dir_offset,
    )


def outside_members(path: Path, shown: str, kind: ArchiveKind) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of the archive at ``path`` that no member's record covers, in order.

    A zip's members are its local file records (header, name, extra field, compressed data, data
    descriptor) of the entries :func:`members` hands out, and of directory entries that hold no data
    (a directory entry's data is never handed out, so its record stays outside); its directory is its
    central directory records and end records: the zip64 end record and its locator where it has them,
    and the classic one without its comment (:func:`end_records`, which reads them from the zip's own
    bytes, so that the ranges are the same on every Python). Everything else is what no unzip hands out
    as a member and yet lies in the file: bytes before the first record (a self-extracting stub, or
    anything prepended), between records, a stored member's data past the size it states (see
    :func:`_local_record`), between the directory and the end records, the archive comment, and bytes
    after it (appended data; zipfile finds the end record up to 64 KiB before the end). Each bound is
    read from the zip's own records: a member's offset, sizes and method from its central directory
    entry, the length of its name and extra field from its local header (the two may differ), the
    directory from the end records. A local header without its signature covers nothing, so its bytes
    stay outside too: nothing is assumed covered that a record does not state.

    A tar has none: it is read whole, and bytes past where its reader stops that are not zeros are
    refused (:func:`_tar_members`); its bytes that are no member's data are :class:`Skipped`. An ar
    archive (a .deb) has none either: its members are read header after header from its magic to its
    last byte, each member's data following its header (an odd one padded with one byte), and a
    truncated or corrupt header, or a second member of one name, is refused
    (``sparkseal.core.deb.ar_members``).
    """
    if kind.container != "zip":
        return []
    try:
        with path.open("rb") as raw:
            records = end_records(raw)
            with zipfile.ZipFile(raw) as archive:
                covered = [
                    part
                    for info in archive.infolist()
                    if not info.is_dir() or not info.file_size
                    for part in _local_record(raw, info)
                ]
    except _READ_ERRORS as error:
        raise _unreadable(shown, kind, error) from error
    return _uncovered(covered + records.structure, records.size)


def _local_record(raw: IO[bytes], info: zipfile.ZipInfo) -> list[tuple[int, int]]:
    """The bytes of one member's local record: its header, name, extra field, data and data descriptor.

    A stored member's data is covered up to its stated size only: zipfile hands out that many bytes and
    no more, so what its compressed size states beyond them stays outside. (A compressed member's
    data is covered whole: where its stream ends is known only by decompressing it.)
    """
    start = info.header_offset
    raw.seek(start)
    header = raw.read(_LOCAL_HEADER)
    if len(header) != _LOCAL_HEADER or header[:4] != _LOCAL_SIGNATURE:
        return []
    flags, name, extra = int.from_bytes(header[6:8], "little"), header[26:28], header[28:30]
    data = start + _LOCAL_HEADER + int.from_bytes(name, "little") + int.from_bytes(extra, "little")
    end = data + info.compress_size
    handed = min(info.file_size, info.compress_size) if info.compress_type == zipfile.ZIP_STORED else None
    record = [(start, end if handed is None else data + handed)]
    if flags & 0x08:  # a data descriptor follows the data: CRC and sizes, with or without its signature
        raw.seek(end)
        record.append((end, end + (16 if raw.read(4) == _DESCRIPTOR else 12)))
    return record


def _uncovered(covered: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The ranges of ``[0, size)`` that no range of ``covered`` (which may overlap) holds, in order."""
    gaps, cursor = [], 0
    for start, end in sorted(covered):
        start, end = max(0, min(start, size)), max(0, min(end, size))
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < size:
        gaps.append((cursor, size))
    return gaps


def _limit_members(shown: str, budget: Budget, count: int, source: str) -> None:
    """Count a zip's ``count`` entries (as ``source`` lists them) at once, refusing past a member limit."""
    if budget.members + count > MAX_MEMBERS:
        raise ArchiveError(
            f"{shown}: refused, not read further: {source} lists {count} entries, which would bring the "
            f"entries of the archive to {budget.members + count}, over the limit of {MAX_MEMBERS} "
            "(MAX_MEMBERS)"
        )
    if budget.scan.members + count > MAX_SCAN_MEMBERS:
        raise ArchiveError(
            f"{shown}: refused, not read further: {source} lists {count} entries, which would bring the "
            f"archive entries of this scan to {budget.scan.members + count}, over the limit of "
            f"{MAX_SCAN_MEMBERS} (MAX_SCAN_MEMBERS)"
        )
    if source == "its directory":
        budget.members += count
        budget.scan.members += count


# Tar header types whose content the reader reads into memory before the entry they extend.
_EXTENSIONS = {
    tarfile.XHDTYPE: "pax extended header",
    tarfile.SOLARIS_XHDTYPE: "pax extended header",
    tarfile.XGLTYPE: "pax global header",
    tarfile.GNUTYPE_LONGNAME: "GNU long name header",
    tarfile.GNUTYPE_LONGLINK: "GNU long link header",
}


@dataclass
class _TarState:
    """What one tar's bounded header reader has seen: entries, pending extension bytes, global bytes."""

    shown: str
    kind: ArchiveKind
    budget: Budget | None  # None: entries are numbered but not counted against a member limit
    entries: int = 0
    pending: int = 0
    globals: int = 0
    start: int = 0  # where the member being read starts: its first (extension) header


def _bounded_tarinfo(state: _TarState) -> type[tarfile.TarInfo]:
    """A TarInfo class that judges every header from its 512-byte block, before its content is read.

    Python's reader reads a pax or GNU long-name header's content whole, at the size its block states,
    and keeps global headers for the rest of the archive: bounded here by :data:`MAX_HEADER_BYTES`.
    GNU sparse entries are refused: their maps are read block by block with no bound, and no wheel,
    sdist or .deb holds one. ``_proc_member`` is the hook tarfile documents for subclasses.
    """

    class Bounded(tarfile.TarInfo):
        def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
            position = state.entries + 1
            if state.pending == 0:  # the member's first header: where its position is counted from
                state.start = self.offset
            where = f" (its header at byte {state.start} of the tar)"
            what = _EXTENSIONS.get(self.type)
            if what is not None:
                state.pending += self.size
                if self.type == tarfile.XGLTYPE:
                    state.globals += self.size
                over = [
                    (self.size, f"its {what} states {self.size} bytes"),
                    (state.pending, f"its extension headers state {state.pending} bytes in all"),
                    (state.globals, f"the archive's global headers state {state.globals} bytes in all"),
                ]
                for size, said in over:
                    if size > MAX_HEADER_BYTES:
                        raise ArchiveError(
                            f"{state.shown}: refused, not read further: member {position}{where}: {said}, "
                            f"over the limit of {MAX_HEADER_BYTES} bytes (MAX_HEADER_BYTES)"
                        )
                return super()._proc_member(tar)  # type: ignore[misc]
            if self.type == tarfile.GNUTYPE_SPARSE:
                raise ArchiveError(
                    f"{state.shown}: expected {state.kind.description}, cannot read it (member "
                    f"{position}{where}): a GNU sparse member, whose map is read without a bound"
                )
            state.entries, state.pending = position, 0
            if state.budget is not None:
                _enter(state.shown, state.budget, position, where)
            return super()._proc_member(tar)  # type: ignore[misc]

        def _proc_gnusparse_10(self, *_args: object) -> None:
            raise ArchiveError(
                f"{state.shown}: expected {state.kind.description}, cannot read it (member "
                f"{state.entries + 1}): a GNU sparse member (pax format 1.0), whose map is read "
                "without a bound"
            )

    return Bounded


def open_tar(
    shown: str,
    fileobj: IO[bytes] | None = None,
    *,
    path: Path | None = None,
    mode: str = "r|*",
    kind: ArchiveKind = _TAR_KINDS[""],
    budget: Budget | None = None,
) -> tarfile.TarFile:
    """A reader of a tar that anyone may have written (``fileobj``, or the file at ``path``), bounded.

    Every reader of untrusted tar bytes opens them here, never with ``tarfile.open`` itself: Python's
    reader would read a pax path or GNU long name whole at whatever size its header states (a 0.5 MB
    ``.tar.gz`` can state 2 GiB), so each header is judged first (:data:`MAX_HEADER_BYTES`), and with a
    ``budget`` each entry is counted (:data:`MAX_MEMBERS`; the reader keeps every header it has read).
    A refusal is an :class:`ArchiveError` naming ``shown``, the member's position and the limit; it may
    come from this call (the reader reads the first header at once) or from any later read.
    """
    state = _TarState(shown, kind, budget)
    return tarfile.open(name=path, fileobj=fileobj, mode=mode, tarinfo=_bounded_tarinfo(state))


# The name, after ``ARCHIVE!``, under which the bytes of a tar that are no member's data are handed to
# both rule sets (``sparkseal.scan.scanner``): a finding there reads ``ARCHIVE!(tar headers and padding)``.
HEADERS = "(tar headers and padding)"


class Skipped:
    """The bytes of a tar that are no regular member's data, written to ``out`` as its reader reads them.

    Header blocks (ustar name, linkname, uname, gname, prefix, and the unused bytes of the block), pax
    extended and global headers (every record: ``comment``, a vendor's key, not only the path), GNU long
    names and links, the padding after each member's data, and the data of an entry the reader skips (an
    unknown type): what no reader hands out as a member, and yet lies in the tar. The zero blocks at its
    end are not (what follows them must be zeros: :func:`_tar_members`). Each run of such bytes (they
    lie between two members' data) starts a line of its own in ``out``, after a newline, so that no
    match spans two runs; ``lines`` holds, for each run, its line in ``out`` and its line in the tar
    (newlines of the members' data counted too), so a finding can be given the tar's own line.

    Bytes are classified as the reader reaches them: the decompressed stream reads ahead of the header
    that says what they are, so the bytes past what is known are held (at most the extension headers
    of one entry, :data:`MAX_HEADER_BYTES`, and the reader's read-ahead); a member's data is never held.
    """

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.size = 0  # bytes written to ``out``, the newlines before each run included
        self.lines: list[tuple[int, int]] = []
        self._held = bytearray()  # bytes from ``_at`` on, read but not yet classified
        self._at = 0
        self._known = 0  # bytes before this are classified: member data, or not
        self._data: list[tuple[int, int]] = []  # member data ranges not yet passed, in order
        self._data_bytes = 0  # of every range told so far
        self._line = 1  # the tar's line at ``_at``
        self._copied = 1  # the line ``out`` has reached
        self._written = -1  # where the last run written so far ends in the tar
        self._done = False

    @property
    def extent(self) -> int:
        """How many of the tar's bytes up to what is known are no member's data (written or to be)."""
        return self._known - self._data_bytes

    def feed(self, data: bytes) -> None:
        """The next bytes of the tar, as the reader's stream reads them."""
        if self._done:
            return
        if self._held:
            self._held += data
            self._release()
        else:  # a member's data passes here, counted and never copied
            taken = self._classify(data)
            self._held += data[taken:]

    def advance(self, known: int, data: tuple[int, int] | None) -> None:
        """Bytes up to ``known`` are classified: ``data`` (a member's, within them) and the rest."""
        if data is not None and data[1] > data[0]:
            self._data.append(data)
            self._data_bytes += data[1] - data[0]
        self._known = max(self._known, known)
        self._release()

    def finish(self, end: int) -> None:
        """The reader stopped at ``end``: bytes before it are classified, what follows is not the tar's."""
        self.advance(end, None)
        self._held.clear()
        self._done = True

    def _release(self) -> None:
        del self._held[: self._classify(self._held)]

    def _classify(self, buffer: bytes | bytearray) -> int:
        """Write the bytes of ``buffer`` (the tar's from ``_at`` on) known to be no member's data, up to
        what is known; return how many of its bytes are classified."""
        base = self._at
        upto = min(self._known, base + len(buffer))
        while self._at < upto:
            inside = bool(self._data) and self._data[0][0] <= self._at
            if inside:
                cut = min(self._data[0][1], upto)
            else:
                cut = min(self._data[0][0], upto) if self._data else upto
            newlines = buffer.count(b"\n", self._at - base, cut - base)
            if not inside:
                if self._written != self._at:  # a new run
                    self.out.write(b"\n")
                    self._copied += 1
                    self.size += 1
                    self.lines.append((self._copied, self._line))
                self.out.write(buffer[self._at - base : cut - base])
                self.size += cut - self._at
                self._copied += newlines
                self._written = cut
            self._line += newlines
            self._at = cut
            if self._data and self._at >= self._data[0][1]:
                self._data.pop(0)
        return upto - base


class _Counted(io.RawIOBase):
    """The decompressed bytes of a tar as its reader reads them, counted, with the last non-zero byte.

    After the reader stops, what follows its end must be zeros: see :func:`_tar_members`.
    """

    def __init__(self, stream: IO[bytes], skipped: Skipped | None = None) -> None:
        super().__init__()
        self._stream, self._skipped = stream, skipped
        self.count = 0
        self.last = -1  # position of the last byte that is not zero

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        kept = len(data.rstrip(b"\0"))
        if kept:
            self.last = self.count + kept - 1
        self.count += len(data)
        if self._skipped is not None:
            self._skipped.feed(data)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _decompressed(raw: IO[bytes], shown: str, kind: ArchiveKind, compression: str) -> tuple[IO[bytes], tuple]:
    """The tar inside ``raw``, every member or frame of it (``gzip -d`` reads a second gzip member too)."""
    errors: tuple[type[BaseException], ...] = _READ_ERRORS
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb"), errors  # type: ignore[return-value]
    if compression == "bz2":
        return bz2.BZ2File(raw), errors  # type: ignore[return-value]
    if compression == "xz":
        return lzma.LZMAFile(raw), errors  # type: ignore[return-value]
    if compression == "zst":
        try:
            zstandard = load_zstandard()
        except ZstdUnavailable as error:
            raise ArchiveError(
                f"{shown}: expected {kind.description}, cannot open it: the zstandard module cannot be "
                f"imported ({error.__cause__}); install it (the locked version is named in "
                "third_party/zstd/zstandard.lock.json) to scan zstd archives"
            ) from error
        return zstd_reader(raw, zstandard), (*errors, zstandard.ZstdError)  # type: ignore[arg-type]
    return raw, errors


def _tar_members(
    raw: IO[bytes],
    packed: int,
    shown: str,
    kind: ArchiveKind,
    compression: str,
    budget: Budget,
    skipped: Skipped | None = None,
) -> Iterator[Member]:
    """The members of a tar, read whole: after the reader's end, anything but zeros is refused.

    A reader stops at the first zero block (end of archive) or, past the first member, at a header it
    cannot parse; ``tar -i`` reads on, and ``gzip -d`` unpacks a second gzip member that Python's
    stream reader never sees. Such bytes would be unpacked by someone and never scanned, so an archive
    holding any is refused, not scanned in part. With ``skipped``, every byte up to the reader's end
    that is no regular member's data is written there as it is read (see :class:`Skipped`), judged
    like members against the bomb limits (``budget.skipped``) before the next member is read.
    """
    source, errors = _decompressed(raw, shown, kind, compression)
    counted = _Counted(source, skipped)
    try:
        tar = open_tar(shown, counted, mode="r|", kind=kind, budget=budget)
    except errors as error:
        raise _unreadable(shown, kind, error) from error
    unpacked = 0
    with tar:
        members = iter(tar)
        while True:
            try:
                member = next(members)
            except StopIteration:
                break
            except errors as error:
                raise _unreadable(shown, kind, error) from error
            name = member_name(member.name)
            if skipped is not None:
                _admit_skipped(skipped, member, tar.offset, shown, packed, unpacked, budget, name)
            if not member.isfile():  # directories, links (not followed), devices
                continue
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
        end = tar.offset
    if skipped is not None:
        skipped.finish(end)
    _read_to_end(counted, end, packed, shown, kind, errors, budget)


def _admit_skipped(
    skipped: Skipped,
    member: tarfile.TarInfo,
    following: int,
    shown: str,
    packed: int,
    unpacked: int,
    budget: Budget,
    name: str,
) -> None:
    """Tell ``skipped`` where ``member``'s data lies (its entry ends at ``following``, where the next
    header starts), and judge the bytes that are no member's data so far against the bomb limits.

    Those bytes are bounded per entry already (:data:`MAX_HEADER_BYTES`, 511 bytes of padding), but
    they are written to scratch space, so their total is judged too, before the next member is read:
    as a member's size, against :data:`MAX_UNPACKED_BYTES` (with everything else the archive
    unpacks) and, with the members, :data:`MAX_COMPRESSION_RATIO`. An entry whose data the reader
    skips (an unknown type, which GNU tar extracts as a regular file) is counted here, before it is read.
    """
    data = (member.offset_data, member.offset_data + member.size) if member.isfile() else None
    before = skipped.extent
    skipped.advance(following, data)
    added = skipped.extent - before
    if added:
        budget.skipped += added
        _admit(
            shown,
            packed,
            unpacked + skipped.extent,
            budget,
            budget.skipped,
            f"its tar headers and padding up to {name}",
        )


def _read_to_end(
    counted: _Counted,
    end: int,
    packed: int,
    shown: str,
    kind: ArchiveKind,
    errors: tuple[type[BaseException], ...],
    budget: Budget,
) -> None:
    """Read what follows a tar's end (under the bomb limits); refuse it unless it is all zeros."""
    try:
        while counted.last < end and counted.read(_DRAIN):
            extra = counted.count - end
            _admit(shown, packed, counted.count, budget, extra, "what follows its end")
    except errors as error:
        raise _unreadable(shown, kind, error, "after its end") from error
    if counted.last >= end:
        raise ArchiveError(
            f"{shown}: expected {kind.description}, cannot read it whole: the tar reader stops at byte "
            f"{end} (an end or zero block, or a header it cannot read), and bytes that are not zero "
            "follow it; refused, since an unpacker that reads on (tar -i, gzip -d over a second member) "
            "would unpack what the scan did not see"
        )


_DRAIN = 1 << 20


def _deb_members(
    path: Path, shown: str, kind: ArchiveKind, budget: Budget, skipped: Skipped | None = None
) -> Iterator[Member]:
    """The members of a .deb's data.tar, and its other ar members as they are, streamed from the .deb on
    disk (its ar headers read first, by ``sparkseal.core.deb``), in archive order.

    The other members are handed out whole: the control tar (``control.tar.gz``: maintainer scripts
    that run as root at install) is opened by the caller like any nested archive, by its name, and
    anything else is scanned as its bytes. The unpackers' reading of a whole member into memory is not
    used: the scan must refuse a bomb before unpacking it, and it reads zstd.
    """
    where = f"{shown}: expected {kind.description}, cannot read it"
    try:
        with path.open("rb") as raw:
            listed: dict[str, ArMember] = {}
            for member in ar_members(raw, where):
                _enter(shown, budget, len(listed) + 1, f" (its ar header at byte {member.header})")
                listed[member.name] = member
            data = tar_member(listed, "data", where)
            packed = path.stat().st_size
            for name, member in listed.items():
                raw.seek(member.start)
                if name != data:
                    _admit(shown, packed, member.size, budget, member.size, f"its member {name}")
                    budget.used += member.size
                    yield Member(name, member.size, _Window(raw, member.size))  # type: ignore[arg-type]
                    continue
                tar = ArchiveKind(
                    f"a Debian package whose {name} is {_TAR_KINDS[compression(name)].description}", "tar"
                )
                content = _Window(raw, member.size)
                yield from _tar_members(content, member.size, shown, tar, compression(name), budget, skipped)  # type: ignore[arg-type]
    except DebError as error:
        raise ArchiveError(str(error)) from error
    except OSError as error:
        raise ArchiveError(f"{where}: {error}") from error


class _Window(io.RawIOBase):
    """``size`` bytes of a file from its current position: one ar member, read as a stream."""

    def __init__(self, raw: IO[bytes], size: int) -> None:
        super().__init__()
        self._raw, self._left = raw, size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = self._raw.read(size)
        self._left -= len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def members(
    path: Path, shown: str, kind: ArchiveKind, budget: Budget, skipped: Skipped | None = None
) -> Iterator[Member]:
    """The regular members of the archive at ``path`` (named ``shown`` in messages), in archive order.

    Each member's stream must be read before the next member is asked for (tars are read as streams).
    The bytes of a tar (a .deb's data.tar too) that are no member's data go to ``skipped`` as they are
    read; a zip's bytes outside its members are :func:`outside_members`.
    """
    if kind.container == "zip":
        yield from _zip_members(path, shown, kind, budget)
    elif kind.container == "deb":
        yield from _deb_members(path, shown, kind, budget, skipped)
    else:
        with path.open("rb") as raw:
            yield from _tar_members(raw, path.stat().st_size, shown, kind, kind.compression, budget, skipped)
