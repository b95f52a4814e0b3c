"""`sparkseal verify`'s locale variation on an auditor's machine: which second locale the rebuild gets, what
the report says when there is none, and the set-up that compiles ours (`make tools` as well as `make setup`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sparkseal.audit import rebuild
from sparkseal.audit.rebuild import second_locale

REPO = Path(__file__).resolve().parents[2]
# What `locale -a` lists on a bookworm machine where no locale was compiled: glibc's built-in C.UTF-8.
BARE = ["C", "C.utf8", "POSIX"]


@pytest.mark.parametrize(
    ("current", "available", "expected"),
    [
        ("C.UTF-8", [*BARE, "fr_CH.utf8"], "fr_CH.UTF-8"),
        ("fr_CH.UTF-8", ["C.utf8", "fr_CH.utf8", "en_US.utf8"], "en_US.utf8"),
        ("en_US.UTF-8", BARE, "C.UTF-8"),  # `make tools` not run: still varied, to glibc's own
        ("unset", BARE, "C.UTF-8"),
        ("C.UTF-8", BARE, None),  # nothing else that Bazel can run under
        ("C.UTF-8", ["de_DE", "de_DE.iso88591"], None),  # not UTF-8
    ],
)
def test_the_second_locale_is_another_installed_utf8_one(
    current: str, available: list[str], expected: str | None
) -> None:
    assert second_locale(current, available) == expected


def _second(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, available: list[str], **env: str) -> tuple:
    monkeypatch.setattr(rebuild, "installed_locales", lambda: available)
    for name in ("LANG", "LC_ALL", "LC_CTYPE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    environment, variations, _ = rebuild.second_environment(tmp_path / "home")
    return environment, variations["LANG/LC_ALL"]


def test_the_rebuild_runs_under_the_second_locale_or_says_why_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    environment, change = _second(monkeypatch, tmp_path, BARE, LANG="en_US.UTF-8", LC_CTYPE="en_US.UTF-8")
    assert change == "en_US.UTF-8 -> C.UTF-8"
    assert (environment["LANG"], environment["LC_ALL"]) == ("C.UTF-8", "C.UTF-8")
    assert "LC_CTYPE" not in environment

    environment, change = _second(monkeypatch, tmp_path, BARE, LC_ALL="C.UTF-8")
    assert change == (
        "not varied: no UTF-8 locale other than C.UTF-8 is installed (Bazel needs UTF-8; "
        "`make tools` compiles fr_CH.UTF-8)"
    )
    assert "LANG" not in environment and "LC_ALL" not in environment


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize(("listed", "compiles"), [("C\nC.utf8\nPOSIX", True), ("C.utf8\nfr_CH.utf8", False)])
def test_setup_locale_compiles_the_second_locale_once(tmp_path: Path, listed: str, compiles: bool) -> None:
    """.ci/setup-locale runs localedef (through sudo when not root) only while `locale -a` lacks it."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    _stub(bin_dir, "locale", f"printf '{listed}\\n'")
    _stub(bin_dir, "localedef", f'echo "localedef $*" >>{calls}')
    _stub(bin_dir, "sudo", f'echo sudo >>{calls}; exec "$@"')
    done = subprocess.run(
        [str(REPO / ".ci/setup-locale")],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    recorded = calls.read_text().splitlines() if calls.exists() else []
    sudo = ["sudo"] if os.getuid() != 0 else []
    assert recorded == ([*sudo, "localedef -i fr_CH -f UTF-8 fr_CH.UTF-8"] if compiles else [])


@pytest.mark.parametrize("script", [".ci/setup-tools", ".ci/setup"])
def test_both_set_ups_compile_the_second_locale(script: str) -> None:
    """An auditor runs `make tools` only, a test machine `make setup`: each runs .ci/setup-locale, and the
    auditor's installs the locale sources it needs (Debian's `locales`)."""
    text = (REPO / script).read_text()
    assert '"$repo/.ci/setup-locale"' in text, f"{script}: expected a call of .ci/setup-locale, found none"
    setup_build = next(line for line in text.splitlines() if line.startswith('"$repo/.ci/setup-build"'))
    if script == ".ci/setup-tools":
        assert " locales" in setup_build, f"{script}: expected locales among {setup_build}"
    assert rebuild.SECOND_LOCALE == "fr_CH.UTF-8"  # what .ci/setup-locale compiles
