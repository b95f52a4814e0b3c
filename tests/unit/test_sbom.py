"""The SBOM action in both formats: SPDX 2.3 (structure, checksums, relationships, determinism, every
input error, spdx-tools' validation) and CycloneDX 1.6 (the fields BSI TR-03183-2 asks for, the pedigree of
our vLLM, determinism, agreement with the SPDX rendering, and the OWASP CycloneDX library's strict schema
validation, which must also reject a broken document)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkseal import __version__
from sparkseal.actions import provenance, sbom
from sparkseal.core.locks import render_lock
from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, Workspace, base_env, make_fixture_workspace

COMMIT = "752a3a504485790a2e8491cacbb35c137339ad34"
PLATFORM = "linux_aarch64"
SPDX_ID = re.compile(r"SPDXRef-[A-Za-z0-9.-]+")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path


def _lock(path: Path, kind: str, document: dict[str, Any]) -> Path:
    """A fixture lock of ``kind``, written as the lock commands write it (its format added, checked)."""
    path.write_text(render_lock(kind, document, path))
    return path


def _deb(package: str, version: str) -> dict[str, object]:
    """A Debian lock entry of the fixture (arm64, from the debian archive, at one snapshot time stamp)."""
    filename = f"{package}_{version}_arm64.deb"
    return {
        "architecture": "arm64",
        "archive": "debian",
        "filename": filename,
        "package": package,
        "path": f"pool/main/{package[0]}/{package}/{filename}",
        "sha256": _sha(package.encode()),
        "size": len(package),
        "snapshot": "20240611T082157Z",
        "version": version,
    }


def _wheel(path: Path, payload: str, license_line: str = "") -> Path:
    """A small wheel: a payload and the METADATA (with ``license_line``) the SBOM reads licences from."""
    project, version = path.name.split("-")[:2]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("payload.txt", payload)
        archive.writestr(
            f"{project}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.4\nName: {project}\nVersion: {version}\n{license_line}",
        )
    return path


@dataclass
class Inputs:
    """The fixture's locks, patches and built wheels (small stand-ins for the real ones)."""

    vllm_lock: Path
    python_lock: Path
    tools_lock: Path
    debian_lock: Path
    cuda_lock: Path
    patches: list[tuple[str, Path]]
    vllm_wheel: Path
    sparkseal_wheel: Path


