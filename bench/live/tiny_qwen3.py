"""A Qwen3 target and its Qwen3 DSpark draft in plain PyTorch, computing what vLLM v0.25.1 computes.

The live runs serve a trained draft (``bench/live/train_dspark.py``); a draft only helps if it was trained
on exactly the function vLLM evaluates at inference, so this module mirrors, step by step:

* the target, ``Qwen3ForCausalLM`` (``vllm/model_executor/models/qwen3.py``): pre-norm decoder layers with
  per-head RMSNorm of q and k, neox-style RoPE, grouped-query attention, a SiLU-gated MLP, an untied LM
  head; the hidden states the draft consumes are the residual stream *after* decoder layer ``i`` for every
  ``i`` in ``dflash_config.target_layer_ids`` (vLLM collects ``hidden_states + residual`` at aux index
  ``i + 1``: ``eagle3_utils.get_eagle3_aux_layers_from_config``);
* the draft, ``Qwen3DSparkModel`` (``qwen3_dspark.py`` over ``qwen3_dflash.py``): the concatenated target
  states go through ``fc`` (``combine_hidden_states``), then ``hidden_norm``, then every draft layer's own
  k/v projection, k-norm and RoPE at the context positions (``precompute_and_store_context_kv``: no
  per-layer input norm on the context); the query block of one request is ``num_speculative_tokens`` rows,
  the anchor (the token the target just sampled, at position P) followed by mask tokens at P+1, P+2, ...
  (``_prepare_dflash_inputs_kernel`` with ``SAMPLE_FROM_ANCHOR``); the block attends non-causally to all
  context positions before P and to itself; the final norm and the target's LM head give base logits at
  every query row, row j predicting position P + 1 + j;
* the Markov head (``DSparkSpeculator._sample_sequential``): row j's logits get the bias
  ``markov_w2 @ markov_w1[prev]``, where ``prev`` is the anchor for row 0 and the token drafted at row
  j - 1 after it; greedy drafting takes the argmax, left to right.

The draft shares the target's embedding (the mask token's row included) and LM head, as vLLM's
``load_dspark_model`` does when the draft checkpoint ships neither. Training uses the same modules with
several query blocks per sequence and a block mask; ``propose`` drafts one block greedily as vLLM does.
Parameter names are the Hugging Face ones vLLM's loaders read, so ``state_dict()`` is the checkpoint.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    """The dimensions target and draft share (the draft reuses the target's embedding and LM head)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (float32, ``[*positions.shape, head_dim // 2]``) as vLLM's rotary cache holds them."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    )
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation (halves, not interleaved pairs) of ``x`` ``[B, heads, T, d]``.

    ``cos`` and ``sin`` are ``[B, T, d/2]``.
    """
    half = x.shape[-1] // 2
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.shape = shape
        h, d = shape.hidden_size, shape.head_dim
        self.q_proj = nn.Linear(h, shape.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, shape.rms_norm_eps)
        self.k_norm = RMSNorm(d, shape.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, heads, self.shape.head_dim).transpose(1, 2)

    def key_value(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed, rotated keys and plain values ``[B, kv_heads, T, d]`` of already-normed input ``h``."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(h), self.shape.num_kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(h), self.shape.num_kv_heads)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Attention of ``h``'s rows over ``prefix`` keys (if any) then their own; returns output and own k/v.

        ``mask`` (True: may attend) spans prefix and own keys; ``causal`` applies to own keys only when
        there is no prefix and no mask (the target's training and prefill path).
        """
        shape = self.shape
        q = apply_rope(self.q_norm(self._heads(self.q_proj(h), shape.num_heads)), cos, sin)
        k, v = self.key_value(h, cos, sin)
        keys, values = k, v
        if prefix is not None:
            keys, values = torch.cat((prefix[0], k), dim=2), torch.cat((prefix[1], v), dim=2)
        group = shape.num_heads // shape.num_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=mask,
            is_causal=causal and mask is None and prefix is None,
            scale=shape.head_dim**-0.5,
        )
        batch, _, length, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = MLP(shape)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        **attention: object,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, kv = self.self_attn(self.input_layernorm(x), cos, sin, **attention)
        x = x + out
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class _TargetModel(nn.Module):
    def __init__(self, shape: Shape, num_layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class Qwen3Target(nn.Module):
    """``Qwen3ForCausalLM``; ``state_dict()`` keys are the checkpoint's (``model.…``, ``lm_head.weight``)."""

    def __init__(self, shape: Shape, num_layers: int) -> None:
        super().__init__()
        self.shape = shape
        self.model = _TargetModel(shape, num_layers)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)

    def forward(
        self, ids: torch.Tensor, aux_layers: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Causal forward of ``ids`` ``[B, T]``: final normed hidden states and the residual stream after each
        layer in ``aux_layers`` (vLLM's aux hidden states for ``target_layer_ids``)."""
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        cos, sin = rope_tables(positions, self.shape.head_dim, self.shape.rope_theta)
        x = self.model.embed_tokens(ids)
        aux = []
        for index, layer in enumerate(self.model.layers):
            x, _ = layer(x, cos, sin, causal=True)
            if index in aux_layers:
                aux.append(x)
        return self.model.norm(x), aux

    @torch.no_grad()
    def generate(
        self,
        prompts: torch.Tensor,
        new_tokens: int,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continuation ``[B, L + new]`` of same-length ``prompts`` ``[B, L]`` (key/value cached): greedy, or
        sampled at ``temperature`` from ``generator`` (on the prompts' device; seeded, so repeatable)."""

        def pick(logits: torch.Tensor) -> torch.Tensor:
            if temperature <= 0:
                return logits.argmax(-1)
            probs = torch.softmax(logits.float()[:, -1] / temperature, dim=-1)
            return torch.multinomial(probs, 1, generator=generator)

        batch, length = prompts.shape
        total = length + new_tokens
        device = prompts.device
        tokens = torch.empty(batch, total, dtype=prompts.dtype, device=device)
        tokens[:, :length] = prompts
        positions = torch.arange(total, device=device).expand(batch, -1)
        cos_all, sin_all = rope_tables(positions, self.shape.head_dim, self.shape.rope_theta)
        caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        x = self.model.embed_tokens(prompts)
        for layer in self.model.layers:
            x, kv = layer(x, cos_all[:, :length], sin_all[:, :length], causal=True)
            caches.append(kv)
        next_token = pick(self.lm_head(self.model.norm(x[:, -1:])))
        for step in range(new_tokens):
            at = length + step
            tokens[:, at] = next_token[:, 0]
            if step == new_tokens - 1:
                break
            x = self.model.embed_tokens(next_token)
            cos, sin = cos_all[:, at : at + 1], sin_all[:, at : at + 1]
            for index, layer in enumerate(self.model.layers):
                x, kv = layer(x, cos, sin, prefix=caches[index])
                caches[index] = (
                    torch.cat((caches[index][0], kv[0]), 2),
                    torch.cat((caches[index][1], kv[1]), 2),
                )
            next_token = pick(self.lm_head(self.model.norm(x)))
        return tokens


class MarkovHead(nn.Module):
    """``DSparkMarkovHead``: ``markov_w1`` ``[V, r]`` embeds the previous token, ``markov_w2`` ``[V, r]``
    maps that to a vocabulary bias."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(prev))


class DSparkDraft(nn.Module):
    """``Qwen3DSparkModel`` without the embedding and LM head it shares with the target.

    ``state_dict()`` keys are the draft checkpoint's (no ``model.`` prefix: vLLM's ``load_weights`` adds it).
    """

    def __init__(
        self,
        shape: Shape,
        num_layers: int,
        target_layer_ids: Sequence[int],
        markov_rank: int,
        mask_token_id: int,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.target_layer_ids = tuple(target_layer_ids)
        self.mask_token_id = mask_token_id
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(num_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * shape.hidden_size, shape.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.markov_head = MarkovHead(shape.vocab_size, markov_rank)

    def block_hidden(
        self,
        embed: nn.Embedding,
        aux: Sequence[torch.Tensor],
        tokens: torch.Tensor,
        anchors: torch.Tensor,
        block: int,
        mask_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states ``[B, K, block, H]`` of K query blocks per sequence, one per anchor.

        ``aux``: the target's states after each target layer, ``[B, T, H]`` each, for ``tokens`` ``[B, T]``;
        ``anchors`` ``[B, K]``: the anchor positions P (context: positions < P). ``mask_embedding`` replaces
        the embedding row of the mask token (training learns it; the export writes it into the target's
        embedding, where vLLM reads it).
        """
        batch, length = tokens.shape
        count = anchors.shape[1]
        device = tokens.device
        offsets = torch.arange(block, device=device)
        query_pos = (anchors[..., None] + offsets).reshape(batch, count * block)
        ids = torch.full((batch, count, block), self.mask_token_id, dtype=tokens.dtype, device=device)
        ids[..., 0] = tokens.gather(1, anchors)
        x = embed(ids.reshape(batch, count * block))
        if mask_embedding is not None:
            is_mask = (ids.reshape(batch, count * block) == self.mask_token_id)[..., None]
            x = torch.where(is_mask, mask_embedding.to(x.dtype), x)
        context = self.hidden_norm(self.fc(torch.cat(list(aux), dim=-1)))
        ctx_pos = torch.arange(length, device=device).expand(batch, -1)
        ctx_cos, ctx_sin = rope_tables(ctx_pos, self.shape.head_dim, self.shape.rope_theta)
        q_cos, q_sin = rope_tables(query_pos, self.shape.head_dim, self.shape.rope_theta)
        # Row r of block k sees context positions < anchor k and every row of block k (non-causal).
        row_anchor = anchors.repeat_interleave(block, dim=1)
        sees_context = torch.arange(length, device=device)[None, None, :] < row_anchor[..., None]
        row_block = torch.arange(count * block, device=device) // block
        sees_block = (row_block[:, None] == row_block[None, :]).expand(batch, -1, -1)
        mask = torch.cat((sees_context, sees_block), dim=-1)[:, None]
        for layer in self.layers:
            prefix = layer.self_attn.key_value(context, ctx_cos, ctx_sin)
            x, _ = layer(x, q_cos, q_sin, prefix=prefix, mask=mask)
        return self.norm(x).view(batch, count, block, -1)

    def propose(self, base_logits: torch.Tensor, anchor_ids: torch.Tensor) -> torch.Tensor:
        """Greedy drafts ``[..., block]`` from base logits ``[..., block, V]``.

        Row j adds the Markov bias of the token before it (the anchor for row 0) and takes the argmax, left
        to right.
        """
        prev = anchor_ids
        drafted = []
        for j in range(base_logits.shape[-2]):
            token = (base_logits[..., j, :] + self.markov_head(prev)).argmax(-1)
            drafted.append(token)
            prev = token
        return torch.stack(drafted, dim=-1)


def teacher_forced_logits(
    draft: DSparkDraft, hidden: torch.Tensor, lm_head: nn.Linear, tokens: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training logits ``[B, K, block, V]`` (Markov bias from the true previous token) and their labels.

    With the true previous token the bias is what greedy drafting adds whenever the drafts so far were
    right, which is the only case in which a later row can be accepted.
    """
    block = hidden.shape[2]
    offsets = torch.arange(block, device=tokens.device)
    positions = anchors[..., None] + offsets
    batch = tokens.shape[0]
    prev = tokens.gather(1, positions.reshape(batch, -1)).view_as(positions)
    labels = tokens.gather(1, (positions + 1).reshape(batch, -1)).view_as(positions)
    return lm_head(hidden) + draft.markov_head(prev), labels


def accepted_prefix(drafts: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """How many leading drafts equal the target's tokens (what greedy verification accepts), per block."""
    return torch.cumprod((drafts == truth).to(torch.int64), dim=-1).sum(-1)


def speculative_walk(accepted: Sequence[int], start: int, end: int) -> list[int]:
    """Accepted counts of the draft steps vLLM takes from anchor ``start`` until position ``end``.

    ``accepted[P - start]`` is what a block anchored at P accepts; after accepting k the next anchor is the
    target's bonus token at P + k + 1.
    """
    steps = []
    anchor = start
    while anchor < end and anchor - start < len(accepted):
        k = int(accepted[anchor - start])
        steps.append(k)
        anchor += k + 1
    return steps


# ---------------------------------------------------------------- checkpoints


_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The safetensors layout (8-byte little-endian header size, JSON header, raw little-endian data),
    names sorted, so equal tensors give equal bytes; no dependency beyond torch."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        raw = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)))
        stream.write(encoded)
        for blob in blobs:
            stream.write(blob)


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Read what ``save_safetensors`` (or any safetensors writer, for these dtypes) wrote."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    base = 8 + size
    names = {value: key for key, value in _DTYPES.items()}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        raw = bytearray(data[base + start : base + end])
        out[name] = torch.frombuffer(raw, dtype=names[entry["dtype"]]).reshape(entry["shape"])
    return out


def shape_of(config: dict) -> Shape:
    """The shared dimensions of a ``config.json`` (target or draft)."""
    return Shape(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        rms_norm_eps=config["rms_norm_eps"],
        rope_theta=config["rope_parameters"]["rope_theta"],
    )


def build(target_config: dict, draft_config: dict) -> tuple[Qwen3Target, DSparkDraft]:
    """Target and draft with the layout their ``config.json`` files describe (weights uninitialised)."""
    target = Qwen3Target(shape_of(target_config), target_config["num_hidden_layers"])
    dflash = draft_config["dflash_config"]
    draft = DSparkDraft(
        shape_of(draft_config),
        draft_config["num_hidden_layers"],
        dflash["target_layer_ids"],
        draft_config["markov_rank"],
        dflash["mask_token_id"],
    )
    return target, draft


def load_models(
    model_dir: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16
) -> tuple[Qwen3Target, DSparkDraft]:
    """The trained pair from ``model_dir/{target,draft}/`` (config.json + model.safetensors), in eval mode."""
    configs = [json.loads((model_dir / name / "config.json").read_text()) for name in ("target", "draft")]
    target, draft = build(*configs)
    for module, name in ((target, "target"), (draft, "draft")):
        module.load_state_dict(load_safetensors(model_dir / name / "model.safetensors"))
        module.to(device=device, dtype=dtype).eval()
    return target, draft


@torch.no_grad()
def draft_blocks(
    target: Qwen3Target, draft: DSparkDraft, tokens: torch.Tensor, anchors: torch.Tensor, block: int
) -> torch.Tensor:
    """Greedy drafts ``[B, K, block]`` for the blocks anchored at ``anchors`` ``[B, K]`` of ``tokens``.

    Each block sees only the positions before its anchor, so one pass over the whole sequence serves all.
    """
    _, aux = target(tokens, draft.target_layer_ids)
    hidden = draft.block_hidden(target.model.embed_tokens, aux, tokens, anchors, block)
    return draft.propose(target.lm_head(hidden), tokens.gather(1, anchors))
