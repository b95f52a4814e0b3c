"""`sparkseal live-check` from the command line: exit codes, the text and JSON reports, progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
        "first-request",
        "soak",
        "prefix-cache",
        "long-context",
        "speculation",
        "lossless",
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
