"""The float32 sparse-MLA reference and its cache packers, against hand-computed cases (CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from sparkseal.kernels.sparse_mla_ref import (
    EMPTY_LSE,
    LAYOUTS,
    PAGE_SIZE,
    V4_FP8,
    V32_BF16,
    V32_FP8,
    Layout,
    get_layout,
    pack_cache,
    random_cache,
    sparse_mla_decode_ref,
    ue8m0_exponents,
    unpack_cache,
)

ALL_LAYOUTS = list(LAYOUTS.values())


def _indices(rows: list[list[int]], topk: int = 64) -> torch.Tensor:
    """Index rows padded with -1 to ``topk`` entries."""
    out = torch.full((len(rows), topk), -1, dtype=torch.int32)
    for t, row in enumerate(rows):
        out[t, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return out


def _one_hot_q(layout: Layout, dim: int, value: float, heads: int = 16) -> torch.Tensor:
    q = torch.zeros(1, heads, layout.q_dim)
    q[..., dim] = value
    return q.to(torch.bfloat16)


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=lambda x: x.name)
def test_single_valid_index_returns_that_value_row(layout: Layout) -> None:
    gen = torch.Generator().manual_seed(1)
    cache = random_cache(layout, 2, generator=gen)
    rows = unpack_cache(cache, layout)
    q = torch.randn(1, 16, layout.q_dim, generator=gen).to(torch.bfloat16)
    out, lse = sparse_mla_decode_ref(q, cache, _indices([[-1, 77, -1]]), 0.1, layout)
    torch.testing.assert_close(out[0], rows[77, :512].expand(16, 512), rtol=0, atol=0)
    expected_lse = 0.1 * (q[0].float() @ rows[77])
    torch.testing.assert_close(lse[0], expected_lse, rtol=1e-6, atol=1e-5)


def test_two_equal_scores_average_the_values() -> None:
    latent = torch.zeros(PAGE_SIZE, 576)
    latent[3, :512] = 2.0
    latent[9, :512] = -1.0
    latent[3, 512:] = 0.5  # same RoPE part: q only sees RoPE, so both scores are equal
    latent[9, 512:] = 0.5
    cache = pack_cache(latent, V32_BF16)
    q = torch.zeros(1, 16, 576)
    q[..., 512:] = 1.0
    out, lse = sparse_mla_decode_ref(q.to(torch.bfloat16), cache, _indices([[3, 9]]), 0.25, V32_BF16)
    torch.testing.assert_close(out, torch.full((1, 16, 512), 0.5))
    score = 0.25 * 64 * 0.5
    torch.testing.assert_close(lse, torch.full((1, 16), score + math.log(2.0)))


def test_lse_and_weights_by_hand() -> None:
    latent = torch.zeros(PAGE_SIZE, 576)
    for slot, key in ((10, 1.0), (11, 2.0), (12, 3.0)):
        latent[slot, 0] = key  # score = scale * q[0] * key
        latent[slot, 1] = 10.0 * key  # a value column to check the weights
    cache = pack_cache(latent, V32_BF16)
    out, lse = sparse_mla_decode_ref(
        _one_hot_q(V32_BF16, 0, 1.0), cache, _indices([[10, 11, 12]]), 1.0, V32_BF16
    )
    z = math.exp(1) + math.exp(2) + math.exp(3)
    assert lse[0, 0].item() == pytest.approx(math.log(z), rel=1e-6)
    expected = sum(math.exp(k) * 10.0 * k for k in (1, 2, 3)) / z
    assert out[0, 0, 1].item() == pytest.approx(expected, rel=1e-6)
    assert out[0, 0, 0].item() == pytest.approx(sum(math.exp(k) * k for k in (1, 2, 3)) / z, rel=1e-6)


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=lambda x: x.name)
def test_rows_without_valid_index_give_zero_and_empty_lse(layout: Layout) -> None:
    cache = random_cache(layout, 2, generator=torch.Generator().manual_seed(2))
    q = torch.ones(3, 16, layout.q_dim, dtype=torch.bfloat16)
    out_of_range = 2 * PAGE_SIZE
    indices = _indices([[-1, -1], [out_of_range, out_of_range + 5, -7], [4, 5]])
    lengths = torch.tensor([64, 64, 0], dtype=torch.int32)
    out, lse = sparse_mla_decode_ref(q, cache, indices, 0.1, layout, topk_length=lengths)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, EMPTY_LSE))
    assert math.isfinite(EMPTY_LSE)


def test_a_nan_record_a_row_reads_makes_the_row_nan_and_one_it_skips_does_not() -> None:
    # DeepSeek V4 on an H200 machine: DSpark's draft cache held a record whose RoPE bytes were NaN (0x7FFF)
    # and whose scale byte was 0. Both kernels gave NaN rows; the reference used to call such a row empty
    # (its score maximum was not finite) and return zeros, so a comparison with it could not fail.
    cache = random_cache(V4_FP8, 2, generator=torch.Generator().manual_seed(7))
    slot = 9
    page = cache[0].reshape(-1)
    page[slot * 576 + 448 : slot * 576 + 576] = torch.tensor([0xFF, 0x7F] * 64, dtype=torch.uint8)
    page[PAGE_SIZE * 576 + slot * 8 : PAGE_SIZE * 576 + slot * 8 + 7] = 0
    q = torch.ones(3, 16, V4_FP8.q_dim, dtype=torch.bfloat16)
    indices = _indices([[3, slot, 4], [3, 4, slot], [3, 4]])
    lengths = torch.tensor([3, 2, 2], dtype=torch.int32)
    out, lse = sparse_mla_decode_ref(q, cache, indices, 0.1, V4_FP8, topk_length=lengths)
    assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all()
    assert torch.isfinite(out[1:]).all() and torch.isfinite(lse[1:]).all()
    torch.testing.assert_close(out[1], out[2])


def test_topk_length_and_minus_one_skip_entries() -> None:
    layout = V32_FP8
    gen = torch.Generator().manual_seed(3)
    cache = random_cache(layout, 2, generator=gen)
    q = torch.randn(2, 16, layout.q_dim, generator=gen).to(torch.bfloat16)
    full = _indices([[5, 6, 7], [5, -1, 7]])
    lengths = torch.tensor([2, 3], dtype=torch.int32)
    out, lse = sparse_mla_decode_ref(q, cache, full, 0.07, layout, topk_length=lengths)
    want_out, want_lse = sparse_mla_decode_ref(q, cache, _indices([[5, 6], [5, 7]]), 0.07, layout)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_second_cache_shares_the_softmax() -> None:
    layout = V4_FP8
    gen = torch.Generator().manual_seed(4)
    first = random_cache(layout, 2, generator=gen)
    second = random_cache(layout, 3, generator=gen)
    q = torch.randn(2, 16, layout.q_dim, generator=gen).to(torch.bfloat16)
    idx_a = _indices([[1, 2, 3], [100, -1, 0]])
    idx_b = _indices([[0, 191], [7, 8, 9]], topk=128)
    sink = torch.linspace(-1.0, 1.0, 16)
    out, lse = sparse_mla_decode_ref(
        q, first, idx_a, 0.05, layout, extra_cache=second, extra_indices=idx_b, attn_sink=sink
    )
    # The same attention over one cache holding both: second cache's slots shifted past the first's.
    merged_latent = torch.cat([unpack_cache(first, layout), unpack_cache(second, layout)])
    merged = pack_cache(merged_latent, layout)
    shift = 2 * PAGE_SIZE
    idx_b_shifted = torch.where(idx_b >= 0, idx_b + shift, idx_b)
    want_out, want_lse = sparse_mla_decode_ref(
        q, merged, torch.cat([idx_a, idx_b_shifted], dim=1), 0.05, layout, attn_sink=sink
    )
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_attn_sink_only_adds_to_the_denominator() -> None:
    layout = V32_BF16
    gen = torch.Generator().manual_seed(5)
    cache = random_cache(layout, 1, generator=gen)
    rows = unpack_cache(cache, layout)
    q = torch.randn(1, 16, 576, generator=gen).to(torch.bfloat16)
    sink = torch.full((16,), 0.3)
    out, lse = sparse_mla_decode_ref(q, cache, _indices([[20]]), 0.1, layout, attn_sink=sink)
    score = 0.1 * (q[0].float() @ rows[20])  # [16]
    weight = torch.exp(score) / (torch.exp(score) + math.exp(0.3))
    torch.testing.assert_close(out[0], weight.unsqueeze(1) * rows[20, :512])
    torch.testing.assert_close(lse[0], score)


def test_v4_record_byte_order() -> None:
    latent = torch.zeros(2 * PAGE_SIZE, 512)
    slot = PAGE_SIZE + 5  # page 1, offset 5
    latent[slot, :64] = 448.0 / 8  # block 0: amax 56 -> scale 2^-3, fp8 value 448
    latent[slot, 64:128] = -3.0  # block 1: amax 3 -> scale 2^ceil(log2(3/448)) = 2^-7
    latent[slot, 448:] = 1.5  # RoPE, stored as bf16
    cache = pack_cache(latent, V4_FP8)
    page = cache[1].reshape(-1)
    data = page[5 * 576 : 6 * 576]
    scales = page[PAGE_SIZE * 576 + 5 * 8 : PAGE_SIZE * 576 + 6 * 8]
    assert scales[:2].tolist() == [127 - 3, 127 - 7]
    assert scales[7].item() == 0
    assert data[0].item() == torch.tensor(448.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert data[64].item() == torch.tensor(-3.0 * 128).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert data[448:576].view(torch.bfloat16).tolist() == [1.5] * 64
    torch.testing.assert_close(unpack_cache(cache, V4_FP8)[slot], latent[slot])


def test_v32_fp8_record_byte_order() -> None:
    latent = torch.zeros(PAGE_SIZE, 576)
    latent[2, :128] = 0.5  # group 0 scale 0.5 / 448
    latent[2, 128:256] = -2.0  # group 1 scale 2 / 448
    latent[2, 512:] = -0.25
    cache = pack_cache(latent, V32_FP8)
    record = cache[0, 2]
    scales = record[512:528].view(torch.float32)
    torch.testing.assert_close(scales[:2], torch.tensor([0.5 / 448.0, 2.0 / 448.0]))
    assert record[528:656].view(torch.bfloat16).tolist() == [-0.25] * 64
    assert record[0].item() == torch.tensor(448.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    torch.testing.assert_close(unpack_cache(cache, V32_FP8)[2], latent[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", [V4_FP8, V32_FP8], ids=lambda x: x.name)
def test_dequantisation_round_trip_error_is_within_half_an_fp8_step(layout: Layout) -> None:
    latent = torch.randn(PAGE_SIZE, layout.q_dim, generator=torch.Generator().manual_seed(6)) * 3.0
    rows = unpack_cache(pack_cache(latent, layout), layout)
    nope = layout.nope_dim
    group = 64 if layout is V4_FP8 else 128
    amax = latent[:, :nope].abs().view(PAGE_SIZE, -1, group).amax(-1, keepdim=True)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each value's binade, <= amax / 16.
    bound = (amax / 16.0).expand(-1, -1, group).reshape(PAGE_SIZE, nope)
    assert bool(((rows[:, :nope] - latent[:, :nope]).abs() <= bound).all())
    torch.testing.assert_close(rows[:, nope:], latent[:, nope:].to(torch.bfloat16).float(), rtol=0, atol=0)


def test_exactly_representable_values_survive_the_round_trip() -> None:
    latent = torch.zeros(PAGE_SIZE, 512)
    values = torch.tensor([1.0, -2.0, 0.375, 448.0]) * 2.0**-5
    latent[:, :4] = values
    rows = unpack_cache(pack_cache(latent, V4_FP8), V4_FP8)
    assert torch.equal(rows[:, :4], values.expand(PAGE_SIZE, 4))


def test_ue8m0_exponents_follow_the_ceil_rule() -> None:
    nope = torch.zeros(2, 448)
    nope[0, :64] = 448.0  # ratio 1 -> exponent 0
    nope[0, 64:128] = 449.0  # just above -> exponent 1
    nope[1, 0] = 1e-9  # clamped to 1e-4
    got = ue8m0_exponents(nope)
    assert got[0, :2].tolist() == [0, 1]
    assert got[1, 0].item() == math.ceil(math.log2(1e-4 / 448.0))


def test_padded_page_stride_reads_the_same_rows() -> None:
    layout = V4_FP8
    cache = random_cache(layout, 3, generator=torch.Generator().manual_seed(7))
    page_bytes = PAGE_SIZE * layout.record_bytes
    padded = torch.zeros(3, page_bytes + 512, dtype=torch.uint8)
    padded[:, :page_bytes] = cache.reshape(3, page_bytes)
    view = padded[:, :page_bytes].view(3, PAGE_SIZE, layout.record_bytes)
    assert view.stride(0) == page_bytes + 512
    torch.testing.assert_close(unpack_cache(view, layout), unpack_cache(cache, layout), rtol=0, atol=0)


def test_random_cache_shapes() -> None:
    for layout in ALL_LAYOUTS:
        cache = random_cache(layout, 2)
        assert cache.shape == (2, PAGE_SIZE, layout.record_elems)
        assert cache.dtype == layout.cache_dtype


def test_packer_and_layout_errors_name_expected_and_actual() -> None:
    with pytest.raises(ValueError, match=r"expected \[k \* 64, 512\], got \[10, 512\]"):
        pack_cache(torch.zeros(10, 512), V4_FP8)
    with pytest.raises(ValueError, match=r"sparse_mla_ref.py: layout: expected .*'v4_fp8'.*got 'v5'"):
        get_layout("v5")
    with pytest.raises(
        ValueError, match=r"expected torch.uint8 \[num_pages, page_size, 656\], got torch.uint8"
    ):
        unpack_cache(torch.zeros(1, 64, 584, dtype=torch.uint8), V32_FP8)
