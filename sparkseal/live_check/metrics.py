"""The server's Prometheus counters (``/metrics``): read, summed over labels, differenced."""

from __future__ import annotations

import re

from sparkseal.live_check.client import Client, RequestFailed

# Prometheus counters of vLLM's v1 engine (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py).
METRIC_DRAFTS = "vllm:spec_decode_num_drafts"


METRIC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"


METRIC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"


# Accepted draft tokens by their position in the draft block, one series per position="N" label: vLLM
# creates them at start-up, one per speculative token, so their count is the server's speculative-token count.
METRIC_ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


METRIC_PREFIX_QUERIES = "vllm:prefix_cache_queries"


METRIC_PREFIX_HITS = "vllm:prefix_cache_hits"


METRIC_TTFT_SUM = "vllm:time_to_first_token_seconds_sum"


METRIC_TTFT_COUNT = "vllm:time_to_first_token_seconds_count"


METRIC_GENERATION_SUM = "vllm:request_generation_tokens_sum"


METRIC_DECODE_SUM = "vllm:request_decode_time_seconds_sum"


METRIC_DECODE_COUNT = "vllm:request_decode_time_seconds_count"


def position_key(position: int) -> str:
    """The key ``parse_metrics`` keeps one position's accepted tokens under, beside the family's sum."""
    return f"{METRIC_ACCEPTED_PER_POSITION}@{position}"


def positions(metrics: dict[str, float] | None) -> dict[int, float]:
    """Accepted draft tokens per position of the draft block, as ``parse_metrics`` kept them."""
    prefix = METRIC_ACCEPTED_PER_POSITION + "@"
    return {int(k.removeprefix(prefix)): v for k, v in (metrics or {}).items() if k.startswith(prefix)}


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each Prometheus sample family over its labels (``_total`` folded into the family name); the
    per-position acceptance family also per position (``position_key``)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not match:
            continue
        name = match.group(1)
        if name.endswith("_created"):
            continue
        name = name.removesuffix("_total")
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
        if name == METRIC_ACCEPTED_PER_POSITION:
            label = re.search(r'position="(\d+)"', match.group(2) or "")
            if label:
                key = position_key(int(label.group(1)))
                totals[key] = totals.get(key, 0.0) + value
    return totals


def read_metrics(client: Client, timeout: float) -> dict[str, float] | None:
    try:
        return parse_metrics(client.get_text("/metrics", timeout))
    except RequestFailed:
        return None


def mean_delta(
    before: dict[str, float] | None, after: dict[str, float] | None, total: str, count: str
) -> float | None:
    """The mean of a Prometheus histogram over an interval (its _sum and _count deltas)."""
    if before is None or after is None or total not in after or count not in after:
        return None
    n = after[count] - before.get(count, 0.0)
    return (after[total] - before.get(total, 0.0)) / n if n > 0 else None


def decode_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Tokens per second of one request's decoding, from vLLM's per-request histograms over an interval:
    each request's tokens after the first over its first-to-last-token time, summed over requests."""
    if (
        before is None
        or after is None
        or METRIC_DECODE_SUM not in after
        or METRIC_GENERATION_SUM not in after
    ):
        return None
    seconds = after[METRIC_DECODE_SUM] - before.get(METRIC_DECODE_SUM, 0.0)
    requests = after.get(METRIC_DECODE_COUNT, 0.0) - before.get(METRIC_DECODE_COUNT, 0.0)
    tokens = after[METRIC_GENERATION_SUM] - before.get(METRIC_GENERATION_SUM, 0.0) - requests
    return round(tokens / seconds, 1) if seconds > 0 and tokens > 0 else None
