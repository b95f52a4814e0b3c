"""The compiled DSpark/DFlash draft-input kernel on a CUDA GPU (``-m gpu``).

The CUDA op must equal the PATCHED vLLM Triton kernel (real Triton on the same GPU) and the PyTorch
reference on random batches with rejected rows, null blocks and padded request rows, and must be
capturable into a CUDA graph whose replays follow new inputs written into the captured buffers.
Needs ``libsparkseal_kernels.so`` (``$SPARKSEAL_KERNELS_LIB`` overrides its path).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import random
from pathlib import Path
from typing import Any

import pytest

from tests import dspark_kernel
from tests.dspark_kernel import OUTPUT_DTYPES, SPECULATOR_RELPATH, STALE, DraftBatch

torch = pytest.importorskip("torch")

from sparkseal.kernels import dspark  # noqa: E402 (needs torch)
from tests.unit.test_dspark_ref import (  # noqa: E402
    DFLASH_BATCH,
    DSPARK_BATCH,
    differing_entries,
    op_arguments,
    outputs_of,
    random_batches,
    reference_outputs,
)

pytestmark = pytest.mark.gpu

SEED = 90121
NUM_RANDOM_BATCHES = 24


@pytest.fixture(scope="module")
def cuda_op() -> None:
    """Skip unless a CUDA GPU and the kernel library are both there."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is false")
    try:
        dspark._kernel()
    except OSError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def triton_kernel(cuda_op: None, patched_vllm_tree: Path) -> dspark_kernel.DFlashKernel:
    """The patched tree's ``_prepare_dflash_inputs_kernel``, compiled by Triton for the GPU."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    conflict = dspark_kernel.triton_mode_conflict("cuda")
    if conflict is not None:
        pytest.skip(conflict)
    return dspark_kernel.load_dflash_kernel(patched_vllm_tree / SPECULATOR_RELPATH, "cuda")


def cuda_outputs(batch: DraftBatch, max_query_len: int | None = None) -> dict[str, list[int]]:
    """Every output buffer after the CUDA op ran on ``batch`` (buffers start as STALE)."""
    args = op_arguments(batch, "cuda")
    if max_query_len is not None:
        args["max_query_len"] = max_query_len
    torch.ops.sparkseal.dspark_prepare_inputs(**args)
    torch.cuda.synchronize()
    return outputs_of(args)


def gpu_batches() -> list[DraftBatch]:
    """Hand-made and random batches; some with long prefill rows (several CUDA blocks per row) and
    some with a large max_num_tokens (several padding blocks)."""
    batches = [DFLASH_BATCH, DSPARK_BATCH, *random_batches(SEED, NUM_RANDOM_BATCHES)]
    long_rows = random_batches(SEED + 1, 6, max_prefill=1500)
    wide = [
        dataclasses.replace(b, max_num_tokens=b.max_num_tokens + 5000) for b in random_batches(SEED + 2, 4)
    ]
    return batches + long_rows + wide


def test_cuda_op_equals_patched_triton_kernel(triton_kernel: dspark_kernel.DFlashKernel) -> None:
    mismatches = []
    for i, batch in enumerate(gpu_batches()):
        want = dspark_kernel.run_prepare_inputs(triton_kernel, batch)
        mismatches += [f"batch {i} vs Triton: {e}" for e in differing_entries(cuda_outputs(batch), want)]
        mismatches += [
            f"batch {i} vs reference: {e}" for e in differing_entries(want, reference_outputs(batch))
        ]
    assert mismatches == []


def test_max_query_len_only_sizes_the_grid(triton_kernel: dspark_kernel.DFlashKernel) -> None:
    # A hint below the longest row still covers every row (the CUDA loops are strided).
    base = random_batches(SEED + 3, 1)[0]
    lens = [900, *base.query_lens[1:]]
    batch = dataclasses.replace(
        base,
        query_lens=lens,
        num_sampled=[0, *base.num_sampled[1:]],
        num_rejected=[0, *base.num_rejected[1:]],
        max_num_tokens=max(base.max_num_tokens, sum(lens)),
    )
    want = dspark_kernel.run_prepare_inputs(triton_kernel, batch)
    assert differing_entries(cuda_outputs(batch, max_query_len=0), want) == []


def test_mixed_devices_are_named(cuda_op: None) -> None:
    args = op_arguments(DFLASH_BATCH, "cuda")
    args["num_rejected"] = args["num_rejected"].cpu()
    message = r"num_rejected must be on target_positions' device cuda:0, got cpu$"
    with pytest.raises(ValueError, match=message):
        torch.ops.sparkseal.dspark_prepare_inputs(**args)


# Scalars fixed by a captured graph; per-row data changes between replays.
REPLAY_REQS = 5
REPLAY_MAX_REQS = 8
REPLAY_STEPS = 3
REPLAY_BLOCK_SIZE = 16
REPLAY_COLUMNS = 8
REPLAY_MAX_TOKENS = 256
REPLAY_MAX_QUERY_LEN = 40
# Target positions past the live tokens of a replayed batch (never read).
JUNK_POSITION = 10**6


def replay_batch(rng: random.Random, sample_from_anchor: bool) -> DraftBatch:
    """A batch of REPLAY_REQS rows within the captured graph's fixed sizes and scalars."""
    query_lens, num_sampled, num_rejected = [], [], []
    for _ in range(REPLAY_REQS):
        if rng.random() < 0.3:
            query_lens.append(rng.randint(1, REPLAY_MAX_QUERY_LEN))
            num_sampled.append(0)
            num_rejected.append(0)
        else:
            q = rng.randint(1, 1 + REPLAY_STEPS)
            sampled = rng.randint(1, q)
            query_lens.append(q)
            num_sampled.append(sampled)
            num_rejected.append(q - sampled)
    return DraftBatch(
        query_lens=query_lens,
        first_positions=[rng.randint(0, 90) for _ in range(REPLAY_REQS)],
        num_rejected=num_rejected,
        num_sampled=num_sampled,
        req_state_idx=rng.sample(range(REPLAY_MAX_REQS), REPLAY_REQS),
        block_table=[
            [0 if rng.random() < 0.25 else rng.randint(1, 900) for _ in range(REPLAY_COLUMNS)]
            for _ in range(REPLAY_MAX_REQS)
        ],
        last_sampled=[rng.randint(0, 2**31 - 1) for _ in range(REPLAY_MAX_REQS)],
        next_prefill_tokens=[rng.randint(0, 2**31 - 1) for _ in range(REPLAY_MAX_REQS)],
        block_size=REPLAY_BLOCK_SIZE,
        num_speculative_steps=REPLAY_STEPS,
        sample_from_anchor=sample_from_anchor,
        max_num_reqs=REPLAY_MAX_REQS,
        max_num_tokens=REPLAY_MAX_TOKENS,
        max_model_len=120,
        parallel_drafting_token_id=31337,
    )


