"""The live check's speculation step: drafted and accepted tokens and the acceptance floors; acceptance the
way speculative-decoding users ask for it (issue 49): the per-position curve from vLLM's counters as deltas,
floors per position, requests that stop at their text's end, and a server whose speculative-token count does
not fit the draft refused before any request (the draft-fit step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkseal.live_check.config import UsageError
from sparkseal.live_check.metrics import parse_metrics, positions
from sparkseal.live_check.report import Report, Step, render
from sparkseal.live_check.speculation import request_floor
from tests.servers.fake_openai import MODEL, Behaviour, FakeServer
from tests.unit.live_check_helpers import check, cli, kinds

PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


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
    text = render(report, False)
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


def test_the_request_floor_names_the_requests_it_cannot_judge():
    """A request /metrics gave no counts for, or one with no draft step, is named, not dropped (issue 39)."""
    report = Report(url="http://127.0.0.1:1")
    step = Step("speculation", True)
    report.steps.append(step)
    request_floor(report, step, 1.0, [(2, 4), None, (0, 0), (2, 4), None])
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


def test_the_per_position_family_is_kept_by_position_beside_its_sum() -> None:
    text = "\n".join(
        f'{PER_POS}_total{{engine="0",model_name="{MODEL}",position="{p}"}} {v}'
        for p, v in ((0, 9.0), (1, 4.0), (2, 0.0))
    )
    metrics = parse_metrics(text + f'\n{PER_POS}_created{{position="0"}} 1.7e9\n')
    assert metrics[PER_POS] == 13.0
    assert positions(metrics) == {0: 9.0, 1: 4.0, 2: 0.0}


def test_the_curve_is_the_checks_own_deltas_per_draft_step() -> None:
    with FakeServer(Behaviour(accepted_per_draft=2)) as server:
        server.behaviour.accepted_per_position[0] = 1000.0  # a server-lifetime total before the check
        report = check(server)
    assert report.ok, report.findings
    assert report.step("speculation").figures["accepted_per_position"] == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_a_position_below_its_floor_is_named() -> None:
    with FakeServer(Behaviour(accepted_per_draft=2)) as server:
        report = check(server, min_position_acceptance=(0.9, 0.9, 0.5))
    assert kinds(report) == {("speculation", "low-position-acceptance")}
    (finding,) = report.findings
    drafts = report.step("speculation").figures["drafts"]
    assert finding.message == (
        f"speculation: position 2 of the draft block accepted a token in 0.0000 of {drafts} draft steps, "
        "below its floor 0.5 (--min-position-acceptance)"
    )
    assert report.step("speculation").figures["floor_position_acceptance"] == [0.9, 0.9, 0.5]


def test_floors_for_positions_the_server_does_not_export_are_a_finding() -> None:
    with FakeServer(Behaviour(accepted_per_draft=2, speculative_tokens=2)) as server:
        report = check(server, min_position_acceptance=(0.5, 0.5, 0.0))
    assert [f.message for f in report.findings] == [
        f"speculation: the server exports {PER_POS} for 2 positions, --min-position-acceptance names 3"
    ]


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ("0.5,x", "got '0.5,x'"),
        ("0.5,1.5", "got '0.5,1.5'"),
    ],
)
def test_position_floors_must_be_rates(typed: str, said: str) -> None:
    done = cli("http://127.0.0.1:9", "--min-position-acceptance", typed)
    assert done.returncode == 2
    assert (
        "argument --min-position-acceptance: expected rates from 0 to 1, one per position, as R0,R1,..., "
        + said
    ) in done.stderr


def test_requests_that_stop_at_their_end_are_counted_not_flagged() -> None:
    with FakeServer(Behaviour(stops_at=3)) as server:
        report = check(server, stop_at_eos=True)
    assert report.ok, report.findings
    soak = report.step("soak").figures
    assert soak["stopped_at_eos"] == soak["requests"] == 12
    assert soak["completion_tokens"] == 12 * 3


def test_without_stop_at_eos_every_request_runs_to_max_tokens() -> None:
    with FakeServer(Behaviour(stops_at=3)) as server:
        report = check(server)
    assert report.ok, report.findings
    assert report.step("soak").figures["completion_tokens"] == 12 * 8
    assert "stopped_at_eos" not in report.step("soak").figures


def draft_config(folder: Path, config: dict) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("config", [{"block_size": 5}, {"dflash_config": {"block_size": 5}}])
def test_a_draft_that_fits_the_server_passes(tmp_path: Path, config: dict) -> None:
    with FakeServer() as server:
        report = check(server, draft_config=draft_config(tmp_path, config))
    assert report.ok, report.findings
    assert report.step("draft-fit").figures == {"draft_block_size": 5, "speculative_tokens": 5}


def test_a_server_drafting_another_count_than_the_draft_is_refused_before_any_request(tmp_path: Path):
    path = draft_config(tmp_path, {"block_size": 7})
    with FakeServer() as server:
        report = check(server, draft_config=path)
        assert server.requests == 0
    assert [f.message for f in report.findings] == [
        f"draft fit: the server drafts 5 tokens per step, but the draft {path} was trained for blocks of 7: "
        'serve it with "num_speculative_tokens": 7'
    ]
    assert report.step("soak").skipped == "the draft does not fit the server"


def test_a_server_without_speculative_metrics_cannot_be_fitted(tmp_path: Path) -> None:
    path = draft_config(tmp_path, {"block_size": 5})
    with FakeServer(Behaviour(speculation=False)) as server:
        report = check(server, draft_config=path)
        assert server.requests == 0
    assert kinds(report) == {("draft-fit", "unknown-speculative-tokens")}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            '{"hidden_size": 256}',
            "no block_size (nor dflash_config.block_size): the draft's block size is not known",
        ),
        ('{"block_size": "5"}', "block_size is '5', expected a positive integer"),
        ("{", "not JSON: "),
    ],
)
def test_an_unusable_draft_config_is_refused_naming_the_file(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with FakeServer() as server, pytest.raises(UsageError) as raised:
        check(server, draft_config=path)
    assert str(raised.value).startswith(f"--draft-config {path}: {said}")


def test_a_missing_draft_config_is_refused(tmp_path: Path) -> None:
    with FakeServer() as server, pytest.raises(UsageError, match=r"--draft-config .*: No such file"):
        check(server, draft_config=tmp_path / "absent.json")
