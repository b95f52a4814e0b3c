"""`sparkseal live-check` against a fake vLLM server on loopback: a pass, each kind of finding, failures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkseal.runtime import live_check
from sparkseal.runtime.live_check import Options, Unreachable, UsageError, parse_metrics, run
from tests.servers.fake_openai import MODEL, Behaviour, FakeServer, answer, ranked, runner_up
from tests.servers.loopback import free_port

REPO = Path(__file__).resolve().parents[2]
SMALL = {"soak": 12, "max_tokens": 8, "prompt_tokens": 16, "long_prompt_tokens": 256, "timeout": 5.0}
# A nearly flat model: its five best tokens lie within 0.08 in log-probability.
FLAT = {"runner_up_gap": 0.02, "rank_step": 0.02}


def check(server: FakeServer, **overrides: object):
    options = Options(url=server.url, **{**SMALL, "first_timeout": 5.0, **overrides})
    return run(options)


def kinds(report) -> set[tuple[str, str]]:
    return {(finding.check, finding.kind) for finding in report.findings}


def test_healthy_server_passes_with_figures():
    with FakeServer() as server:
        report = check(server, concurrency=3)
    assert report.ok, report.findings
    assert report.model == MODEL
    soak = report.step("soak").figures
    assert soak["requests"] == 12 and soak["succeeded"] == 12 and soak["completion_tokens"] == 12 * 8
    assert soak["concurrency"] == 3 and soak["output_tokens_per_s"] > 0
    speculation = report.step("speculation").figures
    assert speculation["draft_tokens"] > 0 and 0 < speculation["acceptance_rate"] < 1
    cache = report.step("prefix-cache").figures
    assert cache["prompt_tokens"] == 256 and cache["prefix_cache_hit_tokens"] == 255
    assert report.step("lossless").skipped == "no reference (--against FILE)"
    assert live_check.render(report, False).endswith("result: pass")


def test_first_request_that_hangs_is_a_finding_not_a_stuck_process():
    with FakeServer(Behaviour(hang_first=3.0)) as server:
        report = check(server, first_timeout=0.5)
    assert kinds(report) == {("first-request", "timeout")}
    assert "first request: /v1/completions: no answer within 0.5 s" in report.findings[0].message
    assert report.step("soak").skipped == "the first request failed"


def test_soak_requests_past_their_deadline_are_counted():
    with FakeServer(Behaviour(hang_all=0.6)) as server:
        report = check(server, first_timeout=5.0, timeout=0.2, soak=3)
    assert ("first-request", "timeout") not in kinds(report)
    assert ("soak", "timeout") in kinds(report)
    assert "soak: 3 of 3 requests failed (timeout); first #0" in live_check.render(report, False)


def test_http_500_is_a_finding_with_the_servers_message():
    with FakeServer(Behaviour(status=500)) as server:
        report = check(server)
    assert kinds(report) == {("first-request", "http-error")}
    assert "HTTP 500" in report.findings[0].message and "EngineCore died" in report.findings[0].message


def test_malformed_json_is_a_finding():
    with FakeServer(Behaviour(malformed=True)) as server:
        report = check(server)
    assert kinds(report) == {("first-request", "malformed")}
    assert "/v1/completions: answer is not JSON" in report.findings[0].message


def test_answer_without_usage_is_malformed():
    with FakeServer(Behaviour(drop_usage=True)) as server:
        report = check(server)
    assert kinds(report) == {("first-request", "malformed")}
    assert "usage.completion_tokens" in report.findings[0].message


def test_models_endpoint_failing_stops_the_check():
    with FakeServer(Behaviour(models_status=503)) as server:
        report = check(server)
    assert kinds(report) == {("server", "http-error")}
    assert report.step("first-request").skipped == "the server check failed"


def test_unknown_model_name_is_a_finding():
    with FakeServer() as server:
        report = check(server, model="other-model")
    assert kinds(report) == {("server", "no-model")}
    assert "'other-model' is not served" in report.findings[0].message


def test_nothing_drafted_is_a_finding():
    with FakeServer(Behaviour(drafting=False)) as server:
        report = check(server)
    assert kinds(report) == {("speculation", "nothing-drafted")}


def test_no_speculation_metrics_auto_skips_and_required_finds():
    with FakeServer(Behaviour(speculation=False)) as server:
        auto = check(server)
        required = check(server, speculation="required")
    assert auto.ok and auto.step("speculation").skipped.startswith("the server is not configured")
    assert kinds(required) == {("speculation", "not-configured")}
    assert "vllm:spec_decode_num_draft_tokens" in required.findings[0].message


def _long_prompt_tokens(server: FakeServer) -> tuple[int, ...]:
    return server.behaviour.seen_prompts[-1]  # the last distinct prompt: the soak's come first


def test_cached_prompt_answering_alike_passes_without_a_difference():
    with FakeServer() as server:
        report = check(server)
    assert report.ok, report.findings
    figures = report.step("prefix-cache").figures
    assert (
        "first_difference" not in figures and "near_tie_flip" not in figures and "tie_margin" not in figures
    )


@pytest.mark.parametrize(("rank", "model"), [(1, {}), (3, FLAT)])
def test_cached_prompt_near_tie_flip_passes(rank: int, model: dict):
    # vLLM's cached prefill need not round like the cold one: a flip within the margin is no finding.
    with FakeServer(Behaviour(cache_rank=rank, **model)) as server:
        report = check(server)
        best = answer(list(_long_prompt_tokens(server)), 8)[3]
    assert report.ok, report.findings
    figures = report.step("prefix-cache").figures
    margin = 0.05 if rank == 1 else 0.06
    assert figures["tie_margin"] == 0.1 and "first_difference" not in figures
    assert figures["near_tie_flip"] == {
        "token": 3,
        "chosen": ranked(best, rank),
        "expected": best,
        "rank": rank + 1,
        "margin": margin,
    }


def test_cached_prompt_beyond_the_tie_margin_is_a_finding():
    with FakeServer(Behaviour(cache_rank=2)) as server:
        report = check(server)
        best = answer(list(_long_prompt_tokens(server)), 8)[3]
    assert kinds(report) == {("prefix-cache", "mismatch")}
    chosen = ranked(best, 2)
    assert report.findings[0].message == (
        f"the cached long prompt answered differently from the cold one at token 3: the cached answer chose "
        f"token {chosen} where the cold answer chose {best} (log-prob -0.5); the cold answer ranked {chosen} "
        "3rd of 5 at log-prob -1.55, a margin of 1.05, beyond the tie margin 0.1"
    )
    assert report.step("prefix-cache").figures["first_difference"]["margin"] == 1.05


def test_cached_prompt_answering_differently_is_a_finding():
    with FakeServer(Behaviour(cache_differs=True)) as server:
        report = check(server)
        best = answer(list(_long_prompt_tokens(server)), 8)[3]
    assert kinds(report) == {("prefix-cache", "mismatch")}
    other = (best + 1) % 997
    assert report.findings[0].message == (
        f"the cached long prompt answered differently from the cold one at token 3: the cached answer chose "
        f"token {other} where the cold answer chose {best} (log-prob -0.5); {other} is not among the cold "
        "answer's top 5 there, so its margin is at least 3.05 (tie margin 0.1)"
    )


def test_empty_completions_are_a_finding():
    with FakeServer(Behaviour(empty_completions=True)) as server:
        report = check(server)
    assert ("soak", "empty") in kinds(report)


def test_record_then_against_passes_and_a_changed_completion_is_found(tmp_path: Path):
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = check(server, record=reference)
    assert recorded.ok and recorded.step("lossless").figures["recorded"] == 12
    document = json.loads(reference.read_text())
    assert document["format"] == live_check.REFERENCE_FORMAT and len(document["prompts"]) == 12

    with FakeServer() as server:
        same = check(server, against=reference, soak=99, max_tokens=3)  # the reference's own prompts win
    assert same.ok, same.findings
    assert same.step("lossless").figures == {
        "compared": 12,
        "equal": 12,
        "near_tie_flips": 0,
        "differing": 0,
        "tie_margin": 0.1,
    }
    assert same.step("soak").figures["max_tokens"] == 8

    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({**document, "model": "Qwen3-8B"}))
    with (
        FakeServer() as server,
        pytest.raises(
            UsageError, match="recorded from model 'Qwen3-8B', but the server serves 'fake-dspark'"
        ),
    ):
        check(server, against=foreign)
    with FakeServer(Behaviour(perturb_request=4)) as server:
        drifted = check(server, against=reference)
    assert kinds(drifted) == {("lossless", "mismatch")}
    assert "1 of 12 completions differ" in drifted.findings[0].message
    assert "request #4 at token 3" in drifted.findings[0].message


def _record(tmp_path: Path, **behaviour: object) -> tuple[Path, dict]:
    """Record a reference as the lossless check's users do: from the same model, without speculation."""
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False, **behaviour)) as server:
        recorded = check(server, record=reference)
    assert recorded.ok, recorded.findings
    return reference, json.loads(reference.read_text())


