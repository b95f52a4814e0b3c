"""The checks that send requests: the server, the first request, the soak, the prefix cache, the long "
"context."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkseal.live_check.client import Client, Completion, RequestFailed, Unreachable, complete
from sparkseal.live_check.config import PROFILES, Options
from sparkseal.live_check.divergence import judge_divergence, output_of
from sparkseal.live_check.inputs import cold_prompt
from sparkseal.live_check.metrics import (
    METRIC_ACCEPTED_TOKENS,
    METRIC_DRAFT_TOKENS,
    METRIC_DRAFTS,
    METRIC_PREFIX_HITS,
    METRIC_TTFT_COUNT,
    METRIC_TTFT_SUM,
    decode_rate,
    mean_delta,
    read_metrics,
)
from sparkseal.live_check.report import Report, Step, heartbeat


def _max_model_len(data: list[Any], model: str) -> int | None:
    """The ``max_model_len`` vLLM lists for ``model`` in /v1/models, if it lists one."""
    for entry in data:
        if isinstance(entry, dict) and str(entry.get("id")) == model:
            value = entry.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _soak_requests(
    client: Client,
    model: str,
    prompts: list[list[int]],
    max_tokens: int,
    timeout: float,
    concurrency: int,
    logprobs: int,
    ignore_eos: bool = True,
) -> tuple[list[Completion | RequestFailed], float]:
    """Run every prompt once with ``concurrency`` clients; results in prompt order, and the wall time."""
    results: list[Completion | RequestFailed | None] = [None] * len(prompts)
    cursor = iter(range(len(prompts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            try:
                results[index] = complete(
                    client, model, prompts[index], max_tokens, timeout, logprobs, ignore_eos
                )
            except RequestFailed as error:
                results[index] = error
            except Unreachable as error:
                results[index] = RequestFailed("connection", str(error))

    start = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None], time.monotonic() - start


def _serial_soak_with_metrics(
    client: Client,
    model: str,
    prompts: list[list[int]],
    max_tokens: int,
    timeout: float,
    logprobs: int,
    ignore_eos: bool = True,
) -> tuple[list[Completion | RequestFailed], float, list[tuple[int, int] | None]]:
    """The soak with one client, reading the speculative-decoding counters around every request: each
    request's (drafts, accepted tokens), None where a request failed or /metrics did not answer."""
    results: list[Completion | RequestFailed] = []
    per_request: list[tuple[int, int] | None] = []
    start = time.monotonic()
    for prompt in prompts:
        before = read_metrics(client, timeout)
        try:
            results.append(complete(client, model, prompt, max_tokens, timeout, logprobs, ignore_eos))
        except RequestFailed as error:
            results.append(error)
            per_request.append(None)
            continue
        except Unreachable as error:
            results.append(RequestFailed("connection", str(error)))
            per_request.append(None)
            continue
        after = read_metrics(client, timeout)
        if before is None or after is None:
            per_request.append(None)
            continue
        drafts = after.get(METRIC_DRAFTS, 0.0) - before.get(METRIC_DRAFTS, 0.0)
        accepted = after.get(METRIC_ACCEPTED_TOKENS, 0.0) - before.get(METRIC_ACCEPTED_TOKENS, 0.0)
        per_request.append((int(drafts), int(accepted)))
    return results, time.monotonic() - start, per_request


def server_step(report: Report, options: Options, client: Client) -> bool:
    """Reachability and the model name (an unreachable server raises Unreachable here); True when served."""
    with report.timed("server", ok=False) as server:
        try:
            models = client.get_json("/v1/models", options.timeout)
            listed = [str(entry["id"]) for entry in models["data"]]
        except RequestFailed as error:
            report.flag(server, error.kind, f"server: {error}")
        except (KeyError, TypeError):
            report.flag(
                server, "malformed", f"/v1/models: no model list in the answer: {str(models)[:200]!r}"
            )
        else:
            report.model = options.model or (listed[0] if listed else "")
            if not report.model or report.model not in listed:
                report.flag(
                    server,
                    "no-model",
                    f"/v1/models: model {report.model!r} is not served (listed: {listed})",
                )
            else:
                server.ok = True
                server.figures = {"models": listed}
                max_model_len = _max_model_len(models["data"], report.model)
                if max_model_len is not None:
                    server.figures["max_model_len"] = max_model_len
    return server.ok


