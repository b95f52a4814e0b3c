"""tests/gpu/sanitizer_driver.py's host side (no GPU): its cases, their inputs and its result check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparkseal.kernels import sparse_mla
from sparkseal.kernels.sparse_mla_ref import LAYOUTS, sparse_mla_decode_ref
from tests.gpu import sanitizer_driver as drv

REPO = Path(__file__).resolve().parents[2]


def test_cases_are_named_uniquely_and_span_layouts_qk_paths_budgets_and_splits() -> None:
    names = [case.name for case in drv.CASES]
    assert len(names) == len(set(names)) == len(drv.CASES_BY_NAME)
    seen = {(c.layout, c.qk, c.max_smem, c.splits > 1) for c in drv.CASES}
    for name, layout in LAYOUTS.items():
        modes = ("bf16",) if layout.cache_dtype == torch.bfloat16 else ("bf16", "fp8", "fp8x2")
        for qk in modes:
            for smem in (0, drv.SMALL_SMEM):
                for split in (False, True):
                    assert (name, qk, smem, split) in seen, (name, qk, smem, split)
    assert {c.heads for c in drv.CASES} >= {16, 32, 64, 128}
    assert any(c.qk == "auto" for c in drv.CASES)
    assert max(c.splits for c in drv.CASES) >= 32


def test_every_case_passes_the_bindings_argument_checks() -> None:
    for case in drv.CASES:
        args, host = drv.build_inputs(case, device="cpu")
        spec = sparse_mla.check_inputs(**args, qk=case.qk)  # type: ignore[arg-type]
        assert spec.num_heads == case.heads and spec.caches[0].topk == case.topk
        assert all(isinstance(v, torch.Tensor) == isinstance(host[k], torch.Tensor) for k, v in args.items())


def test_result_check_passes_the_reference_and_names_a_wrong_result() -> None:
    case = next(c for c in drv.CASES if c.lengths and not c.extra_topk)
    _, host = drv.build_inputs(case, device="cpu")
    kwargs = dict(host)
    layout = LAYOUTS[str(kwargs.pop("layout"))]
    q, cache, indices, scale = (kwargs.pop(k) for k in ("q", "cache", "indices", "softmax_scale"))
    out, lse = sparse_mla_decode_ref(q, cache, indices, scale, layout, **kwargs)  # type: ignore[arg-type]
    assert bool((lse == -1.0e30).any()), "the case should hold an empty row"
    assert drv.check_results(case, out.to(torch.bfloat16), lse, host) is None
    assert "out relative error" in str(drv.check_results(case, (out * 1.1).to(torch.bfloat16), lse, host))
    broken = out.clone()
    broken[lse == -1.0e30] = 1.0
    assert "no valid index" in str(drv.check_results(case, broken.to(torch.bfloat16), lse, host))


@pytest.mark.parametrize(
    ("pairs", "splits", "groups"), [(32, 16, 2), (32, 32, 4), (32, 8, 1), (2000, 64, 1), (300, 32, 2)]
)
def test_combine_groups(pairs: int, splits: int, groups: int) -> None:
    assert drv.combine_groups(pairs, splits, num_sms=132) == groups


def test_list_runs_without_a_gpu() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "tests.gpu.sanitizer_driver", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout.split() == [case.name for case in drv.CASES]