def load_into(static: dict[str, Any], batch: DraftBatch) -> None:
    """Write ``batch``'s inputs into the captured buffers and reset the outputs to STALE."""
    fresh = op_arguments(batch, "cuda")
    for name in OUTPUT_DTYPES:
        static[name].fill_(STALE)
    static["target_positions"].fill_(JUNK_POSITION)
    for name in dspark.INPUTS:
        src = fresh[name]
        static[name].view(-1)[: src.numel()].copy_(src.view(-1))


@pytest.mark.parametrize("sample_from_anchor", [False, True], ids=["dflash", "dspark"])
def test_graph_capture_and_replay(
    triton_kernel: dspark_kernel.DFlashKernel, sample_from_anchor: bool
) -> None:
    rng = random.Random(SEED + int(sample_from_anchor))
    first = replay_batch(rng, sample_from_anchor)
    static = op_arguments(first, "cuda")
    # The captured target positions hold a whole max_num_tokens batch; junk past the live tokens.
    static["target_positions"] = torch.empty(REPLAY_MAX_TOKENS, dtype=torch.int64, device="cuda")
    static["max_query_len"] = REPLAY_MAX_QUERY_LEN
    load_into(static, first)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.sparkseal.dspark_prepare_inputs(**static)  # warm-up launch outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.sparkseal.dspark_prepare_inputs(**static)

    mismatches = []
    for i, batch in enumerate([first, *(replay_batch(rng, sample_from_anchor) for _ in range(6))]):
        load_into(static, batch)
        graph.replay()
        torch.cuda.synchronize()
        want = dspark_kernel.run_prepare_inputs(triton_kernel, batch)
        mismatches += [f"replay {i}: {e}" for e in differing_entries(outputs_of(static), want)]
    assert mismatches == []