def test_reference_records_the_top_k_logprobs(tmp_path: Path):
    _, document = _record(tmp_path)
    assert document["logprobs"] == live_check.TOP_LOGPROBS == 5
    assert len(document["top_logprobs"]) == 12 and len(document["top_logprobs"][0]) == 8
    first_position = document["top_logprobs"][0][0]
    assert [logprob for _, logprob in first_position] == [-0.5, -0.55, -1.55, -2.55, -3.55]
    best = answer(document["prompts"][0], 8)[0]
    assert [token for token, _ in first_position] == [ranked(best, rank) for rank in range(5)]

    seven = tmp_path / "seven.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = check(server, record=seven, top_logprobs=7)
    assert recorded.step("lossless").figures["top_logprobs"] == 7
    assert len(json.loads(seven.read_text())["top_logprobs"][0][0]) == 7
    with FakeServer() as server, pytest.raises(UsageError, match="--top-logprobs must be at least 1"):
        check(server, top_logprobs=0)


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_near_tie_flip_at_any_recorded_rank_is_counted_not_found(tmp_path: Path, rank: int):
    # A nearly flat model: the server's token at the first difference is the reference's 2nd to 5th best,
    # all within the 0.1 tie margin of the best. Only the runner-up counted before; now the margin decides.
    reference, _ = _record(tmp_path, **FLAT)
    with FakeServer(Behaviour(runner_up_request=2, runner_up_rank=rank, **FLAT)) as server:
        flipped = check(server, against=reference)
    assert flipped.ok, flipped.findings
    assert flipped.step("lossless").figures == {
        "compared": 12,
        "equal": 11,
        "near_tie_flips": 1,
        "differing": 0,
        "tie_margin": 0.1,
        "largest_tie_margin": round(0.02 * rank, 4),
    }


