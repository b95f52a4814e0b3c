"""Our attention backend inside a real vLLM engine, against vLLM's FLASHMLA_SPARSE, on an NVIDIA GPU.

Runs ``bench/vllm_backend/compare.py`` (one engine per case: a tiny DeepSeek-V3.2-shaped model, every
sparse-MLA layer of every step compared with FlashMLA on the same inputs). Needs vLLM importable (our
wheel; see ``bench/vllm_backend/h200.sh``), a GPU of capability 9.0 (FlashMLA's kernels) and the kernel
library; skipped otherwise. Run with ``pytest -m gpu``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bazel_util import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("heads", "topk", "kv"), [(16, 512, "fp8_ds_mla"), (128, 2048, "auto")])
def test_every_layer_agrees_with_flashmla(
    h200_vllm: None, tmp_path: Path, heads: int, topk: int, kv: str
) -> None:
    model = tmp_path / "model"
    bench = REPO / "bench/vllm_backend"
    make = [
        sys.executable,
        str(bench / "model.py"),
        "--out",
        str(model),
        "--heads",
        str(heads),
        "--topk",
        str(topk),
    ]
    subprocess.run(make, check=True, capture_output=True)
    out = tmp_path / "compare.json"
    compare = [
        sys.executable,
        str(bench / "compare.py"),
        "--model",
        str(model / "target"),
        "--kv-cache-dtype",
        kv,
    ]
    done = subprocess.run([*compare, "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["slots_equal"] and summary["tail_after_length"] == 0
    assert summary["decode"]["calls"] > 0 and summary["prefill"]["calls"] > 0
    assert summary["decode"]["max_rel"] < 1e-2 and summary["decode"]["max_worst_row"] < 3e-2
    assert summary["prefill"]["max_rel"] < 1e-2 and summary["prefill"]["max_worst_row"] < 3e-2
    assert done.returncode == 0 and summary["pass"], summary
