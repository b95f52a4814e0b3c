"""Float32 PyTorch reference of the sparse-MLA decode kernel, and cache packers for its layouts.

The contract (what is attended, the byte order of each cache record, the empty-row result) is the
one documented in ``kernels_sm121/include/sparkseal/sparse_mla.h``. Caches here are tensors of
shape ``[num_pages, page_size, record]`` as vLLM v0.25.1 allocates them: ``uint8`` with 584-byte
(DeepSeek V4) or 656-byte (DeepSeek V3.2 ``fp8_ds_mla``) records, or ``bfloat16`` with 576 values
(DeepSeek V3.2 bf16). A page may be padded (``cache.stride(0)`` larger than one page).

Everything runs on the tensors' own device, so the same code checks the GPU kernel on a GPU.
"""

from __future__ import annotations

import dataclasses

import torch

V_DIM = 512
ROPE_DIM = 64
PAGE_SIZE = 64
FP8_MAX = 448.0
# Finite lse of a row without any valid index (SPARKSEAL_SPARSE_MLA_EMPTY_LSE in the C header).
EMPTY_LSE = -1.0e30


@dataclasses.dataclass(frozen=True)
class Layout:
    """One cache layout: query width, cache record and the kernel's layout code."""

    name: str
    code: int
    q_dim: int
    nope_dim: int
    record_bytes: int
    cache_dtype: torch.dtype

    @property
    def record_elems(self) -> int:
        """Size of the cache tensor's last dimension (bytes for uint8 caches, values for bf16)."""
        return self.record_bytes // (1 if self.cache_dtype == torch.uint8 else 2)


V4_FP8 = Layout("v4_fp8", 0, q_dim=512, nope_dim=448, record_bytes=584, cache_dtype=torch.uint8)
V32_FP8 = Layout("v32_fp8", 1, q_dim=576, nope_dim=512, record_bytes=656, cache_dtype=torch.uint8)
V32_BF16 = Layout("v32_bf16", 2, q_dim=576, nope_dim=512, record_bytes=1152, cache_dtype=torch.bfloat16)
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (V4_FP8, V32_FP8, V32_BF16)}

V4_DATA_BYTES = 576  # bytes of one token's fp8 NoPE + bf16 RoPE inside a V4 page
V4_SCALE_BYTES = 8  # bytes of one token's ue8m0 scales (7) + pad (1) after all tokens' data
_V4_GROUP = 64
_V32_GROUP = 128