def first_request_step(
    report: Report,
    options: Options,
    client: Client,
    prompt: list[int],
    max_tokens: int,
    progress: Callable[[str], None],
) -> bool:
    """The first request, with its own (long) deadline: graph capture and compilation may still be warming."""
    with report.timed("first-request", ok=False) as first:
        try:
            with heartbeat(progress, "first request", options.progress_interval):
                result = complete(client, report.model, prompt, max_tokens, options.first_timeout)
        except RequestFailed as error:
            report.flag(first, error.kind, f"first request: {error}")
            return False
        first.ok = True
        first.figures = {"seconds": round(result.seconds, 3), "completion_tokens": result.completion_tokens}
    return True


def soak_step(
    report: Report,
    options: Options,
    client: Client,
    prompts: list[list[int]],
    max_tokens: int,
    progress: Callable[[str], None],
) -> tuple[list[Completion | RequestFailed], list[tuple[int, int] | None] | None]:
    """Every prompt once, serially or with several clients: the completions (or failures) in prompt order,
    and with --min-request-accepted-length each request's (drafts, accepted tokens)."""
    progress(f"soak: {len(prompts)} requests of {max_tokens} tokens, {options.concurrency} client(s) ...")
    soak_start = time.monotonic()
    soak_before = read_metrics(client, options.timeout)
    # Only a recording asks for log-probabilities: a checked server runs exactly the requests it serves.
    logprobs = options.top_logprobs if options.record is not None else 0
    per_request: list[tuple[int, int] | None] | None = None
    if options.min_request_accepted_length is not None:
        results, wall, per_request = _serial_soak_with_metrics(
            client, report.model, prompts, max_tokens, options.timeout, logprobs, not options.stop_at_eos
        )
    else:
        results, wall = _soak_requests(
            client,
            report.model,
            prompts,
            max_tokens,
            options.timeout,
            options.concurrency,
            logprobs,
            not options.stop_at_eos,
        )
    soak_after = read_metrics(client, options.timeout)
    done = [r for r in results if isinstance(r, Completion)]
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, RequestFailed)]
    tokens = sum(r.completion_tokens for r in done)
    soak = Step("soak", ok=not failed)
    soak.figures = {
        "requests": len(prompts),
        "succeeded": len(done),
        "failed": len(failed),
        "concurrency": options.concurrency,
        "max_tokens": max_tokens,
        "completion_tokens": tokens,
        "expected_completion_tokens": len(prompts) * max_tokens,
        "seconds": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
    }
    if done:
        latencies = [r.seconds for r in done]
        soak.figures["latency_p50_s"] = round(statistics.median(latencies), 4)
        soak.figures["latency_p95_s"] = round(_percentile(latencies, 0.95), 4)
    ttft = mean_delta(soak_before, soak_after, METRIC_TTFT_SUM, METRIC_TTFT_COUNT)
    if ttft is not None:
        soak.figures["ttft_mean_s"] = round(ttft, 4)
    decode = decode_rate(soak_before, soak_after)
    if decode is not None:
        soak.figures["decode_tokens_per_s"] = decode
    if per_request is not None:
        soak.figures["per_request_metrics"] = True  # /metrics read between requests: wall time includes it
    empty = [i for i, r in enumerate(results) if isinstance(r, Completion) and r.completion_tokens == 0]
    if empty:
        report.flag(soak, "empty", f"soak: {len(empty)} request(s) returned no tokens (first: #{empty[0]})")
    # Every request sets ignore_eos, so each runs to max_tokens: fewer is a server that stopped early.
    # With --stop-at-eos a request ends where the model's text does: counted, not a finding.
    short = [
        (i, r.completion_tokens)
        for i, r in enumerate(results)
        if isinstance(r, Completion) and 0 < r.completion_tokens < max_tokens
    ]
    if options.stop_at_eos:
        soak.figures["stopped_at_eos"] = len(short)
    elif short:
        index, count = short[0]
        report.flag(
            soak,
            "short",
            f"soak: {len(short)} request(s) returned fewer than the {max_tokens} tokens asked for, "
            f"{tokens} of {len(prompts) * max_tokens} in all (first: #{index}, {count} tokens)",
        )
    soak.seconds = round(time.monotonic() - soak_start, 3)
    report.steps.append(soak)
    for kind in sorted({r.kind for _, r in failed}):
        of_kind = [(i, r) for i, r in failed if r.kind == kind]
        index, error = of_kind[0]
        report.flag(
            soak,
            kind,
            f"soak: {len(of_kind)} of {len(prompts)} requests failed ({kind}); first #{index}: {error}",
        )
    return results, per_request


