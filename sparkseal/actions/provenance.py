"""Action: the SLSA v1 provenance of one platform's build, as an in-toto Statement v1.

The statement says what was built (``subject``), from what (``resolvedDependencies``) and by what
(``builder``), with no clock time, host name or build path in it, so two builds of the same inputs write
the same bytes:

* ``subject``: the image (its OCI manifest digest), the PEX (its tree digest, as ``sparkseal_pex`` writes it),
  the module manifest and both SBOMs, SPDX 2.3 and CycloneDX 1.6 (the sha256 of each file), so that
  either SBOM, handed on alone, can be checked against the signed statement. Each subject's ``name`` is
  its path below ``bazel-bin`` and its ``annotations.kind`` says how ``sparkseal provenance check``
  re-derives the digest.
* ``buildDefinition.externalParameters``: the platform, the Bazel targets, the CUDA architecture override.
* ``buildDefinition.resolvedDependencies``: first the source of this build, this repository's commit
  (``uri`` ``git+https://HOST/PATH@refs/heads/BRANCH`` without credentials, ``digest.gitCommit``,
  ``annotations.tree`` ``clean`` or ``dirty``), read from Bazel's stable status file
  (``sparkseal.core.source``); when the build did not know it, no such entry but
  ``internalParameters.source.unknown`` with the reason. Then the locked vLLM commit, sdist and upstream
  wheel, every patch of the series (in series order), every locked wheel and Debian package of the
  platform, the kernel toolchain's wheels, the build tools' wheels, the secret scanner's wheels (the
  scanner and version that scanned every layer), and the Debian packages of the locked interpreter every
  action ran on (``interpreter``) and of the locked compilers of the kernels (``compiler``), each with its
  sha256. Each carries ``annotations.role``.
* ``runDetails.builder``: :data:`BUILDER_ID`, with the interpreter that runs the actions (read here at run
  time) and the Bazel release only where Bazel reported one.
* ``buildDefinition.internalParameters.bazel``: what is known of the Bazel that ran, each in a field that says
  how (``sparkseal.core.slsa.bazel_record``): the release it reported (null for Debian's
  ``bazel-bootstrap``, which reports none), the range inferred from its Starlark, the release the builder
  declared (null unless named with ``--//rules:bazel_version``).
* ``runDetails.byproducts``: the wheels the build made (our vLLM wheel, the sparkseal wheel).

Dates are left out (``runDetails.metadata`` is optional); ``internalParameters`` also records
SOURCE_DATE_EPOCH, the one date every artifact carries.

The statement's types live in ``sparkseal.core.slsa``, shared with the SBOM action and with ``sparkseal
provenance check``; the locks are read by ``sparkseal.core.locks``, the one reader of each lock kind.

As an action::

    provenance --platform linux_aarch64 --vllm-lock vllm.lock.json --patch NAME PATH ... \\
        --python-lock requirements_linux_aarch64.files.json --tools-lock tools.files.json \\
        --debian-lock bookworm_arm64.lock.json --cuda-lock toolchain.lock.json \\
        --scanner-lock scanner.lock.json --built-wheel WHL ... \\
        --subject oci-image NAME DIGEST_FILE --image-tag TAG --subject pex NAME DIGEST_FILE \\
        --subject module-manifest NAME FILE --subject sbom NAME FILE --subject sbom-cyclonedx NAME FILE \\
        --target //:image_linux_aarch64 ... --bazel-inferred '< 6.2' [--bazel-release R] \\
        [--bazel-declared R] [--source-status stable-status.txt] --out provenance.intoto.json
"""

from __future__ import annotations

import argparse
import platform as host_platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkseal.core.determinism import SOURCE_DATE_EPOCH
from sparkseal.core.oci import LAYER_MEDIA_TYPES
from sparkseal.core.repo_names import apparent_text
from sparkseal.core.slsa import (
    BAZEL_INFERENCES,
    BUILD_TYPE,
    BUILDER_ID,
    DIGEST_FILE_KINDS,
    PLATFORMS,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    SUBJECT_KINDS,
    ProvenanceError,
    bazel_record,
    built_wheel,
    debian_packages,
    dumps,
    file_sha256,
    python_wheels,
    read_digest_file,
    tool_wheels,
    vllm_sources,
)
from sparkseal.core.source import NO_STATUS, Source, SourceError, parse_status


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
    bazel_inferred: str
    bazel_release: str | None = None
    bazel_declared: str | None = None
    cuda_archs: str = ""
    scanner_lock: Path | None = None
    layer_compression: str = "gzip"
    zstd_lock: Path | None = None
    interpreter_lock: Path | None = None
    compiler_lock: Path | None = None
    source_status: Path | None = None