def write_inputs(root: Path) -> Inputs:
    """Write fixture locks, two patches and two built wheels under ``root``; used by test_provenance too."""
    root.mkdir(parents=True, exist_ok=True)
    vllm_lock = _lock(
        root / "vllm.lock.json",
        "vllm",
        {
            "commit": COMMIT,
            "name": "vllm",
            "sdist": {"filename": "vllm-0.25.1.tar.gz", "sha256": _sha(b"sdist")},
            "version": "0.25.1",
            "wheels": {
                platform: {
                    "filename": f"vllm-0.25.1-cp38-abi3-manylinux_2_28_{platform.split('_', 1)[1]}.whl",
                    "sha256": _sha(platform.encode()),
                }
                for platform in provenance.PLATFORMS
            },
        },
    )
    python_lock = _lock(
        root / "requirements_linux_aarch64.files.json",
        "python",
        {
            "platform": PLATFORM,
            "requirements": "requirements_linux_aarch64.txt",
            "wheels": {
                "typing-extensions": {
                    "filename": "typing_extensions-4.15.0-py3-none-any.whl",
                    "sha256": _sha(b"typing"),
                    "version": "4.15.0",
                },
                "numpy": {
                    "filename": "numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl",
                    "sha256": _sha(b"numpy"),
                    "version": "2.2.6",
                },
            },
        },
    )
    tools_lock = _lock(
        root / "tools.files.json",
        "python",
        {
            "platform": "any",
            "requirements": "tools.txt",
            "wheels": {
                "pex": {
                    "filename": "pex-2.105.2-py3-none-any.whl",
                    "sha256": _sha(b"pex"),
                    "version": "2.105.2",
                }
            },
        },
    )
    debian_lock = _lock(
        root / "bookworm_arm64.lock.json",
        "debian",
        {
            "architecture": "arm64",
            "suite": "bookworm",
            "roots": ["base-files", "libstdc++6"],
            "packages": [_deb("libstdc++6", "12.2.0-14+deb12u1"), _deb("base-files", "12.4+deb12u15")],
        },
    )
    cuda_lock = _lock(
        root / "toolchain.lock.json",
        "wheels",
        {
            "wheels": {
                "nvidia-cuda-nvcc": {
                    "files": {
                        "linux_x86_64": {
                            "filename": "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.whl",
                            "sha256": _sha(b"nvcc"),
                        }
                    },
                    "version": "13.0.88",
                }
            }
        },
    )
    patches = []
    for name, upstream in (
        ("0001-first.patch", "vllm-project/vllm#1 (0123abc)"),
        ("0002-second.patch", "none (sparkseal's own)"),
    ):
        path = root / "patches" / "vllm" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"Subject: {name}\nUpstream: {upstream}\nReason: a fixture\n  on two lines\n--- a/x\n+++ b/x\n"
        )
        patches.append((f"patches/vllm/{name}", path))
    built = root / "built"
    built.mkdir()
    vllm_wheel = _wheel(
        built / "vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl",
        "patched vllm",
        "License-Expression: Apache-2.0\n",
    )
    sparkseal_wheel = _wheel(
        built / "sparkseal-0.1.0-py3-none-linux_aarch64.whl", "kernels", "License: Apache-2.0\n"
    )
    return Inputs(
        vllm_lock, python_lock, tools_lock, debian_lock, cuda_lock, patches, vllm_wheel, sparkseal_wheel
    )


def sbom_args(inputs: Inputs, out: Path) -> list[str]:
    """The action's command line for the fixture."""
    args = [
        "--platform", PLATFORM,
        "--name", "sparkseal-vllm-0.25.1-linux_aarch64",
        "--vllm-lock", str(inputs.vllm_lock),
        "--python-lock", str(inputs.python_lock),
        "--debian-lock", str(inputs.debian_lock),
        "--vllm-wheel", str(inputs.vllm_wheel),
        "--wheel", str(inputs.sparkseal_wheel),
        "--out", str(out),
    ]  # fmt: skip
    for name, path in inputs.patches:
        args += ["--patch", name, str(path)]
    return args


@pytest.fixture
def inputs(tmp_path: Path) -> Inputs:
    return write_inputs(tmp_path / "in")


def _run(inputs: Inputs, out: Path) -> dict:
    assert sbom.main(sbom_args(inputs, out)) == 0
    return json.loads(out.read_text())


