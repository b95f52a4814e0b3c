"""Action: the SPDX 2.3 JSON SBOM of one platform's image.

Packages, each with ``versionInfo``, a SHA256 checksum and, where one exists, a package URL:

* every locked Debian package of the base OS and every locked wheel (sha256 from the locks, which the
  repository rules verify on download);
* the wheels the build made (our vLLM wheel, the sparkseal wheel), hashed here;
* the vLLM sdist and upstream wheel our vLLM wheel is made from (``GENERATED_FROM``).

The patches of the series are SPDX files (SHA1 and SHA256) with ``PATCH_APPLIED`` to our vLLM wheel. The
document ``DESCRIBES`` every package the image installs (Debian packages and wheels).

Determinism: ``creationInfo.created`` is SOURCE_DATE_EPOCH (the date every artifact of the build carries,
not the time of the build), and ``documentNamespace`` ends with the sha256 of the document written without
it, so the same content always has the same namespace and other content another one.

As an action::

    sbom --platform linux_aarch64 --name sparkseal-vllm-0.25.1-linux_aarch64 --vllm-lock vllm.lock.json \\
        --python-lock requirements_linux_aarch64.files.json --debian-lock bookworm_arm64.lock.json \\
        --vllm-wheel VLLM.whl --wheel SPARKSEAL.whl --patch NAME PATH ... --out sbom.spdx.json
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkseal import __version__
from sparkseal.core.locks import (
    NAMESPACE,
    PLATFORMS,
    Locked,
    ProvenanceError,
    built_wheel,
    dumps,
    read_debian_lock,
    read_vllm_lock,
    read_wheel_lock,
)
from sparkseal.core.oci import CREATED

SPDX_VERSION = "SPDX-2.3"
DATA_LICENSE = "CC0-1.0"
DOCUMENT_ID = "SPDXRef-DOCUMENT"
NOASSERTION = "NOASSERTION"
CREATOR = f"Tool: sparkseal-{__version__}"

# SPDXID prefix and primaryPackagePurpose per role (provenance.Locked.role).
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


def package(item: Locked, comment: str | None = None) -> dict[str, Any]:
    """The SPDX package of a locked or built file."""
    prefix, purpose = _ROLES[item.role]
    entry: dict[str, Any] = {
        "SPDXID": spdx_id(prefix, item.name, item.version),
        "name": item.name,
        "versionInfo": item.version,
        "packageFileName": item.filename,
        "downloadLocation": NOASSERTION,
        "filesAnalyzed": False,
        "checksums": [{"algorithm": "SHA256", "checksumValue": item.sha256}],
        "licenseConcluded": NOASSERTION,
        "licenseDeclared": NOASSERTION,
        "copyrightText": NOASSERTION,
        "primaryPackagePurpose": purpose,
    }
    if item.purl:
        entry["externalRefs"] = [
            {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": item.purl}
        ]
    if comment:
        entry["comment"] = comment
    return entry


def patch_file(name: str, path: Path) -> dict[str, Any]:
    """The SPDX file of one patch of the series (SPDX 2.3 requires a SHA1 for every file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as error:
        raise ProvenanceError(f"{path}: expected the patch {name}, found no file") from error
    return {
        "SPDXID": spdx_id("File", name),
        "fileName": "./" + name,
        "fileTypes": ["SOURCE"],
        "checksums": [
            {"algorithm": "SHA1", "checksumValue": hashlib.sha1(data).hexdigest()},
            {"algorithm": "SHA256", "checksumValue": hashlib.sha256(data).hexdigest()},
        ],
        "licenseConcluded": NOASSERTION,
        "copyrightText": NOASSERTION,
    }


def _relationship(element: str, kind: str, related: str) -> dict[str, str]:
    return {"spdxElementId": element, "relationshipType": kind, "relatedSpdxElement": related}


@dataclass(frozen=True)
class SbomInputs:
    """Everything one SBOM is made from (the action's arguments, parsed)."""

    platform: str
    name: str
    vllm_lock: Path
    python_lock: Path
    debian_lock: Path
    vllm_wheel: Path
    wheels: tuple[Path, ...]
    patches: tuple[tuple[str, Path], ...]


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


def document(inputs: SbomInputs) -> dict[str, Any]:
    """The SPDX 2.3 document of ``inputs``, ``documentNamespace`` included."""
    if inputs.platform not in PLATFORMS:
        raise ProvenanceError(
            f"--platform: expected one of {', '.join(PLATFORMS)}, found {inputs.platform!r}"
        )
    vllm = read_vllm_lock(inputs.vllm_lock, inputs.platform)
    ours = built_wheel(inputs.vllm_wheel)
    if ours.name != "vllm":
        raise ProvenanceError(f"{inputs.vllm_wheel}: expected a vllm wheel, found project {ours.name!r}")
    comment = (
        f"Built by sparkseal from the vLLM sdist at commit {vllm.commit} with the patches of the series "
        "applied and the upstream wheel's compiled files."
    )
    installed = [
        package(item)
        for item in (
            *read_debian_lock(inputs.debian_lock),
            *read_wheel_lock(inputs.python_lock, "wheel"),
            *sorted((built_wheel(path) for path in inputs.wheels), key=lambda item: item.filename),
        )
    ]
    built_vllm = package(ours, comment)
    sources = [package(vllm.sdist), package(vllm.wheel)]
    packages = _unique([*sources, built_vllm, *installed], "sbom packages")
    files = _unique((patch_file(name, path) for name, path in inputs.patches), "sbom files")
    relationships = [
        *(_relationship(DOCUMENT_ID, "DESCRIBES", entry["SPDXID"]) for entry in [built_vllm, *installed]),
        *(_relationship(built_vllm["SPDXID"], "GENERATED_FROM", entry["SPDXID"]) for entry in sources),
        *(_relationship(entry["SPDXID"], "PATCH_APPLIED", built_vllm["SPDXID"]) for entry in files),
    ]
    doc: dict[str, Any] = {
        "spdxVersion": SPDX_VERSION,
        "dataLicense": DATA_LICENSE,
        "SPDXID": DOCUMENT_ID,
        "name": inputs.name,
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
    content = hashlib.sha256(dumps(doc).encode("ascii")).hexdigest()
    return {**doc, "documentNamespace": f"{NAMESPACE}:spdx:{inputs.name}:{content}"}


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
    parser.add_argument("--out", type=Path, required=True, help="SPDX JSON to write")
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
        text = dumps(document(inputs))
    except ProvenanceError as error:
        print(f"sbom: {error}", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
