"""`sparkseal serve`, the image's entrypoint: verify the modules, then become `vllm serve`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.core import manifest as mm
from tests.installed_tree import install, make_venv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(site-packages, manifest, bin dir holding a stand-in `vllm` that records its arguments)."""
    site = make_venv(tmp_path / "tree")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(mm.dumps(mm.tree_manifest(tmp_path / "tree", "/opt/venv")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "vllm-args"}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return site, manifest, bin_dir


def _serve(site: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "serve", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_matching_modules_exec_vllm_serve(image: tuple[Path, Path, Path], tmp_path: Path) -> None:
    site, manifest, bin_dir = image
    done = _serve(
        site, bin_dir, "--manifest", str(manifest), "--modules", "vllm,torch", "--", "model", "--tp", "2"
    )
    assert done.returncode == 0, done.stderr
    assert f"sparkseal: vllm, torch match {manifest}; starting vllm serve" in done.stderr
    assert (tmp_path / "vllm-args").read_text().splitlines() == ["serve", "model", "--tp", "2"]


def test_a_changed_module_refuses_to_serve(image: tuple[Path, Path, Path], tmp_path: Path) -> None:
    site, manifest, bin_dir = image
    (site / "vllm" / "config.py").write_bytes(b"MAX_MODEL_LEN = 1\n")
    done = _serve(site, bin_dir, "--manifest", str(manifest), "--modules", "vllm,torch", "model")
    assert done.returncode == 1
    assert "changed vllm/config.py" in done.stdout + done.stderr
    assert "refusing to serve: the installed modules differ from the image" in done.stderr
    assert not (tmp_path / "vllm-args").exists()


def test_missing_manifest_is_a_usage_error(image: tuple[Path, Path, Path], tmp_path: Path) -> None:
    site, _, bin_dir = image
    done = _serve(site, bin_dir, "--manifest", str(tmp_path / "absent.json"), "model")
    assert done.returncode == 2
    assert "absent.json" in done.stderr


def test_the_default_checks_every_distribution_before_serving(
    image: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    site, manifest, bin_dir = image
    done = _serve(site, bin_dir, "--manifest", str(manifest), "--site-packages", str(site), "model")
    assert done.returncode == 0, done.stderr
    assert (
        f"sparkseal: the 3 distributions of {site} and its files no RECORD names (20 files) match "
        f"{manifest}; starting vllm serve"
    ) in done.stderr
    (tmp_path / "vllm-args").unlink()
    install(site, "vllm-addon", "1.0", {"vllm_addon.py": b"import vllm\n"})
    done = _serve(site, bin_dir, "--manifest", str(manifest), "--site-packages", str(site), "model")
    assert done.returncode == 1
    assert (
        f"vllm-addon: distribution vllm-addon 1.0 ({site / 'vllm_addon-1.0.dist-info'}) is not in the "
        f"manifest {manifest}" in done.stderr
    )
    assert not (tmp_path / "vllm-args").exists()
