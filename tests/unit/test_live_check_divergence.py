"""Near-tie flips: a first difference judged by the reference's recorded log-probabilities."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers.fake_openai import Behaviour, FakeServer, answer, ranked, runner_up
from tests.unit.live_check_helpers import FLAT, check, kinds, record


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_near_tie_flip_at_any_recorded_rank_is_counted_not_found(tmp_path: Path, rank: int):
    # A nearly flat model: the server's token at the first difference is the reference's 2nd to 5th best,
    # all within the 0.1 tie margin of the best. Only the runner-up counted before; now the margin decides.
    reference, _ = record(tmp_path, **FLAT)
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
    reference, document = record(tmp_path)
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
    reference, document = record(tmp_path)
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
