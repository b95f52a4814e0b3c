"""The layer scan of the image build: the layer action scans its files before it writes them.

A finding fails the action (and so the image) and leaves no output. Secrets here are assembled at run
time so that this file itself stays clean.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.actions import oci_layer
from sparkseal.scan import scanner as scan
from sparkseal.scan.catalogue import Catalogue
from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, Workspace, base_env, make_fixture_workspace
from tests.fixture_wheels import locked_installer_wheel, make_wheel
from tests.unit.test_scan import HF, HOME

SCANNER = Catalogue.find()
SCANNER_NOTE = {"name": "kingfisher", "rules": len(SCANNER.rules), "version": "2.14.0"}
SITE = "opt/venv/lib/python3.11/site-packages"


def _allow(path: Path, *entries: tuple[str, str]) -> Path:
    allow = [{"path": p, "rule": r, "reason": "fixture upstream file"} for p, r in entries]
    path.write_text(json.dumps({"allow": allow}))
    return path


def _files(root: Path, files: dict[str, bytes]) -> list[str]:
    """Write ``files`` below ``root``; return ``--file SRC /DEST`` arguments placing each at its path."""
    args = []
    for rel, data in files.items():
        source = root / rel.replace("/", "_")
        root.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        args += ["--file", str(source), f"/{rel}"]
    return args


def _outputs(out: Path) -> list[str]:
    return ["--blob", str(out / "l.tar.gz"), "--descriptor", str(out / "l.json")]


def _scan_args(out: Path, label: str = "//:layer_app") -> list[str]:
    return ["--label", label, "--scanner", str(SCANNER.binary), "--scan-report", str(out / "l.scan.json")]


def test_a_clean_layer_is_written_with_its_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    inputs = _files(tmp_path / "in", {"etc/motd": b"hello\n", "opt/app/main.py": b"print(1)\n"})
    assert oci_layer.main([*inputs, *_outputs(out), *_scan_args(out)]) == 0
    assert json.loads((out / "l.scan.json").read_text()) == {
        "allowed": 0,
        "files": 2,
        "findings": 0,
        "layer": "//:layer_app",
        "scanner": SCANNER_NOTE,
    }
    assert sorted(p.name for p in out.iterdir()) == ["l.json", "l.scan.json", "l.tar.gz"]


def test_a_finding_fails_the_layer_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    inputs = _files(tmp_path / "in", {"etc/app.conf": f"key = {HF}\n".encode(), "etc/ok": b"x\n"})
    assert oci_layer.main([*inputs, *_outputs(out), *_scan_args(out)]) == 1
    err = capsys.readouterr().err
    assert (
        "sparkseal: layer //:layer_app: expected no secrets or private data, found 1 (allow-list: none; "
        "add an entry with a reason if a match is not a secret):\n"
        "  //:layer_app:etc/app.conf:1:betterleaks.huggingface-access-token: hf_q***(37 chars)"
    ) in err
    assert HF not in err
    assert list(out.iterdir()) == []


def test_the_allow_list_covers_upstream_files_by_image_path(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "lib/pkg").mkdir(parents=True)
    (tree / "lib/pkg/doc.py").write_text(f"cache = '{HOME}/data'\n")
    (tree / "lib/pkg/ok.py").write_text("x = 1\n")
    allow = _allow(tmp_path / "allow.json", ("opt/venv/lib/*/doc.py", "home-path"))
    out = tmp_path / "out"
    out.mkdir()
    args = ["--tree", str(tree), "/opt/venv", *_outputs(out), *_scan_args(out), "--scan-allow", str(allow)]
    assert oci_layer.main(args) == 0
    report = json.loads((out / "l.scan.json").read_text())
    assert (report["allowed"], report["files"]) == (1, 2)


@pytest.mark.network
def test_installed_wheels_are_scanned_in_place_by_image_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The installed files are read in the action's scratch directory; findings name their image paths."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    leaky = make_wheel(wheels, "leaky", "1.0", files={"leaky/__init__.py": f"TOKEN = '{HF}'\n".encode()})
    clean = make_wheel(wheels, "clean", "1.0", files={"clean/__init__.py": b"X = 1\n"})
    out = tmp_path / "out"
    out.mkdir()
    args = ["--wheel", str(leaky), "--wheel", str(clean), "--platform", "linux_x86_64"]
    args += ["--installer", str(locked_installer_wheel()), "--modules", str(out / "m.json")]
    assert oci_layer.main([*args, *_outputs(out), *_scan_args(out, "//:layer_deps")]) == 1
    err = capsys.readouterr().err
    where = (
        f"//:layer_deps:{SITE}/leaky/__init__.py:1:betterleaks.huggingface-access-token: hf_q***(37 chars)"
    )
    assert where in err
    assert "found 1 (" in err and HF not in err
    assert list(out.iterdir()) == []

    allow = _allow(tmp_path / "allow.json", (f"{SITE}/leaky/__init__.py", "betterleaks.*"))
    assert (
        oci_layer.main([*args, *_outputs(out), *_scan_args(out, "//:layer_deps"), "--scan-allow", str(allow)])
        == 0
    )
    report = json.loads((out / "l.scan.json").read_text())
    assert report["allowed"] == 1 and report["files"] > 4  # sources, dist-info files, RECORDs


def test_files_where_they_lie_give_the_findings_of_the_written_layer(tmp_path: Path) -> None:
    """Scanning the files where they lie, through links, or as the written tar: the same findings.

    The members lie below ``lib/python3.11/``, as a venv's packages do, where Kingfisher skips files it
    is shown by their own paths: its batches name each member by its file name alone.
    """
    files = {
        "etc/app.conf": f"key = {HF}\npassword = 'Tr0ub4dor&3x'\n".encode(),
        f"{SITE}/pkg/doc.py": f"cache = '{HOME}/data'\n".encode(),
        f"{SITE}/pkg/token.py": f"TOKEN = '{HF}'\n".encode(),
        f"{SITE}/pkg/ok.py": b"x = 1\n",
    }
    root = tmp_path / "root"
    linked = tmp_path / "linked"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        (linked / rel).parent.mkdir(parents=True, exist_ok=True)
        (linked / rel).symlink_to(root / rel)  # as the sandbox stages an input
    in_place = scan.scan_files([(root / rel, rel) for rel in files], SCANNER, "l", tmp_path)
    through_links = scan.scan_files([(linked / rel, rel) for rel in files], SCANNER, "l")
    out = tmp_path / "out"
    out.mkdir()
    args = [a for rel in files for a in ("--file", str(root / rel), f"/{rel}")]
    assert oci_layer.main([*args, *_outputs(out)]) == 0
    with open(out / "l.tar.gz", "rb") as blob:
        written = scan.scan_layer_stream(blob, "l", SCANNER)
    assert in_place == through_links == written
    assert in_place[0] == 4
    assert {(f.path, f.rule) for f in in_place[1]} == {
        ("etc/app.conf", "betterleaks.huggingface-access-token"),
        ("etc/app.conf", "password-assignment"),
        (f"{SITE}/pkg/doc.py", "home-path"),
        (f"{SITE}/pkg/token.py", "betterleaks.huggingface-access-token"),
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linked", "out", "root"]  # no batch left behind
    assert all((root / rel).read_bytes() == data for rel, data in files.items())


def test_members_of_one_file_name_are_each_found_by_their_path(tmp_path: Path) -> None:
    """A batch holds many files of one name (``__init__.py``): each finding keeps its own member's path."""
    names = [f"{SITE}/{pkg}/__init__.py" for pkg in ("a", "b", "c")]
    pairs = []
    for i, rel in enumerate(names):
        source = tmp_path / "root" / rel
        source.parent.mkdir(parents=True)
        source.write_text(f"TOKEN = '{HF}'\n" if i != 1 else "X = 1\n")
        pairs.append((source, rel))
    count, findings = scan.scan_files(pairs, SCANNER, "l", tmp_path)
    assert count == 3
    assert [(f.path, f.rule) for f in findings] == [
        (names[0], "betterleaks.huggingface-access-token"),
        (names[2], "betterleaks.huggingface-access-token"),
    ]


