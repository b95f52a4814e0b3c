"""The live check's inputs: prompt files and recorded references, and their usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkseal.live_check.config import Options, UsageError
from sparkseal.live_check.run import run
from tests.servers.fake_openai import Behaviour, FakeServer, answer
from tests.unit.live_check_helpers import check, prompts_file, record


def test_malformed_reference_logprobs_are_a_usage_error(tmp_path: Path):
    reference, document = record(tmp_path)
    document["top_logprobs"][2] = [["a token", "not a number"]] * 8
    reference.write_text(json.dumps(document))
    with (
        FakeServer(Behaviour(perturb_request=2)) as server,
        pytest.raises(UsageError, match="top_logprobs of completion #2 are not \\[token, log-prob\\] pairs"),
    ):
        check(server, against=reference)


def test_against_a_file_of_another_format_is_a_usage_error(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something/2"}))
    with (
        FakeServer() as server,
        pytest.raises(UsageError, match="expected format 'sparkseal-live-reference/1'"),
    ):
        check(server, against=bad)
    with pytest.raises(UsageError, match="no such file"):
        run(Options(url="http://127.0.0.1:1", against=tmp_path / "missing.json"))


def test_prompts_file_drives_the_soak_and_the_reference(tmp_path: Path):
    held_out = [[11, 12, 13, 14], [21, 22, 23], [31, 32, 33, 34, 35]]
    prompts = prompts_file(tmp_path / "prompts.json", held_out)
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False)) as server:
        recorded = check(server, prompts=prompts, record=reference, soak=2)
        assert recorded.ok, recorded.findings
        assert server.behaviour.seen_prompts[:2] == [tuple(p) for p in held_out[:2]]
    document = json.loads(reference.read_text())
    assert document["prompts"] == held_out[:2]
    assert document["completions"] == [answer(p, 8) for p in held_out[:2]]
    with FakeServer() as server:
        replayed = check(server, against=reference)
    assert replayed.ok and replayed.step("lossless").figures["equal"] == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"format": "other/1", "prompts": [[1]]}, "expected format 'sparkseal-prompts/1', found 'other/1'"),
        ({"format": "sparkseal-prompts/1", "prompts": [[1, "2"]]}, "expected a non-empty list of non-empty"),
        ([[]], "expected a non-empty list of non-empty lists of token ids"),
    ],
)
def test_malformed_prompts_files_are_usage_errors(tmp_path: Path, content: object, message: str):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(content))
    with FakeServer() as server, pytest.raises(UsageError) as error:
        check(server, prompts=path)
    assert str(error.value).startswith(f"--prompts {path}: ") and message in str(error.value)