def prefix_cache_step(
    report: Report,
    options: Options,
    client: Client,
    max_tokens: int,
    progress: Callable[[str], None],
) -> None:
    """A long prompt cold, then again from the prefix cache: the same answer up to a near-tie flip (vLLM's
    cached and cold prefills run other batch shapes, so they may round apart). Each run's prefill time is
    the server's own time to first token, read from its histogram around that request alone."""
    with report.timed("prefix-cache", ok=False) as cache:
        long_prompt = cold_prompt(options.long_prompt_tokens, *options.vocab)
        before = read_metrics(client, options.timeout)
        k = options.top_logprobs
        label = f"prefix cache: a {len(long_prompt)}-token prompt"
        try:
            with heartbeat(progress, f"{label}, cold", options.progress_interval):
                cold = complete(client, report.model, long_prompt, max_tokens, options.first_timeout, k)
            between = read_metrics(client, options.timeout)
            with heartbeat(progress, f"{label}, cached", options.progress_interval):
                warm = complete(client, report.model, long_prompt, max_tokens, options.first_timeout, k)
        except RequestFailed as error:
            report.flag(cache, error.kind, f"long prompt: {error}")
            return
        after = read_metrics(client, options.timeout)
        cache.ok = True
        cache.figures = {
            "prompt_tokens": len(long_prompt),
            "cold_s": round(cold.seconds, 4),
            "cached_s": round(warm.seconds, 4),
            "speedup": round(cold.seconds / warm.seconds, 2) if warm.seconds > 0 else None,
        }
        for name, (start, end) in (
            ("cold_prefill_s", (before, between)),
            ("cached_prefill_s", (between, after)),
        ):
            ttft = mean_delta(start, end, METRIC_TTFT_SUM, METRIC_TTFT_COUNT)
            if ttft is not None:
                cache.figures[name] = round(ttft, 4)
        if warm.cached_tokens is not None:
            cache.figures["cached_tokens"] = warm.cached_tokens
        hits = None
        if between is not None and after is not None and METRIC_PREFIX_HITS in after:
            hits = int(after[METRIC_PREFIX_HITS] - between.get(METRIC_PREFIX_HITS, 0))
            cache.figures["prefix_cache_hit_tokens"] = hits
        if options.require_cache_hit:
            seen = warm.cached_tokens if warm.cached_tokens is not None else hits
            if seen is None:
                report.flag(
                    cache,
                    "no-cache-figures",
                    f"prefix cache: neither usage.prompt_tokens_details.cached_tokens nor /metrics' "
                    f"{METRIC_PREFIX_HITS} says whether the second {len(long_prompt)}-token prompt was "
                    "served "
                    "from the prefix cache",
                )
            elif seen <= 0:
                report.flag(
                    cache,
                    "no-cache-hit",
                    f"prefix cache: the second {len(long_prompt)}-token prompt hit no cached token "
                    "(is the server started with --enable-prefix-caching?)",
                )
        if output_of(cold) != output_of(warm):
            divergence = judge_divergence(
                output_of(warm), output_of(cold), cold.top_logprobs, options.tie_margin
            )
            cache.figures["tie_margin"] = options.tie_margin
            if divergence.near_tie:
                cache.figures["near_tie_flip"] = divergence.figures()
            else:
                cache.figures["first_difference"] = divergence.figures()
                report.flag(
                    cache,
                    "mismatch",
                    f"the cached long prompt answered differently from the cold one at token "
                    f"{divergence.at}: {divergence.describe('the cached answer', 'the cold answer')}",
                )


