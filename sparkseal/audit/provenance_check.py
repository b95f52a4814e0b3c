"""``sparkseal provenance check``: re-derive a provenance statement's subjects from the artifacts on disk.

Each subject of the statement (``sparkseal.actions.provenance``) names its artifact by its path below
``bazel-bin`` and says in ``annotations.kind`` how its digest is made. The artifact is looked up under a
root directory (by default the statement's own directory: ``bazel-bin`` for the top package's
``provenance_<platform>.intoto.json``) unless an artifact of that kind is given on the command line. Then:

* ``oci-image`` (an OCI layout directory): the image manifest that ``index.json`` names is hashed, and so
  are the config and every layer blob the manifest names; each must match its digest;
* ``pex`` (a packed PEX directory): the sha256 of its ``sha256sum``-style listing;
* ``module-manifest``, ``sbom`` (SPDX), ``sbom-cyclonedx`` (files): the sha256 of the file.

A digest that differs is a finding (exit 1) naming the subject, the expected and the actual digest; the
report ends with the verdict, ``PASSED`` or ``FAILED``. ``only`` restricts the check to subjects of some
kinds, for an auditor who holds some of the artifacts only: from a registry, the image (and the SBOMs and
module manifest it carries), never the PEX. What is left out is named in the report and in the verdict
line, so that a partial check never reads as a whole one. It also says what the statement records of the
source (``sparkseal.core.source``): the repository and commit, a build from a dirty tree as such, or that
the source is unknown and why. A statement that is not an in-toto Statement v1 with SLSA v1 provenance,
whose record of the Bazel that ran or of the source is malformed
(``sparkseal.core.slsa.bazel_record_problem``, ``sparkseal.core.source.statement_source``), or an
artifact that is missing, is an input error (:class:`CheckInputError`, exit 2): no verdict.

A signed statement (a DSSE envelope, ``sparkseal provenance sign``) is checked with ``pubkey``: its
signature is verified first (``sparkseal.core.dsse``, the envelope module that signing uses too) and only
the verified payload's subjects are trusted. An envelope without ``pubkey`` is an input error: nothing
is checked unsigned by accident.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkseal.core import dsse
from sparkseal.core.digests import sha256_file, tree_digest
from sparkseal.core.manifest import FORMAT as MODULE_MANIFEST_FORMAT
from sparkseal.core.oci import LayoutError, blob_path, read_image
from sparkseal.core.slsa import PREDICATE_TYPE, STATEMENT_TYPE, SUBJECT_KINDS, bazel_record_problem
from sparkseal.core.source import Source, SourceError, describe, statement_source

PASSED, FAILED = "PASSED", "FAILED"


class CheckInputError(Exception):
    """The statement or an artifact cannot be read; the message names the file and what was expected."""


@dataclass(frozen=True)
class Check:
    """One comparison: a subject (or a blob of the image) against what the artifact on disk gives."""

    subject: str
    kind: str
    path: str
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        """True when the artifact gives the recorded digest."""
        return self.expected == self.actual


@dataclass(frozen=True)
class Report:
    """The result of checking one statement."""

    provenance: str
    checks: tuple[Check, ...]
    signed_by: str | None = None  # the public key whose signature verified, for signed statements
    source: Source | None = None  # what the statement records of the source; None: nothing
    not_checked: tuple[str, ...] = ()  # "NAME (KIND)" of each subject that ``only`` left out

    @property
    def ok(self) -> bool:
        """True when every check matched."""
        return all(check.ok for check in self.checks)

    @property
    def verdict(self) -> str:
        """``PASSED`` when every check matched, else ``FAILED``."""
        return PASSED if self.ok else FAILED


def load_statement(path: Path, content: bytes | None = None) -> list[dict[str, Any]]:
    """The subjects of a provenance statement (``content``, else the file at ``path``), each checked for a
    name, a sha256 and a known kind."""
    return _load(path, content)[1]


def _load(path: Path, content: bytes | None) -> tuple[Source | None, list[dict[str, Any]]]:
    """The source record and the subjects of a provenance statement, each checked."""
    try:
        data = json.loads(path.read_bytes() if content is None else content)
    except FileNotFoundError as error:
        raise CheckInputError(f"{path}: expected a provenance statement, found no file") from error
    except (OSError, ValueError) as error:
        raise CheckInputError(f"{path}: expected JSON, found unreadable content: {error}") from error
    found = (data.get("_type"), data.get("predicateType")) if isinstance(data, dict) else (None, None)
    if found != (STATEMENT_TYPE, PREDICATE_TYPE):
        raise CheckInputError(
            f"{path}: expected _type {STATEMENT_TYPE} and predicateType {PREDICATE_TYPE}, "
            f"found {found[0]!r} and {found[1]!r}"
        )
    # The record of the Bazel that ran says only what was seen (sparkseal.core.slsa): a record that
    # states anything else, or a builder naming a release Bazel did not report, is no statement of ours.
    problem = bazel_record_problem(data)
    if problem is not None:
        raise CheckInputError(f"{path}: {problem}")
    try:
        source = statement_source(data)
    except SourceError as error:
        raise CheckInputError(f"{path}: {error}") from None
    subjects = data.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise CheckInputError(f"{path}: expected a non-empty subject list, found {subjects!r}")
    for index, subject in enumerate(subjects):
        name = subject.get("name") if isinstance(subject, dict) else None
        sha256 = (subject.get("digest") or {}).get("sha256") if isinstance(subject, dict) else None
        kind = (subject.get("annotations") or {}).get("kind") if isinstance(subject, dict) else None
        if not isinstance(name, str) or not isinstance(sha256, str) or kind not in SUBJECT_KINDS:
            raise CheckInputError(
                f"{path}: subject[{index}]: expected name, digest.sha256 and annotations.kind in "
                f"{', '.join(SUBJECT_KINDS)}, found name={name!r} sha256={sha256!r} kind={kind!r}"
            )
    return source, subjects


def artifact_kind(path: Path) -> str:
    """The subject kind an artifact on the command line is: told apart by content, not by name."""
    if path.is_dir():
        if (path / "oci-layout").is_file():
            return "oci-image"
        if (path / "PEX-INFO").is_file():
            return "pex"
    elif path.is_file():
        data = _json_object(path)
        if data is not None and data.get("format") == MODULE_MANIFEST_FORMAT:
            return "module-manifest"
        if data is not None and "spdxVersion" in data:
            return "sbom"
        if data is not None and data.get("bomFormat") == "CycloneDX":
            return "sbom-cyclonedx"
    elif not path.exists():
        raise CheckInputError(f"{path}: expected an artifact, found no file or directory")
    raise CheckInputError(
        f"{path}: expected an OCI layout directory, a PEX directory, a module manifest, an SPDX "
        "document or a CycloneDX document, found none of these"
    )


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file does not hold one (checked before reading all)."""
    try:
        with path.open("rb") as stream:
            if stream.read(1) != b"{":
                return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _blob(layout: Path, digest: str, what: str) -> Path:
    blob = blob_path(layout, digest)
    if not digest.startswith("sha256:") or not blob.is_file():
        raise CheckInputError(f"{layout}: expected the {what} blob {blob}, found no file")
    return blob