def test_flip_beyond_the_tie_margin_is_a_finding_naming_tokens_and_margin(tmp_path: Path):
    reference, document = _record(tmp_path)
    best = answer(document["prompts"][2], 8)[3]
    chosen = ranked(best, 2)
    with FakeServer(Behaviour(runner_up_request=2, runner_up_rank=2)) as server:
        drifted = check(server, against=reference)
    assert kinds(drifted) == {("lossless", "mismatch")}
    assert drifted.findings[0].message == (
        f"lossless: 1 of 12 completions differ from {reference} beyond a near-tie (first: request #2 at "
        f"token 3: the server chose token {chosen} where the reference chose {best} (log-prob -0.5); the "
        f"reference ranked {chosen} 3rd of 5 at log-prob -1.55, a margin of 1.05, beyond the tie margin 0.1)"
    )
    figures = drifted.step("lossless").figures
    assert figures["differing"] == 1 and figures["near_tie_flips"] == 0
    assert figures["first_difference"] == {
        "request": 2,
        "token": 3,
        "chosen": chosen,
        "expected": best,
        "rank": 3,
        "margin": 1.05,
    }

    with FakeServer(Behaviour(runner_up_request=2)) as server:  # the runner-up, 0.05 down, with no margin
        exact = check(server, against=reference, tie_margin=0.0)
    assert kinds(exact) == {("lossless", "mismatch")}
    assert exact.findings[0].message.endswith(
        f"(first: request #2 at token 3: the server chose token {runner_up(best)} where the reference chose "
        f"{best} (log-prob -0.5); the reference ranked {runner_up(best)} 2nd of 5 at log-prob -0.55, a "
        "margin of 0.05, beyond the tie margin 0)"
    )


def test_chosen_token_outside_the_recorded_top_k_is_a_finding(tmp_path: Path):
    reference, document = _record(tmp_path)
    best = answer(document["prompts"][4], 8)[3]
    with FakeServer(Behaviour(perturb_request=4)) as server:  # token + 1: not among the model's top 5
        drifted = check(server, against=reference)
    assert kinds(drifted) == {("lossless", "mismatch")}
    assert drifted.findings[0].message == (
        f"lossless: 1 of 12 completions differ from {reference} beyond a near-tie (first: request #4 at "
        f"token 3: the server chose token {(best + 1) % 997} where the reference chose {best} (log-prob "
        f"-0.5); {(best + 1) % 997} is not among the reference's top 5 there, so its margin is at least "
        "3.05 (tie margin 0.1))"
    )
    assert drifted.step("lossless").figures["first_difference"]["rank"] is None
    assert drifted.step("lossless").figures["first_difference"]["margin"] is None


def test_a_top_2_reference_cannot_judge_a_third_ranked_flip(tmp_path: Path):
    # Why k grew: with the old top-2 record the 3rd best token, 0.04 down, is not recorded, so not judged.
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False, **FLAT)) as server:
        check(server, record=reference, top_logprobs=2)
    with FakeServer(Behaviour(runner_up_request=2, runner_up_rank=2, **FLAT)) as server:
        drifted = check(server, against=reference)
    assert kinds(drifted) == {("lossless", "mismatch")}
    assert "is not among the reference's top 2 there, so its margin is at least 0.02 (tie margin 0.1)" in (
        drifted.findings[0].message
    )


def test_malformed_reference_logprobs_are_a_usage_error(tmp_path: Path):
    reference, document = _record(tmp_path)
    document["top_logprobs"][2] = [["a token", "not a number"]] * 8
    reference.write_text(json.dumps(document))
    with (
        FakeServer(Behaviour(perturb_request=2)) as server,
        pytest.raises(UsageError, match="top_logprobs of completion #2 are not \\[token, log-prob\\] pairs"),
    ):
        check(server, against=reference)


