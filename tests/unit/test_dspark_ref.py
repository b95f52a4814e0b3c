"""The PyTorch reference of DSpark/DFlash draft-input preparation (sparkseal/kernels/dspark_ref.py).

Hand-computed batches pin the semantics down; random batches check that the reference equals the
PATCHED vLLM Triton kernel run in Triton's interpreter on CPU, and that it differs from the
pristine v0.25.1 kernel exactly where the patch changes behaviour. The helpers here (random
batches, op arguments) are shared with test_dspark.py and test_dspark_gpu.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dspark_kernel import OUTPUT_DTYPES, SPECULATOR_RELPATH, STALE, DraftBatch

torch = pytest.importorskip("torch")

from sparkseal.kernels.dspark_ref import (  # noqa: E402 (needs torch)
    PAD_SLOT_ID,
    num_query_per_req_for,
    prepare_inputs_reference,
)

REPO = Path(__file__).resolve().parents[2]
SEED = 20250125
NUM_RANDOM_BATCHES = 12
PAD = PAD_SLOT_ID
S = STALE


# --------------------------------------------------------------------------------------------
# Batches and op arguments (shared with the binding and GPU tests).
# --------------------------------------------------------------------------------------------


def buffer_sizes(batch: DraftBatch) -> dict[str, int]:
    """Output buffer lengths as the speculator allocates them (and as tests/dspark_kernel.py does)."""
    samples = batch.max_num_reqs * batch.num_speculative_steps
    return {
        "input_ids": batch.max_num_tokens,
        "positions": batch.max_num_tokens,
        "query_start_loc": batch.max_num_reqs + 1,
        "seq_lens": batch.max_num_reqs,
        "query_slot_mapping": batch.max_num_tokens,
        "context_positions": batch.max_num_tokens,
        "context_slot_mapping": batch.max_num_tokens,
        "sample_indices": samples,
        "sample_pos": samples,
        "sample_idx_mapping": samples,
    }


def op_arguments(batch: DraftBatch, device: str) -> dict[str, Any]:
    """Keyword arguments of ``sparkseal::dspark_prepare_inputs`` for ``batch``; outputs hold STALE."""
    dev = torch.device(device)
    sizes = buffer_sizes(batch)
    args: dict[str, Any] = {
        name: torch.full((sizes[name],), STALE, dtype=getattr(torch, dtype), device=dev)
        for name, dtype in OUTPUT_DTYPES.items()
    }

    def tensor(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=dev)

    args.update(
        target_positions=tensor(batch.target_positions, torch.int64),
        target_query_start_loc=tensor(batch.query_start_loc, torch.int32),
        idx_mapping=tensor(batch.req_state_idx, torch.int32),
        last_sampled=tensor([[t] for t in batch.last_sampled], torch.int64),
        next_prefill_tokens=tensor(batch.next_prefill_tokens, torch.int32),
        num_sampled=tensor(batch.num_sampled, torch.int32),
        num_rejected=tensor(batch.num_rejected, torch.int32),
        block_table=tensor(batch.block_table, torch.int32),
        num_reqs=batch.num_reqs,
        max_query_len=max(batch.query_lens),
        parallel_drafting_token_id=batch.parallel_drafting_token_id,
        block_size=batch.block_size,
        num_query_per_req=batch.num_query_per_req,
        num_speculative_steps=batch.num_speculative_steps,
        max_num_reqs=batch.max_num_reqs,
        max_num_tokens=batch.max_num_tokens,
        max_model_len=batch.max_model_len,
        sample_from_anchor=batch.sample_from_anchor,
    )
    return args


def outputs_of(args: dict[str, Any]) -> dict[str, list[int]]:
    """The output buffers of an argument dict, as lists."""
    return {name: args[name].cpu().tolist() for name in OUTPUT_DTYPES}


def reference_outputs(batch: DraftBatch) -> dict[str, list[int]]:
    """Every output buffer after the reference ran on ``batch`` (untouched entries stay STALE)."""
    args = op_arguments(batch, "cpu")
    del args["max_query_len"]
    prepare_inputs_reference(**args)
    return outputs_of(args)


def random_batch(rng: random.Random, sample_from_anchor: bool, max_prefill: int = 24) -> DraftBatch:
    """A target step with decode rows (some drafts rejected), chunked-prefill rows, null blocks,
    padded request rows, block columns past the table and query positions past max_model_len."""
    steps = rng.randint(1, 4)
    nq = num_query_per_req_for(steps, sample_from_anchor)
    num_reqs = rng.randint(1, 5)
    max_num_reqs = num_reqs + rng.randint(0, 3)
    block_size = rng.choice([2, 4, 16])
    query_lens, num_sampled, num_rejected = [], [], []
    for _ in range(num_reqs):
        if rng.random() < 0.3:  # chunked prefill: nothing sampled, nothing rejected
            query_lens.append(rng.randint(1, max_prefill))
            num_sampled.append(0)
            num_rejected.append(0)
        else:  # verification of up to `steps` drafts: the tail past the sampled ones is rejected
            q = rng.randint(1, 1 + steps)
            sampled = rng.randint(1, q)
            query_lens.append(q)
            num_sampled.append(sampled)
            num_rejected.append(q - sampled)
    first_positions = [rng.randint(0, 40) for _ in range(num_reqs)]
    ends = [p + q + nq for p, q in zip(first_positions, query_lens, strict=True)]
    max_model_len = rng.choice([4096, max(1, max(ends) + rng.randint(-4, 2))])
    columns = max(1, -(-max(ends) // block_size) - rng.randint(0, 1))
    block_table = [
        [0 if rng.random() < 0.25 else rng.randint(1, 500) for _ in range(columns)]
        for _ in range(max_num_reqs)
    ]
    return DraftBatch(
        query_lens=query_lens,
        first_positions=first_positions,
        num_rejected=num_rejected,
        num_sampled=num_sampled,
        req_state_idx=rng.sample(range(max_num_reqs), num_reqs),
        block_table=block_table,
        last_sampled=[rng.randint(0, 2**31 - 1) for _ in range(max_num_reqs)],
        next_prefill_tokens=[rng.randint(0, 2**31 - 1) for _ in range(max_num_reqs)],
        block_size=block_size,
        num_speculative_steps=steps,
        sample_from_anchor=sample_from_anchor,
        max_num_reqs=max_num_reqs,
        max_num_tokens=max(sum(query_lens), num_reqs * nq) + rng.randint(0, 8),
        max_model_len=max_model_len,
        parallel_drafting_token_id=rng.randint(0, 2**31 - 1),
    )


def random_batches(seed: int, count: int, max_prefill: int = 24) -> list[DraftBatch]:
    """``count`` random batches, alternating DFlash (1 + N query rows) and DSpark (N) layouts."""
    rng = random.Random(seed)
    return [random_batch(rng, i % 2 == 1, max_prefill) for i in range(count)]


def differing_entries(got: dict[str, list[int]], want: dict[str, list[int]]) -> list[str]:
    """``buffer[index]: got X, expected Y`` for every entry where two output sets differ."""
    return [
        f"{name}[{i}]: got {g}, expected {w}"
        for name in want
        for i, (g, w) in enumerate(zip(got[name], want[name], strict=True))
        if g != w
    ]


# --------------------------------------------------------------------------------------------
# Hand-computed batches.
# --------------------------------------------------------------------------------------------

# DFlash layout (1 + N query rows, the anchor is the bonus token), N = 2, block size 4.
# Row 0 (request slot 2): positions 5, 6, 7; the last is rejected; it sampled, so its bonus token
#   is last_sampled[2] = 102. Context: 5 -> column 1 -> block 8 -> slot 33; 6 -> 34; 7 is
#   rejected -> position 0, PAD. Queries at 7, 8, 9: 7 -> block 8 -> slot 35; 8 and 9 -> column 2
#   -> null block -> PAD. Samples at the two mask rows (query rows 1, 2), each at its own position.
#   seq_len = 6 + 1 + 3 = 10.
# Row 1 (request slot 0): chunked prefill of positions 0, 1 (nothing sampled: bonus is
#   next_prefill_tokens[0] = 200). Context: column 0 is the null block -> PAD, PAD. Queries at
#   2, 3, 4: PAD, PAD, 4 -> column 1 -> block 4 -> slot 16. seq_len = 1 + 1 + 3 = 5.
# Row 2 is padding: query_start_loc 6, seq_len 0, sample rows (0, 0, -1), query slots PAD.
DFLASH_BATCH = DraftBatch(
    query_lens=[3, 2],
    first_positions=[5, 0],
    num_rejected=[1, 0],
    num_sampled=[2, 0],
    req_state_idx=[2, 0],
    block_table=[[9, 8, 0], [0, 4, 6], [5, 5, 5]],
    last_sampled=[100, 101, 102],
    next_prefill_tokens=[200, 201, 202],
    block_size=4,
    num_speculative_steps=2,
    sample_from_anchor=False,
    max_num_reqs=3,
    max_num_tokens=10,
    max_model_len=100,
    parallel_drafting_token_id=77,
)
DFLASH_EXPECTED = {
    "input_ids": [102, 77, 77, 200, 77, 77, S, S, S, S],
    "positions": [7, 8, 9, 2, 3, 4, S, S, S, S],
    "query_start_loc": [0, 3, 6, 6],
    "seq_lens": [10, 5, 0],
    "query_slot_mapping": [35, PAD, PAD, PAD, PAD, 16, PAD, PAD, PAD, PAD],
    "context_positions": [5, 6, 0, 0, 1, S, S, S, S, S],
    "context_slot_mapping": [33, 34, PAD, PAD, PAD, S, S, S, S, S],
    "sample_indices": [1, 2, 4, 5, 0, 0],
    "sample_pos": [8, 9, 3, 4, 0, 0],
    "sample_idx_mapping": [2, 2, 0, 0, -1, -1],
}

# DSpark layout (N query rows, the anchor is the first prediction), N = 3, block size 4, a
# two-column block table and max_model_len 10.
# Row 0 (request slot 1): positions 6..9, the last two rejected; bonus last_sampled[1] = 101.
#   Context: 6 -> column 1 -> block 2 -> slot 10; 7 -> 11; rejected -> 0 / PAD.
#   Queries at 8, 9, 10: column 2 is past the table and reads column 1 (block 2): slots 8, 9, 10;
#   positions clamp to max_model_len - 1 = 9. Every query row is sampled, predicting the next
#   position (unclamped): 9, 10, 11. seq_len = 7 + 1 + 3 = 11.
# Row 1 is padding.
DSPARK_BATCH = DraftBatch(
    query_lens=[4],
    first_positions=[6],
    num_rejected=[2],
    num_sampled=[2],
    req_state_idx=[1],
    block_table=[[7, 2], [0, 0]],
    last_sampled=[100, 101],
    next_prefill_tokens=[200, 201],
    block_size=4,
    num_speculative_steps=3,
    sample_from_anchor=True,
    max_num_reqs=2,
    max_num_tokens=8,
    max_model_len=10,
    parallel_drafting_token_id=77,
)
DSPARK_EXPECTED = {
    "input_ids": [101, 77, 77, S, S, S, S, S],
    "positions": [8, 9, 9, S, S, S, S, S],
    "query_start_loc": [0, 3, 3],
    "seq_lens": [11, 0],
    "query_slot_mapping": [8, 9, 10, PAD, PAD, PAD, PAD, PAD],
    "context_positions": [6, 7, 0, 0, S, S, S, S],
    "context_slot_mapping": [10, 11, PAD, PAD, S, S, S, S],
    "sample_indices": [0, 1, 2, 0, 0, 0],
    "sample_pos": [9, 10, 11, 0, 0, 0],
    "sample_idx_mapping": [1, 1, 1, -1, -1, -1],
}


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(DFLASH_BATCH, DFLASH_EXPECTED), (DSPARK_BATCH, DSPARK_EXPECTED)],
    ids=["dflash", "dspark"],
)
def test_hand_computed_batch(batch: DraftBatch, expected: dict[str, list[int]]) -> None:
    assert differing_entries(reference_outputs(batch), expected) == []


def test_bonus_token_is_truncated_to_int32() -> None:
    # last_sampled is int64 and input_ids int32: the kernel keeps the low 32 bits.
    batch = dataclasses.replace(DSPARK_BATCH, last_sampled=[0, 2**32 + 5])
    assert reference_outputs(batch)["input_ids"][0] == 5


def test_row_without_accepted_context_is_rejected() -> None:
    batch = dataclasses.replace(DSPARK_BATCH, num_rejected=[4])
    with pytest.raises(ValueError, match=r"batch row 0 has 4 context tokens and num_rejected=4; expected "):
        reference_outputs(batch)


# --------------------------------------------------------------------------------------------
# Equality with vLLM's Triton kernel (interpreter, CPU).
# --------------------------------------------------------------------------------------------

# Runs tests/dspark_kernel.py in a child process: Triton fixes interpreter mode when it is first
# imported, and a torch custom op call imports it in this process without the interpreter.
_TRITON_RUNNER = """
import json, sys
from pathlib import Path
from tests.dspark_kernel import DraftBatch, load_dflash_kernel, run_prepare_inputs
request = json.load(sys.stdin)
results = {}
for path in request["speculators"]:
    kernel = load_dflash_kernel(Path(path), "cpu")
    results[path] = [run_prepare_inputs(kernel, DraftBatch(**b)) for b in request["batches"]]
