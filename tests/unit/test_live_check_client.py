"""The live check's HTTP client against a fake server: errors by kind, waiting, unreachable, redaction."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sparkseal.live_check.client import Unreachable
from sparkseal.live_check.config import Options, UsageError
from sparkseal.live_check.run import run
from tests.servers.fake_openai import Behaviour, FakeServer
from tests.servers.loopback import free_port
from tests.unit.live_check_helpers import SMALL, check, kinds


def test_http_500_is_a_finding_with_the_servers_message():
    with FakeServer(Behaviour(status=500)) as server:
        report = check(server)
    assert kinds(report) == {("first-request", "http-error")}
    assert "HTTP 500" in report.findings[0].message and "EngineCore died" in report.findings[0].message


def test_malformed_json_is_a_finding():
    with FakeServer(Behaviour(malformed=True)) as server:
        report = check(server)
    assert kinds(report) == {("first-request", "malformed")}
    assert "/v1/completions: answer is not JSON" in report.findings[0].message


def test_answer_without_usage_is_malformed():
    with FakeServer(Behaviour(drop_usage=True)) as server:
        report = check(server)
    assert kinds(report) == {("first-request", "malformed")}
    assert "usage.completion_tokens" in report.findings[0].message


def test_unreachable_server_raises():
    with pytest.raises(Unreachable, match="Connection refused"):
        run(Options(url=f"http://127.0.0.1:{free_port()}", **SMALL))


def test_wait_lets_a_server_that_is_still_starting_answer():
    port = free_port()
    started: list[FakeServer] = []

    def start_late() -> None:
        time.sleep(1.5)  # refused connections first, as from a server still loading its model
        started.append(FakeServer(port=port).__enter__())

    late = threading.Thread(target=start_late)
    late.start()
    try:
        begin = time.monotonic()
        report = run(Options(url=f"http://127.0.0.1:{port}", **SMALL, wait=30.0))
    finally:
        late.join()
        for server in started:
            server.__exit__(None, None, None)
    assert report.ok, report.findings
    assert time.monotonic() - begin >= 1.5


def test_wait_past_its_deadline_is_unreachable_with_the_last_error():
    begin = time.monotonic()
    with pytest.raises(Unreachable) as error:
        run(Options(url=f"http://127.0.0.1:{free_port()}", **SMALL, wait=2.0))
    assert time.monotonic() - begin >= 1.0
    assert "/v1/models: no answer within 2 s (--wait); last: " in str(error.value)
    assert "Connection refused" in str(error.value)
    with pytest.raises(UsageError, match="--wait -1: expected seconds, at least 0"):
        run(Options(url="http://127.0.0.1:1", **SMALL, wait=-1.0))


def test_credentials_in_the_url_never_appear(tmp_path: Path):
    port = free_port()
    with pytest.raises(Unreachable) as error:
        run(Options(url=f"http://operator:s3cret-pass@127.0.0.1:{port}", **SMALL))
    assert "s3cret-pass" not in str(error.value) and f"127.0.0.1:{port}" in str(error.value)
