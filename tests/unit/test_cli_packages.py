"""The `sparkseal` command offers the commands whose package is installed (the image ships a subset)."""

from __future__ import annotations

import importlib.util

import pytest

from sparkseal import cli

IMAGE_PACKAGES = {
    "sparkseal.core",
    "sparkseal.integrity",
    "sparkseal.kernels",
    "sparkseal.live_check",
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
