"""Action and library: the SLSA v1 provenance of one platform's build, as an in-toto Statement v1.

The statement says what was built (``subject``), from what (``resolvedDependencies``) and by what
(``builder``), with no clock time, host name or build path in it, so two builds of the same inputs write
the same bytes:

* ``subject``: the image (its OCI manifest digest), the PEX (its tree digest, as ``pex_build`` writes it),
  the module manifest and the SBOM (the sha256 of each file). Each subject's ``name`` is its path below
  ``bazel-bin`` and its ``annotations.kind`` says how ``sparkseal provenance check`` re-derives the digest.
* ``buildDefinition.externalParameters``: the platform, the Bazel targets, the CUDA architecture override.
* ``buildDefinition.resolvedDependencies``: the locked vLLM commit, sdist and upstream wheel, every patch of
  the series (in series order), every locked wheel and Debian package of the platform, the kernel
  toolchain's wheels and the build tools' wheels, each with its sha256. Each carries ``annotations.role``.
* ``runDetails.builder``: :data:`BUILDER_ID`, with the Bazel release (declared by the workspace: a Debian
  ``bazel-bootstrap`` reports none) and the interpreter that runs the actions (read here at run time).
* ``runDetails.byproducts``: the wheels the build made (our vLLM wheel, the sparkseal wheel).

Dates are left out (``runDetails.metadata`` is optional); ``internalParameters`` records
SOURCE_DATE_EPOCH, the one date every artifact carries.

The lock readers here (:func:`read_vllm_lock`, :func:`read_wheel_lock`, :func:`read_debian_lock`,
:func:`read_toolchain_lock`) are shared with the SBOM action (``sparkseal.build.sbom``).

As an action::

    provenance --platform linux_aarch64 --vllm-lock vllm.lock.json --patch NAME PATH ... \\
        --python-lock requirements_linux_aarch64.files.json --tools-lock tools.files.json \\
        --debian-lock bookworm_arm64.lock.json --cuda-lock toolchain.lock.json --built-wheel WHL ... \\
        --subject oci-image NAME DIGEST_FILE --image-tag TAG --subject pex NAME DIGEST_FILE \\
        --subject module-manifest NAME FILE --subject sbom NAME FILE \\
        --target //:image_linux_aarch64 ... --bazel-version 4.2.3 --out provenance.intoto.json
"""

from __future__ import annotations

import argparse
import json
import platform as host_platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sparkseal.build import platforms
from sparkseal.build.install_wheels import InstallError, normalize_name, parse_wheel_filename
from sparkseal.build.module_manifest import sha256_file
from sparkseal.determinism import SOURCE_DATE_EPOCH

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# sparkseal has no web home of its own, so its identifiers are URNs in the project's own namespace: they
# name the rules and the recipe, never a machine.
NAMESPACE = "urn:sparkseal"
BUILDER_ID = f"{NAMESPACE}:builder:bazel-rules:v1"
BUILD_TYPE = f"{NAMESPACE}:build-type:image-pex:v1"

# How a subject's digest is re-derived from the artifact on disk (sparkseal.audit.provenance_check):
#   oci-image        the OCI layout directory; the digest of the image manifest its index.json names
#   pex              the packed PEX directory; sha256 of its sha256sum-style listing (pex_build.tree_digest)
#   module-manifest  the manifest file; sha256 of its bytes
#   sbom             the SPDX file; sha256 of its bytes
# The action itself reads the first two from the digest files their rules write, never the large trees.
DIGEST_FILE_KINDS = ("oci-image", "pex")
SUBJECT_KINDS = (*DIGEST_FILE_KINDS, "module-manifest", "sbom")

PLATFORMS = tuple(sorted(platforms.PLATFORMS))
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_PURL_SAFE = ".-_~"


class ProvenanceError(Exception):
    """An input is missing or malformed; the message names the file, the expected and the actual value."""


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