def read_source(status: Path | None) -> Source:
    """The source recorded in Bazel's stable status file; unknown (and why) without one."""
    if status is None:
        return Source(unknown=NO_STATUS)
    try:
        text = status.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ProvenanceError(
            f"{status}: expected Bazel's stable status file, cannot read it: {error}"
        ) from None
    try:
        return parse_status(text, str(status))
    except SourceError as error:
        raise ProvenanceError(str(error)) from None


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
    vllm = vllm_sources(inputs.vllm_lock, inputs.platform)
    source = read_source(inputs.source_status)
    source_entry = source.descriptor()
    dependencies = [
        *([source_entry] if source_entry else []),
        vllm.source(),
        vllm.sdist.descriptor(),
        vllm.wheel.descriptor(),
        *patch_descriptors(inputs.patches),
        *(item.descriptor() for item in python_wheels(inputs.python_lock, "wheel")),
        *(item.descriptor() for item in debian_packages(inputs.debian_lock)),
        *(item.descriptor() for item in tool_wheels(inputs.cuda_lock)),
        *(item.descriptor() for item in python_wheels(inputs.tools_lock, "build-tool")),
    ]
    # The locked toolchains every action ran on: their packages shape the outputs like any source.
    for role, lock in (("interpreter", inputs.interpreter_lock), ("compiler", inputs.compiler_lock)):
        if lock is not None:
            dependencies.extend(item.descriptor() for item in debian_packages(lock, role))
    if inputs.scanner_lock is not None:
        dependencies.extend(item.descriptor() for item in tool_wheels(inputs.scanner_lock, "secret-scanner"))
    if (inputs.layer_compression == "zstd") != (inputs.zstd_lock is not None):
        raise ProvenanceError(
            f"--zstd-lock: expected it exactly with zstd layers, found layer compression "
            f"{inputs.layer_compression!r} and zstd lock {inputs.zstd_lock}"
        )
    if inputs.zstd_lock is not None:
        dependencies.extend(item.descriptor() for item in tool_wheels(inputs.zstd_lock, "layer-compressor"))
    parameters: dict[str, Any] = {
        "cudaArchs": inputs.cuda_archs,
        "platform": inputs.platform,
        "targets": sorted(set(inputs.targets)),
    }
    if inputs.layer_compression != "gzip":
        # Only a non-default compression is a parameter: gzip images keep their statements as before.
        parameters["layerCompression"] = inputs.layer_compression
    bazel = bazel_record(inputs.bazel_release, inputs.bazel_inferred, inputs.bazel_declared)
    internal: dict[str, Any] = {"bazel": bazel, "sourceDateEpoch": SOURCE_DATE_EPOCH}
    if source_entry is None:
        # Said plainly rather than left out: a reader must not take a missing source for a clean one.
        internal["source"] = {"unknown": source.unknown}
    # The builder names a Bazel release only where Bazel reported one: nothing unmeasured is stated there.
    version = {"python": interpreter(), **({"bazel": bazel["release"]} if bazel["release"] else {})}
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
                "externalParameters": parameters,
                "internalParameters": internal,
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER_ID,
                    "version": version,
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
        "--scanner-lock", type=Path, default=None, help="third_party/scan/scanner.lock.json (the layer scan)"
    )
    parser.add_argument("--layer-compression", choices=sorted(LAYER_MEDIA_TYPES), default="gzip")
    parser.add_argument(
        "--zstd-lock", type=Path, default=None, help="third_party/zstd/zstandard.lock.json (zstd layers)"
    )
    parser.add_argument(
        "--interpreter-lock",
        type=Path,
        default=None,
        help="third_party/toolchains/python_bookworm_<arch>.lock.json (the actions' interpreter)",
    )
    parser.add_argument(
        "--compiler-lock",
        type=Path,
        default=None,
        help="third_party/toolchains/cc_bookworm_<arch>.lock.json (the kernels' compilers)",
    )
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
    parser.add_argument(
        "--bazel-inferred",
        required=True,
        choices=sorted(BAZEL_INFERENCES),
        help="the Bazel range told from the running Bazel's Starlark",
    )
    parser.add_argument(
        "--bazel-release", default=None, help="the release Bazel reports (native.bazel_version)"
    )
    parser.add_argument("--bazel-declared", default=None, help="the release the builder names (not measured)")
    parser.add_argument("--cuda-archs", default="", help="the CUDA architecture override ('' = per wheel)")
    parser.add_argument(
        "--source-status",
        type=Path,
        default=None,
        help="Bazel's stable status file (ctx.info_file): the repository, commit and tree state",
    )
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
        bazel_inferred=args.bazel_inferred,
        bazel_release=args.bazel_release,
        bazel_declared=args.bazel_declared,
        cuda_archs=args.cuda_archs,
        scanner_lock=args.scanner_lock,
        layer_compression=args.layer_compression,
        zstd_lock=args.zstd_lock,
        interpreter_lock=args.interpreter_lock,
        compiler_lock=args.compiler_lock,
        source_status=args.source_status,
    )
    try:
        text = dumps(statement(inputs))
    except ProvenanceError as error:
        print(f"provenance: {apparent_text(str(error))}", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
