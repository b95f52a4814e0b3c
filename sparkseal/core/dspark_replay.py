"""What DSpark's draft step wrote where, counted, and what the counts mean: the check patch 0001 must pass.

Patch 0001 (vLLM PR #51538) keeps three kinds of rows of vLLM 0.25.1's DFlash/DSpark speculator inert:
context rows of rejected draft tokens, rows whose block-table entry is the null block 0, and padded sample
rows, which without it act as request slot 0. Greedy outputs cannot show any of them (they are written
where nothing reads, or overwritten before a read), so this check reads the writes themselves inside the
serving engine (``sparkseal.vllm_integration.dspark_replay`` counts them after every draft step; vLLM's
``collective_rpc`` hands the counts to ``sparkseal live-check --dspark-replay``) and names each that
happened. This module is the shared, pure part: the report's format, one step's counting over plain
integer lists, and the findings. It imports neither torch nor vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

# The environment switch that installs the counters in every vLLM process (a sparkseal plugin setting),
# and the worker method vLLM's collective_rpc calls by name (POST /collective_rpc, VLLM_SERVER_DEV_MODE=1).
ENVIRONMENT = "SPARKSEAL_DSPARK_REPLAY"
RPC_METHOD = "sparkseal_dspark_replay"
FORMAT = "sparkseal-dspark-replay/1"


@dataclass
class Tally:
    """Counts over the draft steps a worker ran, field by field. Row counts are summed over the draft's
    KV-cache groups (one for a Qwen3 draft; DeepSeek V4's draft has several, each with its own slots).

    steps: draft steps of real requests (``propose`` outside warm-up).
    warmup_steps: warm-up and graph-capture draft steps (``dummy_run``).
    context_rows: context rows given to the draft's K/V precompute in real steps.
    rejected_rows: of them, rows past ``num_ctx - num_rejected``: tokens the target rejected.
    rejected_rows_written: rejected rows given a cache slot (the precompute writes their K/V).
    null_block_context_rows: context rows whose slot lies in the null block 0.
    query_rows: draft query rows of real steps.
    null_block_query_rows: of them, rows whose slot lies in the null block 0.
    warmup_null_block_query_rows: warm-up query rows whose slot lies in the null block 0.
    padded_sample_rows: sample rows past the live requests' in real steps (graph padding).
    padded_sample_rows_as_request: of them, rows whose request index is not -1 (they scatter draft
        logits into that request's row).
    capture_rows_written: request rows of the draft-logits buffer that graph capture wrote, where every
        sample row is padding (a list of request slots; empty when the buffer is absent: greedy drafting).
    unread_steps: draft steps whose buffers the probe could not read (a vLLM whose speculator differs from
        0.25.1's); the probe never stops the engine, so these are counted and named instead.
    """

    steps: int = 0
    warmup_steps: int = 0
    context_rows: int = 0
    rejected_rows: int = 0
    rejected_rows_written: int = 0
    null_block_context_rows: int = 0
    query_rows: int = 0
    null_block_query_rows: int = 0
    warmup_null_block_query_rows: int = 0
    padded_sample_rows: int = 0
    padded_sample_rows_as_request: int = 0
    capture_rows_written: list[int] | None = None
    unread_steps: int = 0

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts (``capture_rows_written`` is set once, at capture, and kept)."""
        for item in fields(self):
            if item.type == "int":
                setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))


def _in_null_block(slot: int, block_size: int) -> bool:
    return 0 <= slot < block_size


def count_step(
    query_start_loc: Sequence[int],
    num_rejected: Sequence[int],
    context_slots: Sequence[int],
    query_slots: Sequence[int],
    block_size: int,
    pad_slot: int,
    warmup: bool = False,
) -> Tally:
    """One draft step's rows, as the draft-input kernel left them.

    ``query_start_loc`` holds the target step's per-request token offsets (``num_reqs + 1`` of them);
    request ``i``'s context rows are ``context_slots[query_start_loc[i]:query_start_loc[i + 1]]``, of which
    the last ``num_rejected[i]`` hold rejected draft tokens. ``query_slots`` are the draft's query rows of
    live requests; ``block_size`` is the block size the kernel computed slots with; ``pad_slot`` is vLLM's
    PAD_SLOT_ID, the slot a write skips. A warm-up step writes no context (vLLM skips the precompute
    there), so only its query rows count.
    """
    tally = Tally()
    null_queries = sum(_in_null_block(slot, block_size) for slot in query_slots)
    if warmup:
        tally.warmup_steps = 1
        tally.warmup_null_block_query_rows = null_queries
        return tally
    tally.steps = 1
    tally.query_rows = len(query_slots)
    tally.null_block_query_rows = null_queries
    for start, end, rejected in zip(query_start_loc, query_start_loc[1:], num_rejected, strict=False):
        rows = context_slots[start:end]
        tally.context_rows += len(rows)
        tally.null_block_context_rows += sum(_in_null_block(slot, block_size) for slot in rows)
        tail = rows[len(rows) - rejected :] if rejected > 0 else []
        tally.rejected_rows += len(tail)
        tally.rejected_rows_written += sum(slot != pad_slot for slot in tail)
    return tally


def count_padding(sample_idx_mapping_tail: Sequence[int]) -> Tally:
    """The padded sample rows of one real step (past the live requests'), and those not marked -1."""
    return Tally(
        padded_sample_rows=len(sample_idx_mapping_tail),
        padded_sample_rows_as_request=sum(index != -1 for index in sample_idx_mapping_tail),
    )


def report(tally: Tally, null_block_bytes: Mapping[str, int], error: str | None = None) -> dict[str, Any]:
    """One worker's answer to the RPC: the tally and, per draft attention layer, the non-zero bytes of its
    null block 0 now (vLLM allocates KV caches zeroed and never hands block 0 to a request); ``error``: the
    first thing the probe could not read, if any."""
    return {
        "format": FORMAT,
        **asdict(tally),
        "null_block_bytes": dict(sorted(null_block_bytes.items())),
        "error": error,
    }


def findings(answer: Mapping[str, Any], rank: int = 0) -> list[str]:
    """What one worker's report says went wrong, one message each; [] when the draft step kept every
    rejected, null-block and padded row inert. A report of another format, or one that saw no draft step
    (so nothing was checked), is a finding too."""
    where = f"rank {rank}: " if rank else ""
    if answer.get("format") != FORMAT:
        return [f"{where}the replay probe answered format {answer.get('format')!r}, expected {FORMAT!r}"]
    tally = Tally(**{item.name: answer[item.name] for item in fields(Tally)})
    if tally.unread_steps or answer.get("error"):
        seen = tally.steps + tally.unread_steps
        return [
            f"{where}the replay probe could not read {tally.unread_steps} draft steps of {seen}: "
            f"{answer.get('error')}"
        ]
    if tally.steps == 0:
        return [f"{where}the replay probe saw no draft step of a request: nothing was checked"]
    found = []
    if tally.rejected_rows_written:
        found.append(
            f"{where}draft K/V of rejected tokens: {tally.rejected_rows_written} of {tally.rejected_rows} "
            f"rejected context rows were given a cache slot in {tally.steps} draft steps (expected none)"
        )
    if tally.null_block_context_rows + tally.null_block_query_rows + tally.warmup_null_block_query_rows:
        found.append(
            f"{where}draft K/V written into the null block 0: {tally.null_block_context_rows} context rows "
            f"and {tally.null_block_query_rows} query rows of requests, {tally.warmup_null_block_query_rows} "
            "query rows of warm-up runs (expected none)"
        )
    dirty = {layer: count for layer, count in answer["null_block_bytes"].items() if count}
    if dirty:
        listed = ", ".join(f"{layer} {count}" for layer, count in dirty.items())
        found.append(f"{where}the null block 0 of the draft's KV cache holds data (non-zero bytes): {listed}")
    if tally.padded_sample_rows_as_request:
        found.append(
            f"{where}padded sample rows acting as a request: {tally.padded_sample_rows_as_request} of "
            f"{tally.padded_sample_rows} padded rows of graph replays carried a request index (expected -1)"
        )
    if tally.capture_rows_written:
        slots = ", ".join(map(str, tally.capture_rows_written))
        found.append(
            f"{where}padded sample rows acting as request slot {slots}: "
            "graph capture, where every sample row is padding, wrote that request's draft logits"
        )
    return found