def test_against_a_file_of_another_format_is_a_usage_error(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something/2"}))
    with (
        FakeServer() as server,
        pytest.raises(UsageError, match="expected format 'sparkseal-live-reference/1'"),
    ):
        check(server, against=bad)
    with pytest.raises(UsageError, match="no such file"):
        run(Options(url="http://127.0.0.1:1", against=tmp_path / "missing.json"))


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


def test_unreachable_server_raises():
    with pytest.raises(Unreachable, match="Connection refused"):
        run(Options(url=f"http://127.0.0.1:{free_port()}", **SMALL))


def test_wait_lets_a_server_that_is_still_starting_answer():
    port = free_port()
    started: list[FakeServer] = []

    def start_late() -> None:
        time.sleep(1.5)  # refused connections first, as from a server still loading its model
        started.append(FakeServer(port=port).__enter__())

    late = threading.Thread(target=start_late)
    late.start()
    try:
        begin = time.monotonic()
        report = run(Options(url=f"http://127.0.0.1:{port}", **SMALL, wait=30.0))
    finally:
        late.join()
        for server in started:
            server.__exit__(None, None, None)
    assert report.ok, report.findings
    assert time.monotonic() - begin >= 1.5


def test_wait_past_its_deadline_is_unreachable_with_the_last_error():
    begin = time.monotonic()
    with pytest.raises(Unreachable) as error:
        run(Options(url=f"http://127.0.0.1:{free_port()}", **SMALL, wait=2.0))
    assert time.monotonic() - begin >= 1.0
    assert "/v1/models: no answer within 2 s (--wait); last: " in str(error.value)
    assert "Connection refused" in str(error.value)
    with pytest.raises(UsageError, match="--wait -1: expected seconds, at least 0"):
        run(Options(url="http://127.0.0.1:1", **SMALL, wait=-1.0))


def test_credentials_in_the_url_never_appear(tmp_path: Path):
    port = free_port()
    with pytest.raises(Unreachable) as error:
        run(Options(url=f"http://operator:s3cret-pass@127.0.0.1:{port}", **SMALL))
    assert "s3cret-pass" not in str(error.value) and f"127.0.0.1:{port}" in str(error.value)


def test_parse_metrics_sums_labels_and_folds_total():
    text = (
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="1"} 5.0\n'
        'vllm:spec_decode_num_draft_tokens_created{engine="0"} 1.7e9\n'
        "vllm:time_to_first_token_seconds_sum 1.5\n"
    )
    assert parse_metrics(text) == {
        "vllm:spec_decode_num_draft_tokens": 15.0,
        "vllm:time_to_first_token_seconds_sum": 1.5,
    }


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "live-check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_cli_exit_codes_and_json(tmp_path: Path):
    with FakeServer() as server:
        passed = _cli(server.url, "--soak", "4", "--max-tokens", "4", "--long-prompt-tokens", "64", "--json")
    assert passed.returncode == 0, passed.stderr
    document = json.loads(passed.stdout)
    assert document["ok"] is True and [s["name"] for s in document["steps"]] == [
        "server",
        "first-request",
        "soak",
        "prefix-cache",
        "long-context",
        "speculation",
        "lossless",
        "teardown",
        "gpu-idle",
        "server-log",
        "module-check",
        "nccl",
    ]
    with FakeServer(Behaviour(drafting=False)) as server:
        finding = _cli(server.url, "--soak", "2", "--long-prompt-tokens", "32")
    assert finding.returncode == 1
    assert "finding: speculation: configured, but no token was drafted" in finding.stdout
    unreachable = _cli(f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 2 and "server unreachable" in unreachable.stderr
    usage = _cli("http://127.0.0.1:1", "--record", "a.json", "--against", "b.json")
    assert usage.returncode == 2 and "not allowed with argument" in usage.stderr
    bad_vocab = _cli("http://127.0.0.1:1", "--vocab", "900:100")
    assert bad_vocab.returncode == 2 and "expected LOW:HIGH with LOW < HIGH" in bad_vocab.stderr
    missing_log = _cli("http://127.0.0.1:1", "--log", str(tmp_path / "none.log"))
    assert missing_log.returncode == 2 and "none.log: no such file" in missing_log.stderr
    no_logprobs = _cli("http://127.0.0.1:1", "--top-logprobs", "0")
    assert no_logprobs.returncode == 2 and "expected a positive number, got '0'" in no_logprobs.stderr
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = _cli(
            server.url,
            "--soak",
            "2",
            "--long-prompt-tokens",
            "32",
            "--top-logprobs",
            "6",
            "--record",
            str(reference),
        )
    assert recorded.returncode == 0, recorded.stderr
    assert len(json.loads(reference.read_text())["top_logprobs"][0][0]) == 6


FIXTURES = REPO / "tests" / "fixtures" / "nccl"


def _tp2_logs(tmp_path: Path, kind: str, ranks_logged: tuple[int, ...] = (0, 1)) -> tuple[Path, Path]:
    """A TP=2 server log with the plugin's line per rank, and a folder of NCCL logs (one per process)."""
    server = tmp_path / "server.log"
    lines = ["(APIServer pid=10) INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM API server"]
    for rank in ranks_logged:
        lines.append(
            f"(Worker_TP{rank} pid={20 + rank}) INFO 12-01 10:00:05 [plugin.py:180] "
            f"sparkseal: rank {rank} of 2: vllm, torch, sparkseal identical on every rank (digest 5f2a9c)"
        )
    server.write_text("\n".join(lines) + "\n")
    folder = tmp_path / "nccl"
    folder.mkdir()
    for rank in (0, 1):
        shutil.copy(FIXTURES / f"{kind}.rank{rank}.log", folder / f"nccl.vm.{640 + rank}.log")
    (folder / "nccl.vm.10.log").write_text(
        "vm:10:10 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
    )  # no collectives
    return server, folder


def test_tensor_parallel_ranks_agree(tmp_path: Path):
    server_log, folder = _tp2_logs(tmp_path, "equal")
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
    server_log, folder = _tp2_logs(tmp_path, "divergent")
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
    server_log, folder = _tp2_logs(tmp_path, "equal", ranks_logged=())
    with FakeServer() as server:
        report = check(server, log=server_log, nccl_logs=folder)
    assert kinds(report) == {("module-check", "did-not-run")}
    assert "no line of the sparkseal plugin's cross-rank check" in report.findings[0].message

    other = tmp_path / "other"
    other.mkdir()
    server_log, folder = _tp2_logs(other, "equal", ranks_logged=(0,))
    with FakeServer() as server:
        report = check(server, log=server_log, require_module_check=True)
    assert kinds(report) == {("module-check", "incomplete")}
    assert "missing ranks [1]" in report.findings[0].message
    with FakeServer() as server:  # one rank without --require-module-check: reported, not required
        single = check(server, log=server_log)
    assert ("module-check", "incomplete") in kinds(single)


def test_nccl_needs_a_log_per_rank(tmp_path: Path):
    server_log, folder = _tp2_logs(tmp_path, "equal")
    (folder / "nccl.vm.641.log").unlink()
    with FakeServer() as server:
        report = check(server, log=server_log, nccl_logs=folder)
    assert kinds(report) == {("nccl", "ranks")}
    assert "found nccl.vm.640.log (rank 0)" in report.findings[0].message
    with FakeServer() as server, pytest.raises(UsageError, match="give --log FILE"):
        check(server, nccl_logs=folder)
    with FakeServer() as server, pytest.raises(UsageError, match="expected a folder of per-rank NCCL logs"):
        check(server, log=server_log, nccl_logs=tmp_path / "none")


# ---------------------------------------------------------------- acceptance floors and held-out prompts
# The fake drafts 5 tokens per draft step and accepts 2 of them: rate 0.4, 2 per step, one step per 3 tokens.


def test_acceptance_floors_that_hold_pass_and_are_named():
    with FakeServer() as server:
        report = check(server, min_acceptance=0.3, min_accepted_length=1.5, min_request_accepted_length=1.5)
    assert report.ok, report.findings
    speculation = report.step("speculation")
    assert speculation.figures["acceptance_rate"] == 0.4
    assert speculation.figures["accepted_per_draft"] == 2.0
    assert speculation.figures["mean_acceptance_length"] == 3.0
    assert speculation.figures["floor_acceptance"] == 0.3
    assert speculation.figures["floor_accepted_per_draft"] == 1.5
    assert speculation.figures["floor_request_accepted_per_draft"] == 1.5
    assert speculation.figures["requests_measured"] == 12
    assert speculation.figures["request_accepted_per_draft_min"] == 2.0
    assert speculation.figures["requests_below_floor"] == 0
    assert speculation.details["per_request"] == [[2, 4]] * 12  # (draft steps, accepted tokens)
    text = live_check.render(report, False)
    assert "accepted_per_draft 2.0" in text and "floor_accepted_per_draft 1.5" in text
    assert "[2, 4]" not in text  # the per-request list goes to the JSON report only


def test_acceptance_below_its_floor_is_a_finding_naming_rate_and_floor():
    with FakeServer() as server:
        report = check(server, min_acceptance=0.5)
    assert kinds(report) == {("speculation", "low-acceptance")}
    assert report.findings[0].message == (
        "speculation: acceptance rate 0.4000 (60 of 150 drafted tokens accepted) is below the floor "
        "--min-acceptance 0.5"
    )


def test_accepted_length_below_its_floor_is_a_finding_without_the_bonus_token():
    with FakeServer(Behaviour(accepted_per_draft=1)) as server:
        report = check(server, min_accepted_length=2.5)
    assert kinds(report) == {("speculation", "short-acceptance")}
    assert report.step("speculation").figures["mean_acceptance_length"] == 2.0  # vLLM's, bonus counted
    assert report.findings[0].message == (
        "speculation: 1.000 draft tokens accepted per draft step (over 30 steps, the bonus token not "
        "counted) is below the floor --min-accepted-length 2.5"
    )


def test_one_weak_request_fails_the_request_floor_where_the_average_passes():
    with FakeServer(Behaviour(weak_request=5, weak_accepted_per_draft=0)) as server:
        report = check(server, min_accepted_length=1.5, min_request_accepted_length=1.0)
    speculation = report.step("speculation")
    assert speculation.figures["accepted_per_draft"] >= 1.5  # 11 requests at 2, one at 0, plus the extras
    assert kinds(report) == {("speculation", "low-request-acceptance")}
    assert report.findings[0].message == (
        "speculation: 1 of 12 requests accepted fewer than 1 draft tokens per draft step (lowest: request "
        "#5, 0.000: 0 accepted over 2 draft steps)"
    )
    assert speculation.figures["lowest_request"] == 5 and speculation.figures["requests_below_floor"] == 1
    assert speculation.details["per_request"][5] == [2, 0]


def test_floors_require_speculation_metrics_even_in_auto_mode():
    with FakeServer(Behaviour(speculation=False)) as server:
        report = check(server, min_accepted_length=1.0)
    assert kinds(report) == {("speculation", "not-configured")}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"min_request_accepted_length": 1.0, "concurrency": 4},
            "--min-request-accepted-length reads /metrics around each request, so it needs --concurrency 1 "
            "(got 4)",
        ),
        ({"min_acceptance": 1.5}, "--min-acceptance 1.5: expected a rate from 0 to 1"),
        (
            {"min_accepted_length": -1.0},
            "--min-accepted-length -1: expected tokens per draft step, at least 0",
        ),
        (
            {"min_acceptance": 0.2, "speculation": "off"},
            "acceptance floors need the speculation check: not with --speculation off",
        ),
    ],
)
def test_floor_arguments_that_cannot_hold_are_usage_errors(overrides: dict, message: str):
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, **overrides)
    assert str(error.value) == message


