"""The live check as a list of steps: each step is a function of its own module, run in this order."""

from __future__ import annotations

from collections.abc import Callable

from sparkseal.live_check.client import Client
from sparkseal.live_check.config import Options, check_options
from sparkseal.live_check.inputs import load_prompts, load_reference, soak_prompts
from sparkseal.live_check.logs import log_step, module_check_step, nccl_step
from sparkseal.live_check.lossless import lossless_step
from sparkseal.live_check.metrics import read_metrics
from sparkseal.live_check.replay import replay_step
from sparkseal.live_check.report import Report, Step
from sparkseal.live_check.speculation import draft_fit_step, speculation_step
from sparkseal.live_check.teardown import gpu_idle_step, teardown_step
from sparkseal.live_check.traffic import (
    context_step,
    first_request_step,
    prefix_cache_step,
    server_step,
    soak_step,
)


def run(options: Options, progress: Callable[[str], None] = lambda _line: None) -> Report:
    """Run every step against the server; findings go into the report, unreachable raises."""
    check_options(options)
    reference = load_reference(options.against) if options.against is not None else None
    given = load_prompts(options.prompts) if options.prompts is not None else None
    client = Client(options.url, options.api_key)
    report = Report(url=client.shown, profile=options.profile)
    if options.wait > 0:
        client.wait_until_ready(options.wait, options.timeout, progress)
    if not server_step(report, options, client):
        return _stop(report, options, progress, "the server check failed", first=True)
    metrics_before = read_metrics(client, options.timeout)
    if not draft_fit_step(report, options, metrics_before):
        return _stop(report, options, progress, "the draft does not fit the server", first=True)
    prompts, max_tokens = soak_prompts(options, reference, given, report.model)
    if not first_request_step(report, options, client, prompts[0], max_tokens, progress):
        return _stop(report, options, progress, "the first request failed", first=False)
    results, per_request = soak_step(report, options, client, prompts, max_tokens, progress)
    # A long cold prompt, then the same prompt from the prefix cache; one at the server's long context.
    prefix_cache_step(report, options, client, max_tokens, progress)
    context_step(report, options, client, max_tokens, progress)
    # Drafted and accepted tokens over the whole check; the soak against (or recorded as) the reference.
    speculation_step(report, options, metrics_before, read_metrics(client, options.timeout), per_request)
    lossless_step(report, options, prompts, results, max_tokens, reference)
    # What the draft steps wrote where, counted in the engine: before the teardown, while it answers.
    replay_step(report, options, client)
    _closing_steps(report, options, progress)
    return report


def _stop(report: Report, options: Options, progress: Callable[[str], None], why: str, first: bool) -> Report:
    """The request steps skipped for ``why`` (the first request too, if ``first``), then the closing steps."""
    names = ("first-request",) * first + (
        "soak",
        "prefix-cache",
        "long-context",
        "speculation",
        "lossless",
        "dspark-replay",
    )
    for name in names:
        report.steps.append(Step(name, ok=False, skipped=why))
    _closing_steps(report, options, progress)
    return report


def _closing_steps(report: Report, options: Options, progress: Callable[[str], None]) -> None:
    """Teardown when asked, then what the logs say: run also when the requests failed, since a failing rank
    is why they may have; after the teardown, since a server's last words and NCCL's come as it stops."""
    stopped = teardown_step(report, options, progress)
    gpu_idle_step(report, options, progress, stopped)
    log_step(report, options)
    module_check_step(report, options)
    nccl_step(report, options)