def get_layout(name: str) -> Layout:
    """Return the layout called ``name`` (``v4_fp8``, ``v32_fp8`` or ``v32_bf16``)."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(
            f"sparkseal/kernels/sparse_mla_ref.py: layout: expected one of {sorted(LAYOUTS)}, got {name!r}"
        ) from None


def _bf16_bytes(values: torch.Tensor) -> torch.Tensor:
    """[N, D] float -> [N, 2 D] uint8 of the bf16 values (little-endian)."""
    return values.to(torch.bfloat16).contiguous().view(torch.uint8)


def _fp8_bytes(values: torch.Tensor) -> torch.Tensor:
    """Values already scaled into the e4m3 range -> their float8_e4m3fn bytes."""
    return values.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def ue8m0_exponents(nope: torch.Tensor) -> torch.Tensor:
    """Per-64-value power-of-two exponents of V4's NoPE quantisation, as vLLM computes them.

    ``nope`` is ``[N, 448]``; the result is ``[N, 7]`` int32 ``e`` with scale ``2**e``, where
    ``e = ceil(log2(max(amax, 1e-4) / 448))``.
    """
    amax = nope.float().abs().view(nope.shape[0], -1, _V4_GROUP).amax(dim=-1).clamp(min=1e-4)
    return torch.ceil(torch.log2(amax / FP8_MAX)).to(torch.int32)


def pack_cache(latent: torch.Tensor, layout: Layout, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """Quantise ``latent`` (``[num_pages * page_size, q_dim]``: NoPE then RoPE) into a cache.

    Returns ``[num_pages, page_size, record_elems]`` in ``layout``'s byte order.
    """
    n, dim = latent.shape
    if dim != layout.q_dim or n % page_size != 0:
        raise ValueError(
            f"sparkseal/kernels/sparse_mla_ref.py: latent: expected [k * {page_size}, {layout.q_dim}], "
            f"got {list(latent.shape)}"
        )
    pages = n // page_size
    latent = latent.float()
    nope, rope = latent[:, : layout.nope_dim], latent[:, layout.nope_dim :]
    if layout is V32_BF16:
        return latent.to(torch.bfloat16).view(pages, page_size, layout.q_dim).contiguous()
    if layout is V4_FP8:
        exponents = ue8m0_exponents(nope)
        scale = torch.pow(2.0, exponents.float()).repeat_interleave(_V4_GROUP, dim=1)
        data = torch.cat([_fp8_bytes(nope / scale), _bf16_bytes(rope)], dim=1)  # [n, 576]
        scale_bytes = torch.zeros(n, V4_SCALE_BYTES, dtype=torch.uint8, device=latent.device)
        scale_bytes[:, :7] = (exponents + 127).clamp(0, 255).to(torch.uint8)
        page = torch.cat(
            [
                data.view(pages, page_size * V4_DATA_BYTES),
                scale_bytes.view(pages, page_size * V4_SCALE_BYTES),
            ],
            dim=1,
        )
        return page.view(pages, page_size, layout.record_bytes)
    groups = nope.view(n, -1, _V32_GROUP)
    scales = (groups.abs().amax(dim=-1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)  # [n, 4]
    values = _fp8_bytes((groups / scales.unsqueeze(-1)).view(n, layout.nope_dim))
    record = torch.cat([values, scales.contiguous().view(torch.uint8), _bf16_bytes(rope)], dim=1)
    return record.view(pages, page_size, layout.record_bytes)


def _check_cache(cache: torch.Tensor, layout: Layout) -> tuple[int, int]:
    if cache.dim() != 3 or cache.shape[2] != layout.record_elems or cache.dtype != layout.cache_dtype:
        raise ValueError(
            f"sparkseal/kernels/sparse_mla_ref.py: cache: expected {layout.cache_dtype} "
            f"[num_pages, page_size, {layout.record_elems}], got {cache.dtype} {list(cache.shape)}"
        )
    return cache.shape[0], cache.shape[1]


def unpack_cache(cache: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Dequantise a whole cache to float32 ``[num_pages * page_size, q_dim]`` (slot order)."""
    pages, page_size = _check_cache(cache, layout)
    n = pages * page_size
    if layout is V32_BF16:
        return cache.reshape(n, layout.q_dim).float()
    if layout is V4_FP8:
        page = cache.reshape(pages, page_size * layout.record_bytes)
        data = page[:, : page_size * V4_DATA_BYTES].reshape(n, V4_DATA_BYTES)
        scale_bytes = page[:, page_size * V4_DATA_BYTES :].reshape(n, V4_SCALE_BYTES)[:, :7]
        scale = torch.pow(2.0, scale_bytes.float() - 127.0).repeat_interleave(_V4_GROUP, dim=1)
        nope = data[:, : layout.nope_dim].contiguous().view(torch.float8_e4m3fn).float() * scale
        rope = data[:, layout.nope_dim :].contiguous().view(torch.bfloat16).float()
        return torch.cat([nope, rope], dim=1)
    record = cache.reshape(n, layout.record_bytes)
    values = record[:, : layout.nope_dim].contiguous().view(torch.float8_e4m3fn).float()
    scales = record[:, layout.nope_dim : layout.nope_dim + 16].contiguous().view(torch.float32)
    nope = (values.view(n, -1, _V32_GROUP) * scales.unsqueeze(-1)).view(n, layout.nope_dim)
    rope = record[:, layout.nope_dim + 16 :].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1)