def test_soak_reports_the_servers_decode_speed():
    with FakeServer(Behaviour(decode_s_per_token=0.004)) as server:
        report = check(server)
    # 7 tokens after the first per request, 0.004 s each: 250 tokens/s, whatever the client's pauses.
    assert report.step("soak").figures["decode_tokens_per_s"] == 250.0


def _prompts_file(path: Path, prompts: object, fmt: str = "sparkseal-prompts/1") -> Path:
    path.write_text(json.dumps({"format": fmt, "prompts": prompts}))
    return path


def test_prompts_file_drives_the_soak_and_the_reference(tmp_path: Path):
    held_out = [[11, 12, 13, 14], [21, 22, 23], [31, 32, 33, 34, 35]]
    prompts = _prompts_file(tmp_path / "prompts.json", held_out)
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = check(server, prompts=prompts, record=reference, soak=2)
        assert recorded.ok, recorded.findings
        assert server.behaviour.seen_prompts[:2] == [tuple(p) for p in held_out[:2]]
    document = json.loads(reference.read_text())
    assert document["prompts"] == held_out[:2]
    assert document["completions"] == [answer(p, 8) for p in held_out[:2]]
    with FakeServer() as server:
        replayed = check(server, against=reference)
    assert replayed.ok and replayed.step("lossless").figures["equal"] == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"format": "other/1", "prompts": [[1]]}, "expected format 'sparkseal-prompts/1', found 'other/1'"),
        ({"format": "sparkseal-prompts/1", "prompts": [[1, "2"]]}, "expected a non-empty list of non-empty"),
        ([[]], "expected a non-empty list of non-empty lists of token ids"),
    ],
)
def test_malformed_prompts_files_are_usage_errors(tmp_path: Path, content: object, message: str):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(content))
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, prompts=path)
    assert str(error.value).startswith(f"--prompts {path}: ") and message in str(error.value)


