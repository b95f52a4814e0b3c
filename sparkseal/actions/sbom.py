"""Action: the SBOM of one platform's image, as SPDX 2.3 JSON or as CycloneDX 1.6 JSON.

Both formats render one package list (sparkseal/core/sbom.py): every locked Debian package and wheel the
image installs, the wheels the build made (our vLLM wheel, the sparkseal wheel), each with its version,
its SHA-256, its package URL, and its supplier and licence where the inputs tell them; the vLLM sdist and
upstream wheel our vLLM wheel is made from; the patch series applied to it.

SPDX 2.3 (``--format spdx-2.3``): the sdist and the upstream wheel are packages our vLLM wheel is
``GENERATED_FROM``; the patches are SPDX files (SHA1 and SHA256) with ``PATCH_APPLIED`` to it; the
document ``DESCRIBES`` every package the image installs.

CycloneDX 1.6 (``--format cyclonedx-1.6``), the format BSI TR-03183-2 names beside SPDX 3.0.1: the image
is ``metadata.component`` (a container) and ``dependencies`` says it depends on every component; our vLLM
component's ``pedigree`` holds the sdist and the upstream wheel as ``ancestors``, the locked commit, and
every patch of the series (its text, and ``backport`` or ``unofficial`` as its ``Upstream:`` header says).

Determinism: the creation time is SOURCE_DATE_EPOCH (the date every artifact of the build carries, not the
time of the build), and the document's identity is derived from its content: SPDX's ``documentNamespace``
ends with the sha256 of the document written without it, CycloneDX's ``serialNumber`` is the UUID (version
5) of the same digest, so the same content always has the same identity and other content another one.

As an action::

    sbom --platform linux_aarch64 --name sparkseal-vllm-0.25.1-linux_aarch64 --vllm-lock vllm.lock.json \\
        --python-lock requirements_linux_aarch64.files.json --debian-lock bookworm_arm64.lock.json \\
        --vllm-wheel VLLM.whl --wheel SPARKSEAL.whl --patch NAME PATH ... [--format cyclonedx-1.6] \\
        --out sbom.spdx.json
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sparkseal import __version__
from sparkseal.core.oci import CREATED
from sparkseal.core.sbom import Package, SbomContent, SbomInputs, SeriesPatch, read_content
from sparkseal.core.slsa import NAMESPACE, PLATFORMS, ProvenanceError, dumps

SPDX_VERSION = "SPDX-2.3"
DATA_LICENSE = "CC0-1.0"
DOCUMENT_ID = "SPDXRef-DOCUMENT"
NOASSERTION = "NOASSERTION"
CREATOR = f"Tool: sparkseal-{__version__}"

# SPDXID prefix and primaryPackagePurpose per role (sparkseal.core.slsa.Locked.role).
_ROLES = {
    "deb": ("Deb", "LIBRARY"),
    "wheel": ("Wheel", "LIBRARY"),
    "built-wheel": ("Built", "LIBRARY"),
    "vllm-sdist": ("Sdist", "SOURCE"),
    "vllm-upstream-wheel": ("Upstream", "LIBRARY"),
}
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def spdx_id(prefix: str, *parts: str) -> str:
    """An SPDX identifier (``SPDXRef-`` then letters, digits, ``.`` and ``-`` only)."""
    return "SPDXRef-" + "-".join(_ID_UNSAFE.sub("-", part) for part in (prefix, *parts))


def package(entry: Package, comment: str | None = None) -> dict[str, Any]:
    """The SPDX package of a locked or built file."""
    item = entry.item
    prefix, purpose = _ROLES[item.role]
    # SPDX 2.3 carries a licence only as an SPDX expression; free text stays NOASSERTION.
    declared = entry.license.text if entry.license and entry.license.expression else NOASSERTION
    package: dict[str, Any] = {
        "SPDXID": spdx_id(prefix, item.name, item.version),
        "name": item.name,
        "versionInfo": item.version,
        "packageFileName": item.filename,
        "downloadLocation": NOASSERTION,
        "filesAnalyzed": False,
        "checksums": [{"algorithm": "SHA256", "checksumValue": item.sha256}],
        "licenseConcluded": NOASSERTION,
        "licenseDeclared": declared,
        "copyrightText": NOASSERTION,
        "primaryPackagePurpose": purpose,
    }
    if entry.supplier:
        package["supplier"] = f"Organization: {entry.supplier}"
    if item.purl:
        package["externalRefs"] = [
            {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": item.purl}
        ]
    if comment:
        package["comment"] = comment
    return package


def patch_file(patch: SeriesPatch) -> dict[str, Any]:
    """The SPDX file of one patch of the series (SPDX 2.3 requires a SHA1 for every file)."""
    return {
        "SPDXID": spdx_id("File", patch.name),
        "fileName": "./" + patch.name,
        "fileTypes": ["SOURCE"],
        "checksums": [
            {"algorithm": "SHA1", "checksumValue": patch.sha1},
            {"algorithm": "SHA256", "checksumValue": patch.sha256},
        ],
        "licenseConcluded": NOASSERTION,
        "copyrightText": NOASSERTION,
    }


def _relationship(element: str, kind: str, related: str) -> dict[str, str]:
    return {"spdxElementId": element, "relationshipType": kind, "relatedSpdxElement": related}


def _unique(entries: Iterable[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        other = seen.setdefault(entry["SPDXID"], entry)
        if other is not entry:
            raise ProvenanceError(
                f"{where}: expected one entry per SPDXID, found {entry['SPDXID']} for "
                f"{other.get('packageFileName') or other.get('fileName')} and "
                f"{entry.get('packageFileName') or entry.get('fileName')}"
            )
    return list(seen.values())


def spdx_document(content: SbomContent) -> dict[str, Any]:
    """The SPDX 2.3 document of ``content``, ``documentNamespace`` included."""
    installed = [package(entry) for entry in content.installed]
    built_vllm = package(content.built_vllm, content.built_from)
    sources = [package(entry) for entry in content.sources]
    packages = _unique([*sources, built_vllm, *installed], "sbom packages")
    files = _unique((patch_file(patch) for patch in content.patches), "sbom files")
    relationships = [
        *(_relationship(DOCUMENT_ID, "DESCRIBES", entry["SPDXID"]) for entry in [built_vllm, *installed]),
        *(_relationship(built_vllm["SPDXID"], "GENERATED_FROM", entry["SPDXID"]) for entry in sources),
        *(_relationship(entry["SPDXID"], "PATCH_APPLIED", built_vllm["SPDXID"]) for entry in files),
    ]
    doc: dict[str, Any] = {
        "spdxVersion": SPDX_VERSION,
        "dataLicense": DATA_LICENSE,
        "SPDXID": DOCUMENT_ID,
        "name": content.name,
        "creationInfo": {
            # SOURCE_DATE_EPOCH in RFC 3339 form (1980-01-01T00:00:00Z), as the image config dates it.
            "created": CREATED,
            "creators": [CREATOR],
            "comment": "created is SOURCE_DATE_EPOCH, the date of every artifact of the build.",
        },
        "packages": packages,
        "files": files,
        "relationships": sorted(
            relationships,
            key=lambda r: (r["spdxElementId"], r["relationshipType"], r["relatedSpdxElement"]),
        ),
    }
    digest = hashlib.sha256(dumps(doc).encode("ascii")).hexdigest()
    return {**doc, "documentNamespace": f"{NAMESPACE}:spdx:{content.name}:{digest}"}


CYCLONEDX_SPEC = "1.6"
CYCLONEDX_SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"

# What BSI TR-03183-2 asks of every component beyond CycloneDX's own fields, in the BSI's property
# taxonomy for CycloneDX: each file we list is a wheel, a .deb or an sdist, i.e. an archive that keeps its
# metadata (structured) and is not itself run (its contents are, which the archive's own SBOM would list).
_BSI_FILE_KIND = (
    ("bsi:component:archive", "archive"),
    ("bsi:component:executable", "non-executable"),
    ("bsi:component:structured", "structured"),
)


def _component(entry: Package) -> dict[str, Any]:
    """The CycloneDX component of a locked or built file; its package URL is its ``bom-ref``."""
    item = entry.item
    if not item.purl:
        raise ProvenanceError(f"{item.filename}: expected a package URL for the CycloneDX SBOM, found none")
    component: dict[str, Any] = {
        "type": "library",
        "bom-ref": item.purl,
        "name": item.name,
        "version": item.version,
        "purl": item.purl,
        "hashes": [{"alg": "SHA-256", "content": item.sha256}],
        "properties": [
            {"name": "bsi:component:filename", "value": item.filename},
            *({"name": name, "value": value} for name, value in _BSI_FILE_KIND),
            {"name": "sparkseal:role", "value": item.role},
        ],
    }
    if entry.supplier:
        component["supplier"] = {"name": entry.supplier}
    if entry.license:
        text = entry.license.text
        component["licenses"] = (
            [{"expression": text}] if entry.license.expression else [{"license": {"name": text}}]
        )
    return component


def _patch(patch: SeriesPatch) -> dict[str, Any]:
    """A patch of the pedigree: its text, and ``backport`` when the header names the upstream change it
    carries, ``unofficial`` when it is ours alone."""
    try:
        text: dict[str, str] = {"contentType": "text/x-diff", "content": patch.data.decode("utf-8")}
    except UnicodeDecodeError:
        text = {
            "contentType": "text/x-diff",
            "encoding": "base64",
            "content": base64.b64encode(patch.data).decode("ascii"),
        }
    return {
        "type": "backport" if patch.upstreamed else "unofficial",
        "diff": {"url": patch.name, "text": text},
    }


def cyclonedx_document(content: SbomContent) -> dict[str, Any]:
    """The CycloneDX 1.6 document of ``content``, ``serialNumber`` included."""
    vllm = _component(content.built_vllm)
    vllm["pedigree"] = {
        "ancestors": [_component(entry) for entry in content.sources],
        "commits": [{"uid": content.vllm.commit}],
        "patches": [_patch(patch) for patch in content.patches],
        "notes": "\n".join(
            [content.built_from]
            + [f"{p.name}: {p.subject} (Upstream: {p.upstream})" for p in content.patches]
        ),
    }
    components = [vllm, *(_component(entry) for entry in content.installed)]
    refs = [c["bom-ref"] for c in [*components, *vllm["pedigree"]["ancestors"]]]
    repeated = sorted({ref for ref in refs if refs.count(ref) > 1})
    if repeated:
        raise ProvenanceError(
            f"sbom components: expected one component per package URL, found {repeated[0]} twice"
        )
    image = f"{NAMESPACE}:image:{content.name}"
    installed = sorted(c["bom-ref"] for c in components)
    doc: dict[str, Any] = {
        "$schema": CYCLONEDX_SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": CYCLONEDX_SPEC,
        "version": 1,
        "metadata": {
            # SOURCE_DATE_EPOCH in RFC 3339 form (1980-01-01T00:00:00Z), as the image config dates it.
            "timestamp": CREATED,
            "lifecycles": [{"phase": "build"}],
            "authors": [{"name": "sparkseal"}],
            "tools": {"components": [{"type": "application", "name": "sparkseal", "version": __version__}]},
            "component": {
                "type": "container",
                "bom-ref": image,
                "name": content.name,
                "version": content.vllm.version,
                "description": f"sparkseal's vLLM {content.vllm.version} image for {content.platform}",
                "properties": [{"name": "sparkseal:platform", "value": content.platform}],
            },
        },
        "components": components,
        "dependencies": [{"ref": image, "dependsOn": installed}],
        # The image's own list is complete (every package it installs); what each package needs in turn
        # is not recorded here.
        "compositions": [
            {"aggregate": "complete", "dependencies": [image]},
            {"aggregate": "unknown", "dependencies": installed},
        ],
    }
    digest = hashlib.sha256(dumps(doc).encode("ascii")).hexdigest()
    serial = uuid.uuid5(uuid.NAMESPACE_URL, f"{NAMESPACE}:cyclonedx:{content.name}:{digest}")
    return {**doc, "serialNumber": serial.urn}


# --format -> the renderer of that format.
FORMATS: dict[str, Callable[[SbomContent], dict[str, Any]]] = {
    "spdx-2.3": spdx_document,
    "cyclonedx-1.6": cyclonedx_document,
}


def main(argv: list[str] | None = None) -> int:
    """Action entry point: write the SBOM to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    parser.add_argument("--platform", required=True, choices=PLATFORMS)
    parser.add_argument("--name", required=True, help="the document's name")
    parser.add_argument("--vllm-lock", type=Path, required=True, help="third_party/vllm/vllm.lock.json")
    parser.add_argument("--python-lock", type=Path, required=True, help="requirements_<platform>.files.json")
    parser.add_argument("--debian-lock", type=Path, required=True, help="bookworm_<arch>.lock.json")
    parser.add_argument("--vllm-wheel", type=Path, required=True, help="our vLLM wheel")
    parser.add_argument(
        "--wheel", type=Path, action="append", default=[], help="another wheel the build made"
    )
    parser.add_argument(
        "--patch",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "PATH"),
        help="a patch of the series",
    )
    parser.add_argument(
        "--format", choices=sorted(FORMATS), default="spdx-2.3", help="the SBOM format (default: spdx-2.3)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the SBOM (JSON) to write")
    args = parser.parse_args(argv)
    inputs = SbomInputs(
        platform=args.platform,
        name=args.name,
        vllm_lock=args.vllm_lock,
        python_lock=args.python_lock,
        debian_lock=args.debian_lock,
        vllm_wheel=args.vllm_wheel,
        wheels=tuple(args.wheel),
        patches=tuple((name, Path(path)) for name, path in args.patch),
    )
    try:
        text = dumps(FORMATS[args.format](read_content(inputs)))
    except ProvenanceError as error:
        print(f"sbom: {error}", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