def random_cache(
    layout: Layout,
    num_pages: int,
    *,
    page_size: int = PAGE_SIZE,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A cache of ``num_pages`` pages filled from normally distributed latents."""
    latent = torch.randn(num_pages * page_size, layout.q_dim, generator=generator, device=device)
    return pack_cache(latent, layout, page_size)


def _valid_mask(indices: torch.Tensor, topk_length: torch.Tensor | None, num_slots: int) -> torch.Tensor:
    valid = (indices >= 0) & (indices < num_slots)
    if topk_length is not None:
        position = torch.arange(indices.shape[1], device=indices.device)
        valid &= position.unsqueeze(0) < topk_length.to(indices.device).unsqueeze(1)
    return valid


def sparse_mla_decode_ref(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    layout: Layout,
    *,
    topk_length: torch.Tensor | None = None,
    extra_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    token_chunk: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 sparse-MLA decode: ``(out [T, H, 512], lse [T, H])``.

    ``indices`` is ``[T, topk]`` int32 of global slot ids; an entry is used when it lies in
    ``[0, num_pages * page_size)`` and before the row's ``topk_length``. The optional second
    cache enters the same softmax. ``attn_sink`` (``[H]``) adds ``exp(sink)`` to the softmax
    denominator only. A row with no valid entry gives ``out = 0`` and ``lse = EMPTY_LSE``.
    Tokens are processed ``token_chunk`` at a time to bound memory.
    """
    sources = [(unpack_cache(cache, layout), indices, topk_length)]
    if extra_cache is not None:
        if extra_indices is None:
            raise ValueError(
                "sparkseal/kernels/sparse_mla_ref.py: extra_indices: expected a tensor, got None"
            )
        sources.append((unpack_cache(extra_cache, layout), extra_indices, extra_topk_length))
    num_tokens, num_heads, _ = q.shape
    out = torch.zeros(num_tokens, num_heads, V_DIM, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_heads), EMPTY_LSE, dtype=torch.float32, device=q.device)
    for start in range(0, num_tokens, token_chunk):
        stop = min(start + token_chunk, num_tokens)
        qc = q[start:stop].float()
        scores, values, used = [], [], []
        for kv, idx, lengths in sources:
            idx = idx[start:stop].reshape(stop - start, -1).long()
            valid = _valid_mask(idx, None if lengths is None else lengths[start:stop], kv.shape[0])
            rows = kv[idx.clamp(0, kv.shape[0] - 1)]  # [t, k, q_dim]
            s = torch.einsum("thd,tkd->thk", qc, rows) * softmax_scale
            scores.append(s.masked_fill(~valid.unsqueeze(1), float("-inf")))
            # Invalid entries contribute exact zeros; a NaN in a valid record stays NaN, as in the kernels.
            values.append(
                torch.where(valid.unsqueeze(-1), rows[..., :V_DIM], torch.zeros_like(rows[..., :V_DIM]))
            )
            used.append(valid.any(dim=1))
        s = torch.cat(scores, dim=2)
        v = torch.cat(values, dim=1)
        m = s.amax(dim=2, keepdim=True)
        # A row is empty when it has no valid entry, not when its scores are not finite: a NaN key must give
        # a NaN row (it did in the kernels), never the empty row's zeros.
        has_any = torch.stack(used).any(dim=0).view(-1, 1, 1).expand_as(m)
        p = torch.exp(s - torch.where(has_any, m, torch.zeros_like(m)))
        total = p.sum(dim=2, keepdim=True)
        denom = total
        if attn_sink is not None:
            sink = attn_sink.float().view(1, -1, 1)
            denom = total + torch.exp(sink - torch.where(has_any, m, torch.zeros_like(m)))
        o = torch.einsum("thk,tkd->thd", p, v) / denom.clamp(min=torch.finfo(torch.float32).tiny)
        out[start:stop] = torch.where(has_any, o, torch.zeros_like(o))
        row_lse = (m + torch.log(total)).squeeze(2)
        lse[start:stop] = torch.where(has_any.squeeze(2), row_lse, torch.full_like(row_lse, EMPTY_LSE))
    return out, lse
