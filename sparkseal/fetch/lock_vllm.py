"""Write ``third_party/vllm/vllm.lock.json`` for a vLLM release and check the patch series against it.

The lock names the release's sdist and its two manylinux wheels with the sha256 the index lists, and the
commit recorded in the sdist's ``vllm/_version.py``. Only the sdist is downloaded (its hash is computed and
compared with the index's); the wheels are locked by the hash the index lists.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkseal.core import locks
from sparkseal.core.archives import ArchiveError, open_tar
from sparkseal.core.commit import CommitMismatch, check_commit, commit_id_from_version_file
from sparkseal.core.files import write_atomically
from sparkseal.core.patchset import PatchError, apply_patch, read_series
from sparkseal.core.platforms import MACHINES
from sparkseal.core.sdist import SdistError, unpack
from sparkseal.core.wheels import platform_tags, wheel_name_or_none
from sparkseal.fetch.download import download
from sparkseal.fetch.index import FetchError, IndexFile, ProjectPage, list_files

PROJECT = "vllm"
FULL_COMMIT_LEN = 40


class LockError(Exception):
    """The release on the index, or the existing lock, does not allow writing a lock."""


@dataclass(frozen=True)
class Release:
    """The files of one vLLM release that the lock names."""

    sdist: IndexFile
    wheels: dict[str, IndexFile]


def select_release(page: ProjectPage, version: str) -> Release:
    """Pick the sdist and the one manylinux wheel per platform of ``version`` from ``page``."""
    sdist_name = f"{PROJECT}-{version}.tar.gz"
    wheels = []
    sdist = None
    for file in page.files:
        name = wheel_name_or_none(file.filename)
        if name and name.project == PROJECT and name.version == version:
            wheels.append((file, platform_tags(name)))
        elif file.filename == sdist_name:
            sdist = file
    release_files = [f.filename for f, _ in wheels] + ([sdist_name] if sdist else [])
    found = ", ".join(release_files) or "none"
    if sdist is None:
        raise LockError(
            f"{PROJECT} {version}: {sdist_name} is not listed on {page.url} (files of {version}: {found})"
        )
    chosen = {}
    for platform, machine in MACHINES.items():
        tag = re.compile(rf"manylinux(?:1|2010|2014|_\d+_\d+)_{machine}")
        matches = [f for f, tags in wheels if any(tag.fullmatch(t) for t in tags)]
        if len(matches) != 1:
            names = ", ".join(f.filename for f in matches) or "none"
            raise LockError(
                f"{PROJECT} {version}: expected exactly one manylinux {machine} wheel on {page.url}, "
                f"found {len(matches)} ({names}); files of {version}: {found}"
            )
        chosen[platform] = matches[0]
    return Release(sdist=sdist, wheels=chosen)


def read_version_file(sdist: Path, top: str) -> tuple[str, str]:
    """Return ``(member name, text)`` of ``<top>/vllm/_version.py`` in the sdist tarball."""
    name = f"{top}/{PROJECT}/_version.py"
    try:
        with open_tar(str(sdist), path=sdist, mode="r:*") as tar:
            source = tar.extractfile(name)
            if source is None:
                raise LockError(f"{sdist}: {name} is not a regular file")
            with source:
                return name, source.read().decode("utf-8")
    except KeyError as exc:
        raise LockError(f"{sdist}: {name} is missing") from exc
    except (tarfile.TarError, ArchiveError, UnicodeDecodeError) as exc:
        raise LockError(f"{sdist}: cannot read {name}: {exc}") from exc


def choose_commit(sdist_id: str, old_lock: locks.VllmLock | None, version: str) -> tuple[str, list[str]]:
    """Return the commit to lock and notes about it.

    The existing lock's commit is kept when it is for the same version and names the same commit as the
    sdist's (usually abbreviated) id, so that re-locking a release reproduces the file.
    """
    notes = []
    commit = sdist_id
    if old_lock is not None and old_lock.version == version:
        try:
            check_commit(sdist_id, old_lock.commit, "the existing lock")
        except CommitMismatch as exc:
            notes.append(f"{exc}; writing the sdist's commit id {sdist_id}")
        else:
            commit = max(sdist_id, old_lock.commit, key=len)
    if len(commit) < FULL_COMMIT_LEN:
        notes.append(
            f"commit {commit} is abbreviated (as recorded in {PROJECT}/_version.py); "
            f"replace it with the full commit of the v{version} tag"
        )
    return commit, notes


def render_lock(version: str, commit: str, release: Release, sdist_sha256: str, where: object) -> str:
    """The text of the lock to be written at ``where`` (a ``vllm`` lock of sparkseal.core.locks)."""
    lock = {
        "commit": commit,
        "name": PROJECT,
        "sdist": {"filename": release.sdist.filename, "sha256": sdist_sha256},
        "version": version,
        "wheels": {
            platform: {"filename": file.filename, "sha256": file.sha256}
            for platform, file in release.wheels.items()
        },
    }
    try:
        return locks.render_lock("vllm", lock, where)
    except locks.LockError as exc:
        raise LockError(str(exc)) from None


def read_old_lock(path: Path) -> locks.VllmLock | None:
    """Return the existing lock at ``path``, or None when there is none."""
    if not path.exists():
        return None
    try:
        return locks.read_vllm_lock(path)
    except locks.LockError as exc:
        raise LockError(f"cannot read the existing lock: {exc} (move it away to lock afresh)") from None


def changed_hashes(old_lock: locks.VllmLock | None, new_lock: locks.VllmLock) -> list[str]:
    """Return one line per file that both locks name with different sha256 (the index replaced a file)."""
    if old_lock is None:
        return []

    def entries(lock: locks.VllmLock) -> dict[str, str]:
        return {file.filename: file.sha256 for file in (lock.sdist, *lock.wheels.values())}

    old, new = entries(old_lock), entries(new_lock)
    return [
        f"{name}: the existing lock has sha256 {old[name]}, the index now lists {new[name]}"
        for name in sorted(old.keys() & new.keys())
        if old[name] != new[name]
    ]


def check_series(series: Path, tree: Path) -> list[tuple[str, str | None]]:
    """Apply the patches of ``series`` to ``tree`` in order; return ``(patch name, error or None)`` each."""
    results: list[tuple[str, str | None]] = []
    for patch in read_series(series):
        try:
            apply_patch(tree, patch)
        except PatchError as exc:
            results.append((patch.name, str(exc)))
        else:
            results.append((patch.name, None))
    return results


def lock_vllm(
    version: str, lock_path: Path, series: Path | None, download_dir: Path, index: str | None = None
) -> int:
    """Write the lock for vLLM ``version`` to ``lock_path`` and report the series; return the exit status."""
    try:
        old_lock = read_old_lock(lock_path)
        page = list_files(PROJECT, index)
        release = select_release(page, version)
        missing = [f.filename for f in release.wheels.values() if f.sha256 is None]
        if missing:
            raise LockError(f"{page.url} lists no sha256 for {', '.join(missing)}")
        print(f"index page: {page.url}")
        sdist_path, sdist_sha256, reused = download(release.sdist, download_dir, index)
        how = f"reused {sdist_path}" if reused else f"downloaded to {sdist_path}"
        listed = "" if release.sdist.sha256 else "; the index lists no sha256, this one is computed"
        print(f"sdist {release.sdist.filename} sha256 {sdist_sha256} ({how}{listed})")
        for platform, file in release.wheels.items():
            print(f"wheel {platform} {file.filename} sha256 {file.sha256}")
        top = f"{PROJECT}-{version}"
        version_file, version_text = read_version_file(sdist_path, top)
        sdist_id = commit_id_from_version_file(version_text, version_file)
        commit, notes = choose_commit(sdist_id, old_lock, version)
        text = render_lock(version, commit, release, sdist_sha256, lock_path)
        changed = changed_hashes(old_lock, locks.parse_vllm_lock(json.loads(text), lock_path))
        write_atomically(lock_path, text)
        print(f"commit {commit} ({version_file} records {sdist_id})")
        for note in notes:
            print(f"note: {note}")
        print(f"wrote {lock_path}")
        for line in changed:
            print(f"sparkseal: {line}", file=sys.stderr)
        status = 1 if changed else 0
        if series is None:
            return status
        with tempfile.TemporaryDirectory(prefix="sparkseal-lock-") as tree:
            unpack(sdist_path, Path(tree), version, commit)
            results = check_series(series, Path(tree))
    except (FetchError, LockError, CommitMismatch, SdistError, PatchError, OSError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    print(f"patch series {series} against {release.sdist.filename}:")
    for name, error in results:
        print(f"{name}: applies" if error is None else f"{name}: does not apply: {error}")
    return 1 if status or any(error for _, error in results) else 0