def context_step(
    report: Report,
    options: Options,
    client: Client,
    max_tokens: int,
    progress: Callable[[str], None],
) -> None:
    """One cold prompt of ``--context-tokens`` on a server long enough for it: HTTP 200, tokens generated,
    and DSpark's drafted and accepted tokens of that request alone (``/metrics`` read just before and just
    after it; another client's requests in between would be counted too, so none should run)."""
    with report.timed("long-context", ok=True) as step:
        tokens = options.context_tokens
        if tokens is None:
            step.skipped = (
                f"no --context-tokens (--profile reference sends {PROFILES['reference']['context_tokens']})"
            )
            return
        max_model_len = report.step("server").figures.get("max_model_len")
        needed = options.min_max_model_len or tokens + max_tokens
        step.figures = {"prompt_tokens": tokens, "max_model_len": max_model_len, "min_max_model_len": needed}
        if max_model_len is None:
            report.flag(
                step,
                "no-max-model-len",
                f"long context: /v1/models lists no max_model_len for {report.model!r}; expected at least "
                f"{needed}",
            )
            return
        if max_model_len < needed:
            report.flag(
                step,
                "max-model-len",
                f"long context: the server's max_model_len is {max_model_len}, expected at least {needed} "
                f"(--min-max-model-len) for a {tokens}-token prompt: serve with --max-model-len {needed} or "
                "more",
            )
            return
        prompt = cold_prompt(tokens, *options.vocab)
        before = read_metrics(client, options.timeout)
        label = f"long context: a {tokens}-token cold prompt (deadline {options.context_timeout:g} s)"
        try:
            with heartbeat(progress, label, options.progress_interval):
                result = complete(client, report.model, prompt, max_tokens, options.context_timeout)
        except RequestFailed as error:
            report.flag(step, error.kind, f"long context: {tokens}-token prompt: {error}")
            return
        after = read_metrics(client, options.timeout)
        step.figures |= {"completion_tokens": result.completion_tokens, "request_s": round(result.seconds, 3)}
        if result.cached_tokens is not None:
            step.figures["cached_tokens"] = result.cached_tokens
        ttft = mean_delta(before, after, METRIC_TTFT_SUM, METRIC_TTFT_COUNT)
        if ttft is not None:
            step.figures["prefill_s"] = round(ttft, 3)
        if result.completion_tokens <= 0:
            report.flag(step, "empty", f"long context: the {tokens}-token prompt returned no tokens")
        if options.speculation == "off":
            return
        if before is None or after is None:
            report.flag(
                step, "no-metrics", "long context: /metrics did not answer; drafted tokens cannot be counted"
            )
            return
        if METRIC_DRAFT_TOKENS not in after:
            return  # the speculation step says whether that is a finding
        drafted = int(after[METRIC_DRAFT_TOKENS] - before.get(METRIC_DRAFT_TOKENS, 0.0))
        accepted = int(after.get(METRIC_ACCEPTED_TOKENS, 0.0) - before.get(METRIC_ACCEPTED_TOKENS, 0.0))
        step.figures |= {
            "drafts": int(after.get(METRIC_DRAFTS, 0.0) - before.get(METRIC_DRAFTS, 0.0)),
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
        }
        if drafted <= 0:
            report.flag(
                step,
                "nothing-drafted",
                f"long context: no token was drafted on the {tokens}-token request ({METRIC_DRAFT_TOKENS} "
                "did "
                "not move)",
            )