def test_document_fields_and_packages(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run(inputs, tmp_path / "sbom.spdx.json")

    assert (doc["spdxVersion"], doc["dataLicense"], doc["SPDXID"]) == (
        "SPDX-2.3",
        "CC0-1.0",
        "SPDXRef-DOCUMENT",
    )
    assert doc["name"] == "sparkseal-vllm-0.25.1-linux_aarch64"
    assert doc["creationInfo"]["created"] == "1980-01-01T00:00:00Z"
    assert doc["creationInfo"]["creators"] == [f"Tool: sparkseal-{__version__}"]
    by_file = {p["packageFileName"]: p for p in doc["packages"]}
    assert sorted(by_file) == sorted(
        [
            "base-files_12.4+deb12u15_arm64.deb",
            "libstdc++6_12.2.0-14+deb12u1_arm64.deb",
            "numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl",
            "typing_extensions-4.15.0-py3-none-any.whl",
            "vllm-0.25.1.tar.gz",
            "vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl",  # upstream and ours share the file name
            "sparkseal-0.1.0-py3-none-linux_aarch64.whl",
        ]
    )
    assert len(doc["packages"]) == 8
    ids = [p["SPDXID"] for p in doc["packages"]]
    assert len(set(ids)) == len(ids)
    for package in doc["packages"]:
        assert SPDX_ID.fullmatch(package["SPDXID"]), package["SPDXID"]
        assert package["versionInfo"] and package["downloadLocation"] == "NOASSERTION"
        assert package["filesAnalyzed"] is False
        [checksum] = package["checksums"]
        assert checksum["algorithm"] == "SHA256" and re.fullmatch(r"[0-9a-f]{64}", checksum["checksumValue"])

    libstdcxx = by_file["libstdc++6_12.2.0-14+deb12u1_arm64.deb"]
    assert libstdcxx["SPDXID"] == "SPDXRef-Deb-libstdc-6-12.2.0-14-deb12u1"
    assert libstdcxx["checksums"][0]["checksumValue"] == _sha(b"libstdc++6")
    assert libstdcxx["externalRefs"] == [
        {
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": "pkg:deb/debian/libstdc%2B%2B6@12.2.0-14%2Bdeb12u1"
            "?arch=arm64&distro=bookworm",
        }
    ]
    numpy = by_file["numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl"]
    assert (numpy["name"], numpy["versionInfo"]) == ("numpy", "2.2.6")
    assert numpy["externalRefs"][0]["referenceLocator"] == (
        "pkg:pypi/numpy@2.2.6?file_name=numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl"
    )
    assert libstdcxx["supplier"] == "Organization: Debian" and "supplier" not in numpy
    kernels = by_file["sparkseal-0.1.0-py3-none-linux_aarch64.whl"]
    assert (kernels["name"], kernels["versionInfo"]) == ("sparkseal", "0.1.0")
    kernels_sha = _sha(inputs.sparkseal_wheel.read_bytes())
    assert kernels["checksums"][0]["checksumValue"] == kernels_sha
    # Published nowhere: a generic package URL told by the content, never one of the package index.
    assert kernels["externalRefs"][0]["referenceLocator"] == (
        f"pkg:generic/sparkseal@0.1.0?checksum=sha256:{kernels_sha}"
        "&file_name=sparkseal-0.1.0-py3-none-linux_aarch64.whl"
    )
    assert kernels["supplier"] == "Organization: sparkseal"
    # Free-text licences (METADATA's License) are no SPDX expression: SPDX 2.3 cannot carry them.
    assert kernels["licenseDeclared"] == "NOASSERTION"


def test_built_vllm_is_related_to_its_sources_and_patches(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run(inputs, tmp_path / "sbom.spdx.json")
    ids = {p["SPDXID"]: p for p in doc["packages"]} | {f["SPDXID"]: f for f in doc["files"]}
    ours = ids["SPDXRef-Built-vllm-0.25.1"]
    ours_sha = _sha(inputs.vllm_wheel.read_bytes())
    assert ours["checksums"][0]["checksumValue"] == ours_sha
    assert ours["licenseDeclared"] == "Apache-2.0"
    assert ours["externalRefs"][0]["referenceLocator"] == (
        f"pkg:pypi/vllm@0.25.1?checksum=sha256:{ours_sha}&file_name=vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl"
    )
    assert COMMIT in ours["comment"]
    assert ids["SPDXRef-Upstream-vllm-0.25.1"]["checksums"][0]["checksumValue"] == _sha(PLATFORM.encode())
    assert ids["SPDXRef-Sdist-vllm-0.25.1"]["primaryPackagePurpose"] == "SOURCE"

    files = {f["fileName"]: f for f in doc["files"]}
    assert sorted(files) == ["./patches/vllm/0001-first.patch", "./patches/vllm/0002-second.patch"]
    for name, path in inputs.patches:
        data = path.read_bytes()
        assert files["./" + name]["checksums"] == [
            {"algorithm": "SHA1", "checksumValue": hashlib.sha1(data).hexdigest()},
            {"algorithm": "SHA256", "checksumValue": _sha(data)},
        ]

    relations = {
        (r["spdxElementId"], r["relationshipType"], r["relatedSpdxElement"]) for r in doc["relationships"]
    }
    for element, _, related in relations:
        assert element == "SPDXRef-DOCUMENT" or element in ids
        assert related in ids
    described = {related for element, kind, related in relations if kind == "DESCRIBES"}
    installed = {p["SPDXID"] for p in doc["packages"]} - {
        "SPDXRef-Sdist-vllm-0.25.1",
        "SPDXRef-Upstream-vllm-0.25.1",
    }
    assert described == installed
    assert {(e, r) for e, kind, r in relations if kind == "GENERATED_FROM"} == {
        ("SPDXRef-Built-vllm-0.25.1", "SPDXRef-Sdist-vllm-0.25.1"),
        ("SPDXRef-Built-vllm-0.25.1", "SPDXRef-Upstream-vllm-0.25.1"),
    }
    assert {e for e, kind, r in relations if kind == "PATCH_APPLIED" and r == ours["SPDXID"]} == {
        f["SPDXID"] for f in doc["files"]
    }


def test_namespace_is_the_content_digest(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run(inputs, tmp_path / "sbom.spdx.json")
    without = {key: value for key, value in doc.items() if key != "documentNamespace"}
    content = _sha(provenance.dumps(without).encode())
    assert doc["documentNamespace"] == f"urn:sparkseal:spdx:sparkseal-vllm-0.25.1-linux_aarch64:{content}"

    _wheel(inputs.sparkseal_wheel, "another build")
    assert _run(inputs, tmp_path / "other.spdx.json")["documentNamespace"] != doc["documentNamespace"]


def test_same_bytes_for_another_time_zone_and_argument_order(
    inputs: Inputs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    other = str(_wheel(inputs.sparkseal_wheel.parent / "extra-1.0-py3-none-any.whl", "extra"))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    assert sbom.main([*sbom_args(inputs, first), "--wheel", other]) == 0
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    assert sbom.main(["--wheel", other, *reversed_flags(sbom_args(inputs, second))]) == 0
    monkeypatch.undo()
    time.tzset()
    assert first.read_bytes() == second.read_bytes()
    text = first.read_text()
    assert text.endswith("}\n") and str(tmp_path) not in text


def reversed_flags(args: list[str]) -> list[str]:
    """The same options in reverse order; ``--patch`` options (whose order is the series) keep theirs."""
    options: list[list[str]] = []
    for arg in args:
        if arg.startswith("--"):
            options.append([arg])
        else:
            options[-1].append(arg)
    patches = [option for option in options if option[0] == "--patch"]
    rest = [option for option in options if option[0] != "--patch"]
    return [arg for option in [*reversed(rest), *patches] for arg in option]


def test_wrong_vllm_wheel(inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = sbom_args(inputs, tmp_path / "sbom.json")
    args[args.index("--vllm-wheel") + 1] = str(inputs.sparkseal_wheel)
    assert sbom.main(args) == 1
    assert capsys.readouterr().err.strip() == (
        f"sbom: {inputs.sparkseal_wheel}: expected a vllm wheel, found project 'sparkseal'"
    )
    assert not (tmp_path / "sbom.json").exists()


# The lock readers' errors (sparkseal.core.locks) name the file, the field, the expected and the actual value.
# The ids name each case: the earlier ones held the whole old message, which the readers no longer write.
@pytest.mark.parametrize(
    ("lock", "edit", "message"),
    [
        pytest.param(
            "debian_lock",
            lambda d: d["packages"][1].update(sha256="ABC"),
            '{path}: field `packages[1].sha256`: expected 64 lowercase hex digits, actual "ABC"',
            id="debian-sha256",
        ),
        pytest.param(
            "debian_lock",
            lambda d: d.pop("suite"),
            "{path}: field `suite`: expected a non-empty string, actual nothing",
            id="debian-suite",
        ),
        pytest.param(
            "python_lock",
            lambda d: d["wheels"]["numpy"].pop("version"),
            "{path}: field `wheels.numpy.version`: expected a non-empty string, actual nothing",
            id="python-version",
        ),
        pytest.param(
            "vllm_lock",
            lambda d: d["wheels"].pop(PLATFORM),
            "{path}: field `wheels.linux_aarch64`: expected an object, actual nothing",
            id="vllm-wheel",
        ),
        pytest.param(
            "vllm_lock",
            lambda d: d.update(commit=COMMIT[:9]),
            "{path}: field `commit`: expected 40 lowercase hex digits (a full commit), "
            f'actual "{COMMIT[:9]}"',
            id="vllm-abbreviated-commit",
        ),
        pytest.param(
            "vllm_lock",
            lambda d: d.update(format=2),
            "{path}: field `format`: expected 1 (a vLLM lock, written by `sparkseal lock vllm`), actual 2",
            id="vllm-format",
        ),
    ],
)
def test_lock_errors_name_file_key_and_value(
    inputs: Inputs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    lock: str,
    edit: Callable[[dict], object],
    message: str,
) -> None:
    path: Path = getattr(inputs, lock)
    data = json.loads(path.read_text())
    edit(data)
    _json(path, data)
    assert sbom.main(sbom_args(inputs, tmp_path / "sbom.json")) == 1
    assert capsys.readouterr().err.strip() == "sbom: " + message.format(path=path)


def test_missing_patch_is_named(inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, path = inputs.patches[1]
    path.unlink()
    assert sbom.main(sbom_args(inputs, tmp_path / "sbom.json")) == 1
    assert capsys.readouterr().err.strip() == f"sbom: {path}: expected the patch {name}, found no file"


def test_the_sbom_validates_with_spdx_tools(inputs: Inputs, tmp_path: Path) -> None:
    """spdx-tools, the SPDX project's own parser and validator, accepts the document as SPDX 2.3."""
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    path = tmp_path / "sbom.spdx.json"
    _run(inputs, path)
    document = parse_file(str(path))
    assert [message.validation_message for message in validate_full_spdx_document(document)] == []
    assert document.creation_info.spdx_version == "SPDX-2.3"
    assert len(document.packages) == len(json.loads(path.read_text())["packages"])

    # The validator is not a rubber stamp: a relationship to an element that does not exist fails it.
    broken = json.loads(path.read_text())
    broken["relationships"][0]["relatedSpdxElement"] = "SPDXRef-nothing"
    (tmp_path / "broken.spdx.json").write_text(json.dumps(broken))
    messages = validate_full_spdx_document(parse_file(str(tmp_path / "broken.spdx.json")))
    assert any("SPDXRef-nothing" in message.validation_message for message in messages)


# --- CycloneDX 1.6 ---

NAME = "sparkseal-vllm-0.25.1-linux_aarch64"
IMAGE_REF = f"urn:sparkseal:image:{NAME}"
SERIAL = re.compile(r"urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def cdx_args(inputs: Inputs, out: Path) -> list[str]:
    """The action's command line for the fixture, in the CycloneDX form."""
    return [*sbom_args(inputs, out), "--format", "cyclonedx-1.6"]


def _run_cdx(inputs: Inputs, out: Path) -> dict[str, Any]:
    assert sbom.main(cdx_args(inputs, out)) == 0
    return json.loads(out.read_text())


def _all_components(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The top-level components and the ancestors of every pedigree."""
    found = []
    for component in doc["components"]:
        found.append(component)
        found.extend(component.get("pedigree", {}).get("ancestors", []))
    return found


def test_cyclonedx_bsi_document_fields(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run_cdx(inputs, tmp_path / "sbom.cdx.json")
    assert (doc["bomFormat"], doc["specVersion"], doc["version"]) == ("CycloneDX", "1.6", 1)
    assert SERIAL.fullmatch(doc["serialNumber"]), doc["serialNumber"]
    metadata = doc["metadata"]
    # The SBOM's creator and its timestamp (SOURCE_DATE_EPOCH, not the time of the build).
    assert metadata["timestamp"] == "1980-01-01T00:00:00Z"
    assert metadata["authors"] == [{"name": "sparkseal"}]
    assert metadata["tools"]["components"] == [
        {"type": "application", "name": "sparkseal", "version": __version__}
    ]
    image = metadata["component"]
    assert (image["type"], image["bom-ref"], image["name"], image["version"]) == (
        "container",
        IMAGE_REF,
        NAME,
        "0.25.1",
    )
    by_file = {
        next(p["value"] for p in c["properties"] if p["name"] == "bsi:component:filename"): c
        for c in doc["components"]
    }
    assert sorted(by_file) == sorted(
        [
            "base-files_12.4+deb12u15_arm64.deb",
            "libstdc++6_12.2.0-14+deb12u1_arm64.deb",
            "numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl",
            "typing_extensions-4.15.0-py3-none-any.whl",
            "vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl",
            "sparkseal-0.1.0-py3-none-linux_aarch64.whl",
        ]
    )
    libstdcxx = by_file["libstdc++6_12.2.0-14+deb12u1_arm64.deb"]
    assert (libstdcxx["name"], libstdcxx["version"]) == ("libstdc++6", "12.2.0-14+deb12u1")
    assert libstdcxx["purl"] == "pkg:deb/debian/libstdc%2B%2B6@12.2.0-14%2Bdeb12u1?arch=arm64&distro=bookworm"
    assert libstdcxx["hashes"] == [{"alg": "SHA-256", "content": _sha(b"libstdc++6")}]
    assert libstdcxx["supplier"] == {"name": "Debian"}
    numpy = by_file["numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl"]
    assert (
        numpy["purl"] == "pkg:pypi/numpy@2.2.6?file_name=numpy-2.2.6-cp311-cp311-manylinux_2_17_aarch64.whl"
    )
    assert "supplier" not in numpy and "licenses" not in numpy  # not in the lock: not claimed
    kernels = by_file["sparkseal-0.1.0-py3-none-linux_aarch64.whl"]
    assert kernels["supplier"] == {"name": "sparkseal"}
    assert kernels["licenses"] == [{"license": {"name": "Apache-2.0"}}]
    assert kernels["purl"].startswith("pkg:generic/sparkseal@0.1.0?checksum=sha256:")
    ours = by_file["vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl"]
    assert ours["licenses"] == [{"expression": "Apache-2.0"}]
    for component in doc["components"]:
        properties = {p["name"]: p["value"] for p in component["properties"]}
        assert properties["bsi:component:archive"] == "archive"
        assert properties["bsi:component:structured"] == "structured"
        assert properties["bsi:component:executable"] == "non-executable"


def test_cyclonedx_every_component_has_a_sha256_and_a_purl(inputs: Inputs, tmp_path: Path) -> None:
    from packageurl import PackageURL

    doc = _run_cdx(inputs, tmp_path / "sbom.cdx.json")
    components = _all_components(doc)
    assert len(components) == 8  # 6 installed + the sdist and the upstream wheel of our vLLM
    refs = [c["bom-ref"] for c in components]
    assert len(set(refs)) == len(refs)
    for component in components:
        [digest] = [h for h in component["hashes"] if h["alg"] == "SHA-256"]
        assert re.fullmatch(r"[0-9a-f]{64}", digest["content"]), component["name"]
        purl = PackageURL.from_string(component["purl"])
        assert (purl.name, purl.version) == (component["name"], component["version"])
        assert component["bom-ref"] == component["purl"]


def test_cyclonedx_the_image_depends_on_every_component(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run_cdx(inputs, tmp_path / "sbom.cdx.json")
    installed = sorted(c["bom-ref"] for c in doc["components"])
    assert doc["dependencies"] == [{"ref": IMAGE_REF, "dependsOn": installed}]
    assert doc["compositions"] == [
        {"aggregate": "complete", "dependencies": [IMAGE_REF]},
        {"aggregate": "unknown", "dependencies": installed},
    ]


def test_cyclonedx_our_vllm_names_its_ancestors_commit_and_patches(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run_cdx(inputs, tmp_path / "sbom.cdx.json")
    [ours] = [c for c in doc["components"] if c["name"] == "vllm"]
    assert ours["hashes"] == [{"alg": "SHA-256", "content": _sha(inputs.vllm_wheel.read_bytes())}]
    pedigree = ours["pedigree"]
    assert [(a["purl"], a["hashes"][0]["content"]) for a in pedigree["ancestors"]] == [
        ("pkg:pypi/vllm@0.25.1?file_name=vllm-0.25.1.tar.gz", _sha(b"sdist")),
        (
            "pkg:pypi/vllm@0.25.1?file_name=vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl",
            _sha(PLATFORM.encode()),
        ),
    ]
    assert pedigree["commits"] == [{"uid": COMMIT}]
    assert [(p["type"], p["diff"]["url"], p["diff"]["text"]["content"]) for p in pedigree["patches"]] == [
        ("backport", "patches/vllm/0001-first.patch", inputs.patches[0][1].read_text()),
        ("unofficial", "patches/vllm/0002-second.patch", inputs.patches[1][1].read_text()),
    ]
    assert COMMIT in pedigree["notes"]
    assert (
        "patches/vllm/0002-second.patch: 0002-second.patch (Upstream: none (sparkseal's own))"
        in (pedigree["notes"])
    )


def test_cyclonedx_the_same_packages_as_the_spdx_document(inputs: Inputs, tmp_path: Path) -> None:
    """Two renderings of one package list: name, version, sha256 and package URL agree."""
    cdx = _run_cdx(inputs, tmp_path / "sbom.cdx.json")
    assert sbom.main(sbom_args(inputs, tmp_path / "sbom.spdx.json")) == 0
    spdx = json.loads((tmp_path / "sbom.spdx.json").read_text())
    from_cdx = {(c["name"], c["version"], c["hashes"][0]["content"], c["purl"]) for c in _all_components(cdx)}
    from_spdx = {
        (
            p["name"],
            p["versionInfo"],
            p["checksums"][0]["checksumValue"],
            p["externalRefs"][0]["referenceLocator"],
        )
        for p in spdx["packages"]
    }
    assert from_cdx == from_spdx and len(from_cdx) == 8


def test_cyclonedx_same_bytes_for_another_time_zone_and_argument_order(
    inputs: Inputs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a.cdx.json", tmp_path / "b.cdx.json"
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    assert sbom.main(cdx_args(inputs, first)) == 0
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    assert sbom.main(reversed_flags(cdx_args(inputs, second))) == 0
    monkeypatch.undo()
    time.tzset()
    assert first.read_bytes() == second.read_bytes()
    assert str(tmp_path) not in first.read_text()


def test_cyclonedx_serial_number_is_derived_from_the_content(inputs: Inputs, tmp_path: Path) -> None:
    doc = _run_cdx(inputs, tmp_path / "sbom.cdx.json")
    without = {key: value for key, value in doc.items() if key != "serialNumber"}
    content = _sha(sbom.dumps(without).encode())
    assert (
        doc["serialNumber"] == uuid.uuid5(uuid.NAMESPACE_URL, f"urn:sparkseal:cyclonedx:{NAME}:{content}").urn
    )

    _wheel(inputs.sparkseal_wheel, "another build")
    assert _run_cdx(inputs, tmp_path / "other.cdx.json")["serialNumber"] != doc["serialNumber"]


def test_cyclonedx_a_patch_without_its_header_is_named(
    inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, path = inputs.patches[0]
    path.write_text("Subject: no upstream\n--- a/x\n+++ b/x\n")
    assert sbom.main(cdx_args(inputs, tmp_path / "sbom.cdx.json")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sbom: {path}: header is missing Upstream, Reason"), err
    assert not (tmp_path / "sbom.cdx.json").exists()


def test_cyclonedx_a_built_wheel_without_metadata_is_named(
    inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs.sparkseal_wheel.write_bytes(b"not a zip")
    assert sbom.main(cdx_args(inputs, tmp_path / "sbom.cdx.json")) == 1
    assert capsys.readouterr().err.strip() == (
        f"sbom: {inputs.sparkseal_wheel}: expected a wheel with UTF-8 METADATA, found: File is not a zip file"
    )


def test_cyclonedx_the_sbom_validates_with_the_cyclonedx_library(inputs: Inputs, tmp_path: Path) -> None:
    """The OWASP CycloneDX library's strict JSON validator accepts the document as CycloneDX 1.6, and is
    no rubber stamp: a component without its name, or a hash of an unknown algorithm, fails it."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    validator = JsonStrictValidator(SchemaVersion.V1_6)
    path = tmp_path / "sbom.cdx.json"
    _run_cdx(inputs, path)
    assert validator.validate_str(path.read_text()) is None

    nameless = json.loads(path.read_text())
    del nameless["components"][1]["name"]
    error = validator.validate_str(json.dumps(nameless))
    assert error is not None and "'name' is a required property" in str(error)

    bad_hash = json.loads(path.read_text())
    bad_hash["components"][0]["pedigree"]["ancestors"][0]["hashes"][0]["alg"] = "SHA-999"
    error = validator.validate_str(json.dumps(bad_hash))
    assert error is not None and "'SHA-999' is not one of" in str(error)


# --- the rules, on a fixture workspace ---

_SBOM_FIXTURE_ARGS = """\
    debian_lock = "in/bookworm_arm64.lock.json",
    document_name = "sparkseal-vllm-0.25.1-linux_aarch64",
    patches = ["in/patches/vllm/0001-first.patch", "in/patches/vllm/0002-second.patch"],
    platform = "linux_aarch64",
    python_lock = "in/requirements_linux_aarch64.files.json",
    vllm_lock = "in/vllm.lock.json",
    vllm_wheel = "in/built/vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl",
    wheels = ["in/built/sparkseal-0.1.0-py3-none-linux_aarch64.whl"],
"""
# BUILD files take no **kwargs: both rules spell out the same inputs. The targets without their load
# line, for fixture BUILD files that load more (test_provenance.py, tests/bazel/test_auditing_page.py).
SBOM_FIXTURE_TARGETS = (
    f'sbom(\n    name = "sbom",\n{_SBOM_FIXTURE_ARGS})\n\n'
    f'sbom_cyclonedx(\n    name = "sbom_cyclonedx",\n{_SBOM_FIXTURE_ARGS})\n'
)
SBOM_FIXTURE_BUILD = 'load("//rules:defs.bzl", "sbom", "sbom_cyclonedx")\n\n' + SBOM_FIXTURE_TARGETS


@pytest.mark.bazel
@pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)")
def test_both_rules_write_what_the_action_writes(tmp_path: Path) -> None:
    """``sbom`` and ``sbom_cyclonedx`` on the same inputs: each output is the action's document in its
    format, byte for byte, with the patches named by their workspace paths."""
    root = tmp_path / "ws"
    make_fixture_workspace(root, MINIMAL_WORKSPACE)
    package = root / "fx"
    inputs = write_inputs(package / "in")
    (package / "BUILD").write_text(SBOM_FIXTURE_BUILD)
    ws = Workspace(root, tmp_path / "output-base", tmp_path / "repository-cache", base_env())
    try:
        result = ws.bazel("build", "//fx:sbom", "//fx:sbom_cyclonedx")
        assert result.returncode == 0, result.output
        bazel_bin = ws.bin_path("fx")
    finally:
        ws.shutdown()

    named = dataclasses.replace(inputs, patches=[(f"fx/in/{name}", path) for name, path in inputs.patches])
    for out, extra in (("sbom.spdx.json", []), ("sbom_cyclonedx.cdx.json", ["--format", "cyclonedx-1.6"])):
        expected = tmp_path / out
        assert sbom.main([*sbom_args(named, expected), *extra]) == 0
        assert (bazel_bin / out).read_bytes() == expected.read_bytes(), out
