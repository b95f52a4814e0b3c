"""live-check --dspark-replay against the fake server's POST /collective_rpc (live_check/replay.py)."""

from __future__ import annotations

from sparkseal.core.dspark_replay import RPC_METHOD, Tally, report
from tests.servers.fake_openai import Behaviour, FakeServer
from tests.unit.live_check_helpers import check, kinds

LAYER = "model.layers.4.self_attn.attn"


def patched() -> dict:
    tally = Tally(steps=40, context_rows=300, rejected_rows=180, query_rows=240, padded_sample_rows=900)
    tally.capture_rows_written = []
    return report(tally, {LAYER: 0})


def unpatched() -> dict:
    answer = patched()
    answer.update(rejected_rows_written=180, warmup_null_block_query_rows=42, capture_rows_written=[0])
    answer["null_block_bytes"] = {LAYER: 512}
    return answer


def test_the_probe_is_read_only_when_asked() -> None:
    with FakeServer(Behaviour(rpc_results=[patched()])) as server:
        report_ = check(server)
        assert server.behaviour.rpc_calls == []
    assert report_.ok, report_.findings
    assert report_.step("dspark-replay").skipped == "not asked (--dspark-replay)"


def test_a_patched_engine_passes_with_its_counts() -> None:
    with FakeServer(Behaviour(rpc_results=[patched()])) as server:
        report_ = check(server, dspark_replay=True)
        assert server.behaviour.rpc_calls == [{"method": RPC_METHOD}]
    assert report_.ok, report_.findings
    step = report_.step("dspark-replay")
    assert step.figures == {
        "steps": 40,
        "rejected_rows": 180,
        "rejected_rows_written": 0,
        "null_block_query_rows": 0,
        "padded_sample_rows": 900,
    }
    assert step.details == {"ranks": [patched()]}


def test_an_unpatched_engine_fails_naming_each_write() -> None:
    with FakeServer(Behaviour(rpc_results=[patched(), unpatched()])) as server:
        report_ = check(server, dspark_replay=True)
    assert kinds(report_) == {("dspark-replay", "replay")}
    messages = [finding.message for finding in report_.findings]
    assert messages == [
        "dspark-replay: rank 1: draft K/V of rejected tokens: 180 of 180 rejected context rows were given a "
        "cache slot in 40 draft steps (expected none)",
        "dspark-replay: rank 1: draft K/V written into the null block 0: 0 context rows and 0 query rows of "
        "requests, 42 query rows of warm-up runs (expected none)",
        "dspark-replay: rank 1: the null block 0 of the draft's KV cache holds data (non-zero bytes): "
        f"{LAYER} 512",
        "dspark-replay: rank 1: padded sample rows acting as request slot 0: graph capture, where every "
        "sample row is padding, wrote that request's draft logits",
    ]
    assert report_.step("dspark-replay").figures["rank1_rejected_rows_written"] == 180


def test_a_server_without_the_dev_endpoint_is_told_how_to_start() -> None:
    with FakeServer(Behaviour(rpc_results=None)) as server:
        report_ = check(server, dspark_replay=True)
    (finding,) = report_.findings
    assert finding.kind == "http-error"
    assert finding.message.endswith(
        ": the server serves no /collective_rpc; start it with VLLM_SERVER_DEV_MODE=1"
    )


def test_a_worker_without_the_probe_is_told_how_to_start() -> None:
    error = f"Method {RPC_METHOD!r} is not implemented."
    with FakeServer(Behaviour(rpc_results=[error], rpc_status=500)) as server:
        report_ = check(server, dspark_replay=True)
    (finding,) = report_.findings
    assert "HTTP 500" in finding.message and "is not implemented" in finding.message
    assert finding.message.endswith(
        "the sparkseal probe is not installed; start the server with SPARKSEAL_DSPARK_REPLAY=1"
    )


def test_an_empty_answer_is_malformed() -> None:
    with FakeServer(Behaviour(rpc_results=[])) as server:
        report_ = check(server, dspark_replay=True)
    assert kinds(report_) == {("dspark-replay", "malformed")}
