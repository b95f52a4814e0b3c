"""Tiny wheels for tests, and the locked ``installer`` wheel.

    make_wheel(directory, "alpha", "1.0", tag="py3-none-any", files={"alpha/__init__.py": b"..."},
               requires=["beta>=2"], console_scripts={"alpha": "alpha.cli:main"},
               data={"scripts/alpha-tool": b"#!python\\n..."}, modes={"alpha/_x.so": 0o755})

Wheels are written with fixed dates and a correct RECORD, so they are the same bytes on every run.
``locked_installer_wheel()`` returns the ``installer`` wheel that ``third_party/python/tools.files.json``
locks: from Bazel's repository cache or the download cache when one holds it, else from the index.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import shutil
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from sparkseal.fetch.download import download, sha256_of
from sparkseal.fetch.index import lookup

REPO = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "sparkseal"
TOOLS_FILES = REPO / "third_party/python/tools.files.json"
ZSTD_LOCK = REPO / "third_party/zstd/zstandard.lock.json"
_DATE = (1980, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    tag: str = "py3-none-any",
    files: Mapping[str, bytes] | None = None,
    requires: Iterable[str] = (),
    console_scripts: Mapping[str, str] | None = None,
    data: Mapping[str, bytes] | None = None,
    modes: Mapping[str, int] | None = None,
    purelib: bool | None = None,
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` into ``directory`` and return its path.

    ``files`` are paths in the wheel's root, ``data`` paths below ``<name>-<version>.data/`` (e.g.
    ``scripts/x``); ``modes`` gives the Unix mode of single entries (default 0644). ``purelib`` defaults to
    True for ``py3-none-any`` wheels.
    """
    dist = f"{name.replace('-', '_')}-{version}"
    dist_info = f"{dist}.dist-info"
    modes = dict(modes or {})
    entries: dict[str, bytes] = dict(files or {})
    for rel, content in (data or {}).items():
        entries[f"{dist}.data/{rel}"] = content
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries[f"{dist_info}/METADATA"] = metadata.encode()
    pure = tag.endswith("-none-any") if purelib is None else purelib
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: sparkseal-tests\nRoot-Is-Purelib: {str(pure).lower()}\n"
    entries[f"{dist_info}/WHEEL"] = (wheel_meta + f"Tag: {tag}\n").encode()
    if console_scripts:
        lines = "".join(f"{k} = {v}\n" for k, v in sorted(console_scripts.items()))
        entries[f"{dist_info}/entry_points.txt"] = f"[console_scripts]\n{lines}".encode()
    record = "".join(f"{rel},{_record_hash(body)},{len(body)}\n" for rel, body in sorted(entries.items()))
    entries[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, body in entries.items():
            info = zipfile.ZipInfo(rel, _DATE)
            info.external_attr = (0o100000 | modes.get(rel, 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, body)
    return path


def locked_tool_wheel(project: str) -> Path:
    """The locked build-tool wheel of ``project`` (tools.files.json), verified by its sha256."""
    entry = json.loads(TOOLS_FILES.read_text())["wheels"][project]
    return _locked_file(entry["filename"], entry["sha256"], TOOLS_FILES)


def zstd_wheel_into(repository_cache: Path) -> Path:
    """Put this machine's locked zstandard wheel into a Bazel repository cache (as the downloader would).

    A fixture workspace that builds zstd layers then fetches @zstandard from that cache, offline.
    """
    machine = {"x86_64": "linux_x86_64", "aarch64": "linux_aarch64"}[platform.machine()]
    entry = json.loads(ZSTD_LOCK.read_text())["wheels"]["zstandard"]["files"][machine]
    wheel = _locked_file(entry["filename"], entry["sha256"], ZSTD_LOCK)
    cached = repository_cache / "content_addressable" / "sha256" / entry["sha256"] / "file"
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel, cached)
    return cached


def _locked_file(filename: str, sha256: str, lock: Path) -> Path:
    """A locked file, verified by its sha256: from the download cache, Bazel's repository cache, or the
    configured index (downloaded once)."""
    path = CACHE / "downloads" / filename
    if path.is_file() and sha256_of(path) == sha256:
        return path
    # Bazel's repository cache names every file `file`; tools read a wheel's name, so copy it out.
    cached = CACHE / "repository" / "content_addressable" / "sha256" / sha256 / "file"
    if cached.is_file() and sha256_of(cached) == sha256:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, path)
        return path
    path, _, _ = download(lookup(filename), CACHE / "downloads")
    actual = sha256_of(path)
    if actual != sha256:
        raise AssertionError(f"{path}: sha256 {actual}, expected {sha256} (locked in {lock})")
    return path


def locked_installer_wheel() -> Path:
    """The locked ``installer`` wheel."""
    return locked_tool_wheel("installer")
