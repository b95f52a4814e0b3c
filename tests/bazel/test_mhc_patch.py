"""Regression tests for patches/vllm/0004-deepseek-v4-mhc-small-batch-fused-kernel-coverage.patch.

DeepSeek V4's hyper-connections join one sub-layer's mHC post with the next one's mHC pre in
``mhc_fused_post_pre_tilelang``. For at most 16 tokens v0.25.1 hands the step to ``mhc_fused_tilelang``,
whose 256 threads a block write ``(hidden // n_splits) // 256`` whole strides of their split and nothing
else: a hidden size that the split does not cut into whole strides (512 gives none) leaves the new residual
unwritten. These tests run the dispatcher of each Bazel-built tree on CPU tensors, with the GPU kernels
replaced by recorders, and read which kernels it chose and with which split. The pristine tree hands 512 to
the fused kernel with a split it cannot cover; the patched tree takes the separate post and pre-norm GEMM
kernels there, and keeps the fused kernel with the same split for DeepSeek V4's own sizes.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.bazel

TILELANG = Path("vllm/model_executor/kernels/mhc/tilelang.py")
KERNELS = Path("vllm/model_executor/kernels/mhc/tilelang_kernels.py")
HC_MULT = 4
SMALL_STEPS = (1, 2, 6, 7, 8, 16)  # a decode, V4's warm-up, a DSpark verification (1 + 5), the split edges
LARGE_STEP = 17  # above 16 tokens v0.25.1 already takes the separate kernels


def _fused_threads(tree: Path) -> int:
    """``mhc_fused_tilelang``'s threads per block: its ``n_thr`` default, read from the kernel's source."""
    for node in ast.walk(ast.parse((tree / KERNELS).read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "mhc_fused_tilelang":
            names = [a.arg for a in node.args.args]
            defaults = dict(
                zip(names[len(names) - len(node.args.defaults) :], node.args.defaults, strict=True)
            )
            threads = defaults["n_thr"]
            assert isinstance(threads, ast.Constant) and isinstance(threads.value, int)
            return threads.value
    raise AssertionError(f"{tree / KERNELS}: no function mhc_fused_tilelang")


def _module(name: str, **attributes: Any) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _dispatcher(
    tree: Path, monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, int]]
) -> Callable[..., Any]:
    """The tree's ``mhc_fused_post_pre_tilelang``, its module run with the GPU kernels as recorders.

    Each recorder appends ``(kernel, n_splits)``; the fused one also returns at once, as the kernels write
    their outputs in place and the dispatcher only reshapes them afterwards.
    """
    torch = pytest.importorskip("torch")

    def recorder(kernel: str, split_at: int | None = None) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            splits = kwargs.get("n_splits", args[split_at] if split_at is not None else 1)
            calls.append((kernel, splits))

        return record

    kernels = _module(
        "vllm.model_executor.kernels.mhc.tilelang_kernels",
        compute_num_split=lambda *args: 1,
        mhc_fused_tilelang=recorder("fused"),
        mhc_post_tilelang=recorder("post"),
        mhc_pre_big_fuse_tilelang=recorder("pre", split_at=14),
        mhc_pre_big_fuse_with_norm_tilelang=recorder("pre", split_at=16),
        hc_prenorm_gemm_tilelang=recorder("prenorm-gemm", split_at=9),
        hc_prenorm_gemm_block_m_tilelang=recorder("prenorm-gemm"),
    )
    fakes = {
        kernels.__name__: kernels,
        "vllm.utils.math_utils": _module("vllm.utils.math_utils", cdiv=lambda a, b: -(-a // b)),
        "vllm.utils.deep_gemm": _module("vllm.utils.deep_gemm", is_deep_gemm_supported=lambda: False),
        "vllm.utils.torch_utils": _module(
            "vllm.utils.torch_utils", direct_register_custom_op=lambda *a, **k: None
        ),
    }
    for name, module in fakes.items():
        monkeypatch.setitem(sys.modules, name, module)
    namespace: dict[str, Any] = {"__name__": "mhc_tilelang_under_test", "torch": torch}
    exec(compile((tree / TILELANG).read_text(), str(tree / TILELANG), "exec"), namespace)
    return namespace["mhc_fused_post_pre_tilelang"]


def _kernels(tree: Path, monkeypatch: pytest.MonkeyPatch, tokens: int, hidden: int) -> list[tuple[str, int]]:
    """The kernels (and their splits) the tree's dispatcher runs for one step of ``tokens`` x ``hidden``."""
    import torch

    calls: list[tuple[str, int]] = []
    dispatch = _dispatcher(tree, monkeypatch, calls)
    mix = HC_MULT * 2 + HC_MULT * HC_MULT
    dispatch(
        torch.zeros(tokens, hidden, dtype=torch.bfloat16),
        torch.zeros(tokens, HC_MULT, hidden, dtype=torch.bfloat16),
        torch.zeros(tokens, HC_MULT, 1),
        torch.zeros(tokens, HC_MULT, HC_MULT),
        torch.zeros(mix, HC_MULT * hidden),
        torch.zeros(3),
        torch.zeros(mix),
        1e-6, 1e-6, 1e-6, 2.0, 20,
    )  # fmt: skip
    return calls


