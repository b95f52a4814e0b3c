"""The vocabulary of the SLSA provenance statement and of the SBOM, apart from the locks they describe.

What an in-toto Statement and an SBOM say of a build: the statement's types, the builder and build-type
identifiers, the subjects' kinds, the record of the Bazel that ran, the canonical JSON text, and for each
locked or built file its ResourceDescriptor and its package URL. The provenance action, the SBOM action
(through ``sparkseal.core.sbom``), ``sparkseal provenance check`` and the verification summary share it.
The locks themselves are read by ``sparkseal.core.locks`` (the one reader of each lock kind); this module
turns what it returns into :class:`Locked` descriptors, and every error into :class:`ProvenanceError`,
naming the file, the expected and the actual value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sparkseal.core import locks, platforms
from sparkseal.core.digests import sha256_file
from sparkseal.core.wheels import WheelError, normalize_name, parse_wheel_filename

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# sparkseal has no web home of its own, so its identifiers are URNs in the project's own namespace: they
# name the rules and the recipe, never a machine.
NAMESPACE = "urn:sparkseal"
BUILDER_ID = f"{NAMESPACE}:builder:bazel-rules:v1"
BUILD_TYPE = f"{NAMESPACE}:build-type:image-pex:v1"

# How a subject's digest is re-derived from the artifact on disk (sparkseal.audit.provenance_check):
#   oci-image        the OCI layout directory; the digest of the image manifest its index.json names
#   pex              the packed PEX directory; sha256 of its sha256sum-style listing (digests.tree_digest)
#   module-manifest  the manifest file; sha256 of its bytes
#   sbom             the SPDX 2.3 file; sha256 of its bytes
#   sbom-cyclonedx   the CycloneDX 1.6 file (the format BSI TR-03183-2 names); sha256 of its bytes
# The action itself reads the first two from the digest files their rules write, never the large trees.
# Both SBOMs are subjects: whoever is handed either can check it against the signed statement.
DIGEST_FILE_KINDS = ("oci-image", "pex")
SUBJECT_KINDS = (*DIGEST_FILE_KINDS, "module-manifest", "sbom", "sbom-cyclonedx")

PLATFORMS = tuple(sorted(platforms.PLATFORMS))
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_PURL_SAFE = ".-_~"


class ProvenanceError(Exception):
    """An input is missing or malformed; the message names the file, the expected and the actual value."""


# What a statement says of the Bazel that ran the build, in ``internalParameters.bazel``: only what was
# seen, each in a field that says how. ``release``: the release Bazel reports of itself
# (``native.bazel_version``), null when it reports none (Debian's bazel-bootstrap builds: `bazel info
# release` says "development version"). ``inferred``: the range rules/private/provenance.bzl tells from the
# Starlark the running Bazel offers, and from what. ``declared``: the release the builder named with
# ``--//rules:bazel_version`` (nobody measured it), null when none was named. ``runDetails.builder.version``
# names a Bazel release only when Bazel reported one.
BAZEL_RECORD = "predicate.buildDefinition.internalParameters.bazel"
BAZEL_INFERENCES = {
    ">= 6.2": ">= 6.2 (from features: native.package_relative_label is present)",
    "< 6.2": "< 6.2 (from features: native.package_relative_label is absent)",
}
_BAZEL_KEYS = ("declared", "inferred", "release")


def bazel_record(release: str | None, inferred: str, declared: str | None) -> dict[str, str | None]:
    """The statement's Bazel record; ``inferred`` is a key of :data:`BAZEL_INFERENCES`, empty strings are
    null (what a build setting or a Bazel that reports nothing gives)."""
    if inferred not in BAZEL_INFERENCES:
        raise ProvenanceError(
            f"--bazel-inferred: expected one of {', '.join(map(repr, BAZEL_INFERENCES))}, found {inferred!r}"
        )
    return {"declared": declared or None, "inferred": BAZEL_INFERENCES[inferred], "release": release or None}


def bazel_record_problem(statement: Any) -> str | None:
    """What is wrong with the Bazel record of ``statement`` (a parsed in-toto Statement), as
    ``field: expected ..., found ...``; None when the record is well formed."""
    predicate = statement.get("predicate") if isinstance(statement, dict) else None
    definition = predicate.get("buildDefinition") if isinstance(predicate, dict) else None
    internal = definition.get("internalParameters") if isinstance(definition, dict) else None
    record = internal.get("bazel") if isinstance(internal, dict) else None
    if not isinstance(record, dict) or sorted(record) != list(_BAZEL_KEYS):
        return f"{BAZEL_RECORD}: expected an object with the keys {', '.join(_BAZEL_KEYS)}, found {record!r}"
    for key in ("release", "declared"):
        if record[key] is not None and (not isinstance(record[key], str) or not record[key]):
            return f"{BAZEL_RECORD}.{key}: expected a non-empty string or null, found {record[key]!r}"
    if record["inferred"] not in BAZEL_INFERENCES.values():
        return (
            f"{BAZEL_RECORD}.inferred: expected one of "
            f"{', '.join(map(repr, BAZEL_INFERENCES.values()))}, found {record['inferred']!r}"
        )
    builder = (predicate.get("runDetails") or {}).get("builder") if isinstance(predicate, dict) else None
    version = builder.get("version") if isinstance(builder, dict) else None
    named = version.get("bazel") if isinstance(version, dict) else None
    if named != record["release"]:
        expected = f"{record['release']!r}" if record["release"] else "no entry (Bazel reported no release)"
        return f"predicate.runDetails.builder.version.bazel: expected {expected}, found {named!r}"
    return None


@dataclass(frozen=True)
class Locked:
    """One locked or built file: what it is, which file, and its sha256."""

    role: str
    name: str
    version: str
    filename: str
    sha256: str
    purl: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    def descriptor(self) -> dict[str, Any]:
        """The in-toto ResourceDescriptor of this file."""
        entry: dict[str, Any] = {
            "name": self.filename,
            "digest": {"sha256": self.sha256},
            "annotations": {"role": self.role, **dict(self.extra)},
        }
        if self.purl:
            entry["uri"] = self.purl
        return entry


def dumps(document: Mapping[str, Any]) -> str:
    """The canonical text of a statement or SBOM: sorted keys, indent 2, ASCII, one trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=True, separators=(",", ": ")) + "\n"


