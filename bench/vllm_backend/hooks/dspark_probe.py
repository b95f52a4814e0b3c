"""Where does a DeepSeek V4 DSpark draft's context record go wrong? (bench only; ``SPARKSEAL_DSPARK_PROBE=1``)

vLLM 0.25.1's DSpark speculator (``vllm/v1/worker/gpu/spec_decode/dflash/speculator.py``, which DSpark's
inherits) writes the draft's context K/V for every accepted target position
(``precompute_and_store_context_kv``) and then runs the draft's query block, whose sliding-window rows read
those records back through the draft's attention metadata. An H200 run found the record of a prompt's last
position holding NoPE 00, scale 00 and RoPE ``FF 7F`` in every draft layer (bench/results/vllm_backend.md
section 5). This probe records, in the server log as ``[dspark-probe] {json}`` lines:

- ``groups``: per KV-cache group its block size, kernel block size and layers; the draft's groups, which
  group each draft layer's cache is in, and each draft cache tensor's shape and strides;
- ``context``: per request of the first real draft steps, the context rows' positions, the slot the
  context insert wrote (``slot``), the slot the same block table gives in kernel-block units
  (``kernel_slot``), the slot the draft decode's index row reads for that position (``read``), and the
  584 bytes (as a summary, and in hex for the last position) before the insert, after it and after the
  draft step;
- ``changed``: a watched record (the last context positions of each request, in every draft layer) whose
  bytes changed after its insert while its block was still in a live request's block table, with the call
  that changed it (a V4 layer's K insert, its decode, the whole layer, the draft step), so an overwrite is
  pinned to one call; a record whose block was freed and handed to another request is dropped from the
  watch (``freed``), since writing it is then legitimate;
- ``hidden``: rows of the target's hidden states (after DSpark's ``combine_hidden_states``) that hold NaN;
- ``combine``: the same step taken apart: each target aux hidden state the draft is fed, ``main_proj`` of
  their concatenation and ``main_norm`` of that, each with its NaN rows, all-zero rows and largest magnitude;
- ``target``: the first V4 decoder layers, attention and MoE calls and ``mhc_post`` results of the target's
  forward (real steps only, not warm-up) whose output holds a NaN row or is all zeros, so the op that makes
  the first bad row is named;
- ``sampler``: NaN rows of the logits entering vLLM's plain sampler (a prefill's logits never reach the
  rejection sampler that ``SPARKSEAL_SAMPLER_NAN`` watches).

- ``engine-ready``: the end of vLLM's start-up warm-up, which runs real steps with made-up requests (token ids
  0, 1, ...) through the KV cache, block ids from 1 up, behind the scheduler's back. Every counter above
  starts again there, so the steps described are the first real ones; ``null-block`` lists the KV caches
  whose block 0 (the null block, which block tables point unused entries at) holds anything but zeros then,
  and again after each described step.

``SPARKSEAL_ZERO_KV_AFTER_WARMUP=1`` (an experiment, with the probe): every KV cache is zeroed at
``engine-ready``, so no real request can read what the warm-up left.

``SPARKSEAL_DSPARK_KERNEL_BLOCKS=1`` (an experiment, with the probe): the speculator's input preparation is
given each draft group's kernel block size instead of its KV-manager block size, the units its block table
is in (upstream's later code passes the kernel block size).

``SPARKSEAL_MHC_CHECK=1`` (with the probe): every call of V4's fused hyper-connection step
(``mhc_fused_post_pre_tilelang``: the previous sub-layer's ``mhc_post`` and the next one's ``mhc_pre``) is
checked against a float32 reference of its ``mhc_post`` half computed from the same inputs, warm-up steps
included: ``mhc`` lines name the layer, the token count, whether vLLM 0.25.1 takes its small-batch kernel
(at most 16 tokens) and whether that kernel covers the hidden size (:func:`small_fma_covers`: v0.25.1's
choice, also where the candidate patch is applied), the rows whose new residual differs from the reference
or holds NaN, and the NaN rows of the inputs and of the next layer input. Bad calls are all reported (up to a
cap), clean ones only the first of each token count; ``mhc-tally`` lines count the checked calls.

``SPARKSEAL_MHC_UNFUSED_SMALL=1`` (an experiment, with the probe; the candidate fix of
``bench/vllm_backend/candidates/``): where the small-batch kernel would not cover the hidden size, the step
runs as vLLM's separate ``mhc_post_tilelang`` then ``mhc_pre_tilelang`` instead (what vLLM does for more than
16 tokens).

``metadata`` lines: for the first real steps, each attention metadata kind's decode/prefill split (requests
and tokens), ``query_start_loc`` and ``seq_lens`` as the target's layers see them.

Every check synchronises, so serve with ``--enforce-eager``; nothing is checked while a CUDA graph is being
captured, and a failure of the probe is logged, never raised.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

PROBE_ENV = "SPARKSEAL_DSPARK_PROBE"
KERNEL_BLOCKS_ENV = "SPARKSEAL_DSPARK_KERNEL_BLOCKS"
SPECULATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"
ATTENTION_MODULE = "vllm.models.deepseek_v4.attention"
FLASHMLA_MODULE = "vllm.models.deepseek_v4.nvidia.flashmla"
SAMPLER_MODULE = "vllm.v1.worker.gpu.sample.sampler"
OURS_MODULE = "sparkseal.vllm_integration.vllm_dsv4"
MODEL_MODULE = "vllm.models.deepseek_v4.nvidia.model"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
ZERO_ENV = "SPARKSEAL_ZERO_KV_AFTER_WARMUP"
MHC_CHECK_ENV = "SPARKSEAL_MHC_CHECK"
MHC_UNFUSED_ENV = "SPARKSEAL_MHC_UNFUSED_SMALL"
MHC_KERNELS_MODULE = "vllm.model_executor.kernels.mhc.tilelang"
MAX_TARGET_EVENTS = 60
# vLLM 0.25.1's small-batch fused mHC step: at most MHC_SMALL_MAX tokens, MHC_THREADS threads a block.
MHC_SMALL_MAX = 16
MHC_THREADS = 256
# Per phase (warm-up, then real steps): every bad mHC call up to MAX_MHC_BAD, the first clean one of each
# token count up to MAX_MHC_CLEAN; the attention metadata of the first METADATA_STEPS real target steps.
MAX_MHC_BAD = 48
MAX_MHC_CLEAN = 12
METADATA_STEPS = 3

# How many real draft steps are described, how many context positions per request (the last ones), how
# many records are watched at most, and how many ``changed`` lines are written.
STEPS = int(os.environ.get("SPARKSEAL_DSPARK_PROBE_STEPS", "4"))
LAST = 6
MAX_WATCHED = 96
MAX_CHANGES = 40
NOPE, DATA, SCALES = 448, 576, 8

_state: dict[str, Any] = {
    "steps": 0,
    "proposes": 0,
    "changes": 0,
    "checks": 0,
    "watch": [],
    "sampler": 0,
    "target_events": 0,
    "freed": 0,
    "mhc_bad": 0,
    "mhc_clean": 0,
    "mhc_clean_sizes": set(),
    "mhc_tally": {},
    "forwards": 0,
    "phase": "warm-up",
    "layer": "",
    "mhc_parts": [],
}


def emit(kind: str, **fields: Any) -> None:
    print(f"[dspark-probe] {json.dumps({'kind': kind, **fields}, default=str)}", file=sys.stderr, flush=True)


def capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def summary(record: Any) -> dict[str, Any]:
    """A 584-byte V4 record (576 data bytes then 8 scale bytes) in a few numbers."""
    import torch

    nope, rope, scale = record[:NOPE], record[NOPE:DATA], record[DATA:]
    rope16 = rope.view(torch.int16).to(torch.int32) & 0xFFFF
    rope_nan = ((rope16 & 0x7F80) == 0x7F80) & ((rope16 & 0x7F) != 0)
    return {
        "nope_zero": int((nope == 0).sum()),
        # e4m3 -448 and +448: what the V4 insert's clamp leaves of a NaN (or saturated) value.
        "nope_fe": int(((nope == 0xFE) | (nope == 0x7E)).sum()),
        "nope_nan": int(((nope & 0x7F) == 0x7F).sum()),
        "scale": scale.tolist(),
        "rope_nan": int(rope_nan.sum()),
        "rope_head": [f"{int(v):04x}" for v in rope16[:4]],
    }


def records(cache: Any, slots: Any) -> Any:
    """Each slot's 584-byte record, ``[R, 584]``, from a V4 fp8_ds_mla page cache ``[pages, block, 584]``."""
    import torch

    block = cache.shape[1]
    flat = cache.view(cache.shape[0], -1)
    slots = slots.to(torch.int64).to(flat.device)
    page, off = slots // block, slots % block
    data = off.unsqueeze(1) * DATA + torch.arange(DATA, device=flat.device)
    scale = block * DATA + off.unsqueeze(1) * SCALES + torch.arange(SCALES, device=flat.device)
    cols = torch.cat([data, scale], dim=1)
    return flat[page.unsqueeze(1).expand_as(cols), cols]


