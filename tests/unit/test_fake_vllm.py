"""The fake ``vllm serve`` of tests/servers/fake_vllm.py: it reads the serving recipe's own server arguments
as vLLM would for what the reference validation checks, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import urllib.request

from tests.recipe import PAGE, REPO, recipe_steps
from tests.servers.fake_vllm import DEFAULT_MAX_MODEL_LEN, behaviour_for, parse
from tests.servers.loopback import free_port, wait_listening


def server_arguments(step: str, port: int = 18000) -> list[str]:
    """The arguments the page's ``step`` gives the server (after ``"$IMAGE"``), as the shell splits them
    with ``PORT`` set to ``port``."""
    text = next(s.text for s in recipe_steps(PAGE.read_text(), "gb10") if s.name == step)
    command = shlex.split(text.replace("\\\n", " ").replace("$PORT", str(port)).splitlines()[0])
    return command[command.index("$IMAGE") + 1 :]


def test_the_recipes_dspark_server_drafts_at_the_reference_length() -> None:
    args, ignored = parse(server_arguments("serve"))
    assert (args.model, args.port, args.max_model_len) == ("/models/target", 18000, 1_048_576)
    assert args.speculative_config["method"] == "dspark"
    behaviour = behaviour_for(args)
    assert behaviour.speculation and behaviour.max_model_len == 1_048_576 and behaviour.prefix_caching
    assert "--max-num-seqs" in ignored and "--compilation-config" in ignored


def test_the_recipes_reference_server_drafts_nothing() -> None:
    args, _ = parse(server_arguments("serve-reference"))
    assert not behaviour_for(args).speculation
    assert behaviour_for(parse(["/m", "--no-enable-prefix-caching"])[0]).prefix_caching is False
    assert parse(["/m"])[0].max_model_len == DEFAULT_MAX_MODEL_LEN < 1_048_576


def test_it_serves_then_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    spec = json.dumps({"method": "dspark", "model": "/models/draft", "num_speculative_tokens": 5})
    argv = ["/models/target", "--port", str(port), "--max-model-len", "1048576", "--speculative-config", spec]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers.fake_vllm", *argv, "--max-num-seqs", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert wait_listening(proc, port, timeout=30) is None, proc.communicate()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as answer:
            card = json.load(answer)["data"][0]
        assert card["max_model_len"] == 1_048_576
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert "vllm:spec_decode_num_drafts_total" in answer.read().decode()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert f"listening on http://127.0.0.1:{port}, max_model_len 1048576" in output
    assert "'--max-num-seqs', '1'" in output and output.endswith("shutting down on a signal\n")
