"""What our vLLM sparse-MLA backend decides without vLLM: support checks, index conversion, settings.

``sparkseal.vllm_integration.vllm_backend`` wires these into vLLM's backend classes; keeping them here lets
them be tested on a CPU-only machine, where vLLM cannot be imported.

The index conversion is the one vLLM's ``triton_convert_req_index_to_global_index`` performs
(``vllm/v1/attention/backends/mla/sparse_utils.py``): the indexer writes per-request token positions,
the kernel reads global cache slots ``block_table[request, position // 64] * 64 + position % 64``, and
a negative position or one past the request's block table becomes ``-1``. It is written with PyTorch
operations instead of a Triton kernel, so it needs no JIT compile at the first request and is captured
in CUDA graphs like any other PyTorch operation. It also returns, per row, one past the last valid
entry: the kernel then skips the ``-1`` tail that short contexts leave in a 2048-wide row.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from sparkseal.kernels.sparse_mla import SUPPORTED_HEADS
from sparkseal.kernels.sparse_mla_ref import PAGE_SIZE, ROPE_DIM, V4_FP8, V32_BF16, V32_FP8, V_DIM, Layout

# The operator's switch: "1" makes our backend vLLM's first choice for sparse MLA on capability 12.x
# (GB10), where vLLM would otherwise pick FLASHINFER_MLA_SPARSE_SM120. `--attention-backend CUSTOM`
# selects it on any supported GPU without this switch.
SWITCH_ENV = "SPARKSEAL_SPARSE_MLA"
# Caps the kernel's shared memory per block (bytes; 0 = the device's limit). 101376 makes an H200 run
# the configurations a GB10 runs.
MAX_SMEM_ENV = "SPARKSEAL_SPARSE_MLA_MAX_SMEM"
# "1" lets a DeepSeek V4 target decode on our kernel under speculative decoding, which is refused
# otherwise (dsv4_speculative_reason says why); for measuring it, not for serving.
V4_SPECULATIVE_ENV = "SPARKSEAL_SPARSE_MLA_V4_SPECULATIVE"
BACKEND_NAME = "CUSTOM"
WHERE = "sparkseal sparse-MLA backend (sparkseal/vllm_integration/vllm_backend.py)"

# vLLM's kv-cache dtype -> the kernel's cache layout. "auto"/"bfloat16" store 576 bf16 values per
# token (V3.2 bf16); "fp8_ds_mla" stores DeepSeek V3.2's 656-byte fp8 records.
KV_CACHE_LAYOUTS: Mapping[str, Layout] = {"auto": V32_BF16, "bfloat16": V32_BF16, "fp8_ds_mla": V32_FP8}
HEAD_SIZE = V32_FP8.q_dim  # kv_lora_rank 512 + qk_rope_head_dim 64
KV_LORA_RANK = V_DIM
# DeepSeek V4 layers attend a sliding-window cache and, every 4th or 128th token compressed, a second
# cache, both in V4's 584-byte fp8 records (vLLM's fp8_ds_mla layout for V4).
DSV4_LAYOUT = V4_FP8
DSV4_COMPRESS_RATIOS = (1, 4, 128)
DSV4_WHERE = "sparkseal DeepSeek V4 decode (sparkseal/vllm_integration/vllm_dsv4.py)"
# Compute capabilities the kernel library is compiled for: sm_90a (the H200 variant) and sm_121a (GB10).
CAPABILITIES = ((9, 0), (12, 1))


class UnsupportedConfiguration(ValueError):
    """The model or deployment asks for something the backend does not implement."""


def _flag(name: str, environ: Mapping[str, str]) -> bool:
    """An on/off environment setting; an unclear value is refused rather than read as off."""
    value = environ.get(name, "0").strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("", "0", "off", "false", "no"):
        return False
    raise UnsupportedConfiguration(f"{name}: expected 1 or 0, got {value!r}")


def switch_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the operator asked for our backend first on capability 12.x."""
    return _flag(SWITCH_ENV, environ)


