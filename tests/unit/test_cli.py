"""The `sparkseal` command offers the commands whose package is installed (the image ships a subset)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal import cli

REPO = Path(__file__).resolve().parents[2]
IMAGE_PACKAGES = {
    "sparkseal.core",
    "sparkseal.integrity",
    "sparkseal.kernels",
    "sparkseal.live_check",
    "sparkseal.scan",
    "sparkseal.vllm_integration",
}


def _commands(parser: object) -> set[str]:
    (subparsers,) = [a for a in parser._actions if a.dest == "command"]  # type: ignore[attr-defined]
    return set(subparsers.choices)


def test_every_command_is_offered_in_a_checkout() -> None:
    assert _commands(cli.build_parser()) == {
        "lock", "verify", "verify-modules", "serve", "scan", "nccl-diff", "live-check", "provenance",
    }  # fmt: skip


def test_an_image_installation_offers_its_own_commands_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def image_find_spec(name: str, *args: object) -> object:
        if name.startswith("sparkseal.") and name not in IMAGE_PACKAGES:
            return None
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", image_find_spec)
    assert _commands(cli.build_parser()) == {"verify-modules", "serve", "scan", "live-check"}
    with pytest.raises(SystemExit) as error:
        cli.main(["verify", "--help"])
    assert error.value.code == 2


@pytest.mark.parametrize("argv", [["--help"], ["lock", "--help"], ["lock", "vllm", "--help"]])
def test_help_as_a_program(argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "sparkseal", *argv], env=env, capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: sparkseal {' '.join(argv[:-1])}".rstrip() + " [-h]")
