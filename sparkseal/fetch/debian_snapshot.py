"""Debian's snapshot archive: where a locked .deb stays fetchable after the mirrors have dropped it.

A Debian mirror keeps a file in its ``pool/`` only while a suite lists that version: a point release or a
security update supersedes it, and the file leaves every mirror soon after. The snapshot archive keeps
every file the archive has published, under the time stamps of its imports:

    <snapshot base>/archive/<archive>/<YYYYMMDDTHHMMSSZ>/<pool path>

(``archive`` is ``debian`` or ``debian-security``; a time stamp between two imports names the one before
it). Each Debian lock entry carries such a time stamp (``snapshot``), at which the archive held the locked
file, and the fetch tries the mirror first, then that URL; Bazel checks either against the locked sha256.

The lock command finds each time stamp with the snapshot archive's machine-readable API:
``/mr/binary/<package>/<version>/binfiles?fileinfo=1`` lists every file of that binary version with
``first_seen`` per archive, and the entry whose name, archive, pool folder and size are the locked ones
gives the time stamp; the file at that URL is then downloaded and its sha256 compared with the locked one,
so a lock never names a time stamp that does not serve its bytes.

Like the mirror's, the snapshot archive's base URL is never written in a file of this repository: it is
``$SPARKSEAL_DEBIAN_SNAPSHOT``, else a snapshot URL the machine's apt sources name (a source's URI, or the
comment Debian's container images write above each URI), read by ``sparkseal.fetch.debian_archive``.

Standard library only: repository rules run the modules that import this one with the host ``python3``.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from sparkseal.core.locks import TIMESTAMP

SNAPSHOT_ENV = "SPARKSEAL_DEBIAN_SNAPSHOT"
# A URL of one archive at one time stamp: <base>/archive/<archive>/<time stamp>.
_ARCHIVE_AT = re.compile(
    r"^(?P<base>(?:https?|file)://\S+?)/archive/(?P<archive>[a-z0-9][a-z0-9.+_-]*)/\d{8}T\d{6}Z/?$"
)
_BASE = re.compile(r"^(https?|file)://\S+$")
_CHUNK = 1 << 20

Opener = Callable[[str], IO[bytes]]


class SnapshotError(Exception):
    """The snapshot archive's base URL is malformed, or it cannot give a locked file's time stamp."""


def parse_base(value: str, where: str = f"${SNAPSHOT_ENV}") -> str:
    """A configured snapshot base URL, without a trailing slash; raise naming ``where`` when malformed."""
    base = value.strip().rstrip("/")
    if not _BASE.match(base) or _ARCHIVE_AT.match(base):
        raise SnapshotError(
            f"{where}: expected the snapshot archive's base URL (http(s):// or file://, the part before "
            f"/archive/<archive>/<time stamp>), actual {value.strip()!r}"
        )
    return base


def base_of(url: str) -> str | None:
    """The snapshot base of a URL of one archive at one time stamp (``<base>/archive/debian/<ts>``)."""
    match = _ARCHIVE_AT.match(url.strip())
    return match["base"].rstrip("/") if match else None


def snapshot_url(base: str, archive: str, timestamp: str, path: str) -> str:
    """The URL of the file at ``path`` of ``archive`` as the snapshot archive held it at ``timestamp``."""
    return f"{base.rstrip('/')}/archive/{archive}/{timestamp}/{path}"


@dataclass(frozen=True)
class LockedFile:
    """What the snapshot look-up needs of one locked .deb."""

    package: str
    version: str
    filename: str
    archive: str
    path: str
    size: int
    sha256: str


def _open(url: str) -> IO[bytes]:
    return urllib.request.urlopen(url, timeout=60)


def _json(url: str, opener: Opener) -> Any:
    """The JSON answer at ``url``; None for a 404 (the API's answer for a version it never held)."""
    try:
        with opener(url) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise SnapshotError(f"{url}: cannot read the snapshot archive's answer: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{url}: cannot read the snapshot archive's answer: {exc}") from exc


def first_seen(base: str, deb: LockedFile, opener: Opener = _open) -> str:
    """The time stamp at which the snapshot archive first held ``deb`` in its archive, checked by sha256."""
    quoted = "/".join(urllib.parse.quote(part, safe="") for part in (deb.package, deb.version))
    url = f"{base.rstrip('/')}/mr/binary/{quoted}/binfiles?fileinfo=1"
    answer = _json(url, opener)
    fileinfo = {} if answer is None else answer.get("fileinfo") if isinstance(answer, dict) else None
    if not isinstance(fileinfo, dict):
        raise SnapshotError(f"{url}: expected an object with `fileinfo`, actual {str(answer)[:200]!r}")
    folder = "/" + deb.path.rsplit("/", 1)[0]
    seen = sorted(
        str(info.get("first_seen"))
        for infos in fileinfo.values()
        if isinstance(infos, list)
        for info in infos
        if isinstance(info, dict)
        and info.get("name") == deb.filename
        and info.get("archive_name") == deb.archive
        and info.get("path") == folder
        and info.get("size") == deb.size
        and TIMESTAMP.fullmatch(str(info.get("first_seen")))
    )
    if not seen:
        raise SnapshotError(
            f"{deb.package}={deb.version}: expected the snapshot archive to list {deb.filename} in "
            f"{deb.archive} at {folder}, {deb.size} bytes ({url}), actual: no such file"
        )
    timestamp = seen[0]
    check_file(snapshot_url(base, deb.archive, timestamp, deb.path), deb, opener)
    return timestamp


def check_file(url: str, deb: LockedFile, opener: Opener = _open) -> None:
    """Download ``url`` (streamed, never stored) and require the locked sha256."""
    digest = hashlib.sha256()
    try:
        with opener(url) as answer:
            while chunk := answer.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise SnapshotError(f"{deb.package}={deb.version}: cannot download {url}: {exc}") from exc
    if digest.hexdigest() != deb.sha256:
        raise SnapshotError(
            f"{deb.package}={deb.version}: sha256 mismatch at {url}: expected {deb.sha256} (locked), "
            f"actual {digest.hexdigest()}"
        )
