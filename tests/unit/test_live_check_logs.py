"""The live check's log steps: the server log, the plugin's cross-rank module check, the ranks' NCCL logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkseal.live_check.config import UsageError
from tests.servers.fake_openai import FakeServer
from tests.unit.live_check_helpers import check, kinds, tp2_logs


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("Traceback (most recent call last):", "traceback"),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "engine-dead"),
        ("TimeoutError: RPC call to sample_tokens timed out.", "rpc-timeout"),
        ("host:1:2 [0] NCCL INFO NCCL error: unhandled cuda error", "nccl-error"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "illegal-memory-access"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out-of-memory"),
    ],
)
def test_server_log_failures_are_findings(tmp_path: Path, line: str, kind: str):
    log = tmp_path / "server.log"
    log.write_text("INFO Started server process\nINFO Application startup complete.\n" + line + "\n")
    with FakeServer() as server:
        report = check(server, log=log)
    assert kinds(report) == {("server-log", kind)}
    assert report.findings[0].message.startswith(f"{log}:3: {kind} (1 line(s)):")


def test_clean_server_log_passes(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text("INFO Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)\nINFO GET /health 200\n")
    with FakeServer() as server:
        report = check(server, log=log)
    assert report.ok and report.step("server-log").figures == {"lines_matched": 0, "by_kind": {}}


def test_tensor_parallel_ranks_agree(tmp_path: Path):
    server_log, folder = tp2_logs(tmp_path, "equal")
    with FakeServer() as server:
        report = check(server, log=server_log, nccl_logs=folder)
    assert report.ok, report.findings
    assert report.step("module-check").figures == {"ranks": [0, 1], "world_size": [2], "digest": ["5f2a9c"]}
    assert report.step("nccl").figures == {
        "ranks": 2,
        "collectives_per_rank": [5, 5],
        "p2p_per_rank": [1, 1],
        "logs": ["nccl.vm.640.log", "nccl.vm.641.log"],
    }


def test_nccl_divergence_is_a_finding_naming_both_ranks(tmp_path: Path):
    server_log, folder = tp2_logs(tmp_path, "divergent")
    with FakeServer() as server:
        report = check(server, log=server_log, nccl_logs=folder)
    assert kinds(report) == {("nccl", "divergence")}
    message = report.findings[0].message
    assert message.startswith("nccl: the ranks diverge at collective #2 (differs in: op, count, datatype): ")
    assert (
        "rank 0: nccl.vm.640.log:4 Broadcast" in message
        and "rank 1: nccl.vm.641.log:4 ReduceScatter" in message
    )


def test_module_check_missing_or_incomplete_is_a_finding(tmp_path: Path):
    server_log, folder = tp2_logs(tmp_path, "equal", ranks_logged=())
    with FakeServer() as server:
        report = check(server, log=server_log, nccl_logs=folder)
    assert kinds(report) == {("module-check", "did-not-run")}
    assert "no line of the sparkseal plugin's cross-rank check" in report.findings[0].message

    other = tmp_path / "other"
    other.mkdir()
    server_log, folder = tp2_logs(other, "equal", ranks_logged=(0,))
    with FakeServer() as server:
        report = check(server, log=server_log, require_module_check=True)
    assert kinds(report) == {("module-check", "incomplete")}
    assert "missing ranks [1]" in report.findings[0].message
    with FakeServer() as server:  # one rank without --require-module-check: reported, not required
        single = check(server, log=server_log)
    assert ("module-check", "incomplete") in kinds(single)


def test_nccl_needs_a_log_per_rank(tmp_path: Path):
    server_log, folder = tp2_logs(tmp_path, "equal")
    (folder / "nccl.vm.641.log").unlink()
    with FakeServer() as server:
        report = check(server, log=server_log, nccl_logs=folder)
    assert kinds(report) == {("nccl", "ranks")}
    assert "found nccl.vm.640.log (rank 0)" in report.findings[0].message
    with FakeServer() as server, pytest.raises(UsageError, match="give --log FILE"):
        check(server, nccl_logs=folder)
    with FakeServer() as server, pytest.raises(UsageError, match="expected a folder of per-rank NCCL logs"):
        check(server, log=server_log, nccl_logs=tmp_path / "none")
