"""bench/live/summary.py: the table of a folder of live-check reports, and what it could not read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def test_the_live_summary_tabulates_each_checks_acceptance_curve(tmp_path: Path) -> None:
    for name, curve in (
        ("ours-c1", [0.9, 0.71, 0.5, 0.333, 0.2]),
        ("ours-c8", [0.8, 0.6]),
        ("plain-c1", None),
    ):
        figures = {"accepted_per_position": curve} if curve else {}
        step = {"name": "speculation", "figures": figures, "details": {}}
        (tmp_path / f"{name}.json").write_text(json.dumps({"ok": True, "findings": [], "steps": [step]}))
    done = _summary(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "| check | position 0 | position 1 | position 2 | position 3 | position 4 |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        "| ours-c1 | 0.900 | 0.710 | 0.500 | 0.333 | 0.200 |\n"
        "| ours-c8 | 0.800 | 0.600 | — | — | — |\n"
    ) in done.stdout
    (tmp_path / "ours-c1.json").unlink()
    (tmp_path / "ours-c8.json").unlink()
    assert "per-position acceptance: no check reports accepted_per_position" in _summary(tmp_path).stdout
