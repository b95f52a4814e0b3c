"""The locked interpreter's .debs in a fixture workspace's repository cache: no apt look-up per test.

Every action runs on the locked CPython (rules/private/toolchains.bzl), so every fixture workspace fetches
its .debs. Fixture workspaces have repository caches of their own; the .debs are put into each one from
the user's repository cache (``~/.cache/sparkseal/repository``, the one ``make image`` fills), where a
missing one is first downloaded once, from its archive's base URL joined to its locked path
(``sparkseal.fetch.debian_archive``, as the repository rule does), and checked against the lock.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import urllib.request
from pathlib import Path

from sparkseal.core.locks import read_debian_lock
from sparkseal.fetch.debian_archive import locked_urls

REPO = Path(__file__).resolve().parent.parent
STORE = Path.home() / ".cache" / "sparkseal" / "repository"
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}


def _cas(cache: Path, sha256: str) -> Path:
    """Where Bazel's repository cache keeps a file of this sha256."""
    return cache / "content_addressable" / "sha256" / sha256 / "file"


def toolchain_lock(kind: str = "python") -> Path:
    """The lock of this machine's locked toolchain of ``kind``."""
    return REPO / "third_party" / "toolchains" / f"{kind}_bookworm_{_ARCHES[platform.machine()]}.lock.json"


def _fill_store(lock: Path) -> list[str]:
    """Put every .deb of ``lock`` into the user's repository cache; return their sha256s."""
    debs = read_debian_lock(lock).packages
    missing = [deb for deb in debs if not _cas(STORE, deb.sha256).is_file()]
    if missing:
        urls = locked_urls(lock, [deb.package for deb in missing])
        for deb in missing:
            with urllib.request.urlopen(urls[deb.package], timeout=120) as response:
                data = response.read()
            actual = hashlib.sha256(data).hexdigest()
            if actual != deb.sha256:
                raise AssertionError(f"{lock}: {deb.filename}: expected sha256 {deb.sha256}, got {actual}")
            target = _cas(STORE, deb.sha256)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"file.{os.getpid()}.partial")
            partial.write_bytes(data)
            partial.replace(target)
    return [deb.sha256 for deb in debs]


def seed_repository_cache(cache: Path, kinds: tuple[str, ...] = ("python",)) -> None:
    """Hard-link (or copy) the locked toolchains' .debs into the repository cache ``cache``."""
    for kind in kinds:
        for sha256 in _fill_store(toolchain_lock(kind)):
            target = _cas(cache, sha256)
            if target.is_file():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(_cas(STORE, sha256), target)
            except OSError:
                shutil.copyfile(_cas(STORE, sha256), target)
