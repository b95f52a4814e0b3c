"""Bench-only hooks for vLLM 0.25.1 servers, loaded at interpreter start when this folder is on PYTHONPATH.

Two switches, each off unless its variable is set (``bench/live/serve.py --site bench/vllm_backend/hooks
--env NAME=VALUE``); every vLLM process (API server, engine core, workers) loads them.

``SPARKSEAL_SEEDED_WEIGHTS=SEED``: vLLM's dummy weights (``--load-format dummy``) are uniform in ±1e-3, which
makes the tiny DeepSeek V4 test model's next-token distribution exactly flat (every token's log-probability
ln(1/4096)): a greedy comparison cannot tell a difference from a tie. With this switch the dummy loader's
weights are replaced, after vLLM drew them and before vLLM converts them to kernel format, by seeded values
that give every layer unit-scale activations (:func:`seeded_value`): normal weights scaled by 1/sqrt(fan-in),
norms 1, fp8 weights with power-of-two block scales, and an output head whose logits spread over a few
nats. Each tensor's values come from a CPU generator seeded by SEED and the parameter's name, so two machines
and two runs hold the same model. Integer tensors, V4's hyper-connection mixers (``hc_*``) and the
compressors' position embeddings (``ape``) keep vLLM's values. vLLM's DSpark draft is loaded by the same
loader and is seeded the same way.

``SPARKSEAL_DSPARK_PROBE=1``: the DSpark context-record probe of ``dspark_probe.py`` (beside this file): the
draft's KV-cache groups and block sizes, each context record's slot as written and as read, its bytes before
and after the insert and the draft step, and the call that changes a watched record afterwards.

``SPARKSEAL_SAMPLER_NAN=1``: count the target-logit rows holding NaN or inf that enter the speculative
rejection sampler, and the sampled ids at or past the vocabulary size that leave it; lines tagged
``[sampler-nan]`` on stderr (the server log), with the positions and input ids of each NaN row.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import math
import os
import sys
from typing import Any

SEED_ENV = "SPARKSEAL_SEEDED_WEIGHTS"
NAN_ENV = "SPARKSEAL_SAMPLER_NAN"
PROBE_ENV = "SPARKSEAL_DSPARK_PROBE"
LOADER_MODULE = "vllm.model_executor.model_loader.dummy_loader"
SAMPLER_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
# Output head: logits with a standard deviation of about HEAD_SPREAD nats over a unit-RMS hidden state.
HEAD_SPREAD = 4.0
KEEP = ("hc_", "ape")


def _name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seeded_value(name: str, param: Any, seed: int) -> Any | None:
    """The seeded tensor for parameter ``name`` (on the CPU), or ``None`` to keep vLLM's value."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if any(part.startswith(KEEP) for part in name.split(".")):
        return None
    if not (torch.is_floating_point(param) or param.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):
        return None
    gen = torch.Generator(device="cpu").manual_seed(_name_seed(seed, name))
    shape = tuple(param.shape)
    if param.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.randn(shape, generator=gen).clamp(-448.0, 448.0).to(param.dtype)
    if leaf.endswith(("weight_scale_inv", "weight_scale")):
        # Block scales ([..., N / 128, K / 128]) of fp8 weights drawn from N(0, 1): 1 / sqrt(K), a power
        # of two.
        fan_in = max(shape[-1] * 128, 1) if len(shape) >= 2 else 128
        return torch.full(shape, 2.0 ** round(-0.5 * math.log2(fan_in)), dtype=param.dtype)
    if param.dim() == 1:
        if "norm" in name:
            return torch.ones(shape, dtype=param.dtype)
        if leaf in ("attn_sink", "bias", "e_score_correction_bias"):
            return torch.zeros(shape, dtype=param.dtype)
        return None
    fan_in = shape[-1]
    if "embed" in name:
        return torch.randn(shape, generator=gen).to(param.dtype)
    gain = HEAD_SPREAD if ("lm_head" in name or name.endswith("head.weight")) else 1.0
    return (torch.randn(shape, generator=gen) * (gain / math.sqrt(fan_in))).to(param.dtype)


def seed_model(model: Any, seed: int) -> dict[str, int]:
    """Replace ``model``'s parameters by their seeded values in place; counts of replaced and kept tensors."""
    import torch

    counts = {"seeded": 0, "kept": 0}
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = seeded_value(name, param, seed)
            if value is None:
                counts["kept"] += 1
                continue
            param.copy_(value.to(param.device))
            counts["seeded"] += 1
    return counts


def _patch_loader(module: Any) -> None:
    seed = int(os.environ[SEED_ENV])
    cls = module.DummyModelLoader
    original = cls.load_weights

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        original(self, model, model_config)
        counts = seed_model(model, seed)
        print(f"[seeded-weights] seed {seed}: {counts} ({type(model).__name__})", file=sys.stderr, flush=True)

    cls.load_weights = load_weights


def _patch_sampler(module: Any) -> None:
    import torch

    cls = module.RejectionSampler
    original = cls.__call__
    state = {"calls": 0, "bad": 0}

    def call(self: Any, logits: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        state["calls"] += 1
        capturing = torch.cuda.is_current_stream_capturing()
        rows = [] if capturing else torch.isnan(logits).any(dim=-1).nonzero().flatten().tolist()
        infs = 0 if capturing else int(torch.isinf(logits).any(dim=-1).sum())
        out = original(self, logits, input_batch, *args, **kwargs)
        past = 0
        if not capturing:
            sampled, counts = out.sampled_token_ids, getattr(out, "num_sampled", None)
            if counts is not None and sampled.dim() == 2 and counts.shape[0] == sampled.shape[0]:
                columns = torch.arange(sampled.shape[1], device=sampled.device)
                sampled = sampled[columns.unsqueeze(0) < counts.unsqueeze(1)]
            past = int((sampled >= logits.shape[-1]).sum())
        if rows or infs or past:
            state["bad"] += 1
            where = input_batch.logits_indices
            print(
                f"[sampler-nan] call {state['calls']}: logits {tuple(logits.shape)}, NaN rows {rows}, "
                f"inf rows {infs}, sampled ids >= vocabulary {past}; "
                f"positions {input_batch.positions[where].tolist()}, "
                f"input ids {input_batch.input_ids[where].tolist()}",
                file=sys.stderr,
                flush=True,
            )
        elif state["calls"] % 500 == 1:
            print(f"[sampler-nan] call {state['calls']}: clean so far ({state['bad']} bad)", file=sys.stderr)
        return out

    cls.__call__ = call


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch`` on module ``target`` right after it is first imported."""

    def __init__(self, target: str, patch: Any) -> None:
        self.target, self.patch = target, patch

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = run  # type: ignore[method-assign]
        return spec


if os.environ.get(SEED_ENV, "").strip():
    sys.meta_path.insert(0, _AfterImport(LOADER_MODULE, _patch_loader))
if os.environ.get(NAN_ENV) == "1":
    sys.meta_path.insert(0, _AfterImport(SAMPLER_MODULE, _patch_sampler))
if os.environ.get(PROBE_ENV) == "1":
    import dspark_probe

    for _module, _patch in dspark_probe.PATCHES.items():
        sys.meta_path.insert(0, _AfterImport(_module, _patch))