def test_prompts_and_a_reference_exclude_each_other(tmp_path: Path):
    prompts = _prompts_file(tmp_path / "prompts.json", [[1, 2]])
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, prompts=prompts, against=tmp_path / "reference.json")
    assert (
        str(error.value)
        == "--prompts and --against exclude each other: the reference carries its own prompts"
    )


def test_cli_floors_in_text_and_json():
    with FakeServer(Behaviour(weak_request=1, weak_accepted_per_draft=0)) as server:
        failed = _cli(
            server.url,
            "--soak",
            "3",
            "--max-tokens",
            "6",
            "--long-prompt-tokens",
            "32",
            "--min-accepted-length",
            "1.0",
            "--min-request-accepted-length",
            "1.0",
            "--json",
        )
    assert failed.returncode == 1, failed.stderr
    document = json.loads(failed.stdout)
    assert [(f["check"], f["kind"]) for f in document["findings"]] == [
        ("speculation", "low-request-acceptance")
    ]
    speculation = next(s for s in document["steps"] if s["name"] == "speculation")
    assert speculation["details"]["per_request"] == [[2, 4], [2, 0], [2, 4]]
    assert speculation["figures"]["floor_request_accepted_per_draft"] == 1.0
    assert "details" not in next(s for s in document["steps"] if s["name"] == "soak")
    with FakeServer() as server:
        passed = _cli(server.url, "--soak", "2", "--long-prompt-tokens", "32", "--min-acceptance", "0.4")
    assert passed.returncode == 0, passed.stdout
    assert "floor_acceptance 0.4" in passed.stdout and passed.stdout.endswith("result: pass\n")
    usage = _cli("http://127.0.0.1:1", "--min-request-accepted-length", "1", "--concurrency", "2")
    assert usage.returncode == 2 and "needs --concurrency 1 (got 2)" in usage.stderr


def test_the_request_floor_names_the_requests_it_cannot_judge():
    """A request /metrics gave no counts for, or one with no draft step, is named, not dropped (issue 39)."""
    report = live_check.Report(url="http://127.0.0.1:1")
    step = live_check.Step("speculation", True)
    report.steps.append(step)
    live_check._request_floor(report, step, 1.0, [(2, 4), None, (0, 0), (2, 4), None])
    assert [(f.check, f.kind, f.message) for f in report.findings] == [
        (
            "speculation",
            "unjudged-requests",
            "speculation: 2 whose counts /metrics did not give (#1, #4) and 1 that made no draft step (#2) "
            "of 5 requests cannot be held to the floor --min-request-accepted-length 1",
        )
    ]
    assert (step.figures["requests_measured"], step.figures["requests_unmeasured"]) == (2, 2)
    assert step.figures["requests_without_draft_steps"] == 1


# ---------------------------------------------------------------- --profile reference and its added steps
# The fake answers a 660,000-token prompt with a JSON round trip and a sum: the full-scale run takes seconds.

PREFILL = 1e-3  # the fake's seconds of time to first token per uncached prompt token, in these tests


def profiled(server: FakeServer, **given: object):
    return run(live_check.options_for("reference", server.url, timeout=5.0, **given))


