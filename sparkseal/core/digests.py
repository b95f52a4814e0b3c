"""sha256 digests of streams, files, listings and trees: the one implementation every layer uses."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from sparkseal.core.tree import list_files

# Read size for hashing: large enough that a multi-GB wheel hashes at disk speed, small enough to stay
# out of the way of the memory a build action needs.
_CHUNK = 1 << 20


def sha256_stream(stream: IO[bytes]) -> str:
    """The hex sha256 of everything left in ``stream``."""
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's content."""
    with open(path, "rb") as stream:
        return sha256_stream(stream)


def record_hash(data: bytes) -> str:
    """The RECORD form of a sha256 (PEP 376/627): ``sha256=<urlsafe base64 without padding>``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def listing_digest(files: Mapping[str, str]) -> str:
    """The sha256 of ``<hex>  <path>\\n`` lines sorted by path (what ``sha256sum`` prints for those files)."""
    listing = "".join(f"{files[path]}  {path}\n" for path in sorted(files))
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()


def tree_digest(root: Path) -> str:
    """``sha256:<hex>`` of the ``<sha256>  <path>`` listing of every file under ``root``."""
    return "sha256:" + listing_digest({rel: sha256_file(root / rel) for rel in list_files(root)})
