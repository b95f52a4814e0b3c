"""sha256 digests of streams, files, listings and trees: the one implementation every layer uses."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container's cpuset narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def sha256_files(paths: Sequence[Path], jobs: int | None = None) -> list[str]:
    """The hex sha256 of each file, in the order of ``paths``, read by ``jobs`` threads at a time.

    Threads suffice: ``hashlib`` releases the GIL while it hashes a buffer larger than 2 KiB and the
    reads release it too, so a tree of many files hashes on every CPU (``jobs=None``: ``usable_cpus``).
    ``jobs=1`` hashes in this thread, one file after another. The result's order is that of ``paths``
    whatever order the threads finish in, so a report built from it is the same for any ``jobs``.
    """
    workers = usable_cpus() if jobs is None else jobs
    if workers < 1:
        raise ValueError(f"jobs: expected at least 1 thread, got {workers}")
    if workers == 1 or len(paths) < 2:
        return [sha256_file(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return list(pool.map(sha256_file, paths))


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