def pypi_purl(project: str, version: str, filename: str, sha256: str | None = None) -> str:
    """The package URL of one file of a Python project (``pkg:pypi/NAME@VERSION?file_name=FILE``).

    ``sha256`` names a file this build made, which no index serves: its ``checksum`` qualifier tells it
    from the released file of the same name (our vLLM wheel and the upstream one share theirs).
    """
    return _file_purl("pypi", normalize_name(project), version, filename, sha256)


def generic_purl(name: str, version: str, filename: str, sha256: str) -> str:
    """The package URL of a file that no package index serves, told by its content
    (``pkg:generic/NAME@VERSION?checksum=sha256:HEX&file_name=FILE``): a ``pkg:pypi`` one would name
    whatever someone else publishes under that name."""
    return _file_purl("generic", quote(name, safe=_PURL_SAFE), version, filename, sha256)


def _file_purl(kind: str, name: str, version: str, filename: str, sha256: str | None) -> str:
    # Qualifiers in the canonical (sorted) order of the purl specification.
    checksum = f"checksum=sha256:{sha256}&" if sha256 else ""
    return f"pkg:{kind}/{name}@{quote(version, safe=_PURL_SAFE)}?{checksum}file_name={quote(filename)}"


def deb_purl(package: str, version: str, architecture: str, suite: str) -> str:
    """The package URL of a Debian binary package (``pkg:deb/debian/NAME@VERSION?arch=..&distro=..``)."""
    return (
        f"pkg:deb/debian/{quote(package, safe=_PURL_SAFE)}@{quote(version, safe=_PURL_SAFE)}"
        f"?arch={architecture}&distro={suite}"
    )


_Lock = TypeVar("_Lock")


def _read(reader: Callable[[Path], _Lock], path: Path) -> _Lock:
    """``reader(path)`` (a reader of ``sparkseal.core.locks``), its errors as :class:`ProvenanceError`."""
    try:
        return reader(path)
    except locks.LockError as error:
        raise ProvenanceError(str(error)) from None


@dataclass(frozen=True)
class VllmSources:
    """What the vLLM lock says of one platform's build: release, commit, sdist and the upstream wheel."""

    version: str
    commit: str
    sdist: Locked
    wheel: Locked

    def source(self) -> dict[str, Any]:
        """The descriptor of the locked commit (the sdist records it; the build checks it)."""
        return {
            "name": "vllm",
            "uri": f"pkg:github/vllm-project/vllm@{self.commit}",
            "digest": {"gitCommit": self.commit},
            "annotations": {"role": "vllm-source", "version": self.version},
        }