def check_watch(where: str) -> None:
    """Compare every watched record with its snapshot; report (and re-snapshot) the ones that changed."""
    watch = _state["watch"]
    if not watch or capturing() or _state["changes"] >= MAX_CHANGES:
        return
    import torch

    try:
        torch.cuda.synchronize()
        _state["checks"] += 1
        for entry in watch:
            now = records(entry["cache"], entry["slots"])
            differs = (now != entry["bytes"]).any(dim=1)
            if not bool(differs.any()):
                continue
            live = live_blocks(entry)
            for row in differs.nonzero().flatten().tolist():
                if live is not None and int(entry["slots"][row]) // entry["block"] not in live:
                    # The block was freed and handed on: its new owner writes it legitimately.
                    _state["freed"] += 1
                    continue
                _state["changes"] += 1
                emit(
                    "changed",
                    where=where,
                    check=_state["checks"],
                    step=_state["steps"],
                    layer=entry["layer"],
                    position=entry["positions"][row],
                    slot=int(entry["slots"][row]),
                    before=summary(entry["bytes"][row].cpu()),
                    after=summary(now[row].cpu()),
                    after_hex=bytes(now[row].cpu().tolist()).hex(),
                )
            entry["bytes"] = now
    except Exception as error:  # the probe must not change what the server does
        emit("error", where=f"check {where}", error=repr(error))


