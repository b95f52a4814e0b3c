"""How tests reach podman: rootful podman on a CI machine needs runc (not crun) and explicit ulimits
(FACTS.md)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

PODMAN_RUN = [
    "podman",
    "--runtime",
    "runc",
    "run",
    "--rm",
    "--network=none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
]


def working_podman() -> str:
    """The podman program, or a skip of the calling test where it is missing or cannot run here."""
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("podman is not installed (apt-get install -y podman; CI installs it)")
    info = subprocess.run([podman, "--runtime", "runc", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        pytest.skip(f"podman is installed but does not work here: {info.stderr.strip()[:200]}")
    return podman


def run_image(image: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``image`` once (removed afterwards, no network) and return what it printed."""
    return subprocess.run(
        [*PODMAN_RUN, image, *args], capture_output=True, text=True, check=False, timeout=300
    )
