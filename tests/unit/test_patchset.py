"""The strict patch parser and applier: exact application, and a precise error for every refusal."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sparkseal.core.patchset import PatchError, apply_patch, parse_patch, read_series
from tests.fixtures_vllm import git_diff, make_patch, write_tree

A_PY = "".join(f"a{i} = {i}\n" for i in range(1, 21))
B_PY = "def g():\n    return 'b'\n"
TREE = {"vllm/a.py": A_PY.encode(), "vllm/b.py": B_PY.encode(), "vllm/data.txt": b"keep\n"}


def _tree(tmp_path: Path, files: dict[str, bytes] | None = None) -> Path:
    return write_tree(tmp_path / "tree", TREE if files is None else files)


def _patch(tmp_path: Path, diff: str | bytes, name: str = "0001-test.patch", **header: str) -> Path:
    return make_patch(tmp_path / name, diff, **header)


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Every entry under ``root``: kind, content (or link target) and mode."""
    found: dict[str, tuple[str, bytes | str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode & 0o7777
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path), mode)
            elif path.is_dir():
                found[rel] = ("dir", b"", mode)
            else:
                found[rel] = ("file", path.read_bytes(), mode)
    return found


def _raises(tree: Path, patch: Path, *fragments: str) -> str:
    """Apply ``patch`` expecting failure; check the tree is untouched and the message has each fragment."""
    before = _snapshot(tree)
    with pytest.raises(PatchError) as info:
        apply_patch(tree, patch)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert _snapshot(tree) == before
    return message


