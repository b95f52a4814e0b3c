"""The DSpark replay check's counting and findings (sparkseal.core.dspark_replay), on hand-made steps laid
out as vLLM 0.25.1's draft-input kernel leaves them, patched (0001) and unpatched."""

from __future__ import annotations

import pytest

from sparkseal.core.dspark_replay import FORMAT, Tally, count_padding, count_step, findings, report

PAD = -1
BLOCK = 16
# Two requests: 4 target rows (the last 2 rejected drafts) in blocks 3, and 6 rows (1 rejected) in block 5.
STARTS = [0, 4, 10]
REJECTED = [2, 1]
# What the patched kernel writes: rejected rows get PAD.
PATCHED_CONTEXT = [3 * BLOCK + p for p in (8, 9)] + [PAD, PAD] + [5 * BLOCK + p for p in range(5)] + [PAD]
# What v0.25.1's kernel writes: every row a real slot.
UNPATCHED_CONTEXT = [3 * BLOCK + p for p in (8, 9, 10, 11)] + [5 * BLOCK + p for p in range(6)]
QUERIES = [3 * BLOCK + 10 + i for i in range(6)] + [5 * BLOCK + 5 + i for i in range(6)]


def test_a_patched_step_gives_rejected_rows_no_slot() -> None:
    tally = count_step(STARTS, REJECTED, PATCHED_CONTEXT, QUERIES, BLOCK, PAD)
    assert (tally.steps, tally.context_rows, tally.rejected_rows, tally.rejected_rows_written) == (
        1,
        10,
        3,
        0,
    )
    assert (tally.query_rows, tally.null_block_query_rows, tally.null_block_context_rows) == (12, 0, 0)


def test_an_unpatched_step_writes_every_rejected_row() -> None:
    tally = count_step(STARTS, REJECTED, UNPATCHED_CONTEXT, QUERIES, BLOCK, PAD)
    assert (tally.rejected_rows, tally.rejected_rows_written) == (3, 3)


def test_slots_in_block_zero_count_as_null_block_writes_and_pad_does_not() -> None:
    context = [0, 1, PAD, BLOCK] + [5 * BLOCK + p for p in range(6)]
    tally = count_step(STARTS, [0, 0], context, [BLOCK - 1, PAD, BLOCK], BLOCK, PAD)
    assert (tally.null_block_context_rows, tally.null_block_query_rows) == (2, 1)


def test_a_warm_up_step_counts_only_its_query_rows() -> None:
    tally = count_step([0, 6], [0], [0] * 6, [0, 1, 2, PAD], BLOCK, PAD, warmup=True)
    assert (tally.steps, tally.warmup_steps, tally.context_rows, tally.warmup_null_block_query_rows) == (
        0,
        1,
        0,
        3,
    )


def test_padded_sample_rows_must_carry_minus_one() -> None:
    assert count_padding([-1, -1, -1]) == Tally(padded_sample_rows=3)
    assert count_padding([0, -1, 0]) == Tally(padded_sample_rows=3, padded_sample_rows_as_request=2)


def test_add_sums_counts_and_keeps_the_capture_rows() -> None:
    tally = Tally(steps=1, rejected_rows=2, capture_rows_written=[0])
    tally.add(Tally(steps=2, rejected_rows=1, capture_rows_written=[5]))
    assert (tally.steps, tally.rejected_rows, tally.capture_rows_written) == (3, 3, [0])


def clean() -> Tally:
    return Tally(
        steps=10,
        context_rows=40,
        rejected_rows=12,
        query_rows=60,
        padded_sample_rows=35,
        capture_rows_written=[],
    )


def test_a_clean_report_has_no_findings() -> None:
    answer = report(clean(), {"model.layers.4.self_attn.attn": 0})
    assert answer["format"] == FORMAT
    assert findings(answer) == []


@pytest.mark.parametrize(
    ("change", "bytes_", "expected"),
    [
        (
            {"rejected_rows_written": 12},
            0,
            "draft K/V of rejected tokens: 12 of 12 rejected context rows were "
            "given a cache slot in 10 draft steps (expected none)",
        ),
        (
            {"warmup_null_block_query_rows": 7},
            0,
            "draft K/V written into the null block 0: 0 context rows and "
            "0 query rows of requests, 7 query rows of warm-up runs (expected none)",
        ),
        (
            {},
            4096,
            "the null block 0 of the draft's KV cache holds data (non-zero bytes): "
            "model.layers.4.self_attn.attn 4096",
        ),
        (
            {"padded_sample_rows_as_request": 5},
            0,
            "padded sample rows acting as a request: 5 of 35 padded rows "
            "of graph replays carried a request index (expected -1)",
        ),
        (
            {"capture_rows_written": [0]},
            0,
            "padded sample rows acting as request slot 0: graph capture, where "
            "every sample row is padding, wrote that request's draft logits",
        ),
    ],
)
def test_each_bug_of_0001_is_named(change: dict, bytes_: int, expected: str) -> None:
    tally = clean()
    for name, value in change.items():
        setattr(tally, name, value)
    assert findings(report(tally, {"model.layers.4.self_attn.attn": bytes_})) == [expected]


def test_a_report_without_draft_steps_checked_nothing() -> None:
    assert findings(report(Tally(), {}), rank=1) == [
        "rank 1: the replay probe saw no draft step of a request: nothing was checked"
    ]


def test_another_format_is_refused() -> None:
    assert findings({"format": "x/2"}) == [f"the replay probe answered format 'x/2', expected {FORMAT!r}"]


def test_steps_the_probe_could_not_read_are_a_finding_that_names_the_error() -> None:
    tally = clean()
    tally.unread_steps = 3
    answer = report(
        tally, {}, "propose: AttributeError: 'X' object has no attribute '_context_slot_mappings'"
    )
    assert findings(answer) == [
        "the replay probe could not read 3 draft steps of 13: propose: AttributeError: 'X' object has no "
        "attribute '_context_slot_mappings'"
    ]