def image_checks(name: str, layout: Path, expected: str) -> list[Check]:
    """The image manifest digest of an OCI layout, then every blob the manifest names."""
    try:
        image = read_image(layout)
    except LayoutError as error:
        raise CheckInputError(f"expected an OCI layout naming one image manifest: {error}") from error
    manifest_blob = _blob(layout, image.digest, "image manifest")
    checks = [Check(name, "oci-image", str(layout), expected, sha256_file(manifest_blob))]
    try:
        blobs = [(image.manifest["config"]["digest"], "config")]
        blobs += [
            (layer["digest"], f"layer {number}") for number, layer in enumerate(image.manifest["layers"])
        ]
    except (KeyError, TypeError) as error:
        raise CheckInputError(
            f"{layout}: expected an image manifest with config and layers at {image.digest}, found: {error}"
        ) from error
    for blob_digest, what in blobs:
        blob = _blob(layout, blob_digest, what)
        checks.append(
            Check(
                f"{name} {what}",
                "oci-blob",
                str(blob),
                blob_digest.removeprefix("sha256:"),
                sha256_file(blob),
            )
        )
    return checks


def subject_checks(subject: dict[str, Any], artifact: Path) -> list[Check]:
    """Re-derive one subject's digest from ``artifact``."""
    name, kind, expected = subject["name"], subject["annotations"]["kind"], subject["digest"]["sha256"]
    if kind == "oci-image":
        if not (artifact / "index.json").exists():
            raise CheckInputError(f"{artifact}: expected the OCI layout of {name}, found no index.json")
        return image_checks(name, artifact, expected)
    if kind == "pex":
        if not artifact.is_dir():
            raise CheckInputError(f"{artifact}: expected the PEX directory of {name}, found none")
        return [Check(name, kind, str(artifact), expected, tree_digest(artifact).removeprefix("sha256:"))]
    if not artifact.is_file():
        raise CheckInputError(f"{artifact}: expected the {kind} file of {name}, found none")
    return [Check(name, kind, str(artifact), expected, sha256_file(artifact))]


