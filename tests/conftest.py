"""Shared pytest fixtures: the real vLLM trees built by Bazel, and GPU detection."""

from __future__ import annotations

import hashlib
import os
import platform
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel_util import BAZEL, REPO, Workspace, base_env
from tests.disk_usage import DiskUsage, watched_paths

CACHE = Path.home() / ".cache" / "sparkseal"
# The real workspace's Bazel server lives as long as a session needs it (``real_workspace`` shuts it down
# at the end): its tests are spread over the whole run, and a server restarted between them would load and
# analyse the repository again and hash its outputs again.
REAL_WORKSPACE_IDLE_SECS = 3600


def pytest_configure(config: pytest.Config) -> None:
    """Without a GPU, Triton runs kernels in its interpreter; the run's disk use is reported at its end
    (``tests/disk_usage.py``).

    Triton reads TRITON_INTERPRET once, when it is first imported (torch's custom-op machinery may import it
    early), so the choice is made here, before any test module loads, for the whole session.
    """
    config.pluginmanager.register(DiskUsage(watched_paths(REPO)), "sparkseal-disk-usage")
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _real_workspace() -> Workspace:
    # One output base per checkout path, beside (not inside) the developer's own default one.
    key = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    return Workspace(
        root=REPO,
        output_base=CACHE / "test-output-base" / key,
        repository_cache=CACHE / "repository",
        env=base_env(),
        max_idle_secs=REAL_WORKSPACE_IDLE_SECS,
    )


@pytest.fixture(scope="session")
def real_workspace() -> Iterator[Workspace]:
    """The repository itself as a Bazel workspace (downloads the locked vLLM artifacts once)."""
    if BAZEL is None:
        pytest.fail("bazel is not installed: run `make setup`")
    workspace = _real_workspace()
    yield workspace
    workspace.shutdown()


@pytest.fixture(scope="session")
def kernels_library(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled kernel library for its CPU-side checks: ``$SPARKSEAL_KERNELS_LIB`` or an installed
    copy where there is one, else the one inside the kernels wheel this run's Bazel build makes for this
    machine (so ``make test`` checks the library it builds, with or without a GPU)."""
    from sparkseal.kernels import _lib

    path = _lib.library_path()
    if path.is_file():
        return path
    workspace: Workspace = request.getfixturevalue("real_workspace")
    target = f"kernels_sm121/wheel_linux_{platform.machine()}"
    result = workspace.bazel("build", f"//{target.replace('/', ':')}")
    assert result.returncode == 0, result.output
    [wheel] = sorted(workspace.bin_path(target).glob("*.whl"))
    path = tmp_path_factory.mktemp("kernels") / _lib.LIBRARY_NAME
    with zipfile.ZipFile(wheel) as archive:
        path.write_bytes(archive.read(f"sparkseal/_lib/{_lib.LIBRARY_NAME}"))
    os.environ[_lib.LIBRARY_ENV] = str(path)
    _lib.load.cache_clear()
    return path


def _tree(request: pytest.FixtureRequest, env_name: str, target: str) -> Path:
    override = os.environ.get(env_name)
    if override:
        return Path(override)
    workspace: Workspace = request.getfixturevalue("real_workspace")
    result = workspace.bazel("build", f"//third_party/vllm:{target}")
    assert result.returncode == 0, result.output
    return workspace.bin_path(f"third_party/vllm/{target}")


@pytest.fixture(scope="session")
def pristine_vllm_tree(request: pytest.FixtureRequest) -> Path:
    """The locked sdist's vllm/ tree (``$SPARKSEAL_PRISTINE_TREE`` overrides the Bazel build)."""
    return _tree(request, "SPARKSEAL_PRISTINE_TREE", "pristine_tree")


@pytest.fixture(scope="session")
def patched_vllm_tree(request: pytest.FixtureRequest) -> Path:
    """The patched and overlaid vllm/ tree (``$SPARKSEAL_PATCHED_TREE`` overrides the Bazel build)."""
    return _tree(request, "SPARKSEAL_PATCHED_TREE", "patched_tree")


@pytest.fixture(scope="session")
def h200_vllm() -> None:
    """Skip unless a capability 9.0 GPU and vLLM are here: the GPU tests that check our backend against
    FlashMLA (an H200-class kernel) inside vLLM, staged as in ``bench/vllm_backend/h200.sh``."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FlashMLA, the reference, runs on capability 9.0 here")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not importable: stage our wheel first (bench/vllm_backend/h200.sh)")


@pytest.fixture
def vllm_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's offline engine with its engine core in this process, so a test can observe (and patch) the
    worker's speculator; skips without a CUDA GPU or an importable vLLM. vLLM's own sampler (FlashInfer's
    would first JIT-compile for minutes on a fresh machine), and no vLLM plugins: the checkout's sparkseal
    may sit on sys.path beside an installed wheel, whose files the plugin's module check would rightly
    refuse."""
    import importlib.util

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is false")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    monkeypatch.setenv("VLLM_PLUGINS", "")