def live_blocks(entry: dict[str, Any]) -> set[int] | None:
    """The block ids in the live block table of the watched record's KV-cache group (``None``: unknown)."""
    tables = _state.get("block_tables")
    gid = entry.get("gid")
    if tables is None or gid is None:
        return None
    return set(tables.input_block_tables[gid].flatten().tolist()) - {0}


def wrap_method(cls: Any, name: str, label: Any) -> None:
    """Check the watched records after every call of ``cls.name`` (``label(self)`` names the call)."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, "_dspark_probe", False):
        return

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if _state["watch"]:
            check_watch(label(self))
        return out

    wrapped._dspark_probe = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _prefix(self: Any) -> str:
    return str(getattr(self, "prefix", type(self).__name__))


# ------------------------------------------------------------------ the speculator


def _groups(spec: Any, kv_cache_config: Any, block_tables: Any) -> None:
    names_of = getattr(spec.model, "get_draft_kv_cache_layer_names", None)
    draft_names = set(names_of()) if names_of is not None else set()
    groups = []
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        names = list(group.layer_names)
        groups.append(
            {
                "gid": gid,
                "spec": type(group.kv_cache_spec).__name__,
                "block_size": block_tables.block_sizes[gid],
                "kernel_block_size": block_tables.kernel_block_sizes[gid],
                "layers": len(names),
                "first_layers": names[:4],
                "draft_layers": [n for n in names if n in draft_names],
            }
        )
    caches = []
    for layer in _draft_layers(spec):
        cache = layer.attn.swa_cache_layer.kv_cache
        caches.append(
            {
                "layer": layer.attn.swa_cache_layer.prefix,
                "block_size": layer.attn.swa_cache_layer.block_size,
                "shape": list(cache.shape),
                "stride": list(cache.stride()),
                "dtype": str(cache.dtype),
            }
        )
    emit(
        "groups",
        groups=groups,
        draft_group_ids=list(spec.draft_kv_cache_group_ids),
        layer_group_idx=spec._layer_group_idx,
        num_query_per_req=spec.num_query_per_req,
        sample_from_anchor=spec.sample_from_anchor,
        caches=caches,
    )


def _draft_layers(spec: Any) -> list[Any]:
    inner = getattr(spec.model, "model", None)
    layers = getattr(inner, "layers", None) or []
    return [layer for layer in layers if hasattr(getattr(layer, "attn", None), "swa_cache_layer")]


def _patch_speculator(module: Any) -> None:
    import torch

    cls = module.DFlashSpeculator
    set_attn, propose, build = cls.set_attn, cls.propose, cls._build_draft_attn_metadata

    def probe_set_attn(self: Any, model_state: Any, kv_cache_config: Any, block_tables: Any) -> None:
        set_attn(self, model_state, kv_cache_config, block_tables)
        _state["block_tables"] = block_tables
        try:
            _groups(self, kv_cache_config, block_tables)
        except Exception as error:
            emit("error", where="groups", error=repr(error))

    def probe_build(self: Any, *args: Any, **kwargs: Any) -> Any:
        metadata = build(self, *args, **kwargs)
        self._dspark_probe_metadata = metadata
        return metadata

    def probe_propose(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        dummy = bool(kwargs.get("dummy_run", False))
        if not dummy and not capturing():
            _state["proposes"] += 1
            if _state["proposes"] > STEPS + 2 and _state["watch"]:
                # Past the first steps blocks are freed and reused: later changes are no longer news.
                emit(
                    "watch-end",
                    proposes=_state["proposes"],
                    checks=_state["checks"],
                    changes=_state["changes"],
                )
                _state["watch"] = []
        if dummy or capturing() or _state["steps"] >= STEPS:
            return propose(self, input_batch, *args, **kwargs)
        _state["steps"] += 1
        step = _state["steps"]
        try:
            _combine(self, input_batch, args, kwargs, step)
        except Exception as error:
            emit("error", where="combine", error=repr(error))
        model = self.model
        precompute = model.precompute_and_store_context_kv
        seen: dict[str, Any] = {}

        def probe_precompute(states: Any, positions: Any, slots: Any = None) -> Any:
            try:
                seen.update(_before_insert(self, input_batch, states, positions, slots))
            except Exception as error:
                emit("error", where="before insert", error=repr(error))
            out = precompute(states, positions, slots)
            try:
                _after_insert(self, seen, step)
            except Exception as error:
                emit("error", where="after insert", error=repr(error))
            return out

        model.precompute_and_store_context_kv = probe_precompute
        try:
            out = propose(self, input_batch, *args, **kwargs)
        finally:
            del model.precompute_and_store_context_kv
        try:
            torch.cuda.synchronize()
            _after_draft(self, seen, step)
            check_watch(f"draft step {step}")
            null_block_report(f"draft step {step}")
            mhc_tally(f"draft step {step}")
        except Exception as error:
            emit("error", where="after draft", error=repr(error))
        return out

    cls.set_attn = probe_set_attn
    cls.propose = probe_propose
    cls._build_draft_attn_metadata = probe_build
    if os.environ.get(KERNEL_BLOCKS_ENV) == "1":
        prepare = module.prepare_dflash_inputs

        def kernel_blocks(*args: Any) -> Any:
            # Positional call of dflash's propose: the block table is argument 12, its block size 13.
            args = list(args)
            tables = _state.get("block_tables")
            if tables is not None:
                for gid, table in enumerate(tables.input_block_tables):
                    if table is args[12] and args[13] != tables.kernel_block_sizes[gid]:
                        if not _state.get("kernel_blocks_said"):
                            _state["kernel_blocks_said"] = True
                            kernel = tables.kernel_block_sizes[gid]
                            emit("kernel-blocks", gid=gid, block_size=args[13], kernel=kernel)
                        args[13] = tables.kernel_block_sizes[gid]
            return prepare(*args)

        module.prepare_dflash_inputs = kernel_blocks


def rows_state(tensor: Any) -> dict[str, Any]:
    """NaN rows, all-zero rows and the largest finite magnitude of a ``[T, ...]`` tensor."""
    import torch

    flat = tensor.float().reshape(tensor.shape[0], -1)
    nan = torch.isnan(flat).any(dim=1)
    zero = (flat == 0).all(dim=1)
    return {
        "rows": int(flat.shape[0]),
        "nan_rows": nan.nonzero().flatten().tolist()[:32],
        "zero_rows": int(zero.sum()),
        "absmax": float(flat.nan_to_num(0).abs().max()) if flat.numel() else 0.0,
    }


def _combine(spec: Any, input_batch: Any, args: tuple[Any, ...], kwargs: dict[str, Any], step: int) -> None:
    """What DSpark's ``combine_hidden_states`` is fed and gives, op by op, for this step's target rows."""
    import torch

    # propose(input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, ...)
    last = args[2] if len(args) > 2 else kwargs.get("last_hidden_states")
    aux = args[3] if len(args) > 3 else kwargs.get("aux_hidden_states")
    n = input_batch.num_tokens
    inner = spec.model.model
    fields: dict[str, Any] = {"step": step, "tokens": n}
    if last is not None:
        fields["last_hidden"] = rows_state(last[:n])
    if aux:
        fields["aux"] = [rows_state(a[:n]) for a in aux]
        with torch.inference_mode():
            projected = inner.main_proj(torch.cat([a[:n] for a in aux], dim=-1))
            fields["main_proj"] = rows_state(projected)
            fields["main_norm"] = rows_state(inner.main_norm(projected))
    emit("combine", **fields)


def _target_check(label: str, tensor: Any) -> None:
    """Report ``tensor`` (an op's output in a real target step) if it holds a NaN row or is all zeros."""
    if _state["target_events"] >= MAX_TARGET_EVENTS or capturing() or tensor is None:
        return
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available() or not isinstance(get_forward_context().attn_metadata, dict):
            return  # warm-up and profiling runs carry no metadata
        import torch

        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
            return
        state = rows_state(tensor)
        if state["nan_rows"] or state["zero_rows"] == state["rows"]:
            _state["target_events"] += 1
            emit("target", where=label, proposes=_state["proposes"], **state)
    except Exception as error:
        emit("error", where=f"target {label}", error=repr(error))


# ------------------------------------------------------------------ hyper-connections (mHC)


def small_fma_covers(num_tokens: int, hidden_size: int, threads: int = MHC_THREADS) -> bool | None:
    """Whether vLLM 0.25.1's small-batch fused mHC kernel writes every element of the new residual.

    ``None`` where that kernel is not taken (more than 16 tokens). ``mhc_fused_post_pre_tilelang``
    (``vllm/model_executor/kernels/mhc/tilelang.py``) takes ``mhc_fused_tilelang`` for at most 16 tokens,
    splitting the hidden size 8 ways (fewer than 8 tokens and a hidden size of at most 4096) or 4 ways; in
    ``tilelang_kernels.py`` each block's 256 threads walk ``hidden_size // splits // 256`` strides of 256
    elements of their split, and nothing else of the split is written (nor summed into the next ``mhc_pre``).
    DeepSeek V4's hidden sizes 4096 and 7168 are covered; the test model's 512 gives 0 strides.
    """
    if num_tokens > MHC_SMALL_MAX:
        return None
    splits = 8 if (num_tokens < 8 and hidden_size <= 4096) else 4
    per_split = hidden_size // splits
    return per_split > 0 and per_split % threads == 0


def mhc_post_reference(x: Any, residual: Any, post_mix: Any, comb_mix: Any) -> Any:
    """float32 ``mhc_post``: each token's new streams ``comb^T @ residual + post * x``."""
    import torch

    hc, hidden = residual.shape[-2], residual.shape[-1]
    streams = residual.reshape(-1, hc, hidden).float()
    tokens = streams.shape[0]
    comb = comb_mix.reshape(tokens, hc, hc).float()
    post = post_mix.reshape(tokens, hc, 1).float()
    return torch.einsum("nij,nih->njh", comb, streams) + post * x.reshape(tokens, 1, hidden).float()


def residual_mismatch(got: Any, want: Any, tolerance: float = 0.02) -> dict[str, Any]:
    """Rows of ``got`` that differ from finite ``want`` rows by more than ``tolerance`` of its scale."""
    import torch

    tokens = want.shape[0]
    got, want = got.reshape(tokens, -1).float(), want.reshape(tokens, -1).float()
    inherited = ~torch.isfinite(want).all(dim=1)
    diff = (got - want).abs().nan_to_num(float("inf"), posinf=float("inf")).amax(dim=1)
    scale = want.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).amax(dim=1)
    differ = (diff > tolerance * scale) & ~inherited
    ratio = (diff / scale.clamp_min(1e-30)).clamp(max=1e30)[~inherited]
    return {
        "differ_rows": differ.nonzero().flatten().tolist()[:32],
        "ref_nan_rows": inherited.nonzero().flatten().tolist()[:32],
        "max_rel": float(ratio.max()) if ratio.numel() else 0.0,
        "ref_absmax": float(scale.max()) if tokens else 0.0,
    }


