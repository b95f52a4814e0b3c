"""`sparkseal verify`'s verdict as a SLSA Verification Summary Attestation: its shape against the published
schema, and the command that writes it (the two builds stood in for here; real rebuilds of a fixture
workspace: tests/bazel/test_verify_build.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sparkseal import cli
from sparkseal.audit import rebuild, verify_build
from sparkseal.audit import verification_summary as vsa
from sparkseal.core import dsse
from sparkseal.core.source import Source
from tests.unit.test_provenance import _blob, _canonical, write_layout
from tests.unit.test_provenance_sign import _keys

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _sha_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


SOURCE = Source(COMMIT, "clean", "git+https://git.example.org/acme/sparkseal.git@refs/heads/main")
DIGEST = "sha256:" + "ab" * 32
AT = "2026-12-08T10:00:00Z"


def _validate(document: dict) -> None:
    """The statement with the in-toto attestation framework's bindings: the Statement v1 schema, and the
    VSA v1 predicate through its published proto (in_toto_attestation/predicates/vsa/v1/vsa.proto).

    Two parts of the predicate are checked against the SLSA spec's text instead: extension fields named
    by URIs (the spec allows them; the proto, which knows none, would refuse them), and verifiedLevels,
    an array in the spec but a single string in the 0.9.3 proto (in-toto/attestation#425).
    """
    from google.protobuf import json_format
    from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    Statement.copy_from_pb(json_format.ParseDict(document, statement_pb2.Statement())).validate()
    assert document["predicateType"] == "https://slsa.dev/verification_summary/v1"
    predicate = {k: v for k, v in document["predicate"].items() if ":" not in k and k != "verifiedLevels"}
    parsed = json_format.ParseDict(predicate, vsa_pb2.VerificationSummary())  # unknown fields fail
    for required in ("verifier", "time_verified", "policy"):
        assert parsed.HasField(required), f"required by the spec: {required}"
    assert parsed.verifier.id and parsed.resource_uri and parsed.policy.uri and parsed.policy.digest
    assert parsed.verification_result in ("PASSED", "FAILED")
    levels = document["predicate"]["verifiedLevels"]
    assert isinstance(levels, list) and levels and all(isinstance(level, str) for level in levels)
    # Custom results must not take the SLSA_ prefix; FAILED exactly when the policy failed.
    assert all(not level.startswith("SLSA_") for level in levels)
    assert (levels == ["FAILED"]) == (parsed.verification_result == "FAILED")


def test_a_passed_summary_is_a_valid_vsa() -> None:
    verdict = vsa.Verdict("//:image", DIGEST, SOURCE, ["--config=bazel7"], {"TZ": "unset -> X"})
    document = vsa.statement(verdict, AT)
    _validate(document)
    assert document["subject"] == [{"name": "//:image", "digest": {"sha256": "ab" * 32}}]
    predicate = document["predicate"]
    assert {k: v for k, v in predicate.items() if k != vsa.INPUTS} == {
        "verifier": {"id": "urn:sparkseal:verifier:rebuild-and-compare:v1"},
        "timeVerified": AT,
        "resourceUri": "urn:sparkseal:bazel-target://:image",
        "policy": {
            "uri": "urn:sparkseal:policy:identical-rebuild:v1",
            "digest": {"sha256": vsa.POLICY_DIGEST},
        },
        "verificationResult": "PASSED",
        "verifiedLevels": ["SPARKSEAL_REBUILT_IDENTICAL"],
        "dependencyLevels": {},
        "slsaVersion": "1.0",
    }
    assert predicate["urn:sparkseal:verify:inputs:v1"] == {
        "source": {
            "name": "sparkseal",
            "uri": SOURCE.uri,
            "digest": {"gitCommit": COMMIT},
            "annotations": {"role": "source", "tree": "clean"},
        },
        "target": "//:image",
        "bazelArgs": ["--config=bazel7"],
        "variations": {"TZ": "unset -> X"},
    }


def test_a_failed_summary_names_the_differing_layers_and_an_unknown_source() -> None:
    layers = [{"layer": "//:layer_leaky", "first": "sha256:" + "1" * 64, "second": "sha256:" + "2" * 64}]
    difference = {"artifact": "image", "detail": ["layer //:layer_leaky: ..."], "layers": layers}
    verdict = vsa.Verdict("//:image", DIGEST, Source(unknown="the workspace is not a git checkout"))
    verdict.against, verdict.differences = DIGEST, [difference]
    document = vsa.statement(verdict, AT)
    _validate(document)
    predicate = document["predicate"]
    assert (predicate["verificationResult"], predicate["verifiedLevels"]) == ("FAILED", ["FAILED"])
    inputs = predicate[vsa.INPUTS]
    assert inputs["source"] == {"unknown": "the workspace is not a git checkout"}
    assert (inputs["against"], inputs["differences"]) == (DIGEST, [difference])


def test_the_schema_check_is_no_rubber_stamp() -> None:
    document = vsa.statement(vsa.Verdict("//:image", DIGEST, SOURCE), AT)
    wrong = json.loads(json.dumps(document))
    wrong["predicate"]["verifier"]["name"] = "x"  # no such field in the published schema
    with pytest.raises(Exception, match='no field named "name"'):
        _validate(wrong)
    wrong = json.loads(json.dumps(document))
    wrong["predicate"]["verifiedLevels"] = ["SLSA_BUILD_LEVEL_3"]  # a level a rebuild does not verify
    with pytest.raises(AssertionError):
        _validate(wrong)
    wrong = json.loads(json.dumps(document))
    wrong["subject"][0]["digest"] = {}
    with pytest.raises(ValueError, match=r"At least one digest required"):
        _validate(wrong)


# --- the command, with the two builds stood in for ---


def _outputs(layout: Path) -> dict[str, dict[str, Path]]:
    """What Bazel's build events report for //:image: the layout file by file, and the digest file."""
    found = {f"image/{p.relative_to(layout).as_posix()}": p for p in layout.rglob("*") if p.is_file()}
    return {"//:image": {**found, "image.digest": layout.parent / "image.digest"}}


def _layout(root: Path, changed_layer: bytes = b"") -> Path:
    layout = root / "image"
    digest = write_layout(layout)
    if changed_layer:  # another image: its second layer has other bytes
        manifest = json.loads((layout / "blobs/sha256" / digest.removeprefix("sha256:")).read_bytes())
        manifest["layers"][1]["digest"] = _blob(layout, changed_layer)
        digest = _blob(layout, _canonical(manifest))
        index = {"manifests": [{"digest": digest, "mediaType": manifest["mediaType"]}], "schemaVersion": 2}
        (layout / "index.json").write_bytes(_canonical(index))
    (root / "image.digest").write_text(digest)
    return layout


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A checkout whose first and second builds are fixture layouts; records the Bazel arguments."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "WORKSPACE").write_text("")
    state: dict = {"root": root, "args": [], "second": _layout(tmp_path / "second")}
    first = _layout(tmp_path / "first")

    def first_build(workspace: Path, targets: list[str], scratch: Path, bazel_args=None) -> rebuild.Build:
        state["args"].append(("first", list(bazel_args or [])))
        return rebuild.Build(workspace, None, {}, _outputs(first))

    def second_build(workspace: Path, targets, scratch: Path, bazel_args=None, status="") -> rebuild.Build:
        state["args"].append(("second", list(bazel_args or []), status))
        (scratch / "second.log").write_text("")
        return rebuild.Build(
            workspace, None, {"TZ": "unset -> Pacific/Kiritimati"}, _outputs(state["second"])
        )

    monkeypatch.setattr(verify_build, "first_build", first_build)
    monkeypatch.setattr(verify_build, "second_build", second_build)
    status = "\n".join(SOURCE.status_lines()) + "\n"
    monkeypatch.setattr(verify_build, "workspace_status", lambda _: (SOURCE, status))
    state["status"] = status
    state["digest"] = (tmp_path / "first" / "image.digest").read_text()
    return state


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(["verify", *args])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_passes_writes_a_signed_vsa_and_passes_bazel_arguments(
    workspace: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = _keys(tmp_path, "auditor")
    reports = tmp_path / "reports"
    args = ["//:image", "--workspace", str(workspace["root"]), "--report-dir", str(reports)]
    code, out, err = _run(
        capsys, *args, "--bazel-arg=--config=bazel7", "--bazel-arg=--jobs=2", "--key", str(private)
    )
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == f"source: {SOURCE.uri} commit {COMMIT} (clean tree)"
    assert lines[-1].startswith("PASSED: identical: ")
    summary, envelope = reports / "image.vsa.intoto.json", reports / "image.vsa.intoto.dsse.json"
    assert f"verification summary: {summary}" in lines and f"verification summary: {envelope}" in lines
    assert workspace["args"] == [
        ("first", ["--config=bazel7", "--jobs=2"]),
        ("second", ["--config=bazel7", "--jobs=2"], workspace["status"]),
    ]
    document = json.loads(summary.read_text())
    _validate(document)
    assert document["subject"][0]["digest"] == {"sha256": workspace["digest"].removeprefix("sha256:")}
    assert document["predicate"]["verificationResult"] == "PASSED"
    assert json.loads(dsse.verify(envelope, public)) == document


def test_verify_fails_naming_the_differing_layer(
    workspace: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace["second"] = _layout(tmp_path / "other", changed_layer=b"layer 1, leaked")
    reports = tmp_path / "reports"
    code, out, _ = _run(
        capsys, "//:image", "--workspace", str(workspace["root"]), "--report-dir", str(reports)
    )
    assert code == 1
    assert out.splitlines()[-1].startswith("FAILED: 2 difference(s) (")  # the image, and its digest file
    predicate = json.loads((reports / "image.vsa.intoto.json").read_text())["predicate"]
    assert (predicate["verificationResult"], predicate["verifiedLevels"]) == ("FAILED", ["FAILED"])
    [image] = [d for d in predicate[vsa.INPUTS]["differences"] if d["artifact"] == "image"]
    assert image["detail"][:1] == [
        f"image manifest: {workspace['digest']} vs {(tmp_path / 'other/image.digest').read_text()}"
    ]
    # The fixture's config has no history, so a layer is named by its position.
    assert image["layers"] == [
        {
            "layer": "layer 1",
            "first": _sha_of(b"layer 1"),
            "second": _sha_of(b"layer 1, leaked"),
        }
    ]


def test_a_bad_key_is_refused_before_any_build(
    workspace: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "not-a-key.pem"
    key.write_text("nonsense\n")
    code, _, err = _run(capsys, "//:image", "--workspace", str(workspace["root"]), "--key", str(key))
    assert code == 2 and workspace["args"] == []
    assert f"error: --key: {key}: expected an ed25519 private key in PEM, cannot load it" in err


def test_a_missing_bazel_points_an_auditor_to_make_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rebuild.shutil, "which", lambda _name: None)
    with pytest.raises(rebuild.RebuildError) as error:
        rebuild.run_bazel(tmp_path, ["//:image"], log=tmp_path / "log")
    assert (
        str(error.value)
        == "bazel is not on PATH (`make tools` installs it, with diffoscope, for `sparkseal verify`)"
    )
