"""Write the locks of tool wheels: the kernel toolchain (CUDA 13.0 compiler parts, cmake, ninja,
scikit-build-core), the secret scanner of the image build and the zstd compressor of its zstd layers.

``python3 -m sparkseal.fetch.lock_wheels [--set cuda|scanner|zstd]`` looks up every pinned wheel of the set
on the configured index (PEP 691) and writes its lock (``third_party/cuda/toolchain.lock.json``,
``third_party/scan/scanner.lock.json``, ``third_party/zstd/zstandard.lock.json``): per project its
version and, per platform, the exact wheel filename and sha256. ``--check`` compares the index with the
existing lock instead of writing it. The ``cuda_toolkit``, ``secret_scanner`` and ``host_wheel``
repository rules read them; Bazel's downloader fetches and verifies each file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkseal.core import locks
from sparkseal.core.platforms import MACHINES
from sparkseal.core.wheels import platform_tags, wheel_name_or_none
from sparkseal.fetch.download import download
from sparkseal.fetch.index import FetchError, IndexFile, ProjectPage, list_files, normalize_name

DEFAULT_LOCK = Path("third_party/cuda/toolchain.lock.json")

ANY = "any"
LINUX_X86_64 = "linux_x86_64"
LINUX_AARCH64 = "linux_aarch64"
# The glibc-based (manylinux) platform tag ending each lock platform accepts.
_ARCH = MACHINES


@dataclass(frozen=True)
class Pin:
    """One project at one version, needed for the listed platforms (``any`` for a pure-Python wheel)."""

    project: str
    version: str
    platforms: tuple[str, ...]
    # The interpreter tag of a wheel with a CPython extension (``cp311``: the build host's python3);
    # empty for wheels that do not depend on it.
    python: str = ""


# CUDA 13.0 (update 2) to match the driver 580 / nvcc 13.0 of the H200 machines. The build host is x86_64
# or aarch64 (a GB10 itself): the host tools are locked for both. The CUDA runtime (static cudart +
# headers) is locked for both targets, because an x86_64 host cross-compiles the linux_aarch64 wheel
# against the aarch64 cudart. cuobjdump is only published from 13.2 on; it reads 13.0 output and only
# tests use it.
_HOSTS = (LINUX_X86_64, LINUX_AARCH64)
PINS: tuple[Pin, ...] = (
    Pin("nvidia-cuda-nvcc", "13.0.88", _HOSTS),
    Pin("nvidia-cuda-crt", "13.0.88", _HOSTS),
    Pin("nvidia-nvvm", "13.0.88", _HOSTS),
    Pin("nvidia-cuda-cccl", "13.0.85", _HOSTS),
    Pin("nvidia-cuda-runtime", "13.0.96", _HOSTS),
    Pin("nvidia-cuda-cuobjdump", "13.2.86", _HOSTS),
    Pin("cmake", "4.4.5", _HOSTS),
    Pin("ninja", "1.13.2", _HOSTS),
    Pin("scikit-build-core", "1.1.2", (ANY,)),
    # scikit-build-core's own requirements on Python 3.11.
    Pin("packaging", "26.4", (ANY,)),
    Pin("pathspec", "1.1.1", (ANY,)),
)

# The secret scanner whose maintained rule catalogue scans every image layer (sparkseal/scan/scanner.py):
# a packaged binary, for each machine that may run the scan action (x86_64 hosts, aarch64 workers).
# Keep the version equal to .ci/requirements-trust.in (the scanner of `sparkseal scan`).
SCANNER_PINS: tuple[Pin, ...] = (Pin("kingfisher-bin", "2.14.0", (LINUX_X86_64, LINUX_AARCH64)),)

SCANNER_LOCK = Path("third_party/scan/scanner.lock.json")

# The zstd compressor of zstd image layers (sparkseal/core/pzstd.py): python-zstandard, whose C extension
# bundles libzstd, so the blobs' bytes depend on this lock and not on the build machine's packages. Its
# extension is built for the interpreter the actions run with, bookworm's CPython 3.11.
ZSTD_PINS: tuple[Pin, ...] = (Pin("zstandard", "0.25.0", (LINUX_X86_64, LINUX_AARCH64), python="cp311"),)
ZSTD_LOCK = Path("third_party/zstd/zstandard.lock.json")
PIN_SETS = ("cuda", "scanner", "zstd")


def pin_set(name: str) -> tuple[tuple[Pin, ...], Path, str]:
    """``--set NAME``: its pins, where their lock lives, and the pins' name in this module."""
    if name == "scanner":
        return SCANNER_PINS, SCANNER_LOCK, "SCANNER_PINS"
    if name == "zstd":
        return ZSTD_PINS, ZSTD_LOCK, "ZSTD_PINS"
    return PINS, DEFAULT_LOCK, "PINS"