def _edit(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = new
    return "".join(lines)


# --- good patches -----------------------------------------------------------------------------------


def test_multi_hunk_multi_file_patch_gives_exact_bytes(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    new_a = _edit(_edit(A_PY, 2, "a2 = 'two'\n"), 18, "a18 = 'eighteen'\nextra = 1\n")
    new_b = "def g():\n    return 'patched'\n"
    diff = git_diff("vllm/a.py", A_PY, new_a) + git_diff("vllm/b.py", B_PY, new_b)
    assert len(re.findall(r"^@@ ", diff, flags=re.M)) == 3
    patch = _patch(tmp_path, diff)

    changed = apply_patch(tree, patch)

    assert changed == ["vllm/a.py", "vllm/b.py"]
    assert (tree / "vllm/a.py").read_bytes() == new_a.encode()
    assert (tree / "vllm/b.py").read_bytes() == new_b.encode()
    assert (tree / "vllm/data.txt").read_bytes() == b"keep\n"


def test_parse_patch_reads_headers_with_continuation_lines(tmp_path: Path) -> None:
    patch = _patch(
        tmp_path,
        git_diff("vllm/b.py", B_PY, B_PY.replace("'b'", "'c'")),
        reason="first line\n  continued here",
    )
    parsed = parse_patch(patch)
    assert parsed.headers == {
        "Subject": "Fix a thing",
        "Upstream": "vllm-project/vllm#1 (0000000)",
        "Reason": "first line continued here",
    }
    assert parsed.targets == ["vllm/b.py"]
    assert [h.header for h in parsed.files[0].hunks] == ["@@ -1,2 +1,2 @@"]


def test_new_file_is_created_with_parent_directories(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    patch = _patch(tmp_path, git_diff("vllm/sub/pkg/new.py", None, "X = 1\nY = 2\n"))
    assert apply_patch(tree, patch) == ["vllm/sub/pkg/new.py"]
    assert (tree / "vllm/sub/pkg/new.py").read_bytes() == b"X = 1\nY = 2\n"


def test_deletion_removes_the_file(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    patch = _patch(tmp_path, git_diff("vllm/b.py", B_PY, None))
    assert apply_patch(tree, patch) == ["vllm/b.py"]
    assert not (tree / "vllm/b.py").exists()
    assert (tree / "vllm/a.py").read_bytes() == A_PY.encode()


def test_deletion_that_leaves_lines_behind_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    diff = "--- a/vllm/a.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a1 = 1\n-a2 = 2\n"
    _raises(tree, _patch(tmp_path, diff), "vllm/a.py: deletion leaves 18 lines behind")


def test_pure_insertion_hunk(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -5,0 +6,2 @@\n+i1 = 1\n+i2 = 2\n"
    apply_patch(tree, _patch(tmp_path, diff))
    lines = A_PY.splitlines(keepends=True)
    assert (tree / "vllm/a.py").read_text() == "".join([*lines[:5], "i1 = 1\n", "i2 = 2\n", *lines[5:]])


def test_change_at_end_of_file_without_newline(tmp_path: Path) -> None:
    """A file whose last line has no newline, changed there: both sides carry the marker."""
    tree = _tree(tmp_path, {"vllm/c.py": b"x = 1\ny = 1"})
    diff = (
        "--- a/vllm/c.py\n+++ b/vllm/c.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 1\n"
        "\\ No newline at end of file\n+y = 2\n\\ No newline at end of file\n"
    )
    apply_patch(tree, _patch(tmp_path, diff))
    assert (tree / "vllm/c.py").read_bytes() == b"x = 1\ny = 2"


def test_adding_lines_after_a_context_line_without_newline(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"vllm/c.py": b"x = 1\ny = 1"})
    diff = (
        "--- a/vllm/c.py\n+++ b/vllm/c.py\n@@ -1,2 +1,3 @@\n x = 1\n-y = 1\n"
        "\\ No newline at end of file\n+y = 1\n+z = 1\n"
    )
    apply_patch(tree, _patch(tmp_path, diff))
    assert (tree / "vllm/c.py").read_bytes() == b"x = 1\ny = 1\nz = 1\n"


# --- headers and structure ----------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["subject", "upstream", "reason"])
def test_missing_header_key(tmp_path: Path, missing: str) -> None:
    patch = _patch(tmp_path, git_diff("vllm/b.py", B_PY, B_PY + "# x\n"), **{missing: ""})
    message = _raises(_tree(tmp_path), patch, f"{patch}: header is missing {missing.capitalize()}")
    assert "'Subject:', 'Upstream:' and 'Reason:'" in message


def test_missing_all_header_keys_names_each(tmp_path: Path) -> None:
    patch = tmp_path / "0001-bare.patch"
    patch.write_text(git_diff("vllm/b.py", B_PY, B_PY + "# x\n"))
    _raises(_tree(tmp_path), patch, f"{patch}: header is missing Subject, Upstream, Reason")


def test_patch_without_file_diffs(tmp_path: Path) -> None:
    patch = _patch(tmp_path, "just words\n")
    _raises(_tree(tmp_path), patch, f"{patch}: contains no file diffs")


def test_file_section_without_hunks(tmp_path: Path) -> None:
    patch = _patch(tmp_path, "--- a/vllm/a.py\n+++ b/vllm/a.py\n")
    _raises(_tree(tmp_path), patch, f"{patch}: file section for vllm/a.py has no hunks")


def test_same_file_in_two_sections(tmp_path: Path) -> None:
    diff = git_diff("vllm/a.py", A_PY, _edit(A_PY, 2, "a2 = 0\n")) + git_diff(
        "vllm/a.py", A_PY, _edit(A_PY, 15, "a15 = 0\n")
    )
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/a.py appears in more than one file section")


def test_minus_line_without_plus_line(tmp_path: Path) -> None:
    patch = _patch(tmp_path, "--- a/vllm/a.py\n@@ -1 +1 @@\n-a1 = 1\n+a1 = 2\n")
    _raises(_tree(tmp_path), patch, f"{patch}:5: '---' line not followed by a '+++' line")


def test_hunk_before_file_header(tmp_path: Path) -> None:
    patch = _patch(tmp_path, "diff --git a/vllm/a.py b/vllm/a.py\n@@ -1 +1 @@\n-a1 = 1\n+a1 = 2\n")
    _raises(_tree(tmp_path), patch, f"{patch}:6: hunk before any '---'/'+++' file header")


# --- exact application --------------------------------------------------------------------------------


def test_context_one_line_lower_fails_without_fuzz(tmp_path: Path) -> None:
    # The hunk says its context starts at line 2; in the file it starts at line 3.
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -2,3 +2,3 @@\n a3 = 3\n-a4 = 4\n+a4 = 40\n a5 = 5\n"
    patch = _patch(tmp_path, diff)
    _raises(
        _tree(tmp_path),
        patch,
        f"{patch}: hunk #1 (@@ -2,3 +2,3 @@) of vllm/a.py: does not apply at line 2: "
        "expected 'a3 = 3', found 'a2 = 2' (no fuzz or offset is allowed)",
    )


def test_context_mismatch_in_second_hunk_names_that_hunk(tmp_path: Path) -> None:
    diff = (
        "--- a/vllm/a.py\n+++ b/vllm/a.py\n"
        "@@ -1,2 +1,2 @@\n-a1 = 1\n+a1 = 10\n a2 = 2\n"
        "@@ -10,2 +10,2 @@\n a10 = 10\n-a11 = 999\n+a11 = 111\n"
    )
    patch = _patch(tmp_path, diff)
    _raises(
        _tree(tmp_path),
        patch,
        f"{patch}: hunk #2 (@@ -10,2 +10,2 @@) of vllm/a.py: does not apply at line 11: "
        "expected 'a11 = 999', found 'a11 = 11'",
    )


def test_wrong_line_numbers_fail_even_if_content_exists_elsewhere(tmp_path: Path) -> None:
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -12,3 +12,3 @@\n a3 = 3\n-a4 = 4\n+a4 = 40\n a5 = 5\n"
    patch = _patch(tmp_path, diff)
    _raises(
        _tree(tmp_path),
        patch,
        "hunk #1",
        "vllm/a.py",
        "does not apply at line 12: expected 'a3 = 3', found 'a12 = 12'",
    )


def test_hunk_past_end_of_file(tmp_path: Path) -> None:
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -20,2 +20,2 @@\n a20 = 20\n-a21 = 21\n+a21 = 0\n"
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, "does not apply at line 21: expected 'a21 = 21', found end of file")


def test_already_applied_patch_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    patch = _patch(tmp_path, git_diff("vllm/a.py", A_PY, _edit(A_PY, 7, "a7 = 'seven'\n")))
    apply_patch(tree, patch)
    _raises(tree, patch, f"{patch}: hunk #1 (@@ -4,7 +4,7 @@) of vllm/a.py: the change is already present")


def test_reversed_patch_is_refused(tmp_path: Path) -> None:
    patch = _patch(tmp_path, git_diff("vllm/a.py", _edit(A_PY, 7, "a7 = 'seven'\n"), A_PY))
    _raises(_tree(tmp_path), patch, "hunk #1", "of vllm/a.py", "(reversed or applied twice)")


def test_overlapping_hunks(tmp_path: Path) -> None:
    diff = (
        "--- a/vllm/a.py\n+++ b/vllm/a.py\n"
        "@@ -5,2 +5,2 @@\n-a5 = 5\n+a5 = 50\n a6 = 6\n"
        "@@ -6,1 +6,1 @@\n-a6 = 6\n+a6 = 60\n"
    )
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, f"{patch}: hunk #2 (@@ -6,1 +6,1 @@) of vllm/a.py: hunk overlaps")


def test_inconsistent_new_side_start(tmp_path: Path) -> None:
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -5,1 +9,1 @@\n-a5 = 5\n+a5 = 50\n"
    patch = _patch(tmp_path, diff)
    _raises(
        _tree(tmp_path),
        patch,
        "hunk #1 (@@ -5,1 +9,1 @@) of vllm/a.py: new-side start line 9 "
        "is inconsistent with the old side (expected 5)",
    )


def test_missing_target_file(tmp_path: Path) -> None:
    patch = _patch(tmp_path, git_diff("vllm/nothere.py", "x = 1\n", "x = 2\n"))
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/nothere.py: the file to patch does not exist in the tree")


def test_creating_a_file_that_exists(tmp_path: Path) -> None:
    patch = _patch(tmp_path, git_diff("vllm/b.py", None, "x = 1\n"))
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/b.py: the patch creates this file, but it already exists")


# --- malformed hunks ----------------------------------------------------------------------------------


def test_hunk_body_shorter_than_its_header(tmp_path: Path) -> None:
    diff = (
        "diff --git a/vllm/a.py b/vllm/a.py\n--- a/vllm/a.py\n+++ b/vllm/a.py\n"
        "@@ -1,3 +1,3 @@\n a1 = 1\n-a2 = 2\n+a2 = 20\n" + git_diff("vllm/b.py", B_PY, B_PY + "# x\n")
    )
    patch = _patch(tmp_path, diff)
    _raises(
        _tree(tmp_path),
        patch,
        f"{patch}: hunk #1 of vllm/a.py (@@ -1,3 +1,3 @@): malformed hunk: header promises 3 old / 3 new "
        "lines, body has 2 / 2",
    )


def test_hunk_body_longer_than_its_header(tmp_path: Path) -> None:
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,2 @@\n a1 = 1\n-a2 = 2\n+a2 = 20\n a3 = 3\n"
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, f"{patch}:11: unexpected line in diff: b' a3 = 3\\n'")


def test_malformed_hunk_header(tmp_path: Path) -> None:
    patch = _patch(tmp_path, "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -x,2 +1,2 @@\n a1 = 1\n")
    _raises(_tree(tmp_path), patch, f"{patch}: hunk #1 of vllm/a.py: malformed hunk header '@@ -x,2 +1,2 @@'")


# --- whitespace and compilation of added lines ------------------------------------------------------------


@pytest.mark.parametrize(
    ("added", "line", "problem"),
    [
        (b"+y = 1 \n", 2, b"trailing whitespace in added line 'y = 1 '"),
        (b"+y = 1\t\n", 2, b"trailing whitespace in added line 'y = 1\\t'"),
        (b"+ \t# note\n", 2, b"space before tab in indent in added line ' \\t# note'"),
        (b"+y = 1\r\n", 2, b"CRLF line ending in added line 'y = 1\\r'"),
    ],
)
def test_whitespace_error_in_added_line(tmp_path: Path, added: bytes, line: int, problem: bytes) -> None:
    diff = b"--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,3 @@\n a1 = 1\n" + added + b" a2 = 2\n"
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/a.py:{line}: " + problem.decode())


def test_new_blank_line_at_end_of_file(tmp_path: Path) -> None:
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -19,2 +19,3 @@\n a19 = 19\n a20 = 20\n+\n"
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/a.py:21: new blank line at EOF in added line ''")


def test_added_blank_line_inside_the_file_is_fine(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -19,2 +19,3 @@\n a19 = 19\n+\n a20 = 20\n"
    apply_patch(tree, _patch(tmp_path, diff))
    assert (tree / "vllm/a.py").read_text() == A_PY.replace("a20 = 20\n", "\na20 = 20\n")


def test_whitespace_in_context_and_removed_lines_is_not_an_error(tmp_path: Path) -> None:
    old = b"x = 1 \n \t# note\ny = 2\r\nw = 0 \nz = 3\n\n"
    tree = _tree(tmp_path, {"vllm/c.py": old})
    diff = (
        b"--- a/vllm/c.py\n+++ b/vllm/c.py\n@@ -1,6 +1,6 @@\n x = 1 \n  \t# note\n y = 2\r\n"
        b"-w = 0 \n+w = 0\n z = 3\n \n"
    )
    apply_patch(tree, _patch(tmp_path, diff))
    assert (tree / "vllm/c.py").read_bytes() == old.replace(b"w = 0 \n", b"w = 0\n")


def test_added_python_that_does_not_compile(tmp_path: Path) -> None:
    diff = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -5,2 +5,3 @@\n a5 = 5\n+def broken(:\n a6 = 6\n"
    patch = _patch(tmp_path, diff)
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/a.py:6: patched file does not compile: invalid syntax")


def test_new_python_file_that_does_not_compile(tmp_path: Path) -> None:
    patch = _patch(tmp_path, git_diff("vllm/new.py", None, "x = 1\nif x\n"))
    _raises(_tree(tmp_path), patch, f"{patch}: vllm/new.py:2: patched file does not compile")


def test_non_python_file_is_not_compiled(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    apply_patch(tree, _patch(tmp_path, git_diff("vllm/data.txt", "keep\n", "def broken(:\n")))
    assert (tree / "vllm/data.txt").read_bytes() == b"def broken(:\n"


# --- paths and scope --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "bad_line", "problem"),
    [
        ("/vllm/a.py", "/vllm/a.py", 5, "path '/vllm/a.py' lacks the 'a/' prefix (patches use -p1 paths)"),
        ("vllm/a.py", "vllm/a.py", 5, "path 'vllm/a.py' lacks the 'a/' prefix"),
        ("a/vllm/a.py", "vllm/a.py", 6, "path 'vllm/a.py' lacks the 'b/' prefix"),
        ("a//etc/x.py", "b//etc/x.py", 5, "absolute path '/etc/x.py' is not allowed"),
        ("a/vllm/../../x.py", "b/vllm/../../x.py", 5, "path 'vllm/../../x.py' escapes its root through '..'"),
        ("a/../vllm/a.py", "b/../vllm/a.py", 5, "path '../vllm/a.py' escapes its root through '..'"),
        (
            "a/docs/x.md",
            "b/docs/x.md",
            5,
            "docs/x.md is outside the vllm/ package; patches may only touch it",
        ),
        ("a/vllm", "b/vllm", 5, "vllm is outside the vllm/ package"),
    ],
)
def test_unsafe_or_out_of_scope_path(tmp_path: Path, old: str, new: str, bad_line: int, problem: str) -> None:
    patch = _patch(tmp_path, f"--- {old}\n+++ {new}\n@@ -1 +1 @@\n-a1 = 1\n+a1 = 2\n")
    _raises(_tree(tmp_path), patch, f"{patch}:{bad_line}: {problem}")


@pytest.mark.parametrize(
    "rel", ["csrc/x.cu", "CMakeLists.txt", "cmake/x.cmake", "vllm/foo.cu", "setup.py", "vllm/ops/k.cuh"]
)
def test_compiled_sources_are_refused(tmp_path: Path, rel: str) -> None:
    patch = _patch(tmp_path, git_diff(rel, "int x;\n", "int y;\n"))
    _raises(
        _tree(tmp_path),
        patch,
        f"{patch}:6: {rel} is a compiled source of vLLM; a source build of vLLM is not supported",
    )


def test_symlink_creation_is_refused(tmp_path: Path) -> None:
    diff = (
        "diff --git a/vllm/link.py b/vllm/link.py\nnew file mode 120000\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/vllm/link.py\n@@ -0,0 +1 @@\n+a.py\n\\ No newline at end of file\n"
    )
    patch = _patch(tmp_path, diff)
    _raises(
        _tree(tmp_path), patch, f"{patch}:6: the patch creates or deletes a symlink; symlinks are not allowed"
    )


@pytest.mark.parametrize(
    ("extra", "line", "what"),
    [
        ("similarity index 100%\nrename from vllm/a.py\nrename to vllm/z.py\n", 7, "renames"),
        ("similarity index 100%\ncopy from vllm/a.py\ncopy to vllm/z.py\n", 7, "copies"),
        ("old mode 100644\nnew mode 100755\n", 6, "mode changes"),
        ("index 1111111..2222222\nGIT binary patch\nliteral 3\nKcmZ?\n", 7, "binary patches"),
        ("index 1111111..2222222\nBinary files a/vllm/a.py and b/vllm/a.py differ\n", 7, "binary patches"),
    ],
)
def test_git_extended_headers_are_refused(tmp_path: Path, extra: str, line: int, what: str) -> None:
    patch = _patch(tmp_path, "diff --git a/vllm/a.py b/vllm/z.py\n" + extra)
    _raises(
        _tree(tmp_path), patch, f"{patch}:{line}: {what} are not supported; express the change as a text diff"
    )


def test_rename_through_differing_paths_is_refused(tmp_path: Path) -> None:
    patch = _patch(tmp_path, "--- a/vllm/a.py\n+++ b/vllm/z.py\n@@ -1 +1 @@\n-a1 = 1\n+a1 = 2\n")
    _raises(_tree(tmp_path), patch, f"{patch}:5: renames are not supported (vllm/a.py -> vllm/z.py)")


def test_target_through_a_symlinked_directory(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "vllm/linked").symlink_to(outside)
    patch = _patch(tmp_path, git_diff("vllm/linked/x.py", None, "x = 1\n"))
    _raises(
        tree,
        patch,
        f"{patch}: vllm/linked/x.py: vllm/linked/x.py passes through the symlink vllm/linked (-> {outside})",
    )
    assert list(outside.iterdir()) == []


def test_target_that_is_a_symlink(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "vllm/alias.py").symlink_to("b.py")
    patch = _patch(tmp_path, git_diff("vllm/alias.py", B_PY, B_PY + "# x\n"))
    _raises(tree, patch, "vllm/alias.py passes through the symlink vllm/alias.py (-> b.py)")
    assert (tree / "vllm/b.py").read_text() == B_PY


# --- atomicity -------------------------------------------------------------------------------------------


def test_failing_second_file_leaves_first_file_untouched(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    diff = (
        git_diff("vllm/new.py", None, "x = 1\n")
        + git_diff("vllm/b.py", B_PY, B_PY.replace("'b'", "'c'"))
        + git_diff("vllm/data.txt", "keep\n", None)
        + "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -3,1 +3,1 @@\n-a3 = 999\n+a3 = 33\n"
    )
    patch = _patch(tmp_path, diff)
    _raises(tree, patch, "does not apply at line 3: expected 'a3 = 999', found 'a3 = 3'")
    assert not (tree / "vllm/new.py").exists()


def test_compile_error_in_last_file_leaves_tree_untouched(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    diff = git_diff("vllm/b.py", B_PY, B_PY.replace("'b'", "'c'")) + git_diff(
        "vllm/zz.py", None, "def broken(:\n"
    )
    _raises(tree, _patch(tmp_path, diff), "vllm/zz.py:1: patched file does not compile")


# --- series ---------------------------------------------------------------------------------------------


def _series(tmp_path: Path, text: str, names: tuple[str, ...] = ("0001-a.patch", "0002-b.patch")) -> Path:
    for name in names:
        (tmp_path / name).write_text("x\n")
    series = tmp_path / "series"
    series.write_text(text)
    return series


def test_read_series_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    series = _series(
        tmp_path, "# header\n\n0002-b.patch   # second first\n   \n\t0001-a.patch\n#0003.patch\n"
    )
    assert read_series(series) == [tmp_path / "0002-b.patch", tmp_path / "0001-a.patch"]


def test_read_series_empty(tmp_path: Path) -> None:
    assert read_series(_series(tmp_path, "# nothing yet\n")) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "0001-a.patch\n0003-c.patch\n",
            "series:2: 0003-c.patch is listed but {dir}/0003-c.patch does not exist",
        ),
        ("0001-a.patch\n\n0001-a.patch\n", "series:3: 0001-a.patch is listed twice"),
        (
            "sub/0001-a.patch\n",
            "series:1: expected a '*.patch' file name beside the series, got 'sub/0001-a.patch'",
        ),
        ("0001-a.diff\n", "series:1: expected a '*.patch' file name beside the series, got '0001-a.diff'"),
        ("../0001-a.patch\n", "series:1: path '../0001-a.patch' escapes its root through '..'"),
        ("/tmp/0001-a.patch\n", "series:1: absolute path '/tmp/0001-a.patch' is not allowed"),
    ],
)
def test_read_series_errors(tmp_path: Path, text: str, problem: str) -> None:
    series = _series(tmp_path, text)
    with pytest.raises(PatchError) as info:
        read_series(series)
    assert str(info.value) == f"{tmp_path}/" + problem.format(dir=tmp_path)