def _verified_payload(provenance: Path, pubkey: Path | None) -> bytes | None:
    """The statement a signed ``provenance`` holds, once its signature verifies; None for a plain one."""
    try:
        data = json.loads(provenance.read_bytes())
    except (OSError, ValueError):
        data = None  # load_statement names the problem
    if not dsse.is_envelope(data):
        if pubkey is not None:
            raise CheckInputError(
                f"{provenance}: --pubkey {pubkey}: expected a signed statement (a DSSE envelope from "
                "`sparkseal provenance sign`), found an unsigned one"
            )
        return None
    if pubkey is None:
        raise CheckInputError(
            f"{provenance}: a signed statement (DSSE envelope): pass --pubkey KEY to verify its signature "
            "before its subjects"
        )
    try:
        return dsse.verify(provenance, pubkey)
    except dsse.SigningInputError as error:
        raise CheckInputError(str(error)) from error


def check(
    provenance: Path,
    artifacts: Iterable[Path] = (),
    root: Path | None = None,
    pubkey: Path | None = None,
    only: Collection[str] = (),
) -> Report:
    """Check every subject of ``provenance`` (of the kinds in ``only``, when given); ``artifacts`` replace
    the lookup under ``root`` by kind.

    A signed statement needs ``pubkey``; its signature is verified first (a failure raises
    :class:`sparkseal.core.dsse.SignatureError`).
    """
    payload = _verified_payload(provenance, pubkey)
    source, subjects = _load(provenance, payload)
    recorded = {subject["annotations"]["kind"] for subject in subjects}
    absent = [kind for kind in only if kind not in recorded]
    if absent:
        raise CheckInputError(
            f"--only {absent[0]}: expected a kind among the subjects of {provenance} "
            f"({', '.join(sorted(recorded))}), found none of that kind"
        )
    left_out = tuple(
        f"{subject['name']} ({subject['annotations']['kind']})"
        for subject in subjects
        if only and subject["annotations"]["kind"] not in only
    )
    subjects = [subject for subject in subjects if not only or subject["annotations"]["kind"] in only]
    given: dict[str, Path] = {}
    for path in artifacts:
        kind = artifact_kind(path)
        if kind in given:
            raise CheckInputError(f"{path}: expected one artifact of kind {kind}, found also {given[kind]}")
        given[kind] = path
    kinds = {subject["annotations"]["kind"] for subject in subjects}
    unused = sorted(set(given) - kinds)
    if unused:
        why = (
            "--only leaves that kind out"
            if unused[0] in recorded
            else f"{provenance} has no subject of that kind"
        )
        raise CheckInputError(f"{given[unused[0]]}: is a {unused[0]} artifact, but {why}")
    base = provenance.parent if root is None else root
    checks: list[Check] = []
    for subject in subjects:
        kind = subject["annotations"]["kind"]
        checks += subject_checks(subject, given.get(kind, base / subject["name"]))
    signed_by = str(pubkey) if payload is not None else None
    return Report(str(provenance), tuple(checks), signed_by, source, left_out)


def render(report: Report, as_json: bool) -> str:
    """The report as text (one line per check, then a summary) or as JSON."""
    if as_json:
        body = {
            "provenance": report.provenance,
            "ok": report.ok,
            "verdict": report.verdict,
            "signed_by": report.signed_by,
            "source": asdict(report.source) if report.source else None,
            "checks": [{**asdict(check), "ok": check.ok} for check in report.checks],
            "not_checked": list(report.not_checked),
        }
        return json.dumps(body, indent=2, sort_keys=True)
    lines = [f"ok signature (ed25519) verifies with {report.signed_by}"] if report.signed_by else []
    lines.append(describe(report.source))
    for item in report.checks:
        if item.ok:
            lines.append(f"ok {item.subject} ({item.kind}) sha256:{item.actual}")
        else:
            lines.append(
                f"DIFFERS {item.subject} ({item.kind}) at {item.path}: expected sha256:{item.expected} "
                f"from {report.provenance}, actual sha256:{item.actual}"
            )
    lines += [f"not checked {subject}: left out by --only" for subject in report.not_checked]
    bad = sum(not item.ok for item in report.checks)
    left_out = f"; {len(report.not_checked)} subjects not checked" if report.not_checked else ""
    lines.append(f"{report.verdict}: {len(report.checks)} checks, {bad} differ{left_out}")
    return "\n".join(lines)