Lister = Callable[[str], ProjectPage]
Hasher = Callable[[IndexFile], str]


class LockError(Exception):
    """The index does not offer exactly one wheel for a pin and platform, or the lock is out of date."""


def wheel_parts(filename: str) -> tuple[str, str, tuple[str, ...]] | None:
    """Return (normalised name, version, platform tags) of a wheel filename, or None for other files."""
    name = wheel_name_or_none(filename)
    return (name.project, name.version, platform_tags(name)) if name else None


def platform_matches(tags: Iterable[str], platform: str) -> bool:
    """True if a wheel with these platform tags installs on ``platform`` (``any`` or a glibc Linux)."""
    tags = tuple(tags)
    if platform == ANY:
        return tags == (ANY,)
    arch = _ARCH[platform]
    return any(tag.startswith("manylinux") and tag.endswith("_" + arch) for tag in tags)


def select_wheel(pin: Pin, platform: str, files: Sequence[IndexFile], page_url: str) -> IndexFile:
    """Return the one wheel of ``pin`` for ``platform`` among ``files``; fail if there is none or several."""
    name = normalize_name(pin.project)
    found = []
    for file in files:
        parts = wheel_parts(file.filename)
        if parts and parts[0] == name and parts[1] == pin.version and platform_matches(parts[2], platform):
            if pin.python and not _for_interpreter(file.filename, pin.python):
                continue
            found.append(file)
    if len(found) != 1:
        listed = ", ".join(f.filename for f in found) or "none"
        raise LockError(
            f"{page_url}: expected exactly one {pin.project} {pin.version} wheel for {platform}, "
            f"found {listed}"
        )
    return found[0]


def _for_interpreter(filename: str, python: str) -> bool:
    """True if a wheel's tags name the interpreter ``python`` (``cp311``) with its own ABI."""
    name = wheel_name_or_none(filename)
    return name is not None and any(tag.startswith(f"{python}-{python}-") for tag in name.tags)


def _download_sha256(file: IndexFile) -> str:
    with tempfile.TemporaryDirectory(prefix="sparkseal-lock-") as scratch:
        return download(file, Path(scratch))[1]


def build_lock(
    pins: Sequence[Pin], lister: Lister, hasher: Hasher = _download_sha256, set_name: str = "cuda"
) -> dict:
    """Return the lock document for ``pins``; ``lister`` reads a project page, ``hasher`` hashes a file
    whose page lists no sha256."""
    wheels: dict[str, dict] = {}
    for pin in sorted(pins, key=lambda p: normalize_name(p.project)):
        page = lister(pin.project)
        files = {}
        for platform in sorted(pin.platforms):
            chosen = select_wheel(pin, platform, page.files, page.url)
            files[platform] = {"filename": chosen.filename, "sha256": chosen.sha256 or hasher(chosen)}
        wheels[normalize_name(pin.project)] = {"version": pin.version, "files": files}
    command = "python3 -m sparkseal.fetch.lock_wheels" + ("" if set_name == "cuda" else f" --set {set_name}")
    pins_name = pin_set(set_name)[2]
    return {"comment": f"Generated by `{command}`; edit {pins_name} there, not this file.", "wheels": wheels}


def render(lock: dict, where: object = "the lock being written") -> str:
    """The lock as it is stored at ``where`` (a ``wheels`` lock of sparkseal.core.locks, checked by its
    reader): its format added, sorted keys, two-space indent, final newline."""
    try:
        return locks.render_lock("wheels", lock, where)
    except locks.LockError as exc:
        raise LockError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python3 -m sparkseal.fetch.lock_wheels", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--set", choices=PIN_SETS, default="cuda", help="which wheels (default cuda)")
    parser.add_argument("--output", type=Path, help=f"lock file (default: the set's, e.g. {DEFAULT_LOCK})")
    parser.add_argument("--index", help="index URL (default: PIP_INDEX_URL, then pip's configuration)")
    parser.add_argument(
        "--check", action="store_true", help="fail if the lock differs from the index's answer"
    )
    args = parser.parse_args(argv)
    try:
        pins, default_output, pins_name = pin_set(args.set)
        args.output = args.output or default_output
        lock = build_lock(pins, lambda project: list_files(project, args.index), set_name=args.set)
        text = render(lock, args.output)
        if args.check:
            current = args.output.read_text(encoding="utf-8") if args.output.is_file() else ""
            if current != text:
                raise LockError(
                    f"{args.output}: out of date with {pins_name} and the index; rerun without --check"
                )
        else:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(text, encoding="utf-8")
    except (FetchError, LockError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