def test_bad_scan_arguments_and_allow_lists_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    inputs = _files(tmp_path / "in", {"etc/ok": b"x\n"})
    bad = tmp_path / "allow.json"
    bad.write_text(json.dumps({"allow": [{"path": "x", "rule": "home-path", "reason": ""}]}))
    assert oci_layer.main([*inputs, *_outputs(out), *_scan_args(out), "--scan-allow", str(bad)]) == 1
    assert (
        f"{bad}: allow[0]: expected a reason for allowing home-path in x, found none"
        in capsys.readouterr().err
    )
    assert list(out.iterdir()) == []


def test_the_image_scan_still_reads_a_written_layer(tmp_path: Path) -> None:
    """``sparkseal scan --image`` reads layer tars: the members are copied to scratch for the catalogue."""
    from tests.unit.test_scan import _layer

    count, findings = scan.scan_layer_stream(
        io.BytesIO(_layer({"etc/a.conf": f"k = {HF}\n".encode()})), "x", SCANNER
    )
    assert count == 1 and [f.rule for f in findings] == ["betterleaks.huggingface-access-token"]


def test_the_image_scan_reads_a_zstd_layer(tmp_path: Path) -> None:
    """A zstd layer (``--config=zstd``) is decompressed for the scan: tarfile reads gzip only."""
    zstandard = pytest.importorskip("zstandard")
    conf = tmp_path / "a.conf"
    conf.write_text(f"k = {HF}\n")
    blob = tmp_path / "l.tar.zst"
    oci_layer.write_layer(
        oci_layer.plan_layer(files=[(conf, "/etc/a.conf")]), None, blob, zstandard=zstandard
    )
    with blob.open("rb") as stream:
        count, findings = scan.scan_layer_stream(stream, "x", SCANNER)
    assert count == 1 and [(f.rule, f.path) for f in findings] == [
        ("betterleaks.huggingface-access-token", "etc/a.conf")
    ]


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
    assert "Writing and scanning image layer //:layer_conf failed" in failed.output
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
        "scanner": SCANNER_NOTE,
    }
