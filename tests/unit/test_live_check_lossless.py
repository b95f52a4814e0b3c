"""The live check's lossless step: a reference recorded, then replayed against the server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkseal.live_check.config import TOP_LOGPROBS, UsageError
from sparkseal.live_check.inputs import REFERENCE_FORMAT
from tests.servers.fake_openai import Behaviour, FakeServer, answer, ranked
from tests.unit.live_check_helpers import check, kinds, record


def test_record_then_against_passes_and_a_changed_completion_is_found(tmp_path: Path):
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = check(server, record=reference)
    assert recorded.ok and recorded.step("lossless").figures["recorded"] == 12
    document = json.loads(reference.read_text())
    assert document["format"] == REFERENCE_FORMAT and len(document["prompts"]) == 12

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


def test_reference_records_the_top_k_logprobs(tmp_path: Path):
    _, document = record(tmp_path)
    assert document["logprobs"] == TOP_LOGPROBS == 5
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
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, top_logprobs=0)
    assert str(error.value) == "argument --top-logprobs: expected a positive number, got '0'"