def vllm_sources(path: Path, platform: str) -> VllmSources:
    """The sdist and the ``platform`` upstream wheel of the vLLM lock at ``path``."""
    lock = _read(locks.read_vllm_lock, path)
    if len(lock.commit) != 40:
        # A gitCommit digest is the full commit: an abbreviated one (as a fresh lock may hold) is refused.
        raise ProvenanceError(
            f"{path}: field `commit`: expected 40 lowercase hex digits (a full commit), "
            f"actual {json.dumps(lock.commit)}"
        )

    def entry(role: str, file: locks.LockedFile) -> Locked:
        purl = pypi_purl("vllm", lock.version, file.filename)
        return Locked(role, "vllm", lock.version, file.filename, file.sha256, purl)

    return VllmSources(
        lock.version,
        lock.commit,
        entry("vllm-sdist", lock.sdist),
        entry("vllm-upstream-wheel", lock.wheels[platform]),
    )


def python_wheels(path: Path, role: str) -> list[Locked]:
    """Every wheel of a ``*.files.json`` sidecar (``sparkseal lock python``), sorted by project."""
    return [
        Locked(
            role,
            project,
            wheel.version,
            wheel.filename,
            wheel.sha256,
            pypi_purl(project, wheel.version, wheel.filename),
        )
        for project, wheel in sorted(_read(locks.read_python_lock, path).wheels.items())
    ]


def debian_packages(path: Path, role: str = "deb") -> list[Locked]:
    """Every package of a Debian lock (``sparkseal lock debian``), sorted by package name; ``role`` says
    what the packages are to the build (``deb``: the image's base OS; ``interpreter``, ``compiler``: the
    build's locked toolchains)."""
    lock = _read(locks.read_debian_lock, path)
    found = [
        Locked(
            role,
            deb.package,
            deb.version,
            deb.filename,
            deb.sha256,
            deb_purl(deb.package, deb.version, deb.architecture, lock.suite),
            (("architecture", deb.architecture),),
        )
        for deb in lock.packages
    ]
    return sorted(found, key=lambda item: (item.name, item.filename))


def tool_wheels(path: Path, role: str = "toolchain") -> list[Locked]:
    """Every file of a tool-wheel lock (``third_party/cuda/toolchain.lock.json``, or with ``role``
    ``secret-scanner`` ``third_party/scan/scanner.lock.json``, with ``layer-compressor``
    ``third_party/zstd/zstandard.lock.json``; all are written by ``lock_wheels``).

    The toolchain repository fetches every file the lock names, for every platform key, so all are listed;
    of the scanner's, the build host's one runs, and all are listed as the lock pins them together.
    """
    return [
        Locked(
            role,
            project,
            wheel.version,
            file.filename,
            file.sha256,
            pypi_purl(project, wheel.version, file.filename),
            (("platform", platform),),
        )
        for project, wheel in sorted(_read(locks.read_wheels_lock, path).wheels.items())
        for platform, file in sorted(wheel.files.items())
    ]


def read_digest_file(path: Path) -> str:
    """The hex digest of a ``sha256:<hex>`` digest file (oci_image's ``.digest``, sparkseal_pex's)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError as error:
        raise ProvenanceError(f"{path}: expected a digest file, found none") from error
    except (OSError, UnicodeDecodeError) as error:
        raise ProvenanceError(
            f"{path}: expected sha256:<64 hex>, found unreadable content: {error}"
        ) from error
    match = _DIGEST.fullmatch(text)
    if not match:
        raise ProvenanceError(f"{path}: expected sha256:<64 hex>, found {text[:80]!r}")
    return match.group(1)


def file_sha256(path: Path) -> str:
    """The hex sha256 of an input file; fail naming it when it is absent."""
    try:
        return sha256_file(path)
    except FileNotFoundError as error:
        raise ProvenanceError(f"{path}: expected a file to hash, found none") from error


def built_wheel(path: Path) -> Locked:
    """A wheel made by this build, hashed here (a byproduct of the provenance)."""
    try:
        parsed = parse_wheel_filename(path.name)
    except WheelError as error:
        raise ProvenanceError(f"{path}: {error}") from error
    return Locked("built-wheel", parsed.project, parsed.version, path.name, file_sha256(path))
