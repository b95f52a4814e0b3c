"""The vLLM sparse-MLA backend's decisions on CPU (sparkseal/vllm_integration/sparse_mla_vllm.py): index
conversion against vLLM's kernel, support checks.

vLLM's ``triton_convert_req_index_to_global_index`` is executed from the locked vLLM source in Triton's
interpreter (no vLLM import); the backend classes themselves are exercised inside the image
(``tests/image/test_image_e2e.py``), where vLLM is installed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sparkseal.vllm_integration import sparse_mla_vllm as rules
from tests import dspark_kernel

SPARSE_UTILS = Path("vllm/v1/attention/backends/mla/sparse_utils.py")


@pytest.fixture(scope="module")
def vllm_convert(pristine_vllm_tree: Path):  # type: ignore[no-untyped-def]
    conflict = dspark_kernel.triton_mode_conflict("cpu")
    if conflict is not None:
        pytest.skip(conflict)
    return dspark_kernel.load_launcher(
        pristine_vllm_tree / SPARSE_UTILS, "triton_convert_req_index_to_global_index", "cpu"
    )


def _batch(seed: int, requests: int, topk: int, blocks: int) -> tuple[torch.Tensor, ...]:
    """Per-request positions with -1 padding, positions past the block table and ragged query lengths."""
    gen = torch.Generator().manual_seed(seed)
    query_lens = torch.randint(0, 5, (requests,), generator=gen)
    query_lens[0] = 1
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), query_lens.cumsum(0)])
    tokens = int(starts[-1])
    positions = torch.randint(0, blocks * 64 + 80, (tokens, topk), generator=gen, dtype=torch.int32)
    lengths = torch.randint(0, topk + 1, (tokens,), generator=gen)
    positions[torch.arange(topk)[None, :] >= lengths[:, None]] = -1
    holes = torch.rand(tokens, topk, generator=gen) < 0.1
    positions[holes] = -1
    table = torch.randperm(requests * blocks * 2, generator=gen)[: requests * blocks].to(torch.int32)
    return starts, positions, table.view(requests, blocks)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_global_slots_equal_vllm_conversion(vllm_convert, seed: int) -> None:  # type: ignore[no-untyped-def]
    starts, positions, table = _batch(seed, requests=6, topk=256, blocks=5)
    request_ids = rules.token_request_ids(starts)
    slots, lengths = rules.to_global_slots(request_ids, table, positions)
    expected = vllm_convert(request_ids, table, positions, BLOCK_SIZE=64, NUM_TOPK_TOKENS=256)
    assert torch.equal(slots, expected)
    # Positions past the table and -1 both give -1; some of each are in the batch.
    assert bool((positions >= 5 * 64).any()) and bool((slots == -1).any())
    # Every entry at or after a row's length is -1, and the entry before it is valid.
    columns = torch.arange(256)[None, :]
    assert not bool(((columns >= lengths[:, None]) & (slots >= 0)).any())
    has = lengths > 0
    assert bool((slots[has, (lengths[has] - 1).long()] >= 0).all())


def test_token_request_ids_follow_query_start_loc() -> None:
    ids = rules.token_request_ids(torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32))
    assert ids.tolist() == [0, 0, 2, 2, 2, 3]
    assert ids.dtype == torch.int32


def test_rows_without_valid_positions_have_length_zero() -> None:
    positions = torch.full((2, 64), -1, dtype=torch.int32)
    positions[1, 10] = 3
    slots, lengths = rules.to_global_slots(
        torch.tensor([0, 1], dtype=torch.int32), torch.tensor([[4], [7]], dtype=torch.int32), positions
    )
    assert lengths.tolist() == [0, 11]
    assert slots[1, 10].item() == 7 * 64 + 3
    assert int((slots >= 0).sum()) == 1


def test_mismatched_shapes_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"positions \[T, K\] and request ids \[T\]: got \[3, 64\] and \[2\]"
    ):
        rules.to_global_slots(
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(1, 1, dtype=torch.int32),
            torch.zeros(3, 64, dtype=torch.int32),
        )


GOOD = {"num_heads": 16, "index_topk": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64}


def test_deepseek_v32_shapes_are_served() -> None:
    for heads in (16, 32, 64, 128):
        for topk in (64, 512, 2048):
            assert rules.model_reason(**{**GOOD, "num_heads": heads, "index_topk": topk}) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_heads": 8}, r"attention heads per rank: expected one of \(16, 32, 64, 128\) .*got 8"),
        ({"num_heads": 96}, r"got 96"),
        ({"index_topk": None}, r"no index_topk: it is not a sparse-attention"),
        ({"index_topk": 100}, r"index_topk: expected a positive multiple of 64, got 100"),
        ({"kv_lora_rank": 448}, r"expected kv_lora_rank 512 and qk_rope_head_dim 64, got 448 and 64"),
        ({"decode_context_parallel_size": 2}, r"decode context parallelism: expected size 1, got 2"),
    ],
)
def test_unsupported_models_are_refused_with_the_reason(change: dict, message: str) -> None:
    reason = rules.model_reason(**{**GOOD, **change})
    assert reason is not None
    assert reason.startswith(rules.WHERE)
    assert re.search(message, reason), reason


# A DeepSeek V4 (Flash) layer on one rank of a TP=1 deployment, as vLLM's FlashMLA class builds it.
V4 = dict(
    uses_fp8_ds_mla_layout=True,
    kv_cache_dtype="fp8_ds_mla",
    padded_heads=64,
    head_dim=512,
    rope_head_dim=64,
    compress_ratio=4,
    window_size=128,
    index_topk=512,
)


def test_deepseek_v4_layers_are_served() -> None:
    for ratio in (1, 4, 128):
        for heads in (16, 32, 64, 128):
            assert rules.dsv4_reason(**{**V4, "compress_ratio": ratio, "padded_heads": heads}) is None
    # The indexer's width only matters for C4A layers, which read its rows.
    assert rules.dsv4_reason(**{**V4, "compress_ratio": 128, "index_topk": None}) is None
    assert rules.DSV4_LAYOUT.name == "v4_fp8" and rules.DSV4_LAYOUT.record_bytes == 584


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"uses_fp8_ds_mla_layout": False, "kv_cache_dtype": "fp8"},
            r"kv cache: expected DeepSeek V4's fp8_ds_mla records \(584 bytes; pass --kv-cache-dtype fp8\), "
            r"got 'fp8' in per-tensor rows",
        ),
        ({"kv_cache_dtype": "auto"}, r"fp8_ds_mla records .*got 'auto'$"),
        ({"head_dim": 576}, r"head sizes: expected head_dim 512 with rope 64, got 576 with rope 64"),
        ({"padded_heads": 8}, r"heads per rank \(padded\): expected one of \(16, 32, 64, 128\), got 8"),
        ({"compress_ratio": 16}, r"compress_ratio: expected one of \(1, 4, 128\), got 16"),
        ({"window_size": 100}, r"sliding_window: expected a positive multiple of 64, got 100"),
        ({"index_topk": 300}, r"index_topk: expected a positive multiple of 64, got 300"),
        ({"index_topk": None}, r"index_topk: expected a positive multiple of 64, got None"),
    ],
)
def test_unsupported_deepseek_v4_layers_are_refused(change: dict, message: str) -> None:
    reason = rules.dsv4_reason(**{**V4, **change})
    assert reason is not None and reason.startswith(rules.DSV4_WHERE)
    assert re.search(message, reason), reason


def test_kv_cache_dtypes() -> None:
    for ok in ("auto", None, "bfloat16", "fp8_ds_mla"):
        assert rules.kv_cache_reason(ok) is None
    assert rules.KV_CACHE_LAYOUTS["fp8_ds_mla"].name == "v32_fp8"
    assert rules.KV_CACHE_LAYOUTS["auto"].name == "v32_bf16"
    fp8 = rules.kv_cache_reason("fp8")
    assert fp8 is not None and "pass --kv-cache-dtype fp8_ds_mla" in fp8
    other = rules.kv_cache_reason("float16")
    assert other is not None and "got 'float16'" in other


def test_capabilities() -> None:
    assert rules.capability_reason((12, 1)) is None
    assert rules.capability_reason((9, 0)) is None
    reason = rules.capability_reason((8, 0))
    assert reason is not None and "compute capability 8.0: the kernels are built for 9.0, 12.1" in reason


def test_switch_and_smem_cap_settings() -> None:
    assert rules.switch_enabled({}) is False
    assert rules.switch_enabled({rules.SWITCH_ENV: "1"}) is True
    assert rules.switch_enabled({rules.SWITCH_ENV: "off"}) is False
    with pytest.raises(
        rules.UnsupportedConfiguration, match=r"SPARKSEAL_SPARSE_MLA: expected 1 or 0, got 'maybe'"
    ):
        rules.switch_enabled({rules.SWITCH_ENV: "maybe"})
    assert rules.max_smem_bytes({}) == 0
    assert rules.max_smem_bytes({rules.MAX_SMEM_ENV: "101376"}) == 101376
    for bad in ("-1", "99KB"):
        with pytest.raises(rules.UnsupportedConfiguration, match=rf"expected a byte count >= 0, got '{bad}'"):
            rules.max_smem_bytes({rules.MAX_SMEM_ENV: bad})


def test_the_serving_page_quotes_the_v4_speculative_refusal_as_the_code_words_it() -> None:
    """docs/serving.md quotes the start-up refusal of a V4 target under speculative decoding word for word
    (the layer's name as LAYER): a reworded reason must reach the page in the same change."""
    reason = rules.dsv4_speculative_reason(speculative=True, draft=False, environ={})
    assert reason is not None
    page = (Path(__file__).resolve().parents[2] / "docs/serving.md").read_text()
    assert f"\nLAYER: {reason}\n" in page
    assert (
        rules.dsv4_speculative_reason(speculative=True, draft=False, environ={rules.V4_SPECULATIVE_ENV: "1"})
        is None
    )