def pypi_purl(project: str, version: str, filename: str) -> str:
    """The package URL of one file of a Python project (``pkg:pypi/NAME@VERSION?file_name=FILE``)."""
    return f"pkg:pypi/{normalize_name(project)}@{quote(version, safe=_PURL_SAFE)}?file_name={quote(filename)}"


def deb_purl(package: str, version: str, architecture: str, suite: str) -> str:
    """The package URL of a Debian binary package (``pkg:deb/debian/NAME@VERSION?arch=..&distro=..``)."""
    return (
        f"pkg:deb/debian/{quote(package, safe=_PURL_SAFE)}@{quote(version, safe=_PURL_SAFE)}"
        f"?arch={architecture}&distro={suite}"
    )


def load_json(path: Path) -> Any:
    """Parse a JSON input; fail naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ProvenanceError(f"{path}: expected a JSON file, found none") from error
    except (OSError, ValueError) as error:
        raise ProvenanceError(f"{path}: expected JSON, found unreadable content: {error}") from error


def _field(data: Any, keys: str, path: Path) -> str:
    value = data
    for key in keys.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str) or not value:
        raise ProvenanceError(f"{path}: expected a non-empty string at {keys}, found {value!r}")
    return value


def _sha256_field(data: Any, keys: str, path: Path) -> str:
    value = _field(data, keys, path)
    if not _HEX64.fullmatch(value):
        raise ProvenanceError(f"{path}: expected 64 lowercase hex digits at {keys}, found {value!r}")
    return value


def _object(data: Any, key: str, path: Path) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, dict):
        raise ProvenanceError(f"{path}: expected an object at {key}, found {type(value).__name__}")
    return value


@dataclass(frozen=True)
class VllmLock:
    """The vLLM lock: release, commit, sdist and the upstream wheel of one platform."""

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


def read_vllm_lock(path: Path, platform: str) -> VllmLock:
    """Read ``third_party/vllm/vllm.lock.json`` for ``platform``."""
    data = load_json(path)
    version, commit = _field(data, "version", path), _field(data, "commit", path)
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ProvenanceError(f"{path}: expected a 40-hex commit at commit, found {commit!r}")

    def entry(role: str, keys: str) -> Locked:
        filename = _field(data, f"{keys}.filename", path)
        return Locked(
            role,
            "vllm",
            version,
            filename,
            _sha256_field(data, f"{keys}.sha256", path),
            pypi_purl("vllm", version, filename),
        )

    return VllmLock(
        version, commit, entry("vllm-sdist", "sdist"), entry("vllm-upstream-wheel", f"wheels.{platform}")
    )


def read_wheel_lock(path: Path, role: str) -> list[Locked]:
    """Every wheel of a ``*.files.json`` sidecar (``sparkseal lock python``), sorted by project."""
    found = []
    for project, entry in sorted(_object(load_json(path), "wheels", path).items()):
        where = f"wheels.{project}"
        filename = _field(entry, "filename", path / where)
        version = _field(entry, "version", path / where)
        found.append(
            Locked(
                role,
                project,
                version,
                filename,
                _sha256_field(entry, "sha256", path / where),
                pypi_purl(project, version, filename),
            )
        )
    return found


def read_debian_lock(path: Path) -> list[Locked]:
    """Every package of a Debian lock (``sparkseal lock debian``), sorted by package name."""
    data = load_json(path)
    suite = _field(data, "suite", path)
    packages = data.get("packages") if isinstance(data, dict) else None
    if not isinstance(packages, list):
        raise ProvenanceError(f"{path}: expected a list at packages, found {type(packages).__name__}")
    found = []
    for index, entry in enumerate(packages):
        where = path / f"packages[{index}]"
        package, version = _field(entry, "package", where), _field(entry, "version", where)
        architecture = _field(entry, "architecture", where)
        found.append(
            Locked(
                "deb",
                package,
                version,
                _field(entry, "filename", where),
                _sha256_field(entry, "sha256", where),
                deb_purl(package, version, architecture, suite),
                (("architecture", architecture),),
            )
        )
    return sorted(found, key=lambda item: (item.name, item.filename))


def read_toolchain_lock(path: Path) -> list[Locked]:
    """Every file of the kernel toolchain lock (``third_party/cuda/toolchain.lock.json``).

    The toolchain repository fetches every file the lock names, for every platform key, so all are listed.
    """
    found = []
    for project, entry in sorted(_object(load_json(path), "wheels", path).items()):
        where = path / f"wheels.{project}"
        version = _field(entry, "version", where)
        for key, file in sorted(_object(entry, "files", where).items()):
            filename = _field(file, "filename", where / f"files.{key}")
            found.append(
                Locked(
                    "toolchain",
                    project,
                    version,
                    filename,
                    _sha256_field(file, "sha256", where / f"files.{key}"),
                    pypi_purl(project, version, filename),
                    (("platform", key),),
                )
            )
    return found


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
    except InstallError as error:
        raise ProvenanceError(f"{path}: {error}") from error
    return Locked("built-wheel", parsed.project, parsed.version, path.name, file_sha256(path))


@dataclass(frozen=True)
class Subject:
    """One artifact the statement is about; ``source`` is the digest file or the artifact itself."""

    kind: str
    name: str
    source: Path
    tag: str | None = None

    def descriptor(self) -> dict[str, Any]:
        """The subject's ResourceDescriptor, its digest read or computed from ``source``."""
        digest = read_digest_file(self.source) if self.kind in DIGEST_FILE_KINDS else file_sha256(self.source)
        annotations = {"kind": self.kind, **({"tag": self.tag} if self.tag else {})}
        return {"name": self.name, "digest": {"sha256": digest}, "annotations": annotations}


