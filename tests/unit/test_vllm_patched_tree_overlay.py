"""The overlay step: manifest checks, and no silent replacement of upstream or patched files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkseal.actions import vllm_patched_tree_overlay as overlay_action
from sparkseal.actions.vllm_patched_tree_overlay import OverlayError, apply_overlay, load_manifest, patched_by
from tests.fixtures_vllm import git_diff, make_overlay, make_patch, write_tree

A_PY = b"A = 1\n"
B_PY = b"B = 1\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A patched tree: vllm/a.py from upstream, vllm/b.py as patch 0001 left it."""
    return write_tree(tmp_path / "tree", {"vllm/a.py": A_PY, "vllm/b.py": B_PY})


@pytest.fixture
def patches(tmp_path: Path) -> list[Path]:
    """The series that produced ``tree``: 0001 changes vllm/b.py, 0002 creates vllm/c.py."""
    directory = tmp_path / "patches"
    directory.mkdir()
    return [
        make_patch(directory / "0001-fix-b.patch", git_diff("vllm/b.py", "B = 0\n", B_PY.decode())),
        make_patch(directory / "0002-add-c.patch", git_diff("vllm/c.py", None, "C = 1\n")),
    ]


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o7777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fails(tree: Path, files: dict[str, Path], manifest: Path, patches: list[Path], expected: str) -> None:
    before = _snapshot(tree)
    with pytest.raises(OverlayError) as info:
        apply_overlay(tree, files, manifest, patches)
    assert str(info.value) == expected
    assert _snapshot(tree) == before


def _manifest(tmp_path: Path, body: object, raw: str | None = None) -> Path:
    path = tmp_path / "overlay.json"
    path.write_text(json.dumps(body) if raw is None else raw, encoding="utf-8")
    return path


