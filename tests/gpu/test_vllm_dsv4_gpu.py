"""DeepSeek V4 decode through our derived attention class, against vLLM's FlashMLA class, on an H200.

Runs ``bench/vllm_backend/dsv4_decode.py`` (window-only, C4A and C128A layers; speculative rows; the
attention sink; a CUDA-graph replay with new rows; the in-place write against the allocating op and a
copy) at the device's shared-memory limit and capped at GB10's 101376 bytes. Needs capability 9.0
(FlashMLA's V4 decode is the reference), vLLM importable (our wheel staged, see
``bench/vllm_backend/h200.sh``) and the kernel library. Run with ``pytest -m gpu``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bazel_util import REPO

pytestmark = pytest.mark.gpu

# The limits of the kernel's own GPU tests (tests/gpu/test_sparse_mla_gpu.py).
REL, WORST_ROW = 1e-2, 3e-2


@pytest.mark.parametrize("max_smem", [0, 101376])
def test_v4_decode_agrees_with_flashmla(h200_vllm: None, tmp_path: Path, max_smem: int) -> None:
    out = tmp_path / "dsv4.json"
    command = [
        sys.executable,
        str(REPO / "bench/vllm_backend/dsv4_decode.py"),
        "--out",
        str(out),
        "--quick",
        "--no-timing",
        "--max-smem",
        str(max_smem),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["ratio"] for r in rows} == {1, 4, 128}
    assert any(r["tokens_per_request"] > 1 for r in rows)
    for r in rows:
        for key in ("ours_vs_ref", "ours_vs_flashmla", "graph_replay_vs_ref"):
            whole, worst = r[key]
            assert whole < REL and worst < WORST_ROW, f"{r['case']}: {key} {whole:.2e} / {worst:.2e}"
        # The reference itself: FlashMLA on the same rows agrees with the float32 result.
        assert r["flashmla_vs_ref"][0] < REL, r
        # A replayed graph computes exactly what an eager call computes on the same rows.
        assert r["graph_replay_vs_eager"] == [0.0, 0.0], r
        # The class writes vLLM's buffer in place: bit for bit what the allocating op and a copy gave.
        assert r["in_place_vs_copy"] == [0.0, 0.0], r
