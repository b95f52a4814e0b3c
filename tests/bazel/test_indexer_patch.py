"""Regression tests for patches/vllm/0003-sparse-indexer-clamp-padded-decode-lengths.patch.

Under speculative decoding the sparse indexer's metadata builder expands each decode request's length L
into per-token lengths L - next_n + j + 1. A slot that only pads the batch (seq_len 0) must attend nothing;
in v0.25.1 it got negative lengths, which the top-k kernels read as row widths. Both expansions are run
here from the Bazel-built trees: the flattened path's Triton kernel in Triton's interpreter (CPU), the
native path's tensor code as written in the builder. The patched tree gives 0 for every padded slot, the
pristine tree the negative lengths the patch removes.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

INDEXER = Path("vllm/v1/attention/backends/mla/indexer.py")
SEQ_LENS = [10, 0]  # a live request of 10 tokens and a padded slot
NEXT_N = 6  # 1 + 5 speculative tokens


def _source(tree: Path) -> tuple[str, ast.Module]:
    path = tree / INDEXER
    text = path.read_text()
    return text, ast.parse(text, filename=str(path))


def _function(tree: Path, name: str) -> tuple[str, ast.FunctionDef]:
    """The source of function or method ``name`` (decorators included) in the indexer module."""
    text, module = _source(tree)
    lines = text.splitlines(keepends=True)
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            assert node.end_lineno is not None
            segment = "".join(lines[first - 1 : node.end_lineno])
            indent = len(segment) - len(segment.lstrip(" "))
            return "\n".join(line[indent:] for line in segment.splitlines()), node
    raise AssertionError(f"{tree / INDEXER}: no function {name!r}")


def _uniform_kernel_lengths(tree: Path) -> list[int]:
    """Per-token lengths from the flattened path's ``_prepare_uniform_decode_kernel``, interpreted on CPU."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import triton
    import triton.language as tl

    if os.environ["TRITON_INTERPRET"] != "1":
        pytest.skip("triton runs compiled in this process (TRITON_INTERPRET is not 1)")
    source, _ = _function(tree, "_prepare_uniform_decode_kernel")
    namespace: dict[str, Any] = {"triton": triton, "tl": tl}
    exec(compile(source, str(tree / INDEXER), "exec"), namespace)
    kernel = namespace["_prepare_uniform_decode_kernel"]
    tokens = len(SEQ_LENS) * NEXT_N
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    out = torch.full((tokens,), 99, dtype=torch.int32)
    table = torch.arange(2 * 4, dtype=torch.int32).reshape(2, 4)
    expanded = torch.zeros(tokens, 4, dtype=torch.int32)
    decode_lens = torch.zeros(tokens, dtype=torch.int32)
    kernel[(tokens,)](seq_lens, out, table, 4, expanded, 4, decode_lens, NEXT_N, BLOCK_SIZE=16)
    return out.tolist()


def _native_lengths(tree: Path) -> list[list[int]]:
    """Per-token lengths from the native path of ``_prepare_decode_tensors`` (plain tensor code)."""
    torch = pytest.importorskip("torch")
    source, _ = _function(tree, "_prepare_decode_tensors")
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, str(tree / INDEXER), "exec"), namespace)
    method = namespace["_prepare_decode_tensors"]
    builder = SimpleNamespace(
        decode_seq_lens_buffer=torch.zeros(64, dtype=torch.int32),
        offsets_buffer=torch.arange(NEXT_N, dtype=torch.int32),
    )
    decode_lens = torch.full((len(SEQ_LENS),), NEXT_N, dtype=torch.int32)
    seq_lens, *_ = method(
        builder,
        seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32),
        block_table=torch.zeros(len(SEQ_LENS), 4, dtype=torch.int32),
        decode_lens=decode_lens,
        decode_lens_cpu=decode_lens.clone(),
        query_start_loc=torch.arange(0, NEXT_N * len(SEQ_LENS), NEXT_N, dtype=torch.int32),
        num_decodes=len(SEQ_LENS),
        num_decode_tokens=NEXT_N * len(SEQ_LENS),
        use_native=True,
        next_n=NEXT_N,
        max_decode_len=NEXT_N,
    )
    return seq_lens.tolist()


LIVE = list(range(SEQ_LENS[0] - NEXT_N + 1, SEQ_LENS[0] + 1))  # 5 .. 10
PRISTINE_PADDED = list(range(1 - NEXT_N, 1))  # -5 .. 0


def test_native_path_clamps_padded_slots(patched_vllm_tree: Path, pristine_vllm_tree: Path) -> None:
    assert _native_lengths(patched_vllm_tree) == [LIVE, [0] * NEXT_N]
    assert _native_lengths(pristine_vllm_tree) == [LIVE, PRISTINE_PADDED]


def test_flattened_path_clamps_padded_slots(patched_vllm_tree: Path, pristine_vllm_tree: Path) -> None:
    assert _uniform_kernel_lengths(patched_vllm_tree) == LIVE + [0] * NEXT_N
    assert _uniform_kernel_lengths(pristine_vllm_tree) == LIVE + PRISTINE_PADDED


def test_v4_compressed_lengths_of_padded_slots_stay_at_zero(
    patched_vllm_tree: Path, pristine_vllm_tree: Path
) -> None:
    # DeepSeek V4 divides the expanded lengths by the compress ratio in place (floor division).
    for tree, padded in ((patched_vllm_tree, [0] * NEXT_N), (pristine_vllm_tree, [-2, -1, -1, -1, -1, 0])):
        compressed = [[length // 4 for length in row] for row in _native_lengths(tree)]
        assert compressed[1] == padded, tree
