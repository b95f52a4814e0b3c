"""Our sparse-MLA kernel as a vLLM 0.25.1 attention backend (vLLM's ``CUSTOM`` slot).

vLLM runs a sparse-MLA layer (DeepSeek V3.2: ``DeepseekV32ForCausalLM``) in three parts: the indexer
writes, per query token, the positions of the ``index_topk`` context tokens to attend
(``topk_indices_buffer``); the layer stores the token's latent in the paged cache; the backend's
``forward_mqa`` attends the query ``[T, H, 512 + 64]`` to those cache entries. Only the last part is
ours. Every query token (decode, speculative and prefill rows alike) goes through
``torch.ops.sparkseal.sparse_mla_decode``: a sparse row is the same computation whatever phase the
token is in, and vLLM's own prefill kernels for this layout (FlashMLA's) are not built for GB10.

The plugin (``sparkseal.vllm_integration.plugin``) registers :class:`SparksealSparseMLABackend` as ``CUSTOM``;
``--attention-backend CUSTOM`` selects it, and ``SPARKSEAL_SPARSE_MLA=1`` puts it first for sparse
MLA on capability 12.x. Anything it cannot serve is refused while vLLM builds the model: the backend's
``supports_combination`` names the reason in vLLM's "backend is not valid" error, and the layer
implementation checks the model's shapes when it is made, before any request.

DeepSeek V4 does not go through vLLM's generic sparse-MLA interface: it builds each layer's attention
from a per-platform class (``vllm/models/deepseek_v4/nvidia/model.py``). Our patch
``0002-deepseek-v4-custom-attention-backend.patch`` asks this class for a V4 class with ``CUSTOM``
(:meth:`SparksealSparseMLABackend.deepseek_v4_attention_cls`); ``sparkseal.vllm_integration.vllm_dsv4``
derives it, with our kernel for V4's decode rows. With ``SPARKSEAL_SPARSE_MLA=1`` and no
``--attention-backend``, V4 on capability 12.x takes that class too
(:meth:`SparksealSparseMLABackend.deepseek_v4_by_default`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.config import VllmConfig, get_current_vllm_config_or_none
from vllm.config.cache import CacheDType
from vllm.platforms.interface import DeviceCapability
from vllm.utils.torch_utils import np_to_pinned_tensor
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
    SparseMLAAttentionImpl,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from sparkseal.kernels.sparse_mla import sparse_mla_decode
from sparkseal.kernels.sparse_mla_ref import PAGE_SIZE
from sparkseal.vllm_integration import sparse_mla_vllm as rules


class SparksealSparseMLABackend(AttentionBackend):
    """The backend class vLLM resolves ``CUSTOM`` to."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    # "fp8"/"fp8_e4m3" are listed so that supports_combination can say what to pass instead.
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        "auto",
        "bfloat16",
        "fp8_ds_mla",
        "fp8",
        "fp8_e4m3",
    ]

    @staticmethod
    def get_name() -> str:
        return rules.BACKEND_NAME

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [PAGE_SIZE]

    @staticmethod
    def get_builder_cls() -> type[SparksealSparseMLAMetadataBuilder]:
        return SparksealSparseMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type[SparksealSparseMLAImpl]:
        return SparksealSparseMLAImpl

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [rules.HEAD_SIZE]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def deepseek_v4_attention_cls(cls, base: type) -> type:
        """DeepSeek V4's attention class for ``CUSTOM``: ``base`` (vLLM's pick) with our decode kernel."""
        from sparkseal.vllm_integration.vllm_dsv4 import attention_class

        return attention_class(base)

    @classmethod
    def deepseek_v4_by_default(cls, capability: DeviceCapability | None) -> bool:
        """Whether V4 decodes through our kernel without ``--attention-backend``: the switch, on 12.x."""
        return capability is not None and capability.major == 12 and rules.switch_enabled()

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return rules.capability_reason((capability.major, capability.minor)) is None

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        reason = rules.kv_cache_reason(kv_cache_dtype)
        if reason is not None:
            return reason
        # Inside vLLM the engine's config is current; without one only the cache dtype is checked here,
        # and the layer implementation checks the model's shapes when it is built.
        config = get_current_vllm_config_or_none()
        if config is None or config.model_config is None:
            return None
        return _model_reason(config)

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        if cache_dtype_str in rules.KV_CACHE_LAYOUTS and cache_dtype_str != "auto":
            return (num_blocks, block_size, rules.KV_CACHE_LAYOUTS[cache_dtype_str].record_elems)
        # vLLM 0.25.1's model runners pass "auto" for every MLA layer (its MLAAttentionSpec carries no
        # quantisation mode), also when the cache holds fp8_ds_mla records. The record size then
        # follows from the dtype the runner views the buffer with: 656 uint8 or 576 bfloat16 values.
        return (num_blocks, block_size, -1)