def max_smem_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The shared-memory cap the kernel plans under (``$SPARKSEAL_SPARSE_MLA_MAX_SMEM``, 0 = device)."""
    value = environ.get(MAX_SMEM_ENV, "0").strip()
    try:
        cap = int(value)
    except ValueError:
        cap = -1
    if cap < 0:
        raise UnsupportedConfiguration(f"{MAX_SMEM_ENV}: expected a byte count >= 0, got {value!r}")
    return cap


def kv_cache_reason(kv_cache_dtype: str | None) -> str | None:
    """Why vLLM's ``kv_cache_dtype`` cannot be served, or ``None``."""
    dtype = kv_cache_dtype or "auto"
    if dtype in KV_CACHE_LAYOUTS:
        return None
    if dtype.startswith("fp8"):
        return (
            f"{WHERE}: kv-cache dtype {dtype!r} is not DeepSeek's packed fp8 layout: "
            "pass --kv-cache-dtype fp8_ds_mla (656-byte records) or leave it at auto (bf16)"
        )
    return f"{WHERE}: kv-cache dtype: expected one of {sorted(KV_CACHE_LAYOUTS)}, got {dtype!r}"


def capability_reason(capability: tuple[int, int]) -> str | None:
    """Why a GPU of ``capability`` cannot run the kernel library, or ``None``."""
    major = capability[0]
    if any(major == known[0] for known in CAPABILITIES):
        return None
    names = ", ".join(f"{a}.{b}" for a, b in CAPABILITIES)
    return f"{WHERE}: compute capability {capability[0]}.{capability[1]}: the kernels are built for {names}"


def model_reason(
    *,
    num_heads: int,
    index_topk: int | None,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    decode_context_parallel_size: int = 1,
) -> str | None:
    """Why a model (heads per rank, indexer width, latent sizes) cannot be served, or ``None``."""
    if index_topk is None:
        return f"{WHERE}: the model has no index_topk: it is not a sparse-attention (DeepSeek V3.2) model"
    if index_topk < PAGE_SIZE or index_topk % PAGE_SIZE != 0:
        return f"{WHERE}: index_topk: expected a positive multiple of {PAGE_SIZE}, got {index_topk}"
    if num_heads not in SUPPORTED_HEADS:
        return (
            f"{WHERE}: attention heads per rank: expected one of {SUPPORTED_HEADS} "
            f"(the model's heads divided by the tensor-parallel size), got {num_heads}"
        )
    if kv_lora_rank != KV_LORA_RANK or qk_rope_head_dim != HEAD_SIZE - KV_LORA_RANK:
        return (
            f"{WHERE}: latent sizes: expected kv_lora_rank {KV_LORA_RANK} and qk_rope_head_dim "
            f"{HEAD_SIZE - KV_LORA_RANK}, got {kv_lora_rank} and {qk_rope_head_dim}"
        )
    if decode_context_parallel_size != 1:
        return f"{WHERE}: decode context parallelism: expected size 1, got {decode_context_parallel_size}"
    return None


def dsv4_reason(
    *,
    uses_fp8_ds_mla_layout: bool,
    kv_cache_dtype: str,
    padded_heads: int,
    head_dim: int,
    rope_head_dim: int,
    compress_ratio: int,
    window_size: int,
    index_topk: int | None,
) -> str | None:
    """Why a DeepSeek V4 attention layer cannot decode through our kernel, or ``None``.

    The widths must be multiples of the kernel's 64-entry index tiles: vLLM hands the window's and the
    indexer's rows over as they are, and padding them every step would cost a copy per layer.
    """
    if not uses_fp8_ds_mla_layout or kv_cache_dtype != "fp8_ds_mla":
        return (
            f"{DSV4_WHERE}: kv cache: expected DeepSeek V4's fp8_ds_mla records "
            f"({DSV4_LAYOUT.record_bytes} bytes; pass --kv-cache-dtype fp8), got {kv_cache_dtype!r}"
            + ("" if uses_fp8_ds_mla_layout else " in per-tensor rows")
        )
    if head_dim != DSV4_LAYOUT.q_dim or rope_head_dim != ROPE_DIM:
        return (
            f"{DSV4_WHERE}: head sizes: expected head_dim {DSV4_LAYOUT.q_dim} with rope {ROPE_DIM}, "
            f"got {head_dim} with rope {rope_head_dim}"
        )
    if padded_heads not in SUPPORTED_HEADS:
        return (
            f"{DSV4_WHERE}: attention heads per rank (padded): expected one of {SUPPORTED_HEADS}, "
            f"got {padded_heads}"
        )
    if compress_ratio not in DSV4_COMPRESS_RATIOS:
        return f"{DSV4_WHERE}: compress_ratio: expected one of {DSV4_COMPRESS_RATIOS}, got {compress_ratio}"
    widths = [("sliding_window", window_size)]
    if compress_ratio == 4:
        widths.append(("index_topk", index_topk))
    for name, width in widths:
        if width is None or width < PAGE_SIZE or width % PAGE_SIZE != 0:
            return f"{DSV4_WHERE}: {name}: expected a positive multiple of {PAGE_SIZE}, got {width}"
    return None


