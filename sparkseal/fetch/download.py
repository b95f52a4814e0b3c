"""Download a file listed by the index into a directory, verifying its sha256 (standard library only)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from sparkseal.core.credentials import CredentialsError, redact
from sparkseal.core.digests import sha256_file as sha256_of
from sparkseal.fetch.index import TIMEOUT_S, FetchError, IndexFile, index_url, request

_CHUNK = 1 << 20


def _configured_index() -> str | None:
    try:
        return index_url()
    except FetchError:
        return None


def download(file: IndexFile, directory: Path, index: str | None = None) -> tuple[Path, str, bool]:
    """Fetch ``file`` into ``directory`` and return ``(path, sha256, reused)``.

    The request carries the credentials of ``index`` (default: the configured index) when the file lives
    on the index's host, else those of a netrc entry for its host; messages show them as ``***``.

    A file already in ``directory`` is reused only when the index lists a sha256 and the file has it.
    A download whose sha256 differs from the listed one is deleted and reported; the final file appears
    under its name only once complete and verified.
    """
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / file.filename
    if file.sha256 is not None and target.is_file() and sha256_of(target) == file.sha256:
        return target, file.sha256, True
    shown = redact(file.url)
    try:
        req = request(file.url, index if index is not None else _configured_index())
    except (ValueError, CredentialsError) as exc:
        raise FetchError(f"{file.filename}: cannot download {shown}: {exc}") from exc
    fd, part_name = tempfile.mkstemp(dir=directory, prefix=f".{file.filename}.", suffix=".part")
    part = Path(part_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if file.sha256 is not None and actual != file.sha256:
            raise FetchError(
                f"{file.filename}: downloaded from {shown} has sha256 {actual}, "
                f"but the index {file.page_url} lists {file.sha256}"
            )
        os.replace(part, target)
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if type(exc) is urllib.error.URLError else exc
        raise FetchError(f"{file.filename}: cannot download {shown}: {reason}") from exc
    finally:
        part.unlink(missing_ok=True)
    return target, actual, False