@dataclass(frozen=True)
class Inputs:
    """Everything one statement is made from (the action's arguments, parsed)."""

    platform: str
    vllm_lock: Path
    patches: tuple[tuple[str, Path], ...]
    python_lock: Path
    tools_lock: Path
    debian_lock: Path
    cuda_lock: Path
    built_wheels: tuple[Path, ...]
    subjects: tuple[Subject, ...]
    targets: tuple[str, ...]
    bazel_version: str
    cuda_archs: str = ""


def patch_descriptors(patches: Iterable[tuple[str, Path]]) -> list[dict[str, Any]]:
    """The descriptors of the series' patches, in series order (``annotations.series`` counts from 1)."""
    return [
        {
            "name": name,
            "digest": {"sha256": file_sha256(path)},
            "annotations": {"role": "patch", "series": index},
        }
        for index, (name, path) in enumerate(patches, start=1)
    ]


def interpreter() -> str:
    """The identity of the interpreter running the action, e.g. ``CPython 3.11.2``."""
    return f"{host_platform.python_implementation()} {host_platform.python_version()}"


def statement(inputs: Inputs) -> dict[str, Any]:
    """The in-toto Statement v1 with the SLSA v1 provenance predicate of ``inputs``."""
    if inputs.platform not in PLATFORMS:
        raise ProvenanceError(
            f"--platform: expected one of {', '.join(PLATFORMS)}, found {inputs.platform!r}"
        )
    kinds = sorted(subject.kind for subject in inputs.subjects)
    if kinds != sorted(SUBJECT_KINDS):
        raise ProvenanceError(
            f"--subject: expected one of each kind {', '.join(sorted(SUBJECT_KINDS))}, "
            f"found {', '.join(kinds) or 'none'}"
        )
    vllm = read_vllm_lock(inputs.vllm_lock, inputs.platform)
    dependencies = [
        vllm.source(),
        vllm.sdist.descriptor(),
        vllm.wheel.descriptor(),
        *patch_descriptors(inputs.patches),
        *(item.descriptor() for item in read_wheel_lock(inputs.python_lock, "wheel")),
        *(item.descriptor() for item in read_debian_lock(inputs.debian_lock)),
        *(item.descriptor() for item in read_toolchain_lock(inputs.cuda_lock)),
        *(item.descriptor() for item in read_wheel_lock(inputs.tools_lock, "build-tool")),
    ]
    byproducts = sorted((built_wheel(path) for path in inputs.built_wheels), key=lambda item: item.filename)
    return {
        "_type": STATEMENT_TYPE,
        "subject": sorted(
            (s.descriptor() for s in inputs.subjects), key=lambda d: (d["name"], d["digest"]["sha256"])
        ),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "cudaArchs": inputs.cuda_archs,
                    "platform": inputs.platform,
                    "targets": sorted(set(inputs.targets)),
                },
                "internalParameters": {"sourceDateEpoch": SOURCE_DATE_EPOCH},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER_ID,
                    "version": {"bazel": inputs.bazel_version, "python": interpreter()},
                },
                "byproducts": [item.descriptor() for item in byproducts],
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Action entry point: write the provenance statement to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    parser.add_argument("--platform", required=True, choices=PLATFORMS)
    parser.add_argument("--vllm-lock", type=Path, required=True, help="third_party/vllm/vllm.lock.json")
    parser.add_argument(
        "--patch", nargs=2, action="append", default=[], metavar=("NAME", "PATH"), help="in series order"
    )
    parser.add_argument("--python-lock", type=Path, required=True, help="requirements_<platform>.files.json")
    parser.add_argument("--tools-lock", type=Path, required=True, help="third_party/python/tools.files.json")
    parser.add_argument("--debian-lock", type=Path, required=True, help="bookworm_<arch>.lock.json")
    parser.add_argument("--cuda-lock", type=Path, required=True, help="third_party/cuda/toolchain.lock.json")
    parser.add_argument(
        "--built-wheel", type=Path, action="append", default=[], help="a wheel the build made"
    )
    parser.add_argument(
        "--subject",
        nargs=3,
        action="append",
        default=[],
        metavar=("KIND", "NAME", "PATH"),
        help=f"KIND is one of {', '.join(SUBJECT_KINDS)}; PATH is the digest file for "
        f"{' and '.join(DIGEST_FILE_KINDS)}, else the artifact",
    )
    parser.add_argument("--image-tag", default=None, help="REPOSITORY:TAG of the oci-image subject")
    parser.add_argument("--target", action="append", default=[], help="a Bazel target the statement covers")
    parser.add_argument("--bazel-version", required=True, help="the Bazel release the workspace declares")
    parser.add_argument("--cuda-archs", default="", help="the CUDA architecture override ('' = per wheel)")
    parser.add_argument("--out", type=Path, required=True, help="statement JSON to write")
    args = parser.parse_args(argv)
    subjects = []
    for kind, name, source in args.subject:
        if kind not in SUBJECT_KINDS:
            parser.error(
                f"--subject {kind} {name}: expected a kind in {', '.join(SUBJECT_KINDS)}, found {kind!r}"
            )
        subjects.append(Subject(kind, name, Path(source), args.image_tag if kind == "oci-image" else None))
    inputs = Inputs(
        platform=args.platform,
        vllm_lock=args.vllm_lock,
        patches=tuple((name, Path(path)) for name, path in args.patch),
        python_lock=args.python_lock,
        tools_lock=args.tools_lock,
        debian_lock=args.debian_lock,
        cuda_lock=args.cuda_lock,
        built_wheels=tuple(args.built_wheel),
        subjects=tuple(subjects),
        targets=tuple(args.target),
        bazel_version=args.bazel_version,
        cuda_archs=args.cuda_archs,
    )
    try:
        text = dumps(statement(inputs))
    except ProvenanceError as error:
        print(f"provenance: {error}", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
