"""The module manifest action: one tree, the trees of several layers, or a PEX, written as one manifest.

The manifest itself (content, digests, determinism, every error): test_manifest.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkseal.actions import module_manifest as mm_action
from sparkseal.core import manifest as mm
from tests.installed_tree import SITE, make_venv
from tests.unit.test_manifest import _WHEEL, _chroot_entries, _write_zip


def test_action_main_writes_the_manifest(tmp_path: Path) -> None:
    make_venv(tmp_path / "tree")
    out = tmp_path / "manifest.json"
    assert mm_action.main(["--tree", str(tmp_path / "tree"), "--prefix", "/opt/venv", "--out", str(out)]) == 0
    assert mm.load_manifest(out) == mm.tree_manifest(tmp_path / "tree", "/opt/venv")
    assert out.read_text() == mm.dumps(mm.load_manifest(out))


def _split_into_layers(tree: Path, layers: Path) -> list[Path]:
    """Move the vllm distribution's files of ``tree`` into a second tree, as a separate image layer."""
    first, second = layers / "deps", layers / "vllm"
    shutil.copytree(tree, first)
    site = first / "opt/venv" / SITE
    for path in sorted(site.rglob("*")):
        rel = path.relative_to(first)
        if path.is_file() and path.relative_to(site).parts[0].startswith("vllm"):
            (second / rel).parent.mkdir(parents=True, exist_ok=True)
            path.rename(second / rel)
    return [first, second]


def test_action_main_merges_the_trees_of_several_layers(tmp_path: Path) -> None:
    make_venv(tmp_path / "tree")
    layers = _split_into_layers(tmp_path / "tree", tmp_path / "layers")
    assert any((layers[1] / "opt/venv").rglob("*.py"))
    out = tmp_path / "manifest.json"
    args = [arg for tree in layers for arg in ("--tree", str(tree))]
    assert mm_action.main([*args, "--out", str(out)]) == 0
    assert mm.load_manifest(out) == mm.tree_manifest(tmp_path / "tree", "/opt/venv")


def test_a_file_in_two_layer_trees_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_venv(tmp_path / "a")
    make_venv(tmp_path / "b")
    out = tmp_path / "manifest.json"
    assert (
        mm_action.main(["--tree", str(tmp_path / "a"), "--tree", str(tmp_path / "b"), "--out", str(out)]) == 1
    )
    err = capsys.readouterr().err
    assert f"is in two layer trees: {tmp_path / 'a'} and {tmp_path / 'b'}" in err
    assert not out.exists()


def test_action_main_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "manifest.json"
    assert mm_action.main(["--tree", str(tmp_path), "--out", str(out)]) == 1
    assert f"module_manifest: {tmp_path}: expected the virtual environment of prefix /opt/venv" in (
        capsys.readouterr().err
    )
    assert not out.exists()
    with pytest.raises(SystemExit) as exit_info:
        mm_action.main(["--tree", str(tmp_path), "--prefix", "opt/venv", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "--prefix opt/venv: expected an absolute path" in capsys.readouterr().err


def test_pex_manifest_via_main(tmp_path: Path) -> None:
    site = make_venv(tmp_path / "tree")
    pex = tmp_path / "app.pex"
    _write_zip(pex, {f".deps/{_WHEEL}/{p}": d for p, d in _chroot_entries(site).items()})
    out = tmp_path / "pex.json"
    assert mm_action.main(["--pex", str(pex), "--out", str(out)]) == 0
    assert mm.load_manifest(out)["distributions"]["torch"]["version"] == "2.11.0"
