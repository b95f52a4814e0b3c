"""The bench scripts name test files that exist: a moved test must not turn a bench phase into a no-op.

``bench/live/h200.sh``'s agree phase ran ``tests/test_dspark_draft_gpu.py`` after it moved to
``tests/gpu/`` (issue 39), and ``|| true`` hid pytest's "file not found".
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


def test_every_test_file_a_bench_script_names_exists() -> None:
    scripts = sorted(REPO.glob("bench/**/*.sh"))
    assert scripts, f"{REPO}/bench: expected shell scripts, found none"
    missing = [
        f"{script.relative_to(REPO)}: {name}"
        for script in scripts
        for name in sorted(_named(script.read_text()))
        if not (REPO / name).is_file()
    ]
    assert missing == [], f"bench scripts name test files that do not exist: {missing}"
