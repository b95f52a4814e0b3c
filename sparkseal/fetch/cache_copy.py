"""Repository-rule helper: copy a repository-cache file into a repository, verified against its sha256.

Bazel serves a repository-cache hit as a hard link (``--experimental_repository_cache_hardlinks``), which the
kernel refuses across mount points (a cache on a CI volume or a bind mount, the output base elsewhere);
Bazel then treats the hit as a miss. A ``file://`` download of the cached file would copy it, but Bazel
7.7.1 refuses every download under ``--repository_disable_download``, ``file://`` included, so a build
that is offline on purpose could not use a cache it has. Copying is no download: this helper copies the
file next to its destination, checks the copy's sha256 against the locked one (a damaged cache entry
fails, naming both digests) and renames it into place.

Standard library only: repository rules run ``python3 -m sparkseal.fetch.cache_copy SHA256 SOURCE DEST``
with the host ``python3``; a failure prints one ``sparkseal:`` line to stderr and exits 1.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from sparkseal.core.digests import sha256_file


class CacheCopyError(Exception):
    """The cached file cannot be copied, or its copy is not the locked file."""


def copy_verified(sha256: str, source: Path, dest: Path) -> None:
    """Copy ``source`` to ``dest`` when the copy has ``sha256``; otherwise leave ``dest`` absent."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.with_name(f".{dest.name}.copying")
    try:
        shutil.copyfile(source, scratch)
        actual = sha256_file(scratch)
        if actual != sha256:
            raise CacheCopyError(
                f"{source}: sha256 mismatch in the repository cache: expected {sha256}, actual {actual}"
            )
        os.replace(scratch, dest)
    except OSError as exc:
        raise CacheCopyError(f"{source}: cannot copy to {dest}: {exc}") from exc
    finally:
        scratch.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python3 -m sparkseal.fetch.cache_copy SHA256 SOURCE DEST", file=sys.stderr)
        return 2
    sha256, source, dest = args
    try:
        copy_verified(sha256, Path(source), Path(dest))
    except CacheCopyError as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
