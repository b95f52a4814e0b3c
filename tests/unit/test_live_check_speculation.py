"""The live check's speculation step: drafted and accepted tokens and the acceptance floors."""

from __future__ import annotations

from sparkseal.live_check.report import Report, Step, render
from sparkseal.live_check.speculation import request_floor
from tests.servers.fake_openai import Behaviour, FakeServer
from tests.unit.live_check_helpers import check, kinds


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
