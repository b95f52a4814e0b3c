"""The patch action: copies the source tree, applies one patch with the strict applier, reports its refusal.

The applier itself, and every refusal it makes: test_patchset.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkseal.actions import vllm_patched_tree_patch as apply_patch_action
from tests.fixtures_vllm import git_diff, make_patch, write_tree
from tests.unit.test_patchset import B_PY, TREE


def test_apply_patch_action_copies_then_patches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tree(tmp_path / "tree", TREE)
    (src / "vllm/data.txt").chmod(0o700)
    out = tmp_path / "out"
    out.mkdir()
    patch = make_patch(tmp_path / "0001-test.patch", git_diff("vllm/b.py", B_PY, B_PY.replace("'b'", "'c'")))
    assert apply_patch_action.main(["--src", str(src), "--patch", str(patch), "--out", str(out)]) == 0
    assert (out / "vllm/b.py").read_text() == B_PY.replace("'b'", "'c'")
    assert (src / "vllm/b.py").read_text() == B_PY
    assert (out / "vllm/data.txt").stat().st_mode & 0o7777 == 0o755
    assert (out / "vllm/a.py").stat().st_mode & 0o7777 == 0o644


def test_apply_patch_action_reports_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tree(tmp_path / "tree", TREE)
    out = tmp_path / "out"
    out.mkdir()
    patch = make_patch(tmp_path / "0001-test.patch", git_diff("vllm/missing.py", "x = 1\n", "x = 2\n"))
    assert apply_patch_action.main(["--src", str(src), "--patch", str(patch), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sparkseal: ")
    assert f"{patch}: vllm/missing.py: the file to patch does not exist in the tree" in err