def test_overlay_adds_files_with_normalised_modes(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(
        tmp_path / "ov", {"vllm/extra.py": b"E = 1\n", "vllm/sub/tool.sh": b"#!\n"}
    )
    files["vllm/extra.py"].chmod(0o600)
    files["vllm/sub/tool.sh"].chmod(0o700)

    assert apply_overlay(tree, files, manifest, patches) == ["vllm/extra.py", "vllm/sub/tool.sh"]

    assert _snapshot(tree) == {
        "vllm/a.py": (A_PY, 0o644),
        "vllm/b.py": (B_PY, 0o644),
        "vllm/extra.py": (b"E = 1\n", 0o644),
        "vllm/sub/tool.sh": (b"#!\n", 0o755),
    }


def test_file_not_listed_in_manifest(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/extra.py": b"E = 1\n"})
    stray = write_tree(tmp_path / "more", {"vllm/stray.py": b"S = 1\n"}) / "vllm/stray.py"
    files["vllm/stray.py"] = stray
    _fails(tree, files, manifest, patches, f"{manifest}: overlay file vllm/stray.py is not listed in 'files'")


def test_manifest_lists_a_missing_file(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/extra.py": b"E = 1\n", "vllm/ghost.py": b"G\n"})
    del files["vllm/ghost.py"]
    _fails(
        tree, files, manifest, patches, f"{manifest}: lists vllm/ghost.py, but no such overlay file exists"
    )


def test_replacing_an_upstream_file_needs_replaces(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/a.py": b"A = 2\n", "vllm/0new.py": b"N = 1\n"})
    _fails(
        tree,
        files,
        manifest,
        patches,
        f"overlay file vllm/a.py would replace the upstream file vllm/a.py; list it under 'replaces' in "
        f"{manifest} with a reason if that is intended",
    )


def test_replacing_a_patched_file_names_the_patch(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/b.py": b"B = 2\n"})
    _fails(
        tree,
        files,
        manifest,
        patches,
        f"overlay file vllm/b.py would replace a file that patch 0001-fix-b.patch modified; list it under "
        f"'replaces' in {manifest} with a reason if that is intended",
    )


def test_replaces_allows_replacement(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(
        tmp_path / "ov",
        {"vllm/a.py": b"A = 2\n", "vllm/b.py": b"B = 2\n"},
        replaces={"vllm/a.py": "ours is better", "vllm/b.py": "so is this"},
    )
    assert apply_overlay(tree, files, manifest, patches) == ["vllm/a.py", "vllm/b.py"]
    assert (tree / "vllm/a.py").read_bytes() == b"A = 2\n"
    assert (tree / "vllm/b.py").read_bytes() == b"B = 2\n"


def test_replaces_names_a_file_absent_from_the_tree(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(
        tmp_path / "ov", {"vllm/absent.py": b"X = 1\n"}, replaces={"vllm/absent.py": "upstream had it once"}
    )
    _fails(
        tree,
        files,
        manifest,
        patches,
        f"{manifest}: 'replaces' names vllm/absent.py, but the patched tree has no such file",
    )


def test_replaces_must_be_listed_under_files(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/x.py": b"X\n"}, replaces={"vllm/a.py": "why"})
    _fails(
        tree,
        files,
        manifest,
        patches,
        f"{manifest}: 'replaces' names vllm/a.py, which is not listed under 'files'",
    )


def test_patched_by_names_the_last_patch_of_a_file(tmp_path: Path, patches: list[Path]) -> None:
    later = make_patch(tmp_path / "0003-b-again.patch", git_diff("vllm/b.py", "B = 1\n", "B = 3\n"))
    assert patched_by([*patches, later]) == {
        "vllm/b.py": "0003-b-again.patch",
        "vllm/c.py": "0002-add-c.patch",
    }


def test_overlay_through_a_symlink_in_the_tree(tmp_path: Path, tree: Path, patches: list[Path]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "vllm/linked").symlink_to(outside)
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/linked/x.py": b"X\n"})
    _fails(
        tree,
        files,
        manifest,
        patches,
        f"overlay file vllm/linked/x.py: vllm/linked/x.py passes through the symlink vllm/linked "
        f"(-> {outside}); symlinks are not allowed in the tree",
    )
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("key", "rel", "problem"),
    [
        ("files", "../x.py", "files: path '../x.py' escapes its root through '..'"),
        ("files", "vllm/../../x.py", "files: path 'vllm/../../x.py' escapes its root through '..'"),
        ("files", "/etc/x.py", "files: absolute path '/etc/x.py' is not allowed"),
        ("replaces", "/etc/x.py", "replaces: absolute path '/etc/x.py' is not allowed"),
        ("replaces", "../x.py", "replaces: path '../x.py' escapes its root through '..'"),
    ],
)
def test_unsafe_manifest_paths(tmp_path: Path, key: str, rel: str, problem: str) -> None:
    body = {"files": {"vllm/x.py": "ok"}, "replaces": {}}
    body[key][rel] = "reason"
    manifest = _manifest(tmp_path, body)
    with pytest.raises(OverlayError) as info:
        load_manifest(manifest)
    assert str(info.value) == f"{manifest}: {problem}"


@pytest.mark.parametrize(
    ("body", "raw", "problem"),
    [
        (None, '{"files": {', "not a readable JSON manifest: "),
        (["vllm/x.py"], None, "expected an object with keys 'files' and 'replaces', got ['vllm/x.py']"),
        ({"files": {}, "extra": {}}, None, "expected an object with keys 'files' and 'replaces', got {"),
        ({"files": ["vllm/x.py"]}, None, "'files' must map each path to a non-empty reason"),
        ({"files": {"vllm/x.py": ""}}, None, "'files' must map each path to a non-empty reason"),
        (
            {"files": {"vllm/x.py": "r"}, "replaces": {"vllm/x.py": 3}},
            None,
            "'replaces' must map each path to a non-empty reason",
        ),
    ],
)
def test_malformed_manifest(tmp_path: Path, body: object, raw: str | None, problem: str) -> None:
    manifest = _manifest(tmp_path, body, raw)
    with pytest.raises(OverlayError) as info:
        load_manifest(manifest)
    assert str(info.value).startswith(f"{manifest}: {problem}")


def test_load_manifest_defaults_replaces(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, {"files": {"vllm/x.py": "why"}})
    assert load_manifest(manifest) == ({"vllm/x.py": "why"}, {})


def test_overlay_action(
    tmp_path: Path, tree: Path, patches: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, files = make_overlay(tmp_path / "ov", {"vllm/extra.py": b"E = 1\n"})
    out = tmp_path / "out"
    out.mkdir()
    args = ["--src", str(tree), "--manifest", str(manifest), "--out", str(out)]
    args += [f"--file=vllm/extra.py={files['vllm/extra.py']}"]
    args += [a for p in patches for a in ("--patch", str(p))]
    assert overlay_action.main(args) == 0
    assert sorted(_snapshot(out)) == ["vllm/a.py", "vllm/b.py", "vllm/extra.py"]
    assert not (tree / "vllm/extra.py").exists()

    (tmp_path / "out2").mkdir()
    bad = ["--src", str(tree), "--manifest", str(manifest), "--out", str(tmp_path / "out2")]
    assert overlay_action.main([*bad, f"--file=vllm/a.py={files['vllm/extra.py']}"]) == 1
    assert (
        capsys.readouterr().err == f"sparkseal: {manifest}: overlay file vllm/a.py is not listed in 'files'\n"
    )