def unfused_post_pre(
    post: Any,
    pre: Any,
    x: Any,
    residual: Any,
    post_layer_mix: Any,
    comb_res_mix: Any,
    fn: Any,
    hc_scale: Any,
    hc_base: Any,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 1,
    tile_n: int = 1,
    norm_weight: Any = None,
    norm_eps: float = 1e-6,
) -> tuple[Any, Any, Any, Any]:
    """``mhc_fused_post_pre_tilelang``'s result through ``post`` then ``pre`` (vLLM's ``mhc_post_tilelang``
    and ``mhc_pre_tilelang``): ``(residual, post_mix, comb_mix, layer_input)``."""
    residual_cur = post(x, residual, post_layer_mix, comb_res_mix)
    post_mix, comb_mix, layer_input = pre(
        residual_cur,
        fn,
        hc_scale,
        hc_base,
        rms_eps,
        hc_pre_eps,
        hc_sinkhorn_eps,
        hc_post_mult_value,
        sinkhorn_repeat,
        norm_weight=norm_weight,
        norm_eps=norm_eps,
    )
    return residual_cur, post_mix, comb_mix, layer_input


def _mhc_check(
    x: Any, residual: Any, post_mix: Any, comb_mix: Any, out: Any, covers: Any, unfused: bool, part: str
) -> None:
    """Compare one mHC step's new residual with :func:`mhc_post_reference`; report it (``mhc``) in budget."""
    import torch

    torch.cuda.synchronize()
    found = residual_mismatch(out[0], mhc_post_reference(x, residual, post_mix, comb_mix))
    layer_input = rows_state(out[3])
    bad = bool(found["differ_rows"]) or bool(layer_input["nan_rows"])
    tokens = int(residual.reshape(-1, residual.shape[-2], residual.shape[-1]).shape[0])
    tally = f"{tokens} tokens {'bad' if bad else 'clean'}"
    _state["mhc_tally"][tally] = _state["mhc_tally"].get(tally, 0) + 1
    if bad and _state["mhc_bad"] >= MAX_MHC_BAD:
        return
    if not bad and (_state["mhc_clean"] >= MAX_MHC_CLEAN or tokens in _state["mhc_clean_sizes"]):
        return
    if not bad:
        _state["mhc_clean_sizes"].add(tokens)
    _state["mhc_bad" if bad else "mhc_clean"] += 1
    emit(
        "mhc",
        phase=_state["phase"],
        forward=_state["forwards"],
        layer=_state["layer"],
        part=part,
        tokens=tokens,
        hidden=int(residual.shape[-1]),
        small=covers is not None,
        covers=covers,
        unfused=unfused,
        x_nan_rows=rows_state(x)["nan_rows"],
        residual_in_nan_rows=rows_state(residual)["nan_rows"],
        layer_input_nan_rows=layer_input["nan_rows"],
        **found,
    )


