"""The locks of ``third_party/`` by kind, and broken copies of them, for both lock readers' tests.

``tests/unit/test_locks.py`` feeds them to the Python reader (``sparkseal.core.locks``),
``tests/bazel/test_locks.py`` to the Starlark one (``rules/private/locks.bzl``) and compares the two: the
same data from every lock, the same error text from every broken one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# JSON files under third_party/ that are no locks: what they hold is policy, not pinned inputs.
NOT_LOCKS = {
    "third_party/python/replaces.json": "which of two wheels shipping the same path wins, and why",
    "third_party/scan/image-allow.json": "the image scan's allow list",
}


def lock_kind(rel: str) -> str:
    """The kind (a key of sparkseal.core.locks.FORMATS) of the lock at ``rel`` below the repository."""
    if rel == "third_party/vllm/vllm.lock.json":
        return "vllm"
    if rel.startswith("third_party/python/") and rel.endswith(".files.json"):
        return "python"
    if rel.startswith(("third_party/debian/", "third_party/toolchains/")):
        return "debian"
    if rel.endswith(".lock.json"):
        return "wheels"
    raise ValueError(f"{rel}: not a lock (NOT_LOCKS, or a kind for it in tests/lock_cases.py)")


def third_party_json() -> list[str]:
    """Every JSON file directly in a folder of ``third_party/`` (offline stand-ins and pex platforms are
    deeper), relative to the repository."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "third_party").glob("*/*.json"))


def locks() -> dict[str, str]:
    """Every lock of ``third_party/``: path relative to the repository -> kind."""
    return {rel: lock_kind(rel) for rel in third_party_json() if rel not in NOT_LOCKS}


@dataclass(frozen=True)
class Broken:
    """A copy of a real lock with one fault, and the error both readers give (after ``<where>: ``)."""

    id: str
    rel: str
    edit: Callable[[Any], Any]
    message: str

    @property
    def kind(self) -> str:
        return lock_kind(self.rel)

    def document(self) -> Any:
        """The broken document: the lock, parsed, with the fault."""
        return self.edit(copy.deepcopy(json.loads((REPO / self.rel).read_text())))


def _set(path: str, value: Any) -> Callable[[Any], Any]:
    """An edit setting the field ``path`` (keys joined by ``/``; a list index is a number) to ``value``."""

    def edit(document: Any) -> Any:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split("/")]
        node = document
        for key in parents:
            node = node[key]
        node[last] = value
        return document

    return edit


def _drop(path: str) -> Callable[[Any], Any]:
    """An edit removing the field ``path``."""

    def edit(document: Any) -> Any:
        *parents, last = path.split("/")
        node = document
        for key in parents:
            node = node[int(key) if key.isdigit() else key]
        del node[last]
        return document

    return edit


def _also(edit: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda document: then(edit(document))


VLLM = "third_party/vllm/vllm.lock.json"
CUDA = "third_party/cuda/toolchain.lock.json"
PYTHON = "third_party/python/requirements_linux_x86_64.files.json"
DEBIAN = "third_party/debian/bookworm_amd64.lock.json"
_FOURTH_DEB = json.loads((REPO / DEBIAN).read_text())["packages"][3]["filename"]
_VLLM_FORMAT = "1 (a vLLM lock, written by `sparkseal lock vllm`)"
_WHEELS_FORMAT = "1 (a lock of tool wheels per platform, written by `python3 -m sparkseal.fetch.lock_wheels`)"
_PYTHON_FORMAT = "1 (a wheel sidecar of a requirements file, written by `sparkseal lock python`)"
_DEBIAN_FORMAT = (
    "3 (a Debian lock, each package with its archive, path and snapshot time stamp; "
    "`sparkseal lock debian --keep-versions` rewrites an older one)"
)

BROKEN = (
    Broken(
        "vllm-no-format", VLLM, _drop("format"), f"field `format`: expected {_VLLM_FORMAT}, actual nothing"
    ),
    Broken(
        "vllm-newer-format", VLLM, _set("format", 2), f"field `format`: expected {_VLLM_FORMAT}, actual 2"
    ),
    Broken(
        "vllm-not-an-object",
        VLLM,
        lambda d: [],
        "expected a JSON object (a vLLM lock, written by `sparkseal lock vllm`), actual an empty list",
    ),
    Broken(
        "vllm-commit",
        VLLM,
        _set("commit", "v0.25.1"),
        "field `commit`: expected 7 to 40 lowercase hex digits (a commit, full or abbreviated), "
        'actual "v0.25.1"',
    ),
    Broken("vllm-no-name", VLLM, _drop("name"), "field `name`: expected a non-empty string, actual nothing"),
    Broken(
        "vllm-other-platform",
        VLLM,
        _set("wheels/linux_riscv64", {"filename": "x.whl", "sha256": "0" * 64}),
        'field `wheels.linux_riscv64`: expected one of linux_aarch64, linux_x86_64, actual "linux_riscv64"',
    ),
    Broken(
        "vllm-no-wheel",
        VLLM,
        _drop("wheels/linux_x86_64"),
        "field `wheels.linux_x86_64`: expected an object, actual nothing",
    ),
    Broken(
        "vllm-sdist-name",
        VLLM,
        _set("sdist/filename", "vllm-0.25.1.zip"),
        "field `sdist.filename`: expected a .tar.gz file name without '/', actual \"vllm-0.25.1.zip\"",
    ),
    Broken(
        "vllm-sha256",
        VLLM,
        _set("wheels/linux_aarch64/sha256", "ABC"),
        'field `wheels.linux_aarch64.sha256`: expected 64 lowercase hex digits, actual "ABC"',
    ),
    Broken(
        "wheels-no-format",
        CUDA,
        _drop("format"),
        f"field `format`: expected {_WHEELS_FORMAT}, actual nothing",
    ),
    Broken(
        "wheels-no-version",
        CUDA,
        _drop("wheels/cmake/version"),
        "field `wheels.cmake.version`: expected a non-empty string, actual nothing",
    ),
    Broken(
        "wheels-no-files",
        CUDA,
        _set("wheels/cmake/files", {}),
        "field `wheels.cmake.files`: expected an object with a wheel per platform, actual an empty object",
    ),
    Broken(
        "wheels-other-platform",
        CUDA,
        _set("wheels/ninja/files/win_amd64", {"filename": "ninja.whl", "sha256": "0" * 64}),
        "field `wheels.ninja.files.win_amd64`: expected one of any, linux_aarch64, linux_x86_64, "
        'actual "win_amd64"',
    ),
    Broken(
        "wheels-filename",
        CUDA,
        _set("wheels/ninja/files/linux_x86_64/filename", "../ninja.whl"),
        "field `wheels.ninja.files.linux_x86_64.filename`: expected a .whl file name without '/', "
        'actual "../ninja.whl"',
    ),
    Broken(
        "python-string-format",
        PYTHON,
        _set("format", "1"),
        f'field `format`: expected {_PYTHON_FORMAT}, actual "1"',
    ),
    Broken(
        "python-platform",
        PYTHON,
        _set("platform", "linux_riscv64"),
        'field `platform`: expected one of any, linux_aarch64, linux_x86_64, actual "linux_riscv64"',
    ),
    Broken(
        "python-no-requirements",
        PYTHON,
        _drop("requirements"),
        "field `requirements`: expected a .txt file name without '/', actual nothing",
    ),
    Broken(
        "python-no-sha256",
        PYTHON,
        _drop("wheels/torch/sha256"),
        "field `wheels.torch.sha256`: expected 64 lowercase hex digits, actual nothing",
    ),
    Broken(
        "python-wheels-list",
        PYTHON,
        _set("wheels", []),
        "field `wheels`: expected an object, actual an empty list",
    ),
    Broken(
        "debian-older-format",
        DEBIAN,
        _set("format", 2),
        f"field `format`: expected {_DEBIAN_FORMAT}, actual 2",
    ),
    Broken(
        "debian-architecture",
        DEBIAN,
        _set("architecture", "riscv64"),
        'field `architecture`: expected one of amd64, arm64, actual "riscv64"',
    ),
    Broken(
        "debian-root",
        DEBIAN,
        _set("roots/0", ""),
        'field `roots[0]`: expected a non-empty string, actual ""',
    ),
    Broken(
        "debian-no-packages",
        DEBIAN,
        _set("packages", []),
        "field `packages`: expected a non-empty list, actual an empty list",
    ),
    Broken(
        "debian-path",
        DEBIAN,
        _set("packages/3/path", "/pool/x.deb"),
        "field `packages[3].path`: expected a relative path without '.', '..' or empty parts, ending in "
        f'{_FOURTH_DEB}, actual "/pool/x.deb"',
    ),
    Broken(
        "debian-size",
        DEBIAN,
        _set("packages/0/size", -1),
        "field `packages[0].size`: expected a whole number of bytes, actual -1",
    ),
    Broken(
        "debian-bool-size",
        DEBIAN,
        _set("packages/0/size", True),
        "field `packages[0].size`: expected a whole number of bytes, actual true",
    ),
    Broken(
        "debian-archive",
        DEBIAN,
        _set("packages/1/archive", "Debian-Security"),
        "field `packages[1].archive`: expected an archive name ([a-z0-9][a-z0-9.+_-]*), "
        'actual "Debian-Security"',
    ),
    Broken(
        "debian-snapshot",
        DEBIAN,
        _set("packages/2/snapshot", "2026-12-07"),
        'field `packages[2].snapshot`: expected a time stamp YYYYMMDDTHHMMSSZ, actual "2026-12-07"',
    ),
    Broken(
        "debian-twice",
        DEBIAN,
        lambda d: _set("packages/1", d["packages"][0])(d),
        'field `packages[1].package`: expected a package not listed before, actual "base-files"',
    ),
    Broken(
        "debian-no-filename",
        DEBIAN,
        _also(_drop("packages/4/filename"), _drop("packages/4/sha256")),
        "field `packages[4].filename`: expected a .deb file name without '/', actual nothing",
    ),
)
