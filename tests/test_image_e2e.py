"""End to end: build the linux/amd64 image, load it into podman and run it (no GPU needed).

It builds the whole image from the locked closure (~4 GB of wheels, fetched once into the repository
cache), so it is marked ``image``; ``make test`` runs it, ``pytest -m "not image"`` skips it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.bazel_util import REPO, Workspace

pytestmark = [pytest.mark.bazel, pytest.mark.network, pytest.mark.image]

PLATFORM = "linux_x86_64"
LOCK = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
TAG = f"localhost/sparkseal/vllm:{LOCK['version']}-{PLATFORM}"
SPECULATOR = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"
# runc instead of crun, and explicit ulimits: what rootful podman needs on a CI machine (FACTS.md).
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


def _podman(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def loaded_image(real_workspace: Workspace) -> Iterator[str]:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run make setup")
    result = real_workspace.bazel("build", f"//:image_{PLATFORM}", timeout=5400)
    assert result.returncode == 0, result.output[-6000:]
    archive = real_workspace.bin_path(f"image_{PLATFORM}.tar")
    loaded = _podman("--runtime", "runc", "load", "-i", str(archive))
    assert loaded.returncode == 0, loaded.stderr
    yield TAG
    _podman("rmi", "--force", TAG)  # ~10 GB of container storage


def _run(image: str, *command: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    args = [*PODMAN_RUN]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    return subprocess.run([*args, image, *command], capture_output=True, text=True, timeout=600, check=False)


def test_vllm_and_sparkseal_import_and_the_patch_is_the_one_imported(loaded_image: str) -> None:
    script = (
        "import importlib.util, vllm, sparkseal\n"
        f"spec = importlib.util.find_spec({SPECULATOR!r})\n"
        "source = open(spec.origin).read()\n"
        "print('RESULT', vllm.__version__, spec.origin, 'fill_(-1)' in source and 'torch.full(' in source)\n"
    )
    done = _run(loaded_image, "-c", script, entrypoint="/opt/venv/bin/python3")
    assert done.returncode == 0, done.stderr[-4000:]
    # vLLM logs to stdout while it imports; the answer is the one line marked RESULT.
    results = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 1, done.stdout[-4000:]
    version, origin, patched = results[0]
    assert version == LOCK["version"]
    assert (
        origin == "/opt/venv/lib/python3.11/site-packages/vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
    )
    assert patched == "True"


def test_manifest_check_passes_inside_the_image(loaded_image: str) -> None:
    done = _run(loaded_image, "verify-modules", entrypoint="/opt/venv/bin/sparkseal")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["vllm", "torch", "sparkseal"]
    assert all(line.endswith("OK") for line in done.stdout.splitlines())