def test_reference_profile_at_full_scale_passes_with_every_figure():
    with FakeServer(Behaviour(prefill_s_per_token=PREFILL)) as server:
        report = profiled(server)
        longest = max(len(prompt) for prompt in server.behaviour.seen_prompts)
    assert report.ok, report.findings
    assert report.profile == "reference" and longest == 660_000
    soak = report.step("soak").figures
    assert (soak["requests"], soak["concurrency"], soak["max_tokens"]) == (120, 1, 64)
    assert soak["completion_tokens"] == soak["expected_completion_tokens"] == 7_680
    cache = report.step("prefix-cache").figures
    assert cache["prompt_tokens"] == 28_820 and cache["prefix_cache_hit_tokens"] == 28_819
    assert cache["cold_prefill_s"] == 28.82 and cache["cached_prefill_s"] == 0.001
    assert report.step("long-context").figures == {
        "prompt_tokens": 660_000,
        "max_model_len": 1_048_576,
        "min_max_model_len": 1_048_576,
        "completion_tokens": 64,
        "request_s": report.step("long-context").figures["request_s"],
        "prefill_s": 660.0,
        "drafts": 21,  # the fake: one draft step of 5 tokens per 3 generated, 2 accepted
        "draft_tokens": 105,
        "accepted_tokens": 42,
    }
    assert report.step("server").figures["max_model_len"] == 1_048_576
    assert report.step("teardown").skipped == "no --teardown-pid: live-check leaves the server running"
    assert report.step("gpu-idle").skipped == "no --teardown-pid: a serving GPU is not idle"
    assert all(step.seconds >= 0 for step in report.steps)
    assert report.step("soak").seconds > 0 and report.step("long-context").seconds > 0
    text = live_check.render(report, False)
    assert text.startswith(f"live-check {server.url} (model {MODEL}, profile reference)")
    assert f"  long-context   ok ({report.step('long-context').seconds:.3f} s): prompt_tokens 660000" in text


def test_profile_sets_defaults_and_what_is_given_wins():
    reference = live_check.options_for("reference", "http://127.0.0.1:1", soak=3, concurrency=2)
    assert (reference.soak, reference.concurrency, reference.max_tokens) == (3, 2, 64)
    assert (reference.long_prompt_tokens, reference.context_tokens) == (28_820, 660_000)
    assert reference.speculation == "required" and reference.require_cache_hit
    plain = live_check.options_for(None, "http://127.0.0.1:1")
    assert (plain.max_tokens, plain.long_prompt_tokens, plain.context_tokens) == (32, 2048, None)
    assert plain.speculation == "auto" and not plain.require_cache_hit
    with pytest.raises(UsageError, match=r"--profile nightly: expected one of \['reference'\]"):
        live_check.options_for("nightly", "http://127.0.0.1:1")


SMALL_PROFILE = {"soak": 3, "max_tokens": 6, "long_prompt_tokens": 64, "first_timeout": 5.0}


def test_server_too_short_for_the_long_prompt_is_a_finding_naming_both_lengths():
    with FakeServer(Behaviour(max_model_len=32_768)) as server:
        report = profiled(server, **SMALL_PROFILE)
        longest = max(len(prompt) for prompt in server.behaviour.seen_prompts)
    assert kinds(report) == {("long-context", "max-model-len")}
    assert report.findings[0].message == (
        "long context: the server's max_model_len is 32768, expected at least 1048576 (--min-max-model-len) "
        "for a 660000-token prompt: serve with --max-model-len 1048576 or more"
    )
    assert longest == 64  # the long prompt was never sent
    with FakeServer(Behaviour(max_model_len=None)) as server:
        unlisted = profiled(server, **SMALL_PROFILE)
    assert kinds(unlisted) == {("long-context", "no-max-model-len")}
    assert unlisted.findings[0].message == (
        f"long context: /v1/models lists no max_model_len for {MODEL!r}; expected at least 1048576"
    )


def test_long_prompt_with_nothing_drafted_is_a_finding_though_the_check_drafted():
    with FakeServer(Behaviour(drafting_long=False)) as server:
        report = profiled(server, **SMALL_PROFILE, context_tokens=200_000)
    assert kinds(report) == {("long-context", "nothing-drafted")}
    assert report.findings[0].message == (
        "long context: no token was drafted on the 200000-token request (vllm:spec_decode_num_draft_tokens "
        "did not move)"
    )
    assert report.step("long-context").figures["draft_tokens"] == 0
    assert report.step("speculation").ok  # the soak drafted: only the long request's own count tells


def test_long_prompt_past_its_deadline_is_a_finding_and_progress_beats_meanwhile():
    lines: list[str] = []
    with FakeServer(Behaviour(hang_long=1.0)) as server:
        options = live_check.options_for(
            "reference",
            server.url,
            **SMALL_PROFILE,
            context_tokens=200_000,
            context_timeout=0.3,
            progress_interval=0.1,
        )
        report = run(options, lines.append)
    assert kinds(report) == {("long-context", "timeout")}
    assert report.findings[0].message == (
        "long context: 200000-token prompt: /v1/completions: no answer within 0.3 s"
    )
    label = "long context: a 200000-token cold prompt (deadline 0.3 s)"
    assert f"{label} ..." in lines and f"{label}: 0 s elapsed" in lines
    assert lines.index("first request ...") < lines.index(f"{label} ...")


