"""Acceptance the way speculative-decoding users ask for it (issue 49): the per-position curve from vLLM's
counters as deltas, floors per position, requests that stop at their text's end, and a server whose
speculative-token count does not fit the draft refused before any request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkseal.live_check.config import UsageError
from sparkseal.live_check.metrics import parse_metrics, positions
from tests.servers.fake_openai import MODEL, Behaviour, FakeServer
from tests.unit.live_check_helpers import check, cli, kinds

PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


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
        server.behaviour.counters[f"{PER_POS}@0"] = 1000.0  # a server-lifetime total before the check
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