def dsv4_speculative_reason(
    *, speculative: bool, draft: bool, environ: Mapping[str, str] = os.environ
) -> str | None:
    """Why a DeepSeek V4 target layer may not decode on our kernel under speculative decoding, or ``None``.

    On vLLM 0.25.1 a tiny V4 with a DSpark draft died at its first verification steps on our class and on
    vLLM's FlashMLA class alike (``bench/results/vllm_backend.md``, 4c-6). The cause was vLLM's small-step
    fused hyper-connection kernel, which wrote none of its new residual at the test model's hidden size
    (512; DeepSeek V4's 4096 and 7168 are covered): patch 0004 fixes it, and the pair then served on an
    H200 machine, 240 requests with CUDA graphs and seeded weights, no NaN (section 7). But under greedy
    sampling the speculative server's answers differed from vLLM's own class without speculation in 113
    and 116 of 120 requests, beyond near-ties: speculative decoding on this kernel is not shown lossless,
    and an unchecked speculative server is worse than a refusal. A draft's own layers are not refused.
    """
    if not speculative or draft or _flag(V4_SPECULATIVE_ENV, environ):
        return None
    return (
        f"{DSV4_WHERE}: speculative decoding with the target's layers on this kernel: expected no "
        "--speculative-config (on vLLM 0.25.1 with patch 0004 a DeepSeek V4 target with a DSpark draft "
        "serves on this kernel, but its greedy answers differed from vLLM's FlashMLA class without "
        "speculation in 113 of 120 requests: not shown lossless; bench/results/vllm_backend.md, 7); serve "
        f"DeepSeek V4 without speculative decoding, or set {V4_SPECULATIVE_ENV}=1 to measure it"
    )


def token_request_ids(query_start_loc: torch.Tensor) -> torch.Tensor:
    """``[T]`` int32: the request each query token belongs to, from ``query_start_loc`` ``[R + 1]``."""
    lengths = torch.diff(query_start_loc.to(torch.int64))
    return torch.repeat_interleave(torch.arange(lengths.numel(), dtype=torch.int32), lengths)


def to_global_slots(
    request_ids: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    block_size: int = PAGE_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-request positions ``[T, K]`` -> global cache slots ``[T, K]`` and row lengths ``[T]``.

    ``request_ids`` int32 ``[T]`` names each row's request, ``block_table`` int32 ``[R, B]`` its pages.
    A slot is ``-1`` where the position is negative or past the block table. The row length is one
    past the last valid slot, so every entry at or beyond it is ``-1``.
    """
    if positions.dim() != 2 or request_ids.shape != positions.shape[:1]:
        raise ValueError(
            f"{WHERE}: positions [T, K] and request ids [T]: got {list(positions.shape)} "
            f"and {list(request_ids.shape)}"
        )
    num_blocks = block_table.shape[1]
    block = torch.div(positions, block_size, rounding_mode="floor")
    valid = (positions >= 0) & (block < num_blocks)
    flat = request_ids.to(torch.int64).unsqueeze(1) * num_blocks + torch.where(valid, block, 0)
    pages = torch.take(block_table, flat)
    slots = torch.where(valid, pages * block_size + positions % block_size, -1).to(torch.int32)
    columns = torch.arange(1, positions.shape[1] + 1, dtype=torch.int32, device=positions.device)
    lengths = (valid.to(torch.int32) * columns).amax(dim=1).to(torch.int32)
    return slots, lengths
