"""How tests reach podman: rootful podman on a CI machine needs runc (not crun) and explicit ulimits
(FACTS.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkseal.core.oci import write_complete_layout

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


def copy_into_podman(layout: Path, tag: str, scratch: Path) -> None:
    """Put ``layout``'s image into podman's storage as ``tag``: ``skopeo copy`` from the complete layout
    that ``bazel run //:image.load -- --oci-layout`` writes (``write_complete_layout``: every blob
    hard-linked after a check of its digest), made under ``scratch`` and removed afterwards.

    For tests that need the image in podman, not the load path itself (the product's ``bazel run
    //:image.load`` is tested on its own): ``podman load`` of the streamed docker-archive first copies the
    whole archive (gigabytes of gzip layers) to a temporary file and reads it back; skopeo reads the layout's
    blobs where they are. The image is the same: its ID is the config's digest, its layers the same blobs.
    """
    complete = scratch / "complete-layout"
    try:
        write_complete_layout(layout, complete)
        copied = subprocess.run(
            ["skopeo", "copy", "--quiet", f"oci:{complete}", f"containers-storage:{tag}"],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    finally:
        shutil.rmtree(complete, ignore_errors=True)
    if copied.returncode != 0:
        raise AssertionError(
            f"skopeo copy oci:{complete} containers-storage:{tag}: exit {copied.returncode}: "
            f"{copied.stderr[-4000:]}"
        )
