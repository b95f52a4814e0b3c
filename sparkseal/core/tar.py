"""The deterministic POSIX ustar writer of image layers (and of the docker-archive around an image).

Members are written with owner 0:0 (or the ids given), empty user and group names and mtime
SOURCE_DATE_EPOCH. A pax header is written only for a path, link target or size that ustar cannot hold,
and then holds only that record, under a fixed name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO, Protocol

from sparkseal.core.determinism import DIR_MODE, FILE_MODE, GID, SOURCE_DATE_EPOCH, UID


class TarError(ValueError):
    """A member cannot be written as asked (a non-UTF-8 name, a file that changed while read)."""


# Linux reports 0777 for every symlink and ignores its bits; writing the same keeps extraction a no-op.
SYMLINK_MODE = 0o777


BLOCK = 512
CHUNK = 1 << 20
USTAR_SIZE_LIMIT = 8**11  # an 11-digit octal size field
USTAR_ID_LIMIT = 8**7  # a 7-digit octal uid or gid field
# A fixed name for pax extended headers: POSIX leaves it to the writer, and GNU tar's default embeds a pid.
PAX_HEADER_NAME = b"././@PaxHeader"


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    length = len(body)
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def _ustar_name(name: bytes) -> tuple[bytes, bytes] | None:
    """Split ``name`` into (prefix, name) ustar fields, or None when it does not fit."""
    if len(name) <= 100:
        return b"", name
    cut = name.rfind(b"/", 0, min(len(name) - 1, 156))
    if cut > 0 and len(name) - cut - 1 <= 100:
        return name[:cut], name[cut + 1 :]
    return None


def _header(
    name: bytes, typeflag: bytes, mode: int, size: int, linkname: bytes = b"", uid: int = UID, gid: int = GID
) -> bytes:
    fields = _ustar_name(name) if name.isascii() else None
    records = b""
    if fields is None:
        records += _pax_record(b"path", name)
        fields = (b"", name[:100])
    if len(linkname) > 100 or not linkname.isascii():
        records += _pax_record(b"linkpath", linkname)
        linkname = linkname[:100]
    if size >= USTAR_SIZE_LIMIT:
        records += _pax_record(b"size", str(size).encode())
        size = 0
    prefix, short = fields
    header = b"".join(
        (
            short.ljust(100, b"\0"),
            _octal(mode, 8),
            _octal(uid, 8),
            _octal(gid, 8),
            _octal(size, 12),
            _octal(SOURCE_DATE_EPOCH, 12),
            b" " * 8,  # checksum, computed over the header with this field as spaces
            typeflag,
            linkname.ljust(100, b"\0"),
            b"ustar\x0000",
            b"\0" * 64,  # user and group names: empty, so that extraction uses the numeric ids only
            _octal(0, 8),
            _octal(0, 8),
            prefix.ljust(155, b"\0"),
            b"\0" * 12,
        )
    )
    header = header[:148] + b"%06o\0 " % sum(header) + header[156:]
    if records:
        return _header(PAX_HEADER_NAME, b"x", FILE_MODE, len(records)) + _padded(records) + header
    return header


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def _encode(path: str) -> bytes:
    try:
        return path.encode("utf-8")
    except UnicodeEncodeError:
        raise TarError(f"{path!r}: path is not valid UTF-8; expected a UTF-8 name") from None


class Writable(Protocol):
    """Anything with a binary ``write``: a file, or a stream that also hashes and compresses."""

    def write(self, data: bytes, /) -> int: ...


class TarWriter:
    """Writes ustar members to a stream with the fixed owner, mtime and header layout described above."""

    def __init__(self, stream: Writable) -> None:
        self._stream = stream

    def directory(self, path: str, mode: int = DIR_MODE, uid: int = UID, gid: int = GID) -> None:
        """Write a directory member (``path`` relative, without the trailing slash)."""
        self._stream.write(_header(_encode(path + "/"), b"5", mode, 0, uid=uid, gid=gid))

    def symlink(self, path: str, target: str) -> None:
        """Write a symlink member."""
        self._stream.write(_header(_encode(path), b"2", SYMLINK_MODE, 0, _encode(target)))

    def file(self, path: str, mode: int, source: Path, *, sha256: bool = False) -> str | None:
        """Write a regular file member with ``source``'s content (symlinks to it are followed).

        With ``sha256``, return the content's hex digest, computed from the bytes written: a caller that
        needs both the tar and the files' digests (a layer and its module manifest) reads each file once.
        """
        content = hashlib.sha256() if sha256 else None
        with source.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            self._stream.write(_header(_encode(path), b"0", mode, size))
            copied = 0
            while chunk := stream.read(CHUNK):
                copied += len(chunk)
                self._stream.write(chunk)
                if content is not None:
                    content.update(chunk)
        if copied != size:
            raise TarError(f"{source}: read {copied} bytes, expected {size} (the file changed while read)")
        self._stream.write(b"\0" * (-size % BLOCK))
        return content.hexdigest() if content is not None else None

    def stream(self, path: str, mode: int, size: int, source: BinaryIO) -> None:
        """Write a regular file member of ``size`` bytes read from ``source`` (a decompressing reader)."""
        self._stream.write(_header(_encode(path), b"0", mode, size))
        copied = 0
        while chunk := source.read(CHUNK):
            copied += len(chunk)
            if copied > size:
                break
            self._stream.write(chunk)
        if copied != size:
            raise TarError(f"{path}: read {copied}+ bytes, expected {size} (the source changed while read)")
        self._stream.write(b"\0" * (-size % BLOCK))

    def data(self, path: str, content: bytes, mode: int = FILE_MODE) -> None:
        """Write a regular file member from bytes in memory."""
        self._stream.write(_header(_encode(path), b"0", mode, len(content)) + _padded(content))

    def close(self) -> None:
        """Write the end-of-archive marker (two zero blocks)."""
        self._stream.write(b"\0" * (2 * BLOCK))


class Digesting:
    """A write-only stream that hashes and counts what passes through it, and forwards it to ``sinks``."""

    def __init__(self, *sinks: Writable) -> None:
        self._sinks = sinks
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        for sink in self._sinks:
            sink.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha256.hexdigest()
