"""`sparkseal provenance check`: each subject of a statement the provenance action wrote against the built
artifacts, found by kind or given, and what it reports when one differs.

Signing and `check --pubkey`: test_provenance_sign.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparkseal.actions.sparkseal_pex import tree_digest
from tests.unit.test_provenance import (
    SOURCE_COMMIT,
    SOURCE_URI,
    Build,
    _canonical,
    _check,
    _sha,
    _statement,
    make_build,
    write_layout,
)


@pytest.fixture
def build(tmp_path: Path) -> Build:
    return make_build(tmp_path)


def test_check_passes_on_the_build(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _check(capsys, str(build.statement))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[-1] == "PASSED: 8 checks, 0 differ"  # 5 subjects + config and 2 layer blobs of the image
    assert lines[0] == f"source: {SOURCE_URI} commit {SOURCE_COMMIT} (clean tree)"
    assert (
        f"ok image_linux_aarch64 (oci-image) {(build.bin / 'image_linux_aarch64.digest').read_text()}"
        in lines
    )
    assert f"ok sbom_linux_aarch64.spdx.json (sbom) sha256:{_sha(build.sbom.read_bytes())}" in lines
    cyclonedx = _sha(build.cyclonedx.read_bytes())
    assert f"ok sbom_cyclonedx_linux_aarch64.cdx.json (sbom-cyclonedx) sha256:{cyclonedx}" in lines


def test_check_reports_a_changed_manifest(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    expected = _sha(build.manifest.read_bytes())
    build.manifest.write_text(
        json.dumps({"format": "sparkseal-module-manifest/1", "distributions": {"x": {}}})
    )
    actual = _sha(build.manifest.read_bytes())
    code, out, _ = _check(capsys, str(build.statement))
    assert code == 1
    assert (
        f"DIFFERS manifest_linux_aarch64.json (module-manifest) at {build.manifest}: "
        f"expected sha256:{expected} from {build.statement}, actual sha256:{actual}"
    ) in out.splitlines()
    assert out.splitlines()[-1] == "FAILED: 8 checks, 1 differ"


def test_check_reports_a_changed_pex_file(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    expected = tree_digest(build.pex)
    (build.pex / ".deps" / "numpy.whl" / "numpy.py").write_text("x = 2\n")
    code, out, _ = _check(capsys, "--json", str(build.statement))
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    [bad] = [check for check in report["checks"] if not check["ok"]]
    assert bad == {
        "subject": "pex_linux_aarch64.pex",
        "kind": "pex",
        "path": str(build.pex),
        "expected": expected.removeprefix("sha256:"),
        "actual": tree_digest(build.pex).removeprefix("sha256:"),
        "ok": False,
    }


def test_check_reports_a_changed_layer_blob(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    manifest_digest = (build.bin / "image_linux_aarch64.digest").read_text()
    manifest = json.loads(
        (build.layout / "blobs" / "sha256" / manifest_digest.removeprefix("sha256:")).read_text()
    )
    layer = manifest["layers"][1]["digest"].removeprefix("sha256:")
    blob = build.layout / "blobs" / "sha256" / layer
    blob.write_bytes(b"tampered")
    code, out, _ = _check(capsys, str(build.statement))
    assert code == 1
    assert (
        f"DIFFERS image_linux_aarch64 layer 1 (oci-blob) at {blob}: expected sha256:{layer} "
        f"from {build.statement}, actual sha256:{_sha(b'tampered')}"
    ) in out.splitlines()
    assert f"ok image_linux_aarch64 (oci-image) {manifest_digest}" in out.splitlines()


def test_check_reports_another_image(
    build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other-layout"
    write_layout(other)
    (other / "blobs" / "sha256" / "extra").write_bytes(b"")  # not named by the manifest: not checked
    index = json.loads((other / "index.json").read_text())
    index["manifests"][0]["annotations"] = {"org.opencontainers.image.ref.name": "other"}
    (other / "index.json").write_text(json.dumps(index))
    manifest = other / "blobs" / "sha256" / index["manifests"][0]["digest"].removeprefix("sha256:")
    changed = json.loads(manifest.read_text()) | {"annotations": {"changed": "yes"}}
    manifest.write_bytes(_canonical(changed))
    expected = (build.bin / "image_linux_aarch64.digest").read_text()
    code, out, _ = _check(capsys, str(build.statement), str(other))
    assert code == 1
    assert (
        f"DIFFERS image_linux_aarch64 (oci-image) at {other}: expected {expected} "
        f"from {build.statement}, actual sha256:{_sha(_canonical(changed))}"
    ) in out.splitlines()


def test_check_uses_artifacts_given_by_kind(
    build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copies = tmp_path / "copies"
    copies.mkdir()
    shutil.copyfile(build.sbom, copies / "image-sbom.json")
    shutil.copyfile(build.cyclonedx, copies / "image-bom.json")  # told apart by content, not by name
    shutil.copytree(build.pex, copies / "app")
    build.sbom.unlink()
    build.cyclonedx.unlink()
    shutil.rmtree(build.pex)
    given = [str(copies / name) for name in ("app", "image-sbom.json", "image-bom.json")]
    code, out, _ = _check(capsys, str(build.statement), *given)
    assert code == 0, out
    assert out.splitlines()[-1] == "PASSED: 8 checks, 0 differ"


def test_only_checks_the_kinds_named_and_says_what_it_left_out(
    build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image copied from a registry comes without the PEX: ``--only oci-image`` checks the image and
    names every other subject as not checked, in the report and the verdict line."""
    copy = shutil.copytree(build.layout, tmp_path / "copy")
    shutil.rmtree(build.pex)
    code, out, err = _check(capsys, "--only", "oci-image", str(build.statement), str(copy))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-5:] == [
        "not checked manifest_linux_aarch64.json (module-manifest): left out by --only",
        "not checked pex_linux_aarch64.pex (pex): left out by --only",
        "not checked sbom_cyclonedx_linux_aarch64.cdx.json (sbom-cyclonedx): left out by --only",
        "not checked sbom_linux_aarch64.spdx.json (sbom): left out by --only",
        "PASSED: 4 checks, 0 differ; 4 subjects not checked",
    ]
    code, out, _ = _check(capsys, "--only", "oci-image", "--json", str(build.statement), str(copy))
    assert json.loads(out)["not_checked"] == [
        "manifest_linux_aarch64.json (module-manifest)",
        "pex_linux_aarch64.pex (pex)",
        "sbom_cyclonedx_linux_aarch64.cdx.json (sbom-cyclonedx)",
        "sbom_linux_aarch64.spdx.json (sbom)",
    ]
    # A changed layer still fails; the SBOM given beside the image is checked once --only names it.
    code, out, _ = _check(capsys, "--only", "oci-image", "--only", "sbom", str(build.statement), str(copy))
    assert code == 0 and out.splitlines()[-1] == "PASSED: 5 checks, 0 differ; 3 subjects not checked"
    layer = next(path for path in (copy / "blobs/sha256").iterdir() if path.read_bytes() == b"layer 1")
    layer.write_bytes(b"layer 2")
    code, out, _ = _check(capsys, "--only", "oci-image", str(build.statement), str(copy))
    assert code == 1 and out.splitlines()[-1] == "FAILED: 4 checks, 1 differ; 4 subjects not checked"


