"""The layer scan of the image build: a finding fails the layer's scan action and so the image.

Secrets here are assembled at run time so that this file itself stays clean.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.actions import oci_layer_scan as scan_layer
from sparkseal.core.catalogue import Catalogue
from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, Workspace, base_env, make_fixture_workspace
from tests.test_scan import HF, HOME
from tests.test_scan import _layer as layer_bytes


def _layer(path: Path, files: dict[str, bytes]) -> Path:
    path.write_bytes(layer_bytes(files))
    return path


SCANNER = Catalogue.find()


def _allow(path: Path, *entries: tuple[str, str]) -> Path:
    allow = [{"path": p, "rule": r, "reason": "fixture upstream file"} for p, r in entries]
    path.write_text(json.dumps({"allow": allow}))
    return path


def test_a_clean_layer_gets_a_report(tmp_path: Path) -> None:
    blob = _layer(tmp_path / "layer.tar.gz", {"etc/motd": b"hello\n", "opt/app/main.py": b"print(1)\n"})
    report = tmp_path / "report.json"
    args = ["--blob", str(blob), "--layer", "//:layer_app", "--scanner", str(SCANNER.binary)]
    assert scan_layer.main([*args, "--report", str(report)]) == 0
    assert json.loads(report.read_text()) == {
        "allowed": 0,
        "files": 2,
        "findings": 0,
        "layer": "//:layer_app",
        "scanner": {"name": "kingfisher", "rules": len(SCANNER.rules), "version": "2.14.0"},
    }


def test_a_finding_fails_and_writes_no_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob = _layer(tmp_path / "layer.tar.gz", {"etc/app.conf": f"key = {HF}\n".encode(), "etc/ok": b"x\n"})
    report = tmp_path / "report.json"
    args = ["--blob", str(blob), "--layer", "//:layer_app", "--scanner", str(SCANNER.binary)]
    assert scan_layer.main([*args, "--report", str(report)]) == 1
    err = capsys.readouterr().err
    assert "scan_layer: layer //:layer_app: expected no findings, found 1 (allow-list: no allow-list;" in err
    assert "  //:layer_app:etc/app.conf:1:betterleaks.huggingface-access-token: hf_q***(37 chars)" in err
    assert HF not in err
    assert not report.exists()


def test_the_allow_list_covers_upstream_files_by_image_path(tmp_path: Path) -> None:
    files = {"opt/venv/lib/pkg/doc.py": f"cache = '{HOME}/data'\n".encode(), "etc/app.conf": b"ok\n"}
    blob = _layer(tmp_path / "layer.tar.gz", files)
    allow = _allow(tmp_path / "allow.json", ("opt/venv/lib/*/doc.py", "home-path"))
    report = tmp_path / "report.json"
    args = ["--blob", str(blob), "--layer", "//:l", "--allow", str(allow), "--report", str(report)]
    args += ["--scanner", str(SCANNER.binary)]
    assert scan_layer.main(args) == 0
    assert json.loads(report.read_text())["allowed"] == 1


def test_a_bad_allow_list_or_blob_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob = _layer(tmp_path / "layer.tar.gz", {"etc/ok": b"x\n"})
    bad = tmp_path / "allow.json"
    bad.write_text(json.dumps({"allow": [{"path": "x", "rule": "home-path", "reason": ""}]}))
    out = tmp_path / "r.json"
    args = ["--blob", str(blob), "--layer", "//:l", "--allow", str(bad), "--report", str(out)]
    assert scan_layer.main([*args, "--scanner", str(SCANNER.binary)]) == 1
    assert (
        f"{bad}: allow[0]: expected a reason for allowing home-path in x, found none"
        in capsys.readouterr().err
    )
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar")
    args = ["--blob", str(junk), "--layer", "//:l", "--report", str(out), "--scanner", str(SCANNER.binary)]
    assert scan_layer.main(args) == 1
    assert f"scan_layer: {junk}: " in capsys.readouterr().err
    assert not out.exists()


BUILD = """\
load("//rules:defs.bzl", "oci_image", "oci_layer")

genrule(name = "conf", outs = ["app.conf"], cmd = "echo 'key = {secret}' > $@")

oci_layer(name = "layer_conf", files = {{":conf": "/etc/app.conf"}}, scan_allow = "allow.json")

oci_image(name = "image", layers = [":layer_conf"], platform = "linux_x86_64")
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    if BAZEL is None:
        pytest.fail("bazel is not installed: run `make setup`")
    root = tmp_path / "ws"
    root.mkdir()
    make_fixture_workspace(root, MINIMAL_WORKSPACE)
    (root / "BUILD").write_text(BUILD.format(secret=HF))
    _allow(root / "allow.json")
    ws = Workspace(root, tmp_path / "output-base", tmp_path / "repository-cache", base_env())
    yield ws
    ws.shutdown()


@pytest.mark.bazel
def test_the_image_build_fails_on_a_secret_in_a_layer(workspace: Workspace) -> None:
    failed = workspace.bazel("build", "//:image")
    assert failed.returncode == 1, failed.output
    assert "Scanning image layer //:layer_conf for secrets failed" in failed.output
    assert (
        "//:layer_conf:etc/app.conf:1:betterleaks.huggingface-access-token: hf_q***(37 chars)"
        in failed.output
    )
    assert HF not in failed.output
    _allow(workspace.root / "allow.json", ("etc/app.conf", "betterleaks.huggingface-access-token"))
    passed = workspace.bazel("build", "//:image")
    assert passed.returncode == 0, passed.output
    report = json.loads(workspace.bin_path("layer_conf.scan.json").read_text())
    assert report == {
        "allowed": 1,
        "files": 1,
        "findings": 0,
        "layer": "//:layer_conf",
        "scanner": {"name": "kingfisher", "rules": len(SCANNER.rules), "version": "2.14.0"},
    }
