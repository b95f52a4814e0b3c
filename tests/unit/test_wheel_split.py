"""One distribution as two layers: the upstream wheel's files below, ours that differ above."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from sparkseal.actions import module_manifest, oci_layer
from sparkseal.core import manifest
from sparkseal.core.wheel_split import (
    FORMAT,
    SplitError,
    differing_paths,
    load_split,
    split_document,
)
from tests.fixture_wheels import locked_installer_wheel, make_wheel

SITE = "opt/venv/lib/python3.11/site-packages"
DIST_INFO = "demo-1.0.dist-info"
UPSTREAM_FILES = {
    "demo/__init__.py": b"from demo.a import A\n",
    "demo/a.py": b"A = 1\n",
    "demo/b.py": b"B = 1\n",
    "demo/gone.py": b"GONE = 1\n",
    "demo/_ext.so": b"\x7fELF upstream extension",
    "demo/data.json": b'{"x": 1}\n',
}
# Ours: b.py changed, gone.py deleted, new.py added; everything else as upstream.
OUR_FILES = {k: v for k, v in UPSTREAM_FILES.items() if k != "demo/gone.py"} | {
    "demo/b.py": b"B = 2\n",
    "demo/new.py": b"NEW = 1\n",
}


@pytest.fixture(scope="module")
def installer_wheel() -> Path:
    return locked_installer_wheel()


class Wheels:
    """The upstream wheel, ours (same file name, other directory) and the split file between them."""

    def __init__(self, root: Path) -> None:
        scripts = {"demo": "demo:main"}
        self.upstream = make_wheel(
            _mkdir(root / "upstream"), "demo", "1.0", files=UPSTREAM_FILES, console_scripts=scripts
        )
        self.ours = make_wheel(_mkdir(root / "ours"), "demo", "1.0", files=OUR_FILES, console_scripts=scripts)
        paths = differing_paths(UPSTREAM_FILES, OUR_FILES, DIST_INFO)
        sha = hashlib.sha256(self.upstream.read_bytes()).hexdigest()
        self.split = root / "split.json"
        self.split.write_text(split_document("demo", DIST_INFO, self.upstream.name, sha, paths))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _layer(out: Path, wheel: Path, installer: Path, *extra: str) -> int:
    out.mkdir(parents=True)
    return oci_layer.main(
        [
            "--wheel",
            str(wheel),
            "--platform",
            "linux_aarch64",
            "--installer",
            str(installer),
            "--modules",
            str(out / "l.modules.json"),
            "--no-pyvenv-cfg",
            "--bytecode",
            *extra,
            "--blob",
            str(out / "l.tar.gz"),
            "--descriptor",
            str(out / "l.json"),
        ]
    )


def _files(blob: Path) -> dict[str, tuple[int, bytes]]:
    """Image path -> (mode, content) of the regular files and symlinks of a layer."""
    with tarfile.open(blob, "r:gz") as archive:
        return {
            m.name: (m.mode, archive.extractfile(m).read() if m.isfile() else m.linkname.encode())  # type: ignore[union-attr]
            for m in archive.getmembers()
            if not m.isdir()
        }


def test_differing_paths_are_the_changed_added_and_deleted_members_outside_the_dist_info() -> None:
    upstream = {**UPSTREAM_FILES, f"{DIST_INFO}/RECORD": b"a"}
    ours = {**OUR_FILES, f"{DIST_INFO}/RECORD": b"b", f"{DIST_INFO}/sparkseal.json": b"{}"}
    assert differing_paths(upstream, ours, DIST_INFO) == ["demo/b.py", "demo/gone.py", "demo/new.py"]
    assert differing_paths(upstream, upstream, DIST_INFO) == []


def test_two_layers_stacked_hold_our_wheel_installed_as_one(tmp_path: Path, installer_wheel: Path) -> None:
    wheels = Wheels(tmp_path / "in")
    lower, upper, whole = tmp_path / "lower", tmp_path / "upper", tmp_path / "whole"
    split = ["--split", str(wheels.split)]
    assert _layer(lower, wheels.upstream, installer_wheel, *split, "--split-part", "lower") == 0
    assert _layer(upper, wheels.ours, installer_wheel, *split, "--split-part", "upper") == 0
    assert _layer(whole, wheels.ours, installer_wheel) == 0

    below, above, one = (_files(d / "l.tar.gz") for d in (lower, upper, whole))
    # Disjoint, and together exactly the single layer's files, byte for byte and mode for mode.
    assert not set(below) & set(above)
    assert below | above == one
    pyc = "__pycache__/{}.cpython-311.pyc"
    assert sorted(p.removeprefix(SITE + "/") for p in above) == sorted(
        [
            "demo/b.py",
            "demo/" + pyc.format("b"),
            "demo/new.py",
            "demo/" + pyc.format("new"),
            *(
                f"{DIST_INFO}/{name}"
                for name in ("INSTALLER", "METADATA", "RECORD", "WHEEL", "entry_points.txt")
            ),
        ]
    )
    # The lower layer has the upstream wheel's unchanged files and scripts, not the deleted module.
    assert f"{SITE}/demo/_ext.so" in below and "opt/venv/bin/demo" in below
    assert not [p for p in below if "gone" in p or DIST_INFO in p]
    # Our RECORD (above) names the files and bytecode of both layers, with our hashes.
    record = above[f"{SITE}/{DIST_INFO}/RECORD"][1].decode()
    assert "demo/__pycache__/a.cpython-311.pyc,sha256=" in record and "demo/gone.py" not in record

    # The two layers' module manifests merge into the manifest of our wheel installed as one.
    merged = tmp_path / "merged.json"
    parts = ["--part", str(lower / "l.modules.json"), "--part", str(upper / "l.modules.json")]
    assert module_manifest.main([*parts, "--out", str(merged)]) == 0
    assert merged.read_bytes() == (whole / "l.modules.json").read_bytes()
    lower_manifest = manifest.load_manifest(lower / "l.modules.json")["distributions"]["demo"]
    assert "demo/b.py" not in lower_manifest["files"] and "demo/a.py" in lower_manifest["files"]


def test_the_lower_layer_must_install_the_upstream_wheel_of_the_split(
    tmp_path: Path, installer_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = Wheels(tmp_path / "in")
    split = ["--split", str(wheels.split), "--split-part", "lower"]
    # Our wheel has the upstream wheel's file name, but not its bytes.
    out = tmp_path / "ours-as-lower"
    assert _layer(out, wheels.ours, installer_wheel, *split) == 1
    upstream_sha = hashlib.sha256(wheels.upstream.read_bytes()).hexdigest()
    ours_sha = hashlib.sha256(wheels.ours.read_bytes()).hexdigest()
    assert (
        f"sparkseal: --split-part lower: {wheels.ours}: expected sha256 {upstream_sha} (the wheel the split "
        f"was computed against), found {ours_sha}"
    ) in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == []

    other = make_wheel(
        _mkdir(tmp_path / "other"), "demo", "1.0", tag="py3-none-linux_aarch64", files=OUR_FILES
    )
    assert _layer(tmp_path / "other-as-lower", other, installer_wheel, *split) == 1
    assert (
        f"sparkseal: --split-part lower: expected the upstream wheel {wheels.upstream.name} among the "
        f"layer's wheels, found {other.name}"
    ) in capsys.readouterr().err

    alien = make_wheel(_mkdir(tmp_path / "alien"), "alien", "1.0", files={"alien/__init__.py": b""})
    assert (
        _layer(tmp_path / "alien-as-upper", alien, installer_wheel, *split[:2], "--split-part", "upper") == 1
    )
    assert (
        f"sparkseal: --split: expected the layer's wheels ({alien.name}) to install {DIST_INFO}, found no "
        f"such directory in lib/python3.11/site-packages"
    ) in capsys.readouterr().err


def test_a_split_part_is_lower_or_upper(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The program parses the part; which flags go together python_venv checks (tests/image/test_oci.py)."""
    blob = ["--blob", str(tmp_path / "l.tar.gz"), "--descriptor", str(tmp_path / "l.json")]
    with pytest.raises(SystemExit) as exit_info:
        oci_layer.main(["--split", "s.json", "--split-part", "middle", *blob])
    assert exit_info.value.code == 2
    assert "argument --split-part: invalid choice: 'middle'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other/1"}, "expected format 'sparkseal-wheel-split/1', found 'other/1'"),
        ({"project": ""}, "expected a non-empty string in project, found ''"),
        (
            {"upstream_wheel": {"file": "x.whl"}},
            "expected a non-empty string in upstream_wheel.sha256, found None",
        ),
        (
            {"dist_info": "demo-1.0"},
            "dist_info: expected a NAME-VERSION.dist-info directory, found 'demo-1.0'",
        ),
        ({"paths": "demo/b.py"}, "paths: expected a list of wheel member paths, found 'demo/b.py'"),
        ({"paths": ["../etc/passwd"]}, "path '../etc/passwd' escapes its root through '..'"),
        ({"paths": ["demo/./b.py"]}, "expected normalised member paths, found 'demo/./b.py' ('demo/b.py')"),
        (
            {"paths": ["demo-1.0.data/scripts/x"]},
            "'demo-1.0.data/scripts/x' lies in a .data directory; a split holds site-packages modules only",
        ),
    ],
)
def test_a_bad_split_file_is_named_with_what_was_expected(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    document = json.loads(
        split_document("demo", DIST_INFO, "demo-1.0-py3-none-any.whl", "0" * 64, ["demo/b.py"])
    )
    assert document["format"] == FORMAT
    path = tmp_path / "split.json"
    path.write_text(json.dumps({**document, **change}))
    with pytest.raises(SplitError) as error:
        load_split(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)


def test_a_bad_split_file_fails_the_layer_and_leaves_nothing(
    tmp_path: Path, installer_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = Wheels(tmp_path / "in")
    wheels.split.write_text("{not json")
    out = tmp_path / "layer"
    assert (
        _layer(out, wheels.ours, installer_wheel, "--split", str(wheels.split), "--split-part", "upper") == 1
    )
    assert f"sparkseal: {wheels.split}: not a readable JSON split file" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == []
