"""bench/live/profile_step.py without a GPU: what it refuses before starting an engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "live" / "profile_step.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


def test_a_folder_without_held_out_prompts_is_refused_naming_the_file(tmp_path: Path) -> None:
    done = run("--model-dir", str(tmp_path), "--mode", "plain", "--out", str(tmp_path / "out.json"))
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"profile_step: {tmp_path / 'prompts.json'}: expected train_dspark.py's held-out prompts"
    )
    assert not (tmp_path / "out.json").exists()


def test_an_empty_prompt_list_is_refused(tmp_path: Path) -> None:
    (tmp_path / "prompts.json").write_text(json.dumps({"format": "sparkseal-prompts/1", "prompts": []}))
    done = run("--model-dir", str(tmp_path), "--mode", "dspark", "--out", str(tmp_path / "out.json"))
    assert (done.returncode, done.stderr) == (2, f"profile_step: {tmp_path / 'prompts.json'}: no prompts\n")
