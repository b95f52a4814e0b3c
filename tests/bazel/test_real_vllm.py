"""The real thing: our vLLM wheels from the locked v0.25.1 sdist and upstream wheels."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.bazel_util import REPO, Workspace, base_env

pytestmark = [pytest.mark.bazel, pytest.mark.network]

LOCK = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
SPECULATOR = "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
DSV4_MODEL = "vllm/models/deepseek_v4/nvidia/model.py"


def _wheel(workspace: Workspace, platform: str) -> Path:
    result = workspace.bazel("build", f"//third_party/vllm:wheel_{platform}")
    assert result.returncode == 0, result.output
    filename = LOCK["wheels"][platform]["filename"]
    return workspace.bin_path(f"third_party/vllm/wheel_{platform}/{filename}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_x86_64_wheel_carries_the_fix_and_upstream_binaries(
    real_workspace: Workspace, tmp_path: Path
) -> None:
    wheel = _wheel(real_workspace, "linux_x86_64")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        speculator = archive.read(SPECULATOR).decode()
        dsv4 = archive.read(DSV4_MODEL).decode()
        record = json.loads(archive.read("vllm-0.25.1.dist-info/sparkseal.json"))
    assert "torch.full(\n            (max_num_sampled_tokens,), -1" in speculator
    assert "self.sample_idx_mapping.fill_(-1)" in speculator
    assert "vllm/_C_stable_libtorch.abi3.so" in names
    assert sum(n.endswith(".so") for n in names) >= 9
    assert names[-1] == "vllm-0.25.1.dist-info/RECORD"
    assert record["commit"] == LOCK["commit"]
    assert record["upstream_wheel"]["sha256"] == LOCK["wheels"]["linux_x86_64"]["sha256"]
    assert [p["file"] for p in record["patches"]] == [
        "0001-dspark-graph-replay-safety.patch",
        "0002-deepseek-v4-custom-attention-backend.patch",
        "0003-sparse-indexer-clamp-padded-decode-lengths.patch",
        "0004-deepseek-v4-mhc-small-batch-fused-kernel-coverage.patch",
    ]
    assert "if backend == AttentionBackendEnum.CUSTOM:" in dsv4
    assert "CUSTOM is not a DeepSeek V4 attention backend" in dsv4
    assert "return derive(DeepseekV4FlashInferSM120Attention)" in dsv4

    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    assert (target / SPECULATOR).read_text() == speculator
    assert (target / "vllm/_sparkseal_build.py").is_file()


def test_aarch64_wheel_is_identical_from_another_clone_and_output_base(
    real_workspace: Workspace, tmp_path: Path
) -> None:
    first = _sha256(_wheel(real_workspace, "linux_aarch64"))
    clone = tmp_path / "elsewhere" / "sparkseal"
    shutil.copytree(
        REPO,
        clone,
        ignore=lambda d, names: [n for n in names if n.startswith("bazel-") or n in {".git", "__pycache__"}],
    )
    other = Workspace(
        root=clone,
        output_base=tmp_path / "other-output-base",
        repository_cache=real_workspace.repository_cache,
        env=base_env(TZ="Pacific/Chatham", LC_ALL="C"),
    )
    try:
        second = _sha256(_wheel(other, "linux_aarch64"))
    finally:
        other.shutdown()
    assert second == first
