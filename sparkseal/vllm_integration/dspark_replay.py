"""Counters inside vLLM's DSpark speculator: where each draft step's K/V and draft logits went.

Installed by the sparkseal plugin in every vLLM process when ``SPARKSEAL_DSPARK_REPLAY=1``
(``sparkseal.core.dspark_replay.ENVIRONMENT``), or by a test that runs vLLM's engine in its own process.
It wraps two methods of vLLM 0.25.1's ``DFlashSpeculator`` (which DSpark's speculator inherits):

- ``propose``: after each draft step, the draft-input kernel's outputs are still in the speculator's
  buffers: the context slot mapping of every target row, the query slot mapping of every draft row, and
  the sample rows' request indices. They are read back and counted (``core.dspark_replay.count_step``):
  rejected context rows given a slot, slots in the null block 0, padded sample rows with a request index.
- ``capture``: the draft-logits buffer (probabilistic drafting only) is filled with a sentinel before graph
  capture and compared after it: a request row that changed was written by capture's sample rows, all of
  which are padding. The buffer is then restored.

The worker method ``sparkseal_dspark_replay`` (vLLM's ``collective_rpc`` calls it by name) answers with
the counts and the non-zero bytes of block 0 of every draft attention layer's KV cache now.

Reading the buffers back costs one device synchronisation per draft step: this is a check, not a serving
setting. Nothing here imports vLLM or torch at module import time.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

from sparkseal.core.dspark_replay import (
    ENVIRONMENT,
    RPC_METHOD,
    Tally,
    count_padding,
    count_step,
    report,
)

logger = logging.getLogger("vllm.sparkseal")

_WRAPPED = "_sparkseal_dspark_replay"
# Written into the draft-logits buffer before capture: a value no logit of a real model takes exactly.
_SENTINEL = -12345.5


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(ENVIRONMENT, "") == "1"


def tally_of(speculator: Any) -> Tally:
    """The speculator's counts so far (a new, empty tally the first time)."""
    found = getattr(speculator, "_sparkseal_tally", None)
    if found is None:
        found = Tally()
        speculator._sparkseal_tally = found
    return found


def _observe_step(speculator: Any, input_batch: Any, num_rejected: Any, dummy_run: bool) -> Tally:
    """Count the rows the last ``propose`` left in the speculator's buffers (vLLM 0.25.1's names)."""
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    num_reqs = int(input_batch.num_reqs)
    num_tokens = int(input_batch.num_tokens)
    starts = [int(x) for x in input_batch.query_start_loc_np[: num_reqs + 1]]
    rejected = num_rejected[:num_reqs].tolist()
    step = Tally()
    for i, gid in enumerate(speculator.draft_kv_cache_group_ids):
        block_size = int(speculator.block_tables.block_sizes[gid])
        query_slots = speculator.block_tables.slot_mappings[gid][: num_reqs * speculator.num_query_per_req]
        step.add(
            count_step(
                starts,
                rejected,
                speculator._context_slot_mappings[i][:num_tokens].tolist(),
                query_slots.tolist(),
                block_size,
                PAD_SLOT_ID,
                warmup=dummy_run,
            )
        )
    if not dummy_run:
        steps = speculator.num_speculative_steps
        # Every group's step counted once as a step, whatever the number of groups.
        step.steps = 1
        step.add(count_padding(speculator.sample_idx_mapping[num_reqs * steps :].tolist()))
    else:
        step.warmup_steps = 1
    return step


def _keep_error(speculator: Any, message: str) -> None:
    """The first error the probe met (the engine goes on; the report names it)."""
    if getattr(speculator, "_sparkseal_probe_error", None) is None:
        speculator._sparkseal_probe_error = message[:500]
        logger.warning("sparkseal: the DSpark replay probe could not read a step: %s", message)


def _draft_rows(buffer: Any) -> Any:
    return buffer.view(buffer.shape[0], -1)


def install() -> bool:
    """Wrap the speculator's ``propose`` and ``capture`` and add the worker method; False when this vLLM
    has no DFlash speculator (then there is nothing to count). Idempotent."""
    try:
        from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as error:
        logger.warning("sparkseal: the DSpark replay probe is not installed: %s", error)
        return False
    if getattr(DFlashSpeculator.propose, _WRAPPED, False):
        return True
    propose = DFlashSpeculator.propose
    capture = DFlashSpeculator.capture

    @functools.wraps(propose)
    def counted_propose(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        drafts = propose(self, input_batch, *args, **kwargs)
        if kwargs.get("dummy_run") and kwargs.get("skip_attn_for_dummy_run"):
            return drafts  # memory profiling: no block tables yet, nothing of 0001's is reached
        num_rejected = kwargs["num_rejected"] if "num_rejected" in kwargs else args[5]
        try:
            step = _observe_step(self, input_batch, num_rejected, bool(kwargs.get("dummy_run")))
        except Exception as error:  # a check must never stop the engine it checks: count and name it
            step = Tally(unread_steps=1)
            _keep_error(self, f"propose: {type(error).__name__}: {error}")
        tally_of(self).add(step)
        return drafts

    @functools.wraps(capture)
    def watched_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        logits = getattr(self, "draft_logits", None)
        if logits is None:
            return capture(self, *args, **kwargs)
        kept = logits.clone()
        logits.fill_(_SENTINEL)
        try:
            return capture(self, *args, **kwargs)
        finally:
            try:
                changed = (_draft_rows(logits) != _SENTINEL).any(dim=1)
                tally_of(self).capture_rows_written = [int(i) for i in changed.nonzero().flatten().tolist()]
            except Exception as error:
                _keep_error(self, f"capture: {type(error).__name__}: {error}")
            logits.copy_(kept)

    def answer(self: Any) -> dict[str, Any]:
        speculator = getattr(self.model_runner, "speculator", None)
        if speculator is None:
            return {"error": "this worker runs no speculator"}
        try:
            counts = null_block_bytes(speculator)
        except Exception as error:
            counts = {}
            _keep_error(speculator, f"null block: {type(error).__name__}: {error}")
        return report(tally_of(speculator), counts, getattr(speculator, "_sparkseal_probe_error", None))

    setattr(counted_propose, _WRAPPED, True)
    DFlashSpeculator.propose = counted_propose
    DFlashSpeculator.capture = watched_capture
    setattr(Worker, RPC_METHOD, answer)
    logger.info("sparkseal: the DSpark replay probe counts every draft step (%s=1)", ENVIRONMENT)
    return True


def null_block_bytes(speculator: Any) -> dict[str, int]:
    """Non-zero bytes of block 0 in each draft attention layer's KV cache. The block index is the cache
    tensor's dimension of ``num_blocks`` entries (its place differs between attention backends)."""
    import torch

    context = speculator.vllm_config.compilation_config.static_forward_context
    num_blocks = int(speculator.kv_cache_config.num_blocks)
    counts = {}
    for name in sorted(speculator.draft_attn_layer_names):
        cache = context[name].kv_cache
        if isinstance(cache, (list, tuple)):
            cache = cache[0]
        dim = list(cache.shape).index(num_blocks)
        block = cache.select(dim, 0)
        counts[name] = int((block.contiguous().view(-1).view(dtype=torch.uint8) != 0).sum())
    return counts
