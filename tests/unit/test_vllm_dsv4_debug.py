"""The V4 NaN debug switch (vllm_integration/vllm_dsv4_debug.py) and the bench's seeded weights (CPU)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import torch

from sparkseal.kernels.sparse_mla_ref import PAGE_SIZE, V4_FP8, random_cache, unpack_cache
from sparkseal.vllm_integration import vllm_dsv4_debug as debug

HOOKS = Path(__file__).resolve().parents[2] / "bench/vllm_backend/hooks/sitecustomize.py"


class Layer:
    prefix = "model.layers.6.attn"
    n_local_heads = 16


def _args(rows: int = 3) -> dict:
    gen = torch.Generator().manual_seed(5)
    cache = random_cache(V4_FP8, 6, generator=gen)
    indices = torch.full((rows, 128), -1, dtype=torch.int32)
    indices[:, :3] = torch.tensor([PAGE_SIZE * 4 + 2, 7, PAGE_SIZE * 5 + 1], dtype=torch.int32)
    return {
        "q": torch.randn(rows, 64, V4_FP8.q_dim, generator=gen).to(torch.bfloat16),
        "cache": cache,
        "indices": indices,
        "topk_length": torch.full((rows,), 3, dtype=torch.int32),
        "extra_cache": None,
        "extra_indices": None,
        "extra_topk_length": None,
        "attn_sink": torch.zeros(64),
        "softmax_scale": 0.05,
        "max_smem_bytes": 0,
    }


def test_compact_cache_keeps_the_named_pages_and_renumbers_flashmla_shaped_rows() -> None:
    args = _args()
    rows = args["indices"].unsqueeze(1)  # FlashMLA's [T, 1, K]
    compact, renumbered = debug.compact_cache(args["cache"], rows)
    assert compact.shape == (3, PAGE_SIZE, V4_FP8.record_bytes)  # pages 0, 4 and 5
    assert renumbered[0, :4].tolist() == [PAGE_SIZE + 2, 7, 2 * PAGE_SIZE + 1, -1]
    whole, small = unpack_cache(args["cache"], V4_FP8), unpack_cache(compact, V4_FP8)
    for old, new in zip(args["indices"][0, :3].tolist(), renumbered[0, :3].tolist(), strict=True):
        assert torch.equal(whole[old], small[new])


def test_a_nan_output_is_logged_compared_and_saved(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    args = _args()
    output = torch.zeros(3, 64, 512, dtype=torch.bfloat16)
    output[1, 4, 0] = float("nan")  # a real head
    output[2, 40, 0] = float("nan")  # a padded head: vLLM drops it, so it is no finding
    calls = []

    def base(*given: object, output: torch.Tensor) -> None:
        calls.append(given)
        output.fill_(1.0)

    with caplog.at_level(logging.WARNING, logger="vllm.sparkseal"):
        debug.check(Layer(), args, args["q"], output, base, ("q", "kv"), tmp_path)
    text = caplog.text
    assert "model.layers.6.attn" in text and "output NaN rows [1] of 3 (16 real heads)" in text
    assert "vLLM's class NaN rows []; float32 reference NaN rows []" in text
    assert calls == [("q", "kv")]
    (saved,) = sorted(tmp_path.iterdir())
    dump = torch.load(saved)
    assert dump["prefix"] == Layer.prefix and dump["heads"] == 16
    assert dump["cache"].shape[0] == 3
    torch.testing.assert_close(dump["ours"], output, equal_nan=True, rtol=0, atol=0)


def test_a_clean_output_costs_no_comparison(tmp_path: Path) -> None:
    args = _args()

    def base(*given: object, output: torch.Tensor) -> None:
        raise AssertionError("vLLM's class must not run for a clean output")

    output = torch.zeros(3, 64, 512, dtype=torch.bfloat16)
    output[0, 60, 0] = float("nan")  # padded heads only
    debug.check(Layer(), args, args["q"], output, base, (), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_debug_dir_is_off_unless_set() -> None:
    assert debug.debug_dir({}) is None
    assert debug.debug_dir({debug.DEBUG_ENV: " "}) is None
    assert debug.debug_dir({debug.DEBUG_ENV: "/tmp/x"}) == Path("/tmp/x")


def _hooks():
    spec = importlib.util.spec_from_file_location("bench_hooks", HOOKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seeded_weights_follow_the_parameter_roles_and_the_seed() -> None:
    hooks = _hooks()
    param = torch.nn.Parameter

    def model() -> torch.nn.Module:
        m = torch.nn.Module()
        m.embed_tokens = torch.nn.Embedding(32, 16)
        m.norm = torch.nn.Module()
        m.norm.weight = param(torch.zeros(16))
        m.proj = torch.nn.Module()
        m.proj.weight = param(torch.zeros(256, 256).to(torch.float8_e4m3fn), requires_grad=False)
        m.proj.weight_scale_inv = param(torch.zeros(2, 2), requires_grad=False)
        m.lm_head = torch.nn.Module()
        m.lm_head.weight = param(torch.zeros(32, 16))
        m.hc_attn_fn = param(torch.full((3, 3), 7.0))
        m.attn_sink = param(torch.full((4,), 9.0))
        m.tid2eid = param(torch.full((4, 2), 3), requires_grad=False)
        return m

    a, b, c = model(), model(), model()
    assert hooks.seed_model(a, 1) == {"seeded": 6, "kept": 2}
    hooks.seed_model(b, 1)
    hooks.seed_model(c, 2)
    assert torch.equal(a.embed_tokens.weight, b.embed_tokens.weight)
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)
    assert torch.equal(a.norm.weight, torch.ones(16)) and torch.equal(a.attn_sink, torch.zeros(4))
    # Block scales [N / 128, K / 128] = [2, 2]: K = 256, 1 / sqrt(K) = 2^-4.
    assert torch.equal(a.proj.weight_scale_inv, torch.full((2, 2), 2.0**-4))
    assert 0.9 < a.proj.weight.float().std().item() < 1.1
    assert torch.equal(a.hc_attn_fn, torch.full((3, 3), 7.0)) and torch.equal(
        a.tid2eid, torch.full((4, 2), 3)
    )
    assert 0.7 < a.lm_head.weight.std().item() < 1.3  # gain 4 / sqrt(16)
