"""The repository-rule helper that lists a patch series after checking it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.fetch import series as series_cli

REPO = Path(__file__).resolve().parents[2]


def _series(tmp_path: Path, text: str, names: tuple[str, ...] = ("0001-a.patch", "0002-b.patch")) -> Path:
    for name in names:
        (tmp_path / name).write_text("Subject: x\n")
    path = tmp_path / "series"
    path.write_text(text)
    return path


def test_prints_patch_names_in_series_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = _series(tmp_path, "# order matters\n0002-b.patch\n\n0001-a.patch  # later\n")
    assert series_cli.main([str(series)]) == 0
    assert capsys.readouterr() == ("0002-b.patch\n0001-a.patch\n", "")


def test_bad_series_exits_1_with_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = _series(tmp_path, "0001-a.patch\n0001-a.patch\n")
    assert series_cli.main([str(series)]) == 1
    assert capsys.readouterr() == ("", f"sparkseal: {series}:2: 0001-a.patch is listed twice\n")


def test_listed_patch_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = _series(tmp_path, "0001-a.patch\n0009-z.patch\n")
    assert series_cli.main([str(series)]) == 1
    err = capsys.readouterr().err
    assert (
        err == f"sparkseal: {series}:2: 0009-z.patch is listed but {tmp_path}/0009-z.patch does not exist\n"
    )


def test_missing_series_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope" / "series"
    assert series_cli.main([str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sparkseal: ") and str(missing) in err


@pytest.mark.parametrize("argv", [[], ["a", "b"]])
def test_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert series_cli.main(argv) == 2
    assert capsys.readouterr().err == "usage: python3 -m sparkseal.fetch.series SERIES\n"


def test_runs_as_a_module(tmp_path: Path) -> None:
    series = _series(tmp_path, "0001-a.patch\n")
    result = subprocess.run(
        [sys.executable, "-m", "sparkseal.fetch.series", str(series)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "0001-a.patch\n", "")