def _uncovered(calls: list[tuple[str, int]], hidden: int, threads: int) -> list[int]:
    """The splits of fused-kernel calls that leave part of each split unwritten."""
    return [
        s for kernel, s in calls if kernel == "fused" and (hidden // s) // threads * threads != hidden // s
    ]


@pytest.mark.parametrize("tokens", SMALL_STEPS)
def test_the_pristine_tree_hands_the_test_models_hidden_size_to_a_kernel_that_cannot_cover_it(
    pristine_vllm_tree: Path, monkeypatch: pytest.MonkeyPatch, tokens: int
) -> None:
    """What 0004 fixes, in the locked source: 512 goes to the fused kernel with a split it cannot cover."""
    threads = _fused_threads(pristine_vllm_tree)
    calls = _kernels(pristine_vllm_tree, monkeypatch, tokens, 512)
    assert _uncovered(calls, 512, threads) == [8 if tokens < 8 else 4], calls


@pytest.mark.parametrize("tokens", SMALL_STEPS)
def test_the_patched_tree_takes_the_separate_kernels_where_the_fused_one_would_not_cover(
    patched_vllm_tree: Path, monkeypatch: pytest.MonkeyPatch, tokens: int
) -> None:
    calls = _kernels(patched_vllm_tree, monkeypatch, tokens, 512)
    assert [kernel for kernel, _ in calls] == ["post", "prenorm-gemm", "pre"], calls
    # The separate path's own split, the same one v0.25.1 takes above 16 tokens.
    assert calls == _kernels(patched_vllm_tree, monkeypatch, LARGE_STEP, 512), calls


@pytest.mark.parametrize("hidden", [2048, 4096, 7168])
@pytest.mark.parametrize("tokens", [*SMALL_STEPS, LARGE_STEP])
def test_hidden_sizes_the_fused_kernel_covers_take_the_same_kernels_in_both_trees(
    pristine_vllm_tree: Path,
    patched_vllm_tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    tokens: int,
    hidden: int,
) -> None:
    """DeepSeek V4's 4096 and 7168 (and the 2048 test model) are untouched by 0004."""
    pristine = _kernels(pristine_vllm_tree, monkeypatch, tokens, hidden)
    assert pristine == _kernels(patched_vllm_tree, monkeypatch, tokens, hidden)
    assert _uncovered(pristine, hidden, _fused_threads(pristine_vllm_tree)) == []
    assert next(kernel for kernel, _ in pristine) == ("fused" if tokens <= 16 else "post")


def test_the_patch_names_the_kernels_thread_count_it_relies_on(patched_vllm_tree: Path) -> None:
    """0004's constant is the fused kernel's ``n_thr`` default: a vLLM that changes one must change both."""
    source = (patched_vllm_tree / TILELANG).read_text()
    constant = re.search(r"^_FUSED_POST_PRE_THREADS = (\d+)$", source, re.MULTILINE)
    assert constant is not None, f"{patched_vllm_tree / TILELANG}: no _FUSED_POST_PRE_THREADS"
    assert int(constant.group(1)) == _fused_threads(patched_vllm_tree)