def _model_reason(config: VllmConfig) -> str | None:
    model = config.model_config
    text = model.hf_text_config
    return rules.model_reason(
        num_heads=model.get_num_attention_heads(config.parallel_config),
        index_topk=getattr(text, "index_topk", None),
        kv_lora_rank=getattr(text, "kv_lora_rank", 0),
        qk_rope_head_dim=getattr(text, "qk_rope_head_dim", 0),
        decode_context_parallel_size=config.parallel_config.decode_context_parallel_size,
    )


@dataclass
class SparksealSparseMLAMetadata(AttentionMetadata):
    """One step's metadata, shared by every sparse-MLA layer of a KV-cache group.

    Fields:
        num_actual_tokens: query tokens of this step, without CUDA-graph padding.
        req_id_per_token: int32 ``[num_actual_tokens]``, each token's request (a view of a persistent
            buffer, so a captured graph reads the replayed step's values).
        block_table: int32 ``[num_reqs, max_blocks]``, vLLM's block table of the group.
        block_size: tokens per cache page (64).
    """

    num_actual_tokens: int
    req_id_per_token: torch.Tensor
    block_table: torch.Tensor
    block_size: int = PAGE_SIZE


class SparksealSparseMLAMetadataBuilder(AttentionMetadataBuilder[SparksealSparseMLAMetadata]):
    """Builds :class:`SparksealSparseMLAMetadata`; every batch shape can be captured in a CUDA graph."""

    # Rows of a step are independent sparse rows; uniform decode batches (speculative ones included)
    # are what vLLM captures.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.req_id_per_token_buffer = torch.zeros(tokens, dtype=torch.int32, device=device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> SparksealSparseMLAMetadata:
        cm = common_attn_metadata
        req_ids = rules.token_request_ids(cm.query_start_loc_cpu).numpy()
        # Padded rows of a captured batch read request 0's row of the block table; their output is
        # discarded, and slots come out of the table, so they never index outside the cache.
        self.req_id_per_token_buffer.fill_(0)
        self.req_id_per_token_buffer[: req_ids.shape[0]].copy_(
            np_to_pinned_tensor(req_ids), non_blocking=True
        )
        return SparksealSparseMLAMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            req_id_per_token=self.req_id_per_token_buffer[: cm.num_actual_tokens],
            block_table=cm.block_table_tensor,
            block_size=self.kv_cache_spec.block_size,
        )


class SparksealSparseMLAImpl(SparseMLAAttentionImpl[SparksealSparseMLAMetadata]):
    """``forward_mqa`` through ``torch.ops.sparkseal.sparse_mla_decode``."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        topk_indices_buffer: torch.Tensor | None = None,
        indexer: Any = None,
        **mla_args: Any,
    ) -> None:
        unsupported = [
            name
            for name, value in (
                ("alibi slopes", alibi_slopes),
                ("a sliding window", sliding_window),
                ("a logits soft cap", logits_soft_cap),
            )
            if value
        ]
        if attn_type != AttentionType.DECODER:
            unsupported.append(f"attention type {attn_type}")
        # Layers with an indexer share its buffer; skip-topk layers get the same buffer passed directly.
        buffer = indexer.topk_indices_buffer if indexer is not None else topk_indices_buffer
        reason = rules.kv_cache_reason(kv_cache_dtype)
        if reason is None:
            reason = rules.model_reason(
                num_heads=num_heads,
                index_topk=None if buffer is None else int(buffer.shape[-1]),
                kv_lora_rank=mla_args.get("kv_lora_rank", 0),
                qk_rope_head_dim=mla_args.get("qk_rope_head_dim", 0),
                decode_context_parallel_size=self.dcp_world_size,
            )
        if unsupported:
            reason = f"{rules.WHERE}: unsupported: {', '.join(unsupported)}"
        if reason is not None:
            raise rules.UnsupportedConfiguration(reason)
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.layout = rules.KV_CACHE_LAYOUTS[kv_cache_dtype].name
        self.max_smem_bytes = rules.max_smem_bytes()
        self.topk_indices_buffer = buffer
        self.supports_quant_query_input = False

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: SparksealSparseMLAMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        elif not q.is_contiguous():
            q = q.contiguous()
        tokens = q.shape[0]
        positions = self.topk_indices_buffer[:tokens]
        slots, lengths = rules.to_global_slots(
            attn_metadata.req_id_per_token[:tokens],
            attn_metadata.block_table,
            positions,
            attn_metadata.block_size,
        )
        cache = kv_c_and_k_pe_cache
        if self.kv_cache_dtype == "fp8_ds_mla":
            cache = cache.view(torch.uint8)
        out, _ = sparse_mla_decode(
            q,
            cache,
            slots,
            softmax_scale=self.scale,
            layout=self.layout,
            topk_length=lengths,
            max_smem_bytes=self.max_smem_bytes,
        )
        return out, None
