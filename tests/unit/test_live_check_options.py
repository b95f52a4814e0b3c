"""`sparkseal live-check` from the command line: exit codes, the text and JSON reports, progress."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sparkseal.live_check.run
from sparkseal import cli as sparkseal_cli
from sparkseal.live_check.config import PROFILES, Options, UsageError, check_options
from tests.servers.fake_openai import Behaviour, FakeServer
from tests.servers.loopback import free_port
from tests.unit.live_check_helpers import REPO, cli

# `sparkseal live-check --help` at 80 columns, recorded from the parser as it was written by hand before its
# options became one table (issue 52): whatever builds the parser must reproduce it byte for byte.
HELP = REPO / "tests" / "fixtures" / "live_check" / "help.80.txt"


def test_help_is_the_recorded_text_byte_for_byte():
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "sparkseal", "live-check", "--help"],
        capture_output=True,
        cwd=REPO,
        env=env,
        check=False,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == HELP.read_bytes()


def test_cli_exit_codes_and_json(tmp_path: Path):
    with FakeServer() as server:
        passed = cli(server.url, "--soak", "4", "--max-tokens", "4", "--long-prompt-tokens", "64", "--json")
    assert passed.returncode == 0, passed.stderr
    document = json.loads(passed.stdout)
    assert document["ok"] is True and [s["name"] for s in document["steps"]] == [
        "server",
        "draft-fit",
        "first-request",
        "soak",
        "prefix-cache",
        "long-context",
        "speculation",
        "lossless",
        "dspark-replay",
        "teardown",
        "gpu-idle",
        "server-log",
        "module-check",
        "nccl",
    ]
    with FakeServer(Behaviour(drafting=False)) as server:
        finding = cli(server.url, "--soak", "2", "--long-prompt-tokens", "32")
    assert finding.returncode == 1
    assert "finding: speculation: configured, but no token was drafted" in finding.stdout
    unreachable = cli(f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 2 and "server unreachable" in unreachable.stderr
    usage = cli("http://127.0.0.1:1", "--record", "a.json", "--against", "b.json")
    assert usage.returncode == 2 and "not allowed with argument" in usage.stderr
    bad_vocab = cli("http://127.0.0.1:1", "--vocab", "900:100")
    assert bad_vocab.returncode == 2 and "expected LOW:HIGH with LOW < HIGH" in bad_vocab.stderr
    missing_log = cli("http://127.0.0.1:1", "--log", str(tmp_path / "none.log"))
    assert missing_log.returncode == 2 and "none.log: no such file" in missing_log.stderr
    no_logprobs = cli("http://127.0.0.1:1", "--top-logprobs", "0")
    assert no_logprobs.returncode == 2 and "expected a positive number, got '0'" in no_logprobs.stderr
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = cli(
            server.url,
            "--soak",
            "2",
            "--long-prompt-tokens",
            "32",
            "--top-logprobs",
            "6",
            "--record",
            str(reference),
        )
    assert recorded.returncode == 0, recorded.stderr
    assert len(json.loads(reference.read_text())["top_logprobs"][0][0]) == 6


def test_cli_floors_in_text_and_json():
    with FakeServer(Behaviour(weak_request=1, weak_accepted_per_draft=0)) as server:
        failed = cli(
            server.url,
            "--soak",
            "3",
            "--max-tokens",
            "6",
            "--long-prompt-tokens",
            "32",
            "--min-accepted-length",
            "1.0",
            "--min-request-accepted-length",
            "1.0",
            "--json",
        )
    assert failed.returncode == 1, failed.stderr
    document = json.loads(failed.stdout)
    assert [(f["check"], f["kind"]) for f in document["findings"]] == [
        ("speculation", "low-request-acceptance")
    ]
    speculation = next(s for s in document["steps"] if s["name"] == "speculation")
    assert speculation["details"]["per_request"] == [[2, 4], [2, 0], [2, 4]]
    assert speculation["figures"]["floor_request_accepted_per_draft"] == 1.0
    assert "details" not in next(s for s in document["steps"] if s["name"] == "soak")
    with FakeServer() as server:
        passed = cli(server.url, "--soak", "2", "--long-prompt-tokens", "32", "--min-acceptance", "0.4")
    assert passed.returncode == 0, passed.stdout
    assert "floor_acceptance 0.4" in passed.stdout and passed.stdout.endswith("result: pass\n")
    usage = cli("http://127.0.0.1:1", "--min-request-accepted-length", "1", "--concurrency", "2")
    assert usage.returncode == 2 and "needs --concurrency 1 (got 2)" in usage.stderr


def test_cli_reference_profile_shows_progress_on_stderr_and_times_every_step(tmp_path: Path):
    with FakeServer() as server:
        done = cli(
            server.url,
            "--profile",
            "reference",
            "--soak",
            "3",
            "--max-tokens",
            "4",
            "--long-prompt-tokens",
            "64",
            "--context-tokens",
            "2000",
            "--json",
        )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["profile"] == "reference" and document["ok"] is True
    assert all(isinstance(step["seconds"], float) for step in document["steps"])
    context = next(step for step in document["steps"] if step["name"] == "long-context")
    assert context["figures"]["prompt_tokens"] == 2000
    assert context["figures"]["min_max_model_len"] == 1_048_576
    assert "live-check: first request ..." in done.stderr.splitlines()
    assert "live-check: long context: a 2000-token cold prompt (deadline 1800 s) ..." in done.stderr
    too_long = cli("http://127.0.0.1:1", "--profile", "reference", "--context-tokens", "2000000")
    assert too_long.returncode == 2
    assert (
        "--min-max-model-len 1048576: a 2000000-token prompt and 64 generated tokens need at least 2000064"
        in (too_long.stderr)
    )
    with FakeServer(Behaviour(speculation=False)) as server:
        required = cli(
            server.url,
            "--profile",
            "reference",
            "--soak",
            "2",
            "--long-prompt-tokens",
            "32",
            "--context-tokens",
            "100",
        )
    assert required.returncode == 1 and "speculative decoding is not configured" in required.stdout


def _cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The message of `sparkseal live-check ARGS`'s usage error, run in this process."""
    with pytest.raises(SystemExit) as exit_:
        sparkseal_cli.main(["live-check", "http://127.0.0.1:1", *args])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("sparkseal live-check: error: ")
    return last.removeprefix("sparkseal live-check: error: ")


