"""The live check end to end against a fake vLLM server on loopback (sparkseal/live_check/run.py)."""

from __future__ import annotations

from sparkseal.live_check.report import render
from tests.servers.fake_openai import MODEL, Behaviour, FakeServer
from tests.unit.live_check_helpers import PREFILL, check, profiled


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
    assert cache["prompt_tokens"] == 256 and cache["prefix_cache_hit_tokens"] == 240
    assert report.step("lossless").skipped == "no reference (--against FILE)"
    assert render(report, False).endswith("result: pass")


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
    assert cache["prompt_tokens"] == 28_820 and cache["prefix_cache_hit_tokens"] == 28_816
    assert cache["cold_prefill_s"] == 28.82 and cache["cached_prefill_s"] == 0.004
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
    text = render(report, False)
    assert text.startswith(f"live-check {server.url} (model {MODEL}, profile reference)")
    assert f"  long-context   ok ({report.step('long-context').seconds:.3f} s): prompt_tokens 660000" in text
