"""The one Python reader of sparkseal's locks: one versioned schema per lock kind, checked in one place.

Every lock under ``third_party/`` is data that each build starts from, read in both languages: here for
Python (the provenance and the SBOM, the lock commands, the root file system and toolchain builders, the
repository-rule helpers) and in ``rules/private/locks.bzl`` for Starlark (the repository rules). Both
readers know the same kinds, formats and fields and fail with the same text, so a field means one thing
wherever it is read; ``tests/bazel/test_locks.py`` feeds every lock of ``third_party/`` to both and
compares what they return. The requirements files pip-tools' format gives (``requirements_*.txt``, read by
``sparkseal.fetch.lock_python`` and ``rules/private/python_lock.bzl``) are the ecosystem's format and
stay as they are; their ``.files.json`` sidecars are the ``python`` kind here.

The kinds (:data:`FORMATS`), each with a ``format`` field that this reader checks first:

- ``vllm``: ``third_party/vllm/vllm.lock.json`` (``sparkseal lock vllm``): the release, its commit, its
  sdist and its upstream wheel per platform;
- ``wheels``: ``third_party/{cuda,scan,zstd}/*.lock.json`` (``python3 -m sparkseal.fetch.lock_wheels``):
  per project its version and, per platform, one wheel;
- ``python``: ``third_party/python/*.files.json`` (``sparkseal lock python``): per pin of the requirements
  file beside it, the one wheel the platform installs;
- ``debian``: ``third_party/{debian,toolchains}/*.lock.json`` (``sparkseal lock debian``): the packages of
  one architecture, each with its archive, path and snapshot time stamp.

A lock that breaks its schema fails naming the file, the field, what was expected and what was found
(:class:`LockError`); a ``format`` this reader does not know fails the same way, naming the format it
reads. A locked sha256 is checked here only: its form by :func:`check_sha256`, a file against it by
:func:`check_file`. The lock commands write through :func:`render_lock`, which adds the ``format`` and
reads the document back before a byte is written, so no command writes a lock this module would refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from sparkseal.core.digests import sha256_file
from sparkseal.core.platforms import DEBIAN_ARCHITECTURES, PLATFORMS

# The format each kind is written in now; a reader accepts exactly this one (the Debian lock's writer
# also reads its older formats, to rewrite them: DEBIAN_OLDER_FORMATS).
FORMATS: dict[str, int] = {"vllm": 1, "wheels": 1, "python": 1, "debian": 3}
# What each kind is and which command rewrites it: the text after the expected format in an error.
DESCRIPTIONS: dict[str, str] = {
    "vllm": "a vLLM lock, written by `sparkseal lock vllm`",
    "wheels": "a lock of tool wheels per platform, written by `python3 -m sparkseal.fetch.lock_wheels`",
    "python": "a wheel sidecar of a requirements file, written by `sparkseal lock python`",
    "debian": (
        "a Debian lock, each package with its archive, path and snapshot time stamp; "
        "`sparkseal lock debian --keep-versions` rewrites an older one"
    ),
}
# Debian lock formats the writer still reads to rewrite them (``--keep-versions``): 1 had no archive and
# no path (URLs came from apt at fetch time), 2 no snapshot time stamp. The entries lack what they lacked.
DEBIAN_OLDER_FORMATS = (1, 2)

# Platforms a wheel may be locked for: a platform of the build, or any (a pure-Python wheel).
ANY = "any"
WHEEL_PLATFORMS = (ANY, *sorted(PLATFORMS))
ARCHITECTURES = tuple(sorted(DEBIAN_ARCHITECTURES.values()))

_SHA256 = re.compile(r"[0-9a-f]{64}")
# A commit as the vLLM lock names it: in full, or abbreviated as the sdist records it (`sparkseal lock vllm`
# writes the sdist's id and asks for the full one; the provenance takes only a full one).
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
COMMIT_EXPECTED = "7 to 40 lowercase hex digits (a commit, full or abbreviated)"
# A Debian archive's name: a Release file's Label, lower-cased, with no space and no slash.
ARCHIVE_NAME = re.compile(r"[a-z0-9][a-z0-9.+_-]*")
# A time stamp of Debian's snapshot archive.
TIMESTAMP = re.compile(r"[0-9]{8}T[0-9]{6}Z")

_MISSING: Any = object()


class LockError(Exception):
    """A lock breaks its schema, or a file is not the one a lock names; the message names the file, the
    field, the expected and the actual value."""


@dataclass(frozen=True)
class LockedFile:
    """One locked file: its name and its sha256."""

    filename: str
    sha256: str


@dataclass(frozen=True)
class Lock:
    """What every lock holds: the format of its kind it is written in (:data:`FORMATS`)."""

    format: int


@dataclass(frozen=True)
class VllmLock(Lock):
    """The ``vllm`` lock: a vLLM release, its commit, its sdist and its upstream wheel per platform."""

    name: str
    version: str
    commit: str
    sdist: LockedFile
    wheels: dict[str, LockedFile]


@dataclass(frozen=True)
class ToolWheel:
    """One project of a ``wheels`` lock: its version and its wheel per platform (``any``: pure Python)."""

    version: str
    files: dict[str, LockedFile]


@dataclass(frozen=True)
class WheelsLock(Lock):
    """The ``wheels`` lock: project -> its version and wheels."""

    wheels: dict[str, ToolWheel]


@dataclass(frozen=True)
class PythonWheel:
    """One pin of a ``python`` lock: its version and the one wheel the platform installs."""

    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class PythonLock(Lock):
    """The ``python`` lock (a requirements file's sidecar): its platform, its requirements file, and
    project -> wheel."""

    platform: str
    requirements: str
    wheels: dict[str, PythonWheel]


@dataclass(frozen=True)
class DebianPackage:
    """One locked Debian package: the file apt would download, with its size, sha256 and place.

    ``path`` is the file's path below its archive's base URL (``pool/main/z/zlib/zlib1g_...deb``),
    ``archive`` the archive's name (``debian``, ``debian-security``) and ``snapshot`` a time stamp
    (``YYYYMMDDTHHMMSSZ``) at which the snapshot archive holds this file: a fetch needs nothing else but
    the base URLs of that archive and of the snapshot archive, which the build machine configures. Read
    from an older format (:data:`DEBIAN_OLDER_FORMATS`), what that format lacked is empty.
    """

    package: str
    version: str
    architecture: str
    filename: str
    sha256: str
    size: int
    archive: str
    path: str
    snapshot: str = ""


@dataclass(frozen=True)
class DebianLock(Lock):
    """The ``debian`` lock: one architecture's packages of one suite, and the roots they close over."""

    architecture: str
    suite: str
    roots: tuple[str, ...]
    packages: tuple[DebianPackage, ...]


# --- the checks every reader is made of; rules/private/locks.bzl spells each the same -----------------


def _shown(value: Any) -> str:
    """A value as an error shows it: JSON for a scalar, the kind of a container (the Starlark reader shows
    the same, so both languages' messages agree)."""
    if value is _MISSING:
        return "nothing"
    if isinstance(value, dict):
        return "an object" if value else "an empty object"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return json.dumps(value, ensure_ascii=False)


def _fail(where: object, field: str, expected: str, value: Any) -> NoReturn:
    raise LockError(f"{where}: field `{field}`: expected {expected}, actual {_shown(value)}")


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _object(parent: Mapping[str, Any], key: str, where: object, field: str = "") -> dict[str, Any]:
    value = parent.get(key, _MISSING)
    if not isinstance(value, dict):
        _fail(where, _join(field, key), "an object", value)
    return value


def _list(parent: Mapping[str, Any], key: str, where: object, field: str = "") -> list[Any]:
    value = parent.get(key, _MISSING)
    if not isinstance(value, list):
        _fail(where, _join(field, key), "a list", value)
    return value


def _string(parent: Mapping[str, Any], key: str, where: object, field: str = "") -> str:
    value = parent.get(key, _MISSING)
    if not isinstance(value, str) or not value:
        _fail(where, _join(field, key), "a non-empty string", value)
    return value


def _filename(parent: Mapping[str, Any], key: str, where: object, field: str, suffix: str) -> str:
    value = parent.get(key, _MISSING)
    if not isinstance(value, str) or "/" in value or len(value) <= len(suffix) or not value.endswith(suffix):
        _fail(where, _join(field, key), f"a {suffix} file name without '/'", value)
    return value


def _one_of(value: str, choices: tuple[str, ...], where: object, field: str) -> str:
    if value not in choices:
        _fail(where, field, f"one of {', '.join(choices)}", value)
    return value


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a sha256 as every lock writes it: 64 lowercase hex digits."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def check_sha256(value: Any, where: object, field: str) -> str:
    """``value``, a locked sha256; fail naming ``where`` and ``field`` unless it is 64 lowercase hex digits.

    The one check of a sha256's form in Python: every reader of this module, and the requirements
    parser of ``sparkseal lock python``, call it (or :func:`is_sha256`)."""
    if not is_sha256(value):
        _fail(where, field, "64 lowercase hex digits", value)
    return value


def check_file(path: Path, sha256: str, source: str) -> None:
    """Fail unless the file at ``path`` has the locked ``sha256`` (``source`` says where it is locked).

    The one place Python compares a file's bytes with a lock: the root file system and toolchain
    builders (each .deb), ``sparkseal lock python`` (the locked sdist) and the repository cache copy."""
    actual = sha256_file(path)
    if actual != sha256:
        raise LockError(f"{path}: sha256 mismatch: expected {sha256} ({source}), actual {actual}")


def _file(entry: Mapping[str, Any], where: object, field: str, suffix: str) -> LockedFile:
    return LockedFile(
        _filename(entry, "filename", where, field, suffix),
        check_sha256(entry.get("sha256", _MISSING), where, _join(field, "sha256")),
    )


def _format(document: Any, where: object, kind: str, accepted: tuple[int, ...]) -> int:
    """The ``format`` of a lock ``document`` (a JSON object) of ``kind``: one of ``accepted``."""
    if not isinstance(document, dict):
        raise LockError(f"{where}: expected a JSON object ({DESCRIPTIONS[kind]}), actual {_shown(document)}")
    found = document.get("format", _MISSING)
    if type(found) is not int or found not in accepted:
        _fail(where, "format", f"{' or '.join(map(str, accepted))} ({DESCRIPTIONS[kind]})", found)
    return found


# --- one reader per kind ------------------------------------------------------------------------------


def parse_vllm_lock(document: Any, where: object) -> VllmLock:
    """A ``vllm`` lock document (parsed JSON) read from ``where``: a wheel for every platform."""
    version = _format(document, where, "vllm", (FORMATS["vllm"],))
    commit = _string(document, "commit", where)
    if not _COMMIT.fullmatch(commit):
        _fail(where, "commit", COMMIT_EXPECTED, commit)
    wheels = _object(document, "wheels", where)
    for platform in sorted(wheels):
        _one_of(platform, tuple(sorted(PLATFORMS)), where, f"wheels.{platform}")
    return VllmLock(
        format=version,
        name=_string(document, "name", where),
        version=_string(document, "version", where),
        commit=commit,
        sdist=_file(_object(document, "sdist", where), where, "sdist", ".tar.gz"),
        wheels={
            platform: _file(_object(wheels, platform, where, "wheels"), where, f"wheels.{platform}", ".whl")
            for platform in sorted(PLATFORMS)
        },
    )


def parse_wheels_lock(document: Any, where: object) -> WheelsLock:
    """A ``wheels`` lock document read from ``where``: every project with its version and its wheels."""
    version = _format(document, where, "wheels", (FORMATS["wheels"],))
    wheels = _object(document, "wheels", where)
    found = {}
    for project in sorted(wheels):
        field = f"wheels.{project}"
        entry = _object(wheels, project, where, "wheels")
        files = _object(entry, "files", where, field)
        if not files:
            _fail(where, f"{field}.files", "an object with a wheel per platform", files)
        for platform in sorted(files):
            _one_of(platform, WHEEL_PLATFORMS, where, f"{field}.files.{platform}")
        found[project] = ToolWheel(
            version=_string(entry, "version", where, field),
            files={
                platform: _file(
                    _object(files, platform, where, f"{field}.files"),
                    where,
                    f"{field}.files.{platform}",
                    ".whl",
                )
                for platform in sorted(files)
            },
        )
    return WheelsLock(format=version, wheels=found)


def parse_python_lock(document: Any, where: object) -> PythonLock:
    """A ``python`` lock document (a requirements file's sidecar) read from ``where``."""
    version = _format(document, where, "python", (FORMATS["python"],))
    platform = _one_of(_string(document, "platform", where), WHEEL_PLATFORMS, where, "platform")
    requirements = _filename(document, "requirements", where, "", ".txt")
    wheels = _object(document, "wheels", where)
    found = {}
    for project in sorted(wheels):
        field = f"wheels.{project}"
        entry = _object(wheels, project, where, "wheels")
        file = _file(entry, where, field, ".whl")
        found[project] = PythonWheel(_string(entry, "version", where, field), file.filename, file.sha256)
    return PythonLock(format=version, platform=platform, requirements=requirements, wheels=found)


def _pool_path(value: str, filename: str) -> bool:
    """Whether ``value`` is a clean relative path (no empty, ``.`` or ``..`` part) ending in ``filename``."""
    parts = value.split("/")
    return parts[-1] == filename and not [part for part in parts if part in ("", ".", "..")]


def _placed(entry: Mapping[str, Any], where: object, field: str, filename: str) -> dict[str, str]:
    """The archive, path and snapshot time stamp of a package entry, each checked in this order."""
    archive = _string(entry, "archive", where, field)
    if not ARCHIVE_NAME.fullmatch(archive):
        _fail(where, f"{field}.archive", "an archive name ([a-z0-9][a-z0-9.+_-]*)", archive)
    path = _string(entry, "path", where, field)
    if not _pool_path(path, filename):
        expected = f"a relative path without '.', '..' or empty parts, ending in {filename}"
        _fail(where, f"{field}.path", expected, path)
    snapshot = _string(entry, "snapshot", where, field)
    if not TIMESTAMP.fullmatch(snapshot):
        _fail(where, f"{field}.snapshot", "a time stamp YYYYMMDDTHHMMSSZ", snapshot)
    return {"archive": archive, "path": path, "snapshot": snapshot}


def parse_debian_lock(
    document: Any, where: object, formats: tuple[int, ...] = (FORMATS["debian"],)
) -> DebianLock:
    """A ``debian`` lock document read from ``where``, in one of ``formats`` (the writer passes
    :data:`DEBIAN_OLDER_FORMATS` too, to rewrite such a lock): each package named once."""
    version = _format(document, where, "debian", formats)
    current = version == FORMATS["debian"]
    architecture = _one_of(_string(document, "architecture", where), ARCHITECTURES, where, "architecture")
    suite = _string(document, "suite", where)
    roots = _list(document, "roots", where)
    for index, root in enumerate(roots):
        if not isinstance(root, str) or not root:
            _fail(where, f"roots[{index}]", "a non-empty string", root)
    entries = _list(document, "packages", where)
    if not entries:
        _fail(where, "packages", "a non-empty list", entries)
    packages = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        field = f"packages[{index}]"
        if not isinstance(entry, dict):
            _fail(where, field, "an object", entry)
        package = _string(entry, "package", where, field)
        if package in seen:
            _fail(where, f"{field}.package", "a package not listed before", package)
        seen.add(package)
        file = _file(entry, where, field, ".deb")
        size = entry.get("size", _MISSING)
        if type(size) is not int or size < 0:
            _fail(where, f"{field}.size", "a whole number of bytes", size)
        if current:
            placed = _placed(entry, where, field, file.filename)
        else:
            placed = {key: str(entry.get(key) or "") for key in ("archive", "path", "snapshot")}
        packages.append(
            DebianPackage(
                package=package,
                version=_string(entry, "version", where, field),
                architecture=_string(entry, "architecture", where, field),
                filename=file.filename,
                sha256=file.sha256,
                size=size,
                **placed,
            )
        )
    return DebianLock(
        format=version, architecture=architecture, suite=suite, roots=tuple(roots), packages=tuple(packages)
    )


PARSERS: dict[str, Callable[[Any, object], Lock]] = {
    "vllm": parse_vllm_lock,
    "wheels": parse_wheels_lock,
    "python": parse_python_lock,
    "debian": parse_debian_lock,
}


def load(path: Path) -> Any:
    """The parsed JSON of the lock at ``path``; fail naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LockError(f"{path}: expected a lock file, found none") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise LockError(f"{path}: expected a JSON lock, actual unreadable content: {error}") from None


def read_lock(kind: str, path: Path) -> Lock:
    """The lock of ``kind`` (a key of :data:`FORMATS`) at ``path``, read by that kind's reader."""
    if kind not in PARSERS:
        raise ValueError(f"unknown lock kind {kind!r}: expected one of {', '.join(PARSERS)}")
    return PARSERS[kind](load(path), path)


def read_vllm_lock(path: Path) -> VllmLock:
    """The ``vllm`` lock at ``path``."""
    return parse_vllm_lock(load(path), path)


def read_wheels_lock(path: Path) -> WheelsLock:
    """The ``wheels`` lock at ``path``."""
    return parse_wheels_lock(load(path), path)


def read_python_lock(path: Path) -> PythonLock:
    """The ``python`` lock (a ``*.files.json`` sidecar) at ``path``."""
    return parse_python_lock(load(path), path)


def read_debian_lock(path: Path, formats: tuple[int, ...] = (FORMATS["debian"],)) -> DebianLock:
    """The ``debian`` lock at ``path``, in one of ``formats``."""
    return parse_debian_lock(load(path), path, formats)


def render_lock(kind: str, document: Mapping[str, Any], where: object) -> str:
    """The text of a lock of ``kind`` to be written at ``where``: ``document`` with the kind's current
    ``format``, read back by the kind's reader (a writer's slip fails here, before a byte is written),
    sorted keys, two-space indent, one trailing newline."""
    body = {**document, "format": FORMATS[kind]}
    PARSERS[kind](body, where)
    return json.dumps(body, indent=2, sort_keys=True) + "\n"