# One bad value each: the command line's words, which a Python caller hears too.
REFUSALS = [
    (("--soak", "0"), {"soak": 0}, "argument --soak: expected a positive number, got '0'"),
    (
        ("--context-timeout", "0"),
        {"context_timeout": 0.0},
        "argument --context-timeout: expected a positive number, got '0'",
    ),
    (
        ("--timeout", "nan"),
        {"timeout": math.nan},
        "argument --timeout: expected a positive number, got 'nan'",
    ),
    (
        ("--teardown-pid", "0"),
        {"teardown_pid": 0},
        "argument --teardown-pid: expected a positive number, got '0'",
    ),
    (
        ("--speculation", "bogus"),
        {"speculation": "bogus"},
        "argument --speculation: invalid choice: 'bogus' (choose from 'auto', 'required', 'off')",
    ),
    (
        ("--vocab", "900:100"),
        {"vocab": (900, 100)},
        "argument --vocab: expected LOW:HIGH with LOW < HIGH (token ids), got '900:100'",
    ),
    (("--wait", "-1"), {"wait": -1.0}, "--wait -1: expected seconds, at least 0"),
    (
        ("--min-acceptance", "1.5"),
        {"min_acceptance": 1.5},
        "--min-acceptance 1.5: expected a rate from 0 to 1",
    ),
    (
        ("--idle-utilization", "101"),
        {"idle_utilization": 101.0},
        "--idle-memory-mib 512, --idle-utilization 101: expected MiB at least 0 and a percentage from 0 "
        "to 100",
    ),
    (
        ("--record", "a.json", "--against", "b.json"),
        {"record": Path("a.json"), "against": Path("b.json")},
        "argument --against: not allowed with argument --record",
    ),
]


@pytest.mark.parametrize(("args", "given", "message"), REFUSALS, ids=[args[0] for args, _, _ in REFUSALS])
def test_a_bad_value_is_refused_in_the_same_words_typed_or_given(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], given: dict, message: str
):
    assert _cli_error(capsys, *args) == message
    with pytest.raises(UsageError) as error:
        check_options(Options(url="http://127.0.0.1:1", **given))
    assert str(error.value) == message


def test_a_profiles_values_meet_the_same_checks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(PROFILES["reference"], "max_tokens", 0)
    assert _cli_error(capsys, "--profile", "reference") == (
        "argument --max-tokens: expected a positive number, got '0'"
    )
    assert _cli_error(capsys, "--profile", "reference", "--max-tokens", "-1") == (
        "argument --max-tokens: expected a positive number, got '-1'"
    )


def test_typed_beats_the_profile_and_the_profile_beats_the_default(monkeypatch: pytest.MonkeyPatch):
    ran: list[Options] = []

    def run(options: Options, progress: object) -> None:
        ran.append(options)
        raise SystemExit(0)

    monkeypatch.setattr(sparkseal.live_check.run, "run", run)
    for args in (
        ["--profile", "reference", "--soak", "3", "--no-require-cache-hit", "--speculation", "auto"],
        ["--soak", "3", "--require-cache-hit"],
    ):
        with pytest.raises(SystemExit):
            sparkseal_cli.main(["live-check", "http://127.0.0.1:1", *args])
    profiled, plain = ran
    assert (profiled.soak, profiled.require_cache_hit, profiled.speculation) == (3, False, "auto")
    assert (profiled.max_tokens, profiled.context_tokens, profiled.timeout) == (64, 660_000, 60.0)
    assert (plain.soak, plain.require_cache_hit, plain.max_tokens, plain.context_tokens) == (
        3,
        True,
        32,
        None,
    )
    assert plain == Options(url="http://127.0.0.1:1", soak=3, require_cache_hit=True)
