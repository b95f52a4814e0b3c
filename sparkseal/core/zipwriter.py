"""A small deterministic ZIP writer that can copy already-compressed members verbatim.

Our vLLM wheel keeps ~600 MB of upstream compiled files. Re-deflating them would cost most of the repack
time and tie the output bytes to the build host's zlib; copying their compressed streams from the locked
upstream wheel avoids both. Only members we replace are deflated here (with a fixed level).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from sparkseal.core.determinism import ZIP_DATE_TIME, ZLIB_LEVEL

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_LOCAL_SIG, _CENTRAL_SIG, _END_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_VERSION = 20  # 2.0: deflate, no zip64
_MADE_BY_UNIX = 3 << 8  # so that the external attributes carry Unix modes
_UTF8_FLAG = 0x800
_S_IFREG = 0o100000
_ZIP32_LIMIT = 0xFFFFFFFF


def _dos_date_time() -> tuple[int, int]:
    year, month, day, hour, minute, second = ZIP_DATE_TIME
    return (year - 1980) << 9 | month << 5 | day, hour << 11 | minute << 5 | second // 2


@dataclass(frozen=True)
class RawMember:
    """A member's compressed bytes as stored in another archive, with what is needed to copy them."""

    method: int
    crc: int
    size: int
    compressed: bytes


def read_raw(archive: BinaryIO, info: zipfile.ZipInfo) -> RawMember:
    """Return ``info``'s compressed stream from ``archive`` (the file object of an open ZIP)."""
    archive.seek(info.header_offset)
    header = _LOCAL.unpack(archive.read(_LOCAL.size))
    if header[0] != _LOCAL_SIG:
        raise zipfile.BadZipFile(f"bad local header for {info.filename}")
    archive.seek(header[9] + header[10], 1)
    return RawMember(info.compress_type, info.CRC, info.file_size, archive.read(info.compress_size))


def deflate(data: bytes) -> RawMember:
    """Compress ``data`` with raw deflate at our fixed level."""
    compressor = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    compressed = compressor.compress(data) + compressor.flush()
    return RawMember(zipfile.ZIP_DEFLATED, zlib.crc32(data), len(data), compressed)


class ZipWriter:
    """Writes members in the order given, every one dated ZIP_DATE_TIME, owned by nobody, mode as given."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._central: list[bytes] = []
        self._offset = 0

    def add(self, name: str, member: RawMember, mode: int) -> None:
        """Append one regular file member."""
        if member.method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(f"{name}: compression method {member.method} is not supported")
        if max(self._offset, member.size, len(member.compressed)) > _ZIP32_LIMIT:
            raise ValueError(f"{name}: archive exceeds 4 GiB; zip64 is not supported by this writer")
        encoded = name.encode("utf-8")
        flags = 0 if encoded.isascii() else _UTF8_FLAG
        date, time = _dos_date_time()
        common = (member.method, time, date, member.crc, len(member.compressed), member.size, len(encoded))
        local = _LOCAL.pack(_LOCAL_SIG, _VERSION, flags, *common, 0)
        self._stream.write(local + encoded)
        self._stream.write(member.compressed)
        attributes = (_S_IFREG | mode) << 16
        self._central.append(
            _CENTRAL.pack(
                _CENTRAL_SIG,
                _MADE_BY_UNIX | _VERSION,
                _VERSION,
                flags,
                *common,
                0,
                0,
                0,
                0,
                attributes,
                self._offset,
            )
            + encoded
        )
        self._offset += len(local) + len(encoded) + len(member.compressed)

    def close(self) -> None:
        """Write the central directory and the end record."""
        if len(self._central) > 0xFFFF:
            raise ValueError(f"{len(self._central)} members exceed the ZIP limit of 65535 without zip64")
        directory = b"".join(self._central)
        self._stream.write(directory)
        count = len(self._central)
        self._stream.write(_END.pack(_END_SIG, 0, 0, count, count, len(directory), self._offset, 0))
