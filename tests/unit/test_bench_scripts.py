"""The bench scripts name test files that exist: a moved test must not turn a bench phase into a no-op.

``bench/live/h200.sh``'s agree phase ran ``tests/test_dspark_draft_gpu.py`` after it moved to
``tests/gpu/`` (issue 39), and ``|| true`` hid pytest's "file not found".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
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


def _summary(folder: Path) -> subprocess.CompletedProcess[str]:
    script = REPO / "bench/live/summary.py"
    return subprocess.run(
        [sys.executable, str(script), str(folder)], capture_output=True, text=True, check=False
    )


def test_the_live_summary_says_what_it_could_not_read(tmp_path: Path) -> None:
    missing = _summary(tmp_path / "nowhere")
    assert missing.returncode == 1 and missing.stdout == ""
    assert (
        missing.stderr
        == f"summary: {tmp_path / 'nowhere'}: expected a folder of live-check reports, found none\n"
    )
    empty = _summary(tmp_path)
    assert empty.returncode == 1
    assert empty.stderr == f"summary: {tmp_path}: expected live-check reports (*.json), found none\n"
    (tmp_path / "plain-c1.json").write_text('{"ok": true, "findings": [], "steps": []}')
    (tmp_path / "ours-c1.json").write_text("{truncated")
    partial = _summary(tmp_path)
    assert partial.returncode == 1
    assert "| ours-c1 | unreadable: '{truncated' |" in partial.stdout
    assert "| plain-c1 |" in partial.stdout
    assert (
        partial.stderr == f"summary: {tmp_path}: unreadable reports, left out of the figures: ours-c1.json\n"
    )


def test_the_live_summary_names_per_request_lists_without_a_draft_step(tmp_path: Path) -> None:
    for name, per_request in (("ours-requests", [[4, 2]]), ("upstream-requests", [None, [0, 0]])):
        step = {"name": "speculation", "figures": {}, "details": {"per_request": per_request}}
        (tmp_path / f"{name}.json").write_text(json.dumps({"ok": True, "findings": [], "steps": [step]}))
    done = _summary(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "per-request acceptance: upstream-requests has no request that made a draft step" in done.stdout