def mhc_tally(where: str) -> None:
    """How many mHC steps were checked so far in this phase, by token count, clean or bad (``mhc-tally``)."""
    if _state["mhc_tally"]:
        emit("mhc-tally", where=where, phase=_state["phase"], calls=dict(sorted(_state["mhc_tally"].items())))


def mhc_step(fused: Any, unfused_ops: tuple[Any, Any] | None, check: bool) -> Any:
    """The model's ``mhc_fused_post_pre_tilelang``: run unfused where the small kernel would not cover the
    hidden size (``unfused_ops`` given), and check the result against the reference (``check``)."""

    def step(x: Any, residual: Any, post_mix: Any, comb_mix: Any, *args: Any, **kwargs: Any) -> Any:
        tokens = residual.reshape(-1, residual.shape[-2], residual.shape[-1]).shape[0]
        covers = small_fma_covers(int(tokens), int(residual.shape[-1]))
        parts = _state["mhc_parts"]
        part = parts.pop(0) if parts else "?"
        unfused = unfused_ops is not None and covers is False
        if unfused:
            if not _state.get("unfused_said"):
                _state["unfused_said"] = True
                emit("mhc-unfused", tokens=int(tokens), hidden=int(residual.shape[-1]))
            out = unfused_post_pre(*unfused_ops, x, residual, post_mix, comb_mix, *args, **kwargs)
        else:
            out = fused(x, residual, post_mix, comb_mix, *args, **kwargs)
        if check and not capturing():
            try:
                _mhc_check(x, residual, post_mix, comb_mix, out, covers, unfused, part)
            except Exception as error:
                emit("error", where="mhc", error=repr(error))
        return out

    return step


