"""DeepSeek V4 decode through our sparse-MLA kernel, inside vLLM 0.25.1's own V4 attention classes.

vLLM builds each V4 layer's attention from a per-platform class (``vllm/models/deepseek_v4/nvidia``):
FlashMLA's on capability 9.x/10.x, FlashInfer's SM120 class on 12.x (GB10). Those classes own V4's
metadata (the sliding-window rows, the indexer's C4A rows, the precomputed C128A rows), its two caches
in 584-byte fp8 records, prefill, and the output projection. Our patch
``0002-deepseek-v4-custom-attention-backend.patch`` hands that class to
:meth:`SparksealSparseMLABackend.deepseek_v4_attention_cls` when the operator passes
``--attention-backend CUSTOM``; :func:`attention_class` derives a class that keeps all of it and
replaces only ``_forward_decode``: every decode row (speculative rows included) attends the window
cache, the layer's compressed cache and the attention sink in one call of
``torch.ops.sparkseal.sparse_mla_decode_into``, which writes the layer's output buffer directly, as
FlashMLA's kernel does (no copy per layer). Prefill stays on the base class (FlashMLA's sparse prefill
kernel on an H200, FlashInfer's on GB10).

The rows are computed by the same vLLM functions the base classes call, so both kernels see identical
slot ids; a layer the kernel cannot serve is refused when vLLM builds the model, never at a request.

V4's DSpark draft (``vllm/models/deepseek_v4/nvidia/dspark.py``) is made of V4 decoder layers, whose
class is chosen the same way, but under the speculative config's ``attention_backend``, not the target's
``--attention-backend`` (``vllm/v1/worker/gpu/spec_decode/dspark/utils.py``): the draft runs our class
only when ``--speculative-config`` says ``"attention_backend": "CUSTOM"`` (or, unset, where
``SPARKSEAL_SPARSE_MLA=1`` makes CUSTOM V4's default). Its non-causal rows are the window plus the whole
draft block, a wider index row than the target's, which the kernel reads the same way. The server log
says which layers run our kernel: one line for the target's, one more for a draft's. A target on our class
under speculative decoding is refused at start-up (:func:`sparse_mla_vllm.dsv4_speculative_reason`).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch
from vllm.models.deepseek_v4.common.ops import compute_global_topk_indices_and_lens

from sparkseal.kernels.sparse_mla import sparse_mla_decode, sparse_mla_decode_into
from sparkseal.vllm_integration import sparse_mla_vllm as rules
from sparkseal.vllm_integration import vllm_dsv4_debug

# vLLM configures only its own logger tree; the plugin logs under it too.
logger = logging.getLogger("vllm.sparkseal")


class SparksealDecode:
    """The mix-in placed before vLLM's V4 attention class: our kernel for the decode rows.

    Attributes it reads are the base class's (``swa_cache_layer``, ``compress_ratio``,
    ``topk_indices_buffer``, ``attn_sink``, ``scale``, ``padded_heads``); it adds
    ``sparkseal_max_smem_bytes``, the shared-memory cap the kernel plans under, and
    ``sparkseal_debug_dir``, where the debug switch saves a NaN call's inputs (``None``: off).
    """

    sparkseal_debug_dir: Path | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        buffer = getattr(self, "topk_indices_buffer", None)
        reason = rules.dsv4_reason(
            uses_fp8_ds_mla_layout=self._uses_fp8_ds_mla_layout(),
            kv_cache_dtype=self.kv_cache_dtype,
            padded_heads=self.padded_heads,
            head_dim=self.head_dim,
            rope_head_dim=self.rope_head_dim,
            compress_ratio=self.compress_ratio,
            window_size=self.window_size,
            index_topk=None if buffer is None else int(buffer.shape[-1]),
        )
        config = args[0] if args else kwargs.get("vllm_config")
        draft = draft_layer(config)
        reason = reason or rules.dsv4_speculative_reason(
            speculative=getattr(config, "speculative_config", None) is not None, draft=draft
        )
        if reason is not None:
            raise rules.UnsupportedConfiguration(f"{self.prefix}: {reason}")
        self.sparkseal_max_smem_bytes = rules.max_smem_bytes()
        self.sparkseal_debug_dir = vllm_dsv4_debug.debug_dir()
        _announce(type(self), self.sparkseal_max_smem_bytes, draft)

    def _forward_decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor | None,
        swa_metadata: Any,
        attn_metadata: Any,
        swa_only: bool,
        output: torch.Tensor,
    ) -> None:
        args = self.sparkseal_decode_args(q, kv_cache, swa_metadata, attn_metadata, swa_only, output.shape[1])
        if output.is_contiguous():
            sparse_mla_decode_into(output, **args)
        else:
            # vLLM 0.25.1 hands over a prefix of the layer's contiguous [tokens, padded_heads, 512] buffer
            # (DeepseekV4MLAAttention.forward's o_padded), so this is only a guard for other callers.
            output.copy_(sparse_mla_decode(**args)[0])
        if self.sparkseal_debug_dir is not None:
            base = super()._forward_decode  # type: ignore[misc]
            vllm_dsv4_debug.check(
                self,
                args,
                q,
                output,
                base,
                (q, kv_cache, swa_metadata, attn_metadata, swa_only),
                self.sparkseal_debug_dir,
            )

    def sparkseal_decode_args(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor | None,
        swa_metadata: Any,
        attn_metadata: Any,
        swa_only: bool,
        heads: int,
    ) -> dict[str, Any]:
        """The kernel's keyword arguments for this step's decode rows (``heads``: the output's padded heads).

        Apart from ``_forward_decode`` so that ``bench/vllm_backend/dsv4_decode.py`` can time the same rows
        through the allocating op and a copy, the path before the in-place op.
        """
        tokens = swa_metadata.num_decode_tokens
        extra_cache = extra_indices = extra_lengths = None
        if not swa_only:
            if attn_metadata is None or swa_metadata.is_valid_token is None or kv_cache is None:
                raise RuntimeError(
                    f"{rules.DSV4_WHERE}: {self.prefix}: a compressed layer without its metadata"
                )
            extra_cache = kv_cache
            if self.compress_ratio == 4:
                # C4A: the indexer's per-layer rows, mapped through the block table as vLLM does.
                extra_indices, extra_lengths = compute_global_topk_indices_and_lens(
                    self.topk_indices_buffer[:tokens],
                    swa_metadata.token_to_req_indices,
                    attn_metadata.block_table[: swa_metadata.num_decodes],
                    attn_metadata.block_size // self.compress_ratio,
                    swa_metadata.is_valid_token[:tokens],
                )
            else:
                # C128A: rows vLLM's metadata builder computed once for every such layer.
                extra_indices = attn_metadata.c128a_global_decode_topk_indices
                extra_lengths = attn_metadata.c128a_decode_topk_lens
        return {
            "q": padded_query(q, heads),
            "cache": self.swa_cache_layer.kv_cache,
            "indices": swa_metadata.decode_swa_indices,
            "softmax_scale": self.scale,
            "layout": rules.DSV4_LAYOUT.name,
            "topk_length": swa_metadata.decode_swa_lens,
            "extra_cache": extra_cache,
            "extra_indices": extra_indices,
            "extra_topk_length": extra_lengths,
            "attn_sink": self.attn_sink,
            "max_smem_bytes": self.sparkseal_max_smem_bytes,
        }


def draft_layer(vllm_config: Any) -> bool:
    """Whether the layer being built belongs to a speculative draft with non-causal attention (DSpark's).

    vLLM 0.25.1 builds a DSpark (or DFlash) draft under a copy of the configuration whose attention
    config has ``use_non_causal`` set (``vllm/v1/worker/gpu/spec_decode/dspark/utils.py``); the target's
    layers are built under the configuration as given.
    """
    attention = getattr(vllm_config, "attention_config", None)
    return bool(getattr(attention, "use_non_causal", False))


@functools.cache
def _announce(cls: type, max_smem_bytes: int, draft: bool = False) -> None:
    """One line per class, cap and role in the server log: which kernel V4's decode rows run."""
    logger.info(
        "sparkseal: DeepSeek V4 decode runs the sparkseal kernel%s (%s, shared memory cap %s)",
        " in the speculative draft" if draft else "",
        cls.__qualname__,
        max_smem_bytes or "the device's limit",
    )


def padded_query(q: torch.Tensor, heads: int) -> torch.Tensor:
    """``q`` contiguous, with zero heads appended up to the output's ``heads`` (its dtype the binding checks).

    FlashMLA's class hands over queries already padded; FlashInfer's SM120 class pads them itself.
    """
    if q.shape[1] < heads:
        q = torch.nn.functional.pad(q, (0, 0, 0, heads - q.shape[1]))
    return q.contiguous()


@functools.cache
def attention_class(base: type) -> type:
    """The V4 attention class for ``--attention-backend CUSTOM``: ``base`` with our decode kernel.

    One class per base, so every layer of a model (and a second engine in the same process) shares it.
    """
    if not callable(getattr(base, "_forward_decode", None)):
        raise TypeError(
            f"{rules.DSV4_WHERE}: {base.__module__}.{base.__qualname__}: expected a DeepSeek V4 attention "
            "class with _forward_decode (vLLM 0.25.1's FlashMLA or FlashInfer SM120 class)"
        )
    name = f"Sparkseal{base.__name__}"
    return type(name, (SparksealDecode, base), {"__module__": __name__, "__qualname__": name})
