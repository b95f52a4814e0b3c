"""What the live check's tests share: small options, the fake server's runs, fake logs and nvidia-smi."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from sparkseal.live_check.config import Options, options_for
from sparkseal.live_check.run import run
from tests.servers.fake_openai import Behaviour, FakeServer

REPO = Path(__file__).resolve().parents[2]


SMALL = {"soak": 12, "max_tokens": 8, "prompt_tokens": 16, "long_prompt_tokens": 256, "timeout": 5.0}


# A nearly flat model: its five best tokens lie within 0.08 in log-probability.
FLAT = {"runner_up_gap": 0.02, "rank_step": 0.02}


def check(server: FakeServer, **overrides: object):
    options = Options(url=server.url, **{**SMALL, "first_timeout": 5.0, **overrides})
    return run(options)


def kinds(report) -> set[tuple[str, str]]:
    return {(finding.check, finding.kind) for finding in report.findings}


def long_prompt_tokens(server: FakeServer) -> tuple[int, ...]:
    return server.behaviour.seen_prompts[-1]  # the last distinct prompt: the soak's come first


def record(tmp_path: Path, **behaviour: object) -> tuple[Path, dict]:
    """Record a reference as the lossless check's users do: from the same model, without speculation."""
    reference = tmp_path / "reference.json"
    with FakeServer(Behaviour(speculation=False, **behaviour)) as server:
        recorded = check(server, record=reference)
    assert recorded.ok, recorded.findings
    return reference, json.loads(reference.read_text())


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "live-check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


FIXTURES = REPO / "tests" / "fixtures" / "nccl"


def tp2_logs(tmp_path: Path, kind: str, ranks_logged: tuple[int, ...] = (0, 1)) -> tuple[Path, Path]:
    """A TP=2 server log with the plugin's line per rank, and a folder of NCCL logs (one per process)."""
    server = tmp_path / "server.log"
    lines = ["(APIServer pid=10) INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM API server"]
    for rank in ranks_logged:
        lines.append(
            f"(Worker_TP{rank} pid={20 + rank}) INFO 12-01 10:00:05 [plugin.py:180] "
            f"sparkseal: rank {rank} of 2: vllm, torch, sparkseal identical on every rank (digest 5f2a9c)"
        )
    server.write_text("\n".join(lines) + "\n")
    folder = tmp_path / "nccl"
    folder.mkdir()
    for rank in (0, 1):
        shutil.copy(FIXTURES / f"{kind}.rank{rank}.log", folder / f"nccl.vm.{640 + rank}.log")
    (folder / "nccl.vm.10.log").write_text(
        "vm:10:10 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
    )  # no collectives
    return server, folder


def prompts_file(path: Path, prompts: object, fmt: str = "sparkseal-prompts/1") -> Path:
    path.write_text(json.dumps({"format": fmt, "prompts": prompts}))
    return path


PREFILL = 1e-3  # the fake's seconds of time to first token per uncached prompt token, in these tests


def profiled(server: FakeServer, **given: object):
    return run(options_for("reference", server.url, timeout=5.0, **given))


SMALL_PROFILE = {"soak": 3, "max_tokens": 6, "long_prompt_tokens": 64, "first_timeout": 5.0}


def nvidia_smi(folder: Path, *answers: str, status: int = 0) -> Path:
    """A fake nvidia-smi on PATH: each call prints the next answer (the last one again), exit ``status``."""
    folder.mkdir(exist_ok=True)
    (folder / "answers").write_text(json.dumps(list(answers)))
    script = folder / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        "here = pathlib.Path(__file__).parent\n"
        "answers = json.loads((here / 'answers').read_text())\n"
        "calls = here / 'calls'\n"
        "n = int(calls.read_text()) if calls.exists() else 0\n"
        "calls.write_text(str(n + 1))\n"
        "print(answers[min(n, len(answers) - 1)])\n"
        f"sys.exit({status})\n"
    )
    script.chmod(0o755)
    return folder


TEARDOWN = {"idle_poll": 0.05, "idle_timeout": 0.3, "teardown_timeout": 5.0}
