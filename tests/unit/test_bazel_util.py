"""tests/bazel_util.py's Workspace: the startup options each workspace's Bazel server gets."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests import bazel_util, conftest
from tests.bazel_util import Workspace, base_env

# Stands in for bazel: records its arguments, prints what `bazel info` would.
FAKE_BAZEL = """\
#!/usr/bin/env python3
import json, sys
with open({log!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
print("/fake/bazel-bin")
"""


@pytest.fixture
def bazel_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every command a Workspace runs goes to the fake bazel, which logs its arguments here."""
    log = tmp_path / "bazel.log"
    fake = tmp_path / "bazel"
    fake.write_text(FAKE_BAZEL.format(log=str(log)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(bazel_util, "BAZEL", str(fake))
    monkeypatch.setattr(bazel_util, "seed_repository_cache", lambda cache: None)
    return log


def _commands(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_scratch_workspace_server_goes_after_30_idle_seconds(bazel_log: Path, tmp_path: Path) -> None:
    scratch = Workspace(tmp_path, tmp_path / "ob", tmp_path / "cache", base_env())
    assert scratch.bazel("build", "//:x").returncode == 0
    assert _commands(bazel_log) == [
        [f"--output_base={tmp_path / 'ob'}", "--max_idle_secs=30", "build",
         f"--repository_cache={tmp_path / 'cache'}", "//:x"],
    ]  # fmt: skip


def test_the_real_workspace_server_is_kept_for_the_session(bazel_log: Path) -> None:
    """The real workspace's server outlives an hour of other tests: its analysis and output digests stay."""
    real = conftest._real_workspace()
    assert real.bin_path("third_party/vllm") == Path("/fake/bazel-bin/third_party/vllm")
    [command] = _commands(bazel_log)
    assert command[:3] == [f"--output_base={real.output_base}", "--max_idle_secs=3600", "info"]