def metadata_summary(attn_metadata: Any) -> dict[str, Any]:
    """Per attention metadata class of one step: its layers and its decode/prefill split."""
    if not isinstance(attn_metadata, dict):
        return {"kind": type(attn_metadata).__name__}
    kinds: dict[str, Any] = {}
    for name, meta in attn_metadata.items():
        kind = type(meta).__name__
        if kind in kinds:
            kinds[kind]["layers"] += 1
            continue
        entry: dict[str, Any] = {"layers": 1, "first": name}
        for field in ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens", "block_size"):
            value = getattr(meta, field, None)
            if isinstance(value, int):
                entry[field] = value
        for field in ("query_start_loc_cpu", "query_start_loc", "seq_lens"):
            value = getattr(meta, field, None)
            if hasattr(value, "tolist"):
                entry[field] = value.flatten()[:9].tolist()
        kinds[kind] = entry
    return kinds


def _patch_model(module: Any) -> None:
    """Check the V4 decoder layers', MoE's and ``mhc_post``'s outputs of real target steps; mHC switches."""
    layer_cls, moe_cls = module.DeepseekV4DecoderLayer, module.DeepseekV4MoE
    layer_forward, moe_forward, post = layer_cls.forward, moe_cls.forward, module.mhc_post_tilelang
    model_forward = module.DeepseekV4Model.forward
    check, unfused = os.environ.get(MHC_CHECK_ENV) == "1", os.environ.get(MHC_UNFUSED_ENV) == "1"
    if check or unfused:
        ops = None
        if unfused:
            import importlib

            kernels = importlib.import_module(MHC_KERNELS_MODULE)
            ops = (kernels.mhc_post_tilelang, kernels.mhc_pre_tilelang)
        module.mhc_fused_post_pre_tilelang = mhc_step(module.mhc_fused_post_pre_tilelang, ops, check)

    def model(self: Any, input_ids: Any, positions: Any, *args: Any, **kwargs: Any) -> Any:
        _state["forwards"] += 1
        if _state["phase"] == "real" and _state["forwards"] <= METADATA_STEPS and not capturing():
            try:
                from vllm.forward_context import get_forward_context, is_forward_context_available

                if is_forward_context_available():
                    emit(
                        "metadata",
                        forward=_state["forwards"],
                        tokens=int(positions.shape[0]),
                        positions=positions[:16].tolist(),
                        input_ids=None if input_ids is None else input_ids[:16].tolist(),
                        kinds=metadata_summary(get_forward_context().attn_metadata),
                    )
            except Exception as error:
                emit("error", where="metadata", error=repr(error))
        return model_forward(self, input_ids, positions, *args, **kwargs)

    def layer(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(getattr(self.attn, "prefix", "layer")).removesuffix(".attn")
        # The layer's fused mHC steps, in order: before attention (all but the first layer), before the MoE.
        residual = args[5] if len(args) > 5 else kwargs.get("residual")
        _state["layer"], _state["mhc_parts"] = name, ["ffn"] if residual is None else ["attn", "ffn"]
        out = layer_forward(self, *args, **kwargs)
        _target_check(f"{name} output", out[0])
        _target_check(f"{name} residual", out[1])
        return out

    def moe(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = moe_forward(self, *args, **kwargs)
        _target_check(f"{getattr(self, 'prefix', 'moe')} (MoE)", out)
        return out

    def mhc_post(*args: Any, **kwargs: Any) -> Any:
        out = post(*args, **kwargs)
        _target_check("mhc_post", out)
        return out

    layer_cls.forward = layer
    moe_cls.forward = moe
    module.mhc_post_tilelang = mhc_post
    module.DeepseekV4Model.forward = model


def _kv_layers() -> dict[str, Any]:
    """Every layer's KV cache tensor by layer name (vLLM's static forward context)."""
    config = _state.get("vllm_config")
    if config is None:
        return {}
    context = config.compilation_config.static_forward_context
    out = {}
    for name, layer in context.items():
        cache = getattr(layer, "kv_cache", None)
        if hasattr(cache, "dim") and cache.dim() >= 2 and cache.shape[0] > 0:
            out[name] = cache
    return out


def null_block_report(where: str) -> None:
    """Name the KV caches whose block 0 (the null block) holds anything but zeros."""
    import torch

    dirty = {}
    for name, cache in _kv_layers().items():
        block = cache[0]
        raw = block.view(torch.uint8) if block.is_contiguous() else block.contiguous().view(torch.uint8)
        nonzero = int((raw != 0).sum())
        if nonzero:
            dirty[name] = nonzero
    emit("null-block", where=where, layers=len(_kv_layers()), dirty=dirty)


def _patch_worker(module: Any) -> None:
    """Mark the end of the warm-up: counters start again, block 0 is inspected, caches zeroed on request."""
    import torch

    cls = module.Worker
    warm_up = cls.compile_or_warm_up_model

    def probe_warm_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = warm_up(self, *args, **kwargs)
        try:
            _state["vllm_config"] = self.vllm_config
            emit(
                "engine-ready",
                proposes=_state["proposes"],
                steps=_state["steps"],
                target_events=_state["target_events"],
            )
            null_block_report("after warm-up")
            mhc_tally("after warm-up")
            _state["mhc_tally"], _state["mhc_clean_sizes"] = {}, set()
            if os.environ.get(ZERO_ENV) == "1":
                for cache in _kv_layers().values():
                    cache.zero_()
                torch.cuda.synchronize()
                emit("zeroed", layers=len(_kv_layers()))
            for key in (
                "steps",
                "proposes",
                "changes",
                "checks",
                "sampler",
                "target_events",
                "freed",
                "mhc_bad",
                "mhc_clean",
                "forwards",
            ):
                _state[key] = 0
            _state["phase"] = "real"
            _state["watch"] = []
        except Exception as error:
            emit("error", where="engine-ready", error=repr(error))
        return out

    cls.compile_or_warm_up_model = probe_warm_up


def _before_insert(spec: Any, input_batch: Any, states: Any, positions: Any, slots: Any) -> dict[str, Any]:
    """Which context rows to describe (each request's last LAST valid positions) and their bytes now."""
    import torch

    num_reqs = input_batch.num_reqs
    qsl = input_batch.query_start_loc[: num_reqs + 1].tolist()
    nan_rows = torch.isnan(states.float()).any(dim=-1).nonzero().flatten().tolist()
    emit(
        "hidden",
        step=_state["steps"],
        rows=int(states.shape[0]),
        nan_rows=nan_rows[:64],
        absmax=float(states.float().abs().nan_to_num(0).max()),
    )
    layers = _draft_layers(spec)
    slot_list = slots if isinstance(slots, (list, tuple)) else [slots] * len(layers)
    rows = []
    for req in range(num_reqs):
        start, end = qsl[req], qsl[req + 1]
        rows += [(req, row) for row in range(max(start, end - LAST), end)]
    picked = torch.tensor([row for _, row in rows], dtype=torch.int64, device=positions.device)
    return {
        "rows": rows,
        "picked": picked,
        "positions": positions[picked].tolist(),
        "target_positions": input_batch.positions[picked].tolist(),
        "layers": layers,
        "slots": [None if s is None else s[picked].clone() for s in slot_list],
        "before": [
            None if s is None else records(layer.attn.swa_cache_layer.kv_cache, s[picked].clamp(min=0))
            for layer, s in zip(layers, slot_list, strict=True)
        ],
        "num_reqs": num_reqs,
        "gids": [
            spec.draft_kv_cache_group_ids[
                spec._layer_group_idx[i] if spec._layer_group_idx is not None else 0
            ]
            for i in range(len(layers))
        ],
        "block_table_rows": {
            gid: spec.block_tables.input_block_tables[gid][:num_reqs, :4].tolist()
            for gid in spec.draft_kv_cache_group_ids
        },
    }


def _after_insert(spec: Any, seen: dict[str, Any], step: int) -> None:
    import torch

    torch.cuda.synchronize()
    seen["after"] = []
    for index, (layer, slots) in enumerate(zip(seen["layers"], seen["slots"], strict=True)):
        if slots is None:
            seen["after"].append(None)
            continue
        cache = layer.attn.swa_cache_layer.kv_cache
        now = records(cache, slots.clamp(min=0))
        seen["after"].append(now)
        valid = slots >= 0
        if len(_state["watch"]) < MAX_WATCHED and bool(valid.any()):
            keep = valid.nonzero().flatten()
            _state["watch"].append(
                {
                    "layer": layer.attn.swa_cache_layer.prefix,
                    "gid": seen["gids"][index],
                    "block": cache.shape[1],
                    "cache": cache,
                    "slots": slots[keep],
                    "positions": [seen["positions"][i] for i in keep.tolist()],
                    "bytes": now[keep].clone(),
                }
            )


def _reader_slots(spec: Any, seen: dict[str, Any]) -> dict[str, list[int | None]]:
    """Per draft layer, the slot the draft decode's index row reads for each described position."""
    metadata = getattr(spec, "_dspark_probe_metadata", None) or {}
    out: dict[str, list[int | None]] = {}
    seq_lens = spec.input_buffers.seq_lens[: seen["num_reqs"]].tolist()
    query_len = spec.num_query_per_req
    for layer in seen["layers"]:
        name = layer.attn.swa_cache_layer.prefix
        meta = metadata.get(name)
        if meta is None or getattr(meta, "decode_swa_indices", None) is None:
            out[name] = [None] * len(seen["rows"])
            continue
        indices = meta.decode_swa_indices
        window = int(getattr(layer.attn, "window_size", 128))
        found: list[int | None] = []
        for (req, _row), position in zip(seen["rows"], seen["positions"], strict=True):
            token = req * query_len
            prefix_len = seq_lens[req] - query_len
            column = position - max(prefix_len - window, 0)
            if token >= indices.shape[0] or not 0 <= column < indices.shape[-1]:
                found.append(None)
            else:
                found.append(int(indices[token].reshape(-1)[column]))
        out[name] = found
    return out


def _after_draft(spec: Any, seen: dict[str, Any], step: int) -> None:
    import torch

    if "rows" not in seen:
        emit("error", where=f"draft step {step}", error="the context insert was not seen")
        return
    readers = _reader_slots(spec, seen)
    gidx = spec._layer_group_idx
    for index, layer in enumerate(seen["layers"]):
        name = layer.attn.swa_cache_layer.prefix
        slots = seen["slots"][index]
        gid = spec.draft_kv_cache_group_ids[gidx[index] if gidx is not None else 0]
        kbs = spec.block_tables.kernel_block_sizes[gid]
        bs = spec.block_tables.block_sizes[gid]
        table = spec.block_tables.input_block_tables[gid]
        cache = layer.attn.swa_cache_layer.kv_cache
        now = None if slots is None else records(cache, slots.clamp(min=0))
        rows = []
        for i, ((req, row), position) in enumerate(zip(seen["rows"], seen["positions"], strict=True)):
            kernel_slot = int(table[req, position // kbs]) * kbs + position % kbs
            entry: dict[str, Any] = {
                "req": req,
                "row": row,
                "position": position,
                "target_position": seen["target_positions"][i],
                "slot": None if slots is None else int(slots[i]),
                "kernel_slot": kernel_slot,
                "read": readers[name][i],
            }
            if slots is not None:
                entry["before"] = summary(seen["before"][index][i].cpu())
                entry["inserted"] = summary(seen["after"][index][i].cpu())
                entry["after_draft"] = summary(now[i].cpu())
            read = readers[name][i]
            if read is not None and read >= 0 and (slots is None or read != int(slots[i])):
                entry["read_record"] = summary(records(cache, torch.tensor([read]))[0].cpu())
            rows.append(entry)
        last = max(range(len(rows)), key=lambda i: rows[i]["position"]) if rows else None
        emit(
            "context",
            step=step,
            layer=name,
            gid=gid,
            block_size=bs,
            kernel_block_size=kbs,
            block_table_rows=seen["block_table_rows"].get(gid),
            seq_lens=spec.input_buffers.seq_lens[: seen["num_reqs"]].tolist(),
            rows=rows,
            last_inserted_hex=None
            if last is None or slots is None
            else bytes(seen["after"][index][last].cpu().tolist()).hex(),
        )


# ------------------------------------------------------------------ the sampler


def _patch_sampler(module: Any) -> None:
    import torch

    cls = module.Sampler
    original = cls.__call__

    def call(self: Any, logits: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if not capturing() and _state["sampler"] < 200:
            _state["sampler"] += 1
            try:
                nan = torch.isnan(logits).any(dim=-1)
                if bool(nan.any()) or _state["sampler"] <= 3:
                    where = input_batch.logits_indices
                    emit(
                        "sampler",
                        call=_state["sampler"],
                        logits=list(logits.shape),
                        nan_rows=nan.nonzero().flatten().tolist()[:32],
                        positions=input_batch.positions[where].tolist()[:32],
                    )
            except Exception as error:
                emit("error", where="sampler", error=repr(error))
        return original(self, logits, input_batch, *args, **kwargs)

    cls.__call__ = call


def _patch_attention(module: Any) -> None:
    cls = module.DeepseekV4Attention
    wrap_method(cls, "forward", lambda self: f"layer {_prefix(self)}")
    forward = cls.forward

    def attention(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = forward(self, *args, **kwargs)
        _target_check(f"{_prefix(self)} (attention)", out)
        return out

    cls.forward = attention
    wrap_method(cls, "_fused_qnorm_rope_kv_insert", lambda self: f"K insert {_prefix(self)}")


def _patch_flashmla(module: Any) -> None:
    wrap_method(module.DeepseekV4FlashMLAAttention, "_forward_decode", lambda self: f"decode {_prefix(self)}")


def _patch_ours(module: Any) -> None:
    wrap_method(module.SparksealDecode, "_forward_decode", lambda self: f"decode {_prefix(self)} (ours)")


PATCHES = {
    SPECULATOR_MODULE: _patch_speculator,
    SAMPLER_MODULE: _patch_sampler,
    ATTENTION_MODULE: _patch_attention,
    FLASHMLA_MODULE: _patch_flashmla,
    OURS_MODULE: _patch_ours,
    MODEL_MODULE: _patch_model,
    WORKER_MODULE: _patch_worker,
}
