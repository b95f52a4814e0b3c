"""The bench scripts cannot pass over a failed step: they name test files that exist, and hide no failure.

``bench/live/h200.sh``'s agree phase ran ``tests/test_dspark_draft_gpu.py`` after it moved to
``tests/gpu/`` (issue 39), and ``|| true`` hid pytest's "file not found". A ``|| true`` is kept only with a
comment on its line or the line above saying why its failure does not matter.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A test module as a script names it: tests/.../test_*.py (a pytest node id's "::" part is not a path).
_TEST_PATH = re.compile(r"(?<![\w/.-])tests/[\w/.-]*test_\w+\.py")


def _named(text: str) -> set[str]:
    return set(_TEST_PATH.findall(text))


def test_the_pattern_finds_a_moved_test() -> None:
    assert _named('pytest -m gpu tests/test_dspark_draft_gpu.py -q "$x" tests/gpu/test_a.py::t') == {
        "tests/test_dspark_draft_gpu.py",
        "tests/gpu/test_a.py",
    }


def _scripts() -> list[Path]:
    """The bench scripts (shell and Python; not bench/results/, whose records name paths of their day)."""
    scripts = sorted(
        path
        for pattern in ("bench/**/*.sh", "bench/**/*.py")
        for path in REPO.glob(pattern)
        if "results" not in path.relative_to(REPO).parts
    )
    assert any(p.suffix == ".sh" for p in scripts), f"{REPO}/bench: expected shell scripts, found none"
    return scripts


def _missing_tests(root: Path, scripts: list[Path]) -> list[str]:
    return [
        f"{script.relative_to(root)}: {name}"
        for script in scripts
        for name in sorted(_named(script.read_text()))
        if not (root / name).is_file()
    ]


def test_every_test_file_a_bench_script_names_exists() -> None:
    missing = _missing_tests(REPO, _scripts())
    assert missing == [], f"bench scripts name test files that do not exist: {missing}"


def test_a_script_naming_a_moved_test_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tests/gpu").mkdir(parents=True)
    (tmp_path / "tests/gpu/test_dspark_draft_gpu.py").write_text("")
    script = tmp_path / "bench/live/h200.sh"
    script.parent.mkdir(parents=True)
    script.write_text("pytest tests/gpu/test_dspark_draft_gpu.py\npytest tests/test_dspark_draft_gpu.py\n")
    assert _missing_tests(tmp_path, [script]) == ["bench/live/h200.sh: tests/test_dspark_draft_gpu.py"]


_OR_TRUE = re.compile(r"\|\|\s*(?:true|:)(?![\w-])")


def _uncommented_or_true(text: str) -> list[int]:
    """Lines (from 1) holding ``|| true`` (or ``|| :``) with no comment on that line or the one above."""
    lines = text.splitlines()
    return [
        number
        for number, line in enumerate(lines, 1)
        if _OR_TRUE.search(line)
        and "#" not in line
        and not (number > 1 and lines[number - 2].lstrip().startswith("#"))
    ]


def test_the_or_true_pattern_finds_an_uncommented_one() -> None:
    text = (
        'serve "$@" || true\n'  # 1: hides a failed server
        "cleanup || true  # the directory may be gone already\n"  # 2: commented on its line
        "# a second stop finds no process: not a failure\n"
        "stop || true\n"  # 4: commented on the line above
        "grep x f || :\n"  # 5: the same, spelt with ':'
        "grep x f || truef\n"  # 6: another command
    )
    assert _uncommented_or_true(text) == [1, 5]


def test_no_bench_script_hides_a_failure_without_saying_why() -> None:
    hidden = [
        f"{script.relative_to(REPO)}:{number}"
        for script in _scripts()
        for number in _uncommented_or_true(script.read_text())
    ]
    assert hidden == [], f"|| true with no comment saying why its failure does not matter: {hidden}"