def test_only_refuses_a_kind_without_subject_or_an_artifact_it_leaves_out(
    build: Build, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = _statement(build)
    statement["subject"] = [s for s in statement["subject"] if s["annotations"]["kind"] != "pex"]
    build.statement.write_text(json.dumps(statement))
    code, _, err = _check(capsys, "--only", "pex", str(build.statement))
    assert code == 2
    assert (
        f"error: --only pex: expected a kind among the subjects of {build.statement} (module-manifest, "
        "oci-image, sbom, sbom-cyclonedx), found none of that kind"
    ) in err
    code, _, err = _check(capsys, "--only", "oci-image", str(build.statement), str(build.sbom))
    assert code == 2
    assert f"error: {build.sbom}: is a sbom artifact, but --only leaves that kind out" in err
    code, _, err = _check(capsys, "--only", "tarball", str(build.statement))
    assert code == 2 and "argument --only: invalid choice: 'tarball'" in err


def test_check_root_option(build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    moved = tmp_path / "elsewhere.json"
    shutil.move(build.statement, moved)
    code, out, _ = _check(capsys, "--root", str(build.bin), str(moved))
    assert code == 0, out
    code, _, err = _check(capsys, str(moved))
    assert code == 2
    assert (
        f"{tmp_path / 'image_linux_aarch64'}: expected the OCI layout of image_linux_aarch64, "
        "found no index.json" in err
    )


def test_check_missing_artifact_is_a_usage_error(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(build.pex)
    code, out, err = _check(capsys, str(build.statement))
    assert (code, out) == (2, "")
    assert f"error: {build.pex}: expected the PEX directory of pex_linux_aarch64.pex, found none" in err
    build.sbom.unlink()
    code, _, err = _check(capsys, str(build.statement), str(build.sbom))
    assert code == 2
    assert f"error: {build.sbom}: expected an artifact, found no file or directory" in err


def test_check_refuses_what_is_not_a_statement(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _check(capsys, str(build.sbom))
    assert code == 2
    assert (
        f"error: {build.sbom}: expected _type https://in-toto.io/Statement/v1 and predicateType "
        "https://slsa.dev/provenance/v1, found None and None"
    ) in err
    statement = _statement(build)
    statement["subject"][0]["annotations"]["kind"] = "tarball"
    build.statement.write_text(json.dumps(statement))
    code, _, err = _check(capsys, str(build.statement))
    assert code == 2
    assert "subject[0]: expected name, digest.sha256 and annotations.kind in oci-image, pex, " in err
    assert "kind='tarball'" in err


def test_check_refuses_an_artifact_of_no_known_kind(build: Build, capsys: pytest.CaptureFixture[str]) -> None:
    stray = build.inputs.patches[0][1]
    code, _, err = _check(capsys, str(build.statement), str(stray))
    assert code == 2
    assert (
        f"error: {stray}: expected an OCI layout directory, a PEX directory, a module manifest, an SPDX "
        "document or a CycloneDX document, found none of these"
    ) in err


def test_check_help_documents_the_lookup(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _check(capsys, "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "PROVENANCE [ARTIFACT ...]" in text
    assert "default: PROVENANCE's directory, i.e. bazel-bin" in text
    assert "(exit 1)" in text and "(exit 2)" in text


_RECORD = "predicate.buildDefinition.internalParameters.bazel"
_INFERRED = (
    "'>= 6.2 (from features: native.package_relative_label is present)', "
    "'< 6.2 (from features: native.package_relative_label is absent)'"
)


def _no_record(statement: dict) -> None:
    """The statement as it was before the record: the builder states a release nobody measured."""
    del statement["predicate"]["buildDefinition"]["internalParameters"]["bazel"]
    _version(statement)["bazel"] = "7.7.1"


def _version(statement: dict) -> dict:
    return statement["predicate"]["runDetails"]["builder"]["version"]


def _set(key: str, value: object) -> object:
    return lambda statement: statement["predicate"]["buildDefinition"]["internalParameters"]["bazel"].update(
        {key: value}
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (_no_record, f"{_RECORD}: expected an object with the keys declared, inferred, release, found None"),
        (
            _set("measured", "7.7.1"),
            f"{_RECORD}: expected an object with the keys declared, inferred, release, found "
            "{'declared': None, 'inferred': '< 6.2 (from features: native.package_relative_label is "
            "absent)', 'release': None, 'measured': '7.7.1'}",
        ),
        (_set("release", 7), f"{_RECORD}.release: expected a non-empty string or null, found 7"),
        (_set("release", ""), f"{_RECORD}.release: expected a non-empty string or null, found ''"),
        (
            _set("declared", ["7.7.1"]),
            f"{_RECORD}.declared: expected a non-empty string or null, found ['7.7.1']",
        ),
        (_set("inferred", "7.7.1"), f"{_RECORD}.inferred: expected one of {_INFERRED}, found '7.7.1'"),
        (
            lambda statement: _version(statement).update(bazel="4.2.3"),
            "predicate.runDetails.builder.version.bazel: expected no entry (Bazel reported no release), "
            "found '4.2.3'",
        ),
        (
            _set("release", "8.1.0"),
            "predicate.runDetails.builder.version.bazel: expected '8.1.0', found None",
        ),
    ],
    ids=[
        "none",
        "extra-key",
        "release-int",
        "release-empty",
        "declared-list",
        "inferred",
        "builder",
        "unnamed",
    ],
)
def test_check_refuses_a_malformed_bazel_record(
    build: Build, capsys: pytest.CaptureFixture[str], change, problem: str
) -> None:
    """An attestation states only what was seen: the check refuses any other record of the Bazel."""
    statement = _statement(build)
    change(statement)
    build.statement.write_text(json.dumps(statement))
    code, out, err = _check(capsys, str(build.statement))
    assert (code, out) == (2, "")
    assert err.strip().splitlines()[-1] == f"sparkseal provenance check: error: {build.statement}: {problem}"


def test_check_says_plainly_what_is_known_of_the_source(
    build: Build, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dirty tree and an unknown source are said in the report (text and JSON); the digests decide."""
    data = _statement(build)
    [entry] = [
        d
        for d in data["predicate"]["buildDefinition"]["resolvedDependencies"]
        if d["annotations"]["role"] == "source"
    ]
    entry["annotations"]["tree"] = "dirty"
    build.statement.write_text(json.dumps(data))
    code, out, _ = _check(capsys, str(build.statement))
    assert code == 0
    assert out.splitlines()[0] == (
        f"source: {SOURCE_URI} commit {SOURCE_COMMIT}, DIRTY tree: built with changes that commit does not "
        "hold, so the commit alone cannot rebuild it"
    )
    data["predicate"]["buildDefinition"]["resolvedDependencies"].remove(entry)
    data["predicate"]["buildDefinition"]["internalParameters"]["source"] = {"unknown": "git is not on PATH"}
    build.statement.write_text(json.dumps(data))
    code, out, _ = _check(capsys, "--json", str(build.statement))
    report = json.loads(out)
    assert (code, report["verdict"], report["source"]["unknown"]) == (0, "PASSED", "git is not on PATH")
    code, out, _ = _check(capsys, str(build.statement))
    assert out.splitlines()[0] == "source: UNKNOWN: git is not on PATH"


def test_check_refuses_a_source_record_with_a_credential(
    build: Build, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _statement(build)
    data["predicate"]["buildDefinition"]["resolvedDependencies"][0]["uri"] = "git+https://me:tok3n@h/x"
    build.statement.write_text(json.dumps(data))
    code, _, err = _check(capsys, str(build.statement))
    assert code == 2 and "tok3n" not in err
    assert err.strip().splitlines()[-1] == (
        f"sparkseal provenance check: error: {build.statement}: "
        "predicate.buildDefinition.resolvedDependencies[0].uri: expected git+SCHEME://HOST/PATH without "
        "user name or password, found another form (not shown: it may hold a credential)"
    )
