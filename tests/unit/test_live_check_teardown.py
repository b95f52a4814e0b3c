"""The live check's teardown: SIGTERM to the server's pid, its exit, then idle GPUs (nvidia-smi)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers.fake_openai import Behaviour, FakeServer
from tests.unit.live_check_helpers import TEARDOWN, check, kinds, nvidia_smi


@pytest.fixture
def server_process():
    """A stand-in for the server's process, which the teardown stops by its pid."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_teardown_stops_the_server_and_skips_the_gpu_without_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_process: subprocess.Popen
):
    monkeypatch.setenv("PATH", str(tmp_path))
    with FakeServer() as server:
        report = check(server, teardown_pid=server_process.pid, **TEARDOWN)
    assert report.ok, report.findings
    assert server_process.wait(timeout=5) == -15
    teardown = report.step("teardown").figures
    assert (
        teardown["pid"] == server_process.pid and teardown["signal"] == "SIGTERM" and teardown["exit_s"] >= 0
    )
    assert report.step("gpu-idle").skipped == (
        "no nvidia-smi on PATH: the GPUs' memory and utilisation cannot be read here"
    )


def test_gpus_back_to_idle_pass_and_busy_gpus_are_a_finding_naming_figure_and_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    smi = nvidia_smi(tmp_path / "idle", "0, 40000, 87\n1, 300, 0", "0, 12, 0\n1, [N/A], 0")
    monkeypatch.setenv("PATH", str(smi))
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with FakeServer() as server:
        idle = check(server, teardown_pid=process.pid, **TEARDOWN)
    process.wait()
    assert idle.ok, idle.findings
    figures = idle.step("gpu-idle").figures
    assert figures["gpus"] == [
        {"index": "0", "memory_used_mib": 12.0, "utilization_pct": 0.0},
        {"index": "1", "memory_used_mib": None, "utilization_pct": 0.0},
    ]
    assert figures["not_reported_by_gpus"] == ["1"] and figures["idle_after_s"] >= 0
    assert int((smi / "calls").read_text()) == 2  # polled until idle

    smi = nvidia_smi(tmp_path / "busy", "0, 2048, 35")
    monkeypatch.setenv("PATH", str(smi))
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with FakeServer() as server:
        busy = check(server, teardown_pid=process.pid, idle_utilization=5.0, **TEARDOWN)
    process.wait()
    assert kinds(busy) == {("gpu-idle", "busy")}
    assert busy.findings[0].message == (
        "gpu idle: 0.3 s after teardown (--idle-timeout): GPU 0 memory.used 2048 MiB > --idle-memory-mib "
        "512; GPU 0 utilization.gpu 35 % > --idle-utilization 5"
    )
    smi = nvidia_smi(tmp_path / "broken", "NVIDIA-SMI has failed", status=9)
    monkeypatch.setenv("PATH", str(smi))
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with FakeServer() as server:
        broken = check(server, teardown_pid=process.pid, **TEARDOWN)
    process.wait()
    assert kinds(broken) == {("gpu-idle", "nvidia-smi")}
    assert broken.findings[0].message == f"gpu idle: {smi / 'nvidia-smi'} exited 9: NVIDIA-SMI has failed"


def test_a_server_that_ignores_sigterm_is_a_finding_and_is_not_killed(tmp_path: Path):
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        with FakeServer() as server:
            report = check(server, teardown_pid=process.pid, **{**TEARDOWN, "teardown_timeout": 0.3})
        assert process.poll() is None  # still running: the finding is the operator's to act on
    finally:
        process.kill()
        process.wait()
    assert kinds(report) == {("teardown", "still-running")}
    assert report.findings[0].message == (
        f"teardown: pid {process.pid} still runs 0.3 s after SIGTERM (--teardown-timeout); it was not killed"
    )
    assert report.step("gpu-idle").skipped == "the server did not stop"


def test_a_server_that_exited_during_the_check_is_a_teardown_finding():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    try:
        with FakeServer(Behaviour(hang_first=1.0)) as server:
            report = check(server, teardown_pid=process.pid, **TEARDOWN)
    finally:
        process.wait()
    assert kinds(report) == {("teardown", "not-running")}
    assert report.findings[0].message == f"teardown: pid {process.pid} had already exited before the teardown"
