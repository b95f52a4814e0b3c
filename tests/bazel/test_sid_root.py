"""The Debian sid root of .ci/setup-sid: Bazel 7.7.1 runs in it, binds show up at their own paths, and
nothing stays mounted afterwards."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.sid_root import SID_ROOT, available, run_in_sid


def require_sid_root() -> None:
    """Skip the calling test when the root is missing; in CI (``CI=true``) fail instead."""
    if available():
        return
    reason = f"Debian sid root {SID_ROOT}: expected a complete root, actual: missing (run .ci/setup-sid)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run .ci/setup first")
    pytest.skip(reason)


def _root_mounts() -> list[str]:
    with open("/proc/mounts") as mounts:
        return [line for line in mounts if str(SID_ROOT) in line]


def _processes_naming(path: Path) -> list[str]:
    """The pids of the host's processes whose command line names ``path``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(path).encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
    return found


def test_bazel_runs_in_the_sid_root_with_binds_at_their_own_paths(tmp_path: Path) -> None:
    require_sid_root()
    (tmp_path / "from-host").write_text("host\n")
    script = f"""
        set -euo pipefail
        cat {tmp_path}/from-host
        echo "$GREETING" >{tmp_path}/from-root
        bazel --version
        mkdir {tmp_path}/ws
        cd {tmp_path}/ws
        touch WORKSPACE
        bazel --output_user_root={tmp_path}/out info --noenable_bzlmod release
    """
    result = run_in_sid(script, [tmp_path], {"GREETING": "root"}, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    # `bazel --version` ends with a blank line. Debian's build gives the server no release label (`bazel
    # info release`: "development version"); the client's 7.7.1 is the version.
    lines = [line for line in result.stdout.splitlines() if line]
    assert lines == ["host", "bazel 7.7.1", "development version"], result.stdout
    assert (tmp_path / "from-root").read_text() == "root\n"
    # Bazel's server did run in the namespace (its output base is there) ...
    assert list((tmp_path / "out").glob("*/server")), sorted(p.name for p in (tmp_path / "out").iterdir())
    # ... and died with it; no mount of the root remains either.
    assert _processes_naming(tmp_path / "out") == []
    assert _root_mounts() == []
