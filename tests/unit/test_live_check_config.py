"""The live check's options: profiles, defaults, and the arguments refused before any request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.live_check.config import OPTIONS, PROFILES, Options, UsageError, options_for, refusal
from sparkseal.live_check.run import run
from tests.servers.fake_openai import FakeServer
from tests.unit.live_check_helpers import check, prompts_file


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"min_request_accepted_length": 1.0, "concurrency": 4},
            "--min-request-accepted-length reads /metrics around each request, so it needs --concurrency 1 "
            "(got 4)",
        ),
        ({"min_acceptance": 1.5}, "--min-acceptance 1.5: expected a rate from 0 to 1"),
        (
            {"min_accepted_length": -1.0},
            "--min-accepted-length -1: expected tokens per draft step, at least 0",
        ),
        (
            {"min_acceptance": 0.2, "speculation": "off"},
            "acceptance floors need the speculation check: not with --speculation off",
        ),
    ],
)
def test_floor_arguments_that_cannot_hold_are_usage_errors(overrides: dict, message: str):
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, **overrides)
    assert str(error.value) == message


def test_prompts_and_a_reference_exclude_each_other(tmp_path: Path):
    prompts = prompts_file(tmp_path / "prompts.json", [[1, 2]])
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, prompts=prompts, against=tmp_path / "reference.json")
    assert (
        str(error.value)
        == "--prompts and --against exclude each other: the reference carries its own prompts"
    )


def test_profile_sets_defaults_and_what_is_given_wins():
    reference = options_for("reference", "http://127.0.0.1:1", soak=3, concurrency=2)
    assert (reference.soak, reference.concurrency, reference.max_tokens) == (3, 2, 64)
    assert (reference.long_prompt_tokens, reference.context_tokens) == (28_820, 660_000)
    assert reference.speculation == "required" and reference.require_cache_hit
    plain = options_for(None, "http://127.0.0.1:1")
    assert (plain.max_tokens, plain.long_prompt_tokens, plain.context_tokens) == (32, 2048, None)
    assert plain.speculation == "auto" and not plain.require_cache_hit
    # The command line's words: one check of the value, whoever gives it.
    with pytest.raises(UsageError) as error:
        options_for("nightly", "http://127.0.0.1:1")
    assert str(error.value) == "argument --profile: invalid choice: 'nightly' (choose from 'reference')"


def test_every_profile_sets_declared_options_to_values_they_accept():
    for values in PROFILES.values():
        assert set(values) <= set(OPTIONS)
        assert {name: refusal(name, value) for name, value in values.items()} == dict.fromkeys(values)


def test_arguments_of_the_added_steps_are_checked_before_any_request():
    with pytest.raises(UsageError) as error:
        run(options_for("reference", "http://127.0.0.1:1", context_tokens=2_000_000))
    assert str(error.value) == (
        "--min-max-model-len 1048576: a 2000000-token prompt and 64 generated tokens need at least 2000064"
    )
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(UsageError) as error:
        run(Options(url="http://127.0.0.1:1", teardown_pid=gone.pid))
    assert str(error.value) == f"--teardown-pid {gone.pid}: no such process"
