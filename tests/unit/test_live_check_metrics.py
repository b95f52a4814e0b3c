"""The live check's reading of the server's Prometheus counters (sparkseal/live_check/metrics.py)."""

from __future__ import annotations

from sparkseal.live_check.metrics import parse_metrics


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
