"""The live check's request steps: server, first request, soak, prefix cache, long context."""

from __future__ import annotations

import pytest

from sparkseal.live_check.config import options_for
from sparkseal.live_check.report import render
from sparkseal.live_check.run import run
from tests.servers.fake_openai import MODEL, Behaviour, FakeServer, answer, ranked
from tests.unit.live_check_helpers import FLAT, SMALL_PROFILE, check, kinds, long_prompt_tokens, profiled


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
    assert "soak: 3 of 3 requests failed (timeout); first #0" in render(report, False)


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
        best = answer(list(long_prompt_tokens(server)), 8)[3]
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
        best = answer(list(long_prompt_tokens(server)), 8)[3]
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
        best = answer(list(long_prompt_tokens(server)), 8)[3]
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


def test_soak_reports_the_servers_decode_speed():
    with FakeServer(Behaviour(decode_s_per_token=0.004)) as server:
        report = check(server)
    # 7 tokens after the first per request, 0.004 s each: 250 tokens/s, whatever the client's pauses.
    assert report.step("soak").figures["decode_tokens_per_s"] == 250.0


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
        options = options_for(
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


def test_a_cache_hit_that_nothing_reports_is_a_finding():
    with FakeServer(Behaviour(prefix_metrics=False)) as server:
        report = profiled(server, **SMALL_PROFILE, context_tokens=1000)
    assert kinds(report) == {("prefix-cache", "no-cache-figures")}
    assert report.findings[0].message == (
        "prefix cache: neither usage.prompt_tokens_details.cached_tokens nor /metrics' "
        "vllm:prefix_cache_hits says whether the second 64-token prompt was served from the prefix cache"
    )