json.dump(results, sys.stdout)
"""


def interpreted_outputs(speculators: list[Path], batches: list[DraftBatch]) -> dict[Path, list[dict]]:
    """Outputs of each speculator.py's Triton kernel (interpreted on CPU) for every batch."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    request = {
        "speculators": [str(p) for p in speculators],
        "batches": [dataclasses.asdict(b) for b in batches],
    }
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_RUNNER],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, f"Triton interpreter run failed (exit {proc.returncode}):\n{proc.stderr}"
    results = json.loads(proc.stdout)
    return {p: results[str(p)] for p in speculators}


def test_reference_equals_patched_triton_kernel(pristine_vllm_tree: Path, patched_vllm_tree: Path) -> None:
    batches = [DFLASH_BATCH, DSPARK_BATCH, *random_batches(SEED, NUM_RANDOM_BATCHES, max_prefill=300)]
    patched = patched_vllm_tree / SPECULATOR_RELPATH
    pristine = pristine_vllm_tree / SPECULATOR_RELPATH
    triton_results = interpreted_outputs([patched, pristine], batches)
    reference = [reference_outputs(b) for b in batches]

    mismatches = [
        f"batch {i}: {entry}"
        for i, (got, want) in enumerate(zip(triton_results[patched], reference, strict=True))
        for entry in differing_entries(got, want)
    ]
    assert mismatches == []

    # The comparison can fail: the unpatched kernel gives rejected and null-block rows real slots
    # (and rejected rows their positions), so it differs from the reference on exactly those.
    unpatched = [
        differing_entries(got, want) for got, want in zip(triton_results[pristine], reference, strict=True)
    ]
    assert unpatched[0] and unpatched[1], (
        "the pristine kernel matched the fixed semantics on hand-made batches"
    )
    changed = {entry.split("[")[0] for diffs in unpatched for entry in diffs}
    assert changed == {"context_positions", "context_slot_mapping", "query_slot_mapping"}