def test_profile_needs_a_real_prefix_cache_hit_and_a_short_soak_is_found():
    with FakeServer(Behaviour(prefix_caching=False)) as server:
        report = profiled(server, **SMALL_PROFILE, context_tokens=1000)
        plain = check(server)
    assert kinds(report) == {("prefix-cache", "no-cache-hit")}
    assert report.findings[0].message == (
        "prefix cache: the second 64-token prompt hit no cached token (is the server started with "
        "--enable-prefix-caching?)"
    )
    assert plain.ok, plain.findings  # without the profile a miss is reported, not required
    with FakeServer(Behaviour(short_completions=True)) as server:
        short = profiled(server, **SMALL_PROFILE, context_tokens=1000)
    assert kinds(short) == {("soak", "short")}
    assert short.findings[0].message == (
        "soak: 3 request(s) returned fewer than the 6 tokens asked for, 15 of 18 in all (first: #0, 5 tokens)"
    )


def test_arguments_of_the_added_steps_are_checked_before_any_request():
    with pytest.raises(UsageError) as error:
        run(live_check.options_for("reference", "http://127.0.0.1:1", context_tokens=2_000_000))
    assert str(error.value) == (
        "--min-max-model-len 1048576: a 2000000-token prompt and 64 generated tokens need at least 2000064"
    )
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(UsageError) as error:
        run(Options(url="http://127.0.0.1:1", teardown_pid=gone.pid))
    assert str(error.value) == f"--teardown-pid {gone.pid}: no such process"


# ---------------------------------------------------------------- teardown and idle GPUs


@pytest.fixture
def server_process():
    """A stand-in for the server's process, which the teardown stops by its pid."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def _nvidia_smi(folder: Path, *answers: str, status: int = 0) -> Path:
    """A fake nvidia-smi on PATH: each call prints the next answer (the last one again), exit ``status``."""
    folder.mkdir(exist_ok=True)
    (folder / "answers").write_text(json.dumps(list(answers)))
    script = folder / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        "here = pathlib.Path(__file__).parent\n"
        "answers = json.loads((here / 'answers').read_text())\n"
        "calls = here / 'calls'\n"
        "n = int(calls.read_text()) if calls.exists() else 0\n"
        "calls.write_text(str(n + 1))\n"
        "print(answers[min(n, len(answers) - 1)])\n"
        f"sys.exit({status})\n"
    )
    script.chmod(0o755)
    return folder


TEARDOWN = {"idle_poll": 0.05, "idle_timeout": 0.3, "teardown_timeout": 5.0}


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
    smi = _nvidia_smi(tmp_path / "idle", "0, 40000, 87\n1, 300, 0", "0, 12, 0\n1, [N/A], 0")
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

    smi = _nvidia_smi(tmp_path / "busy", "0, 2048, 35")
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
    smi = _nvidia_smi(tmp_path / "broken", "NVIDIA-SMI has failed", status=9)
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


def test_cli_reference_profile_shows_progress_on_stderr_and_times_every_step(tmp_path: Path):
    with FakeServer() as server:
        done = _cli(
            server.url,
            "--profile",
            "reference",
            "--soak",
            "3",
            "--max-tokens",
            "4",
            "--long-prompt-tokens",
            "64",
            "--context-tokens",
            "2000",
            "--json",
        )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["profile"] == "reference" and document["ok"] is True
    assert all(isinstance(step["seconds"], float) for step in document["steps"])
    context = next(step for step in document["steps"] if step["name"] == "long-context")
    assert context["figures"]["prompt_tokens"] == 2000
    assert context["figures"]["min_max_model_len"] == 1_048_576
    assert "live-check: first request ..." in done.stderr.splitlines()
    assert "live-check: long context: a 2000-token cold prompt (deadline 1800 s) ..." in done.stderr
    too_long = _cli("http://127.0.0.1:1", "--profile", "reference", "--context-tokens", "2000000")
    assert too_long.returncode == 2
    assert (
        "--min-max-model-len 1048576: a 2000000-token prompt and 64 generated tokens need at least 2000064"
        in (too_long.stderr)
    )
    with FakeServer(Behaviour(speculation=False)) as server:
        required = _cli(
            server.url,
            "--profile",
            "reference",
            "--soak",
            "2",
            "--long-prompt-tokens",
            "32",
            "--context-tokens",
            "100",
        )
    assert required.returncode == 1 and "speculative decoding is not configured" in required.stdout


def test_a_cache_hit_that_nothing_reports_is_a_finding():
    with FakeServer(Behaviour(prefix_metrics=False)) as server:
        report = profiled(server, **SMALL_PROFILE, context_tokens=1000)
    assert kinds(report) == {("prefix-cache", "no-cache-figures")}
    assert report.findings[0].message == (
        "prefix cache: neither usage.prompt_tokens_details.cached_tokens nor /metrics' "
        "vllm:prefix_cache_hits says whether the second 64-token prompt was served from the prefix cache"
    )


def test_a_server_that_exited_during_the_check_is_a_teardown_finding():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    try:
        with FakeServer(Behaviour(hang_first=1.0)) as server:
            report = check(server, teardown_pid=process.pid, **TEARDOWN)
    finally:
        process.wait()
    assert kinds(report) == {("teardown", "not-running")}
    assert report.findings[0].message == f"teardown: pid {process.pid} had already exited before the teardown"
