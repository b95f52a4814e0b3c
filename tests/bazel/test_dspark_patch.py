"""Regression tests for patches/vllm/0001-dspark-graph-replay-safety.patch.

DSpark's speculator inherits vLLM's DFlash speculator. A FULL CUDA graph replays every row of the
draft buffers, so rows that carry no live work (padded sample rows, rejected context rows, rows
whose block-table entry is the null block 0) must be inert:

* ``sample_idx_mapping`` is -1 for every padded row, from allocation on and after ``capture()``;
* ``_prepare_dflash_inputs_kernel`` writes PAD_SLOT_ID (and position 0) for rejected context rows
  and PAD_SLOT_ID for any row whose block-table entry is 0, and loads positions and block-table
  entries only for valid rows.

Each check returns a list of violations: the patched tree must have none, the pristine v0.25.1 tree
must show exactly the violations the patch fixes. Kernel checks run in Triton's interpreter on
``cpu`` and with real Triton on ``cuda`` (``-m gpu``).
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import dspark_kernel
from tests.dspark_kernel import PAD_SLOT_ID, SPECULATOR_RELPATH, STALE, DraftBatch

SEED = 51538
NUM_RANDOM_BATCHES = 12
DSPARK_RELPATH = Path("vllm/v1/worker/gpu/spec_decode/dspark/speculator.py")

REJECTED_CTX = "rejected context row"
NULL_BLOCK_CTX = "null-block context row"
NULL_BLOCK_QUERY = "null-block query row"
FIXED_BY_PATCH = {REJECTED_CTX, NULL_BLOCK_CTX, NULL_BLOCK_QUERY}


# --------------------------------------------------------------------------------------------
# Reference semantics of the draft input preparation (after the fix), in plain Python.
# --------------------------------------------------------------------------------------------


def expected_outputs(batch: DraftBatch) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """Every output buffer after a launch on ``batch``, and a label saying why each entry is so.

    Buffers start as STALE (as in dspark_kernel.run_prepare_inputs); entries the kernel must not
    write stay STALE.
    """
    steps = batch.num_speculative_steps
    nq = batch.num_query_per_req
    sizes = {
        "input_ids": batch.max_num_tokens,
        "positions": batch.max_num_tokens,
        "query_start_loc": batch.max_num_reqs + 1,
        "seq_lens": batch.max_num_reqs,
        "query_slot_mapping": batch.max_num_tokens,
        "context_positions": batch.max_num_tokens,
        "context_slot_mapping": batch.max_num_tokens,
        "sample_indices": batch.max_num_reqs * steps,
        "sample_pos": batch.max_num_reqs * steps,
        "sample_idx_mapping": batch.max_num_reqs * steps,
    }
    values = {name: [STALE] * size for name, size in sizes.items()}
    labels = {name: ["untouched"] * size for name, size in sizes.items()}

    def put(name: str, index: int, value: int, label: str) -> None:
        values[name][index] = value
        labels[name][index] = label

    def slot(req: int, pos: int) -> tuple[int, int]:
        """(block id, slot) of ``pos`` in request ``req``'s block table, block number clamped."""
        row = batch.block_table[req]
        block_id = row[min(pos // batch.block_size, len(row) - 1)]
        return block_id, block_id * batch.block_size + pos % batch.block_size

    positions = batch.target_positions
    starts = batch.query_start_loc
    for r in range(batch.num_reqs):
        state = batch.req_state_idx[r]
        ctx_start, num_ctx = starts[r], batch.query_lens[r]
        num_valid = num_ctx - batch.num_rejected[r]
        last_valid_pos = positions[ctx_start + num_valid - 1]
        for j in range(num_ctx):
            where = f"request {r}, context row {j}"
            if j >= num_valid:
                put("context_positions", ctx_start + j, 0, f"{REJECTED_CTX} ({where})")
                put("context_slot_mapping", ctx_start + j, PAD_SLOT_ID, f"{REJECTED_CTX} ({where})")
                continue
            pos = positions[ctx_start + j]
            block_id, ctx_slot = slot(r, pos)
            label = f"{NULL_BLOCK_CTX} ({where})" if block_id == 0 else f"valid context row ({where})"
            put("context_positions", ctx_start + j, pos, label)
            put("context_slot_mapping", ctx_start + j, PAD_SLOT_ID if block_id == 0 else ctx_slot, label)

        bonus = batch.last_sampled[state] if batch.num_sampled[r] > 0 else batch.next_prefill_tokens[state]
        for k in range(nq):
            q_pos = last_valid_pos + 1 + k
            q_idx = r * nq + k
            block_id, q_slot = slot(r, q_pos)
            where = f"request {r}, query row {k}"
            label = f"{NULL_BLOCK_QUERY} ({where})" if block_id == 0 else f"query row ({where})"
            put("input_ids", q_idx, bonus if k == 0 else batch.parallel_drafting_token_id, label)
            put("positions", q_idx, min(q_pos, batch.max_model_len - 1), label)
            put("query_slot_mapping", q_idx, PAD_SLOT_ID if block_id == 0 else q_slot, label)
            sample_off = 0 if batch.sample_from_anchor else 1
            if k >= sample_off:
                s = r * steps + k - sample_off
                put("sample_indices", s, q_idx, label)
                put("sample_pos", s, q_pos + 1 if batch.sample_from_anchor else q_pos, label)
                put("sample_idx_mapping", s, state, label)
        put("query_start_loc", r, r * nq, f"request row (request {r})")
        put("seq_lens", r, last_valid_pos + 1 + nq, f"request row (request {r})")

    for i in range(batch.num_reqs, batch.max_num_reqs + 1):
        put("query_start_loc", i, batch.num_reqs * nq, f"padded request row {i}")
    for i in range(batch.num_reqs, batch.max_num_reqs):
        put("seq_lens", i, 0, f"padded request row {i}")
    for s in range(batch.num_reqs * steps, batch.max_num_reqs * steps):
        put("sample_indices", s, 0, f"padded sample row {s}")
        put("sample_pos", s, 0, f"padded sample row {s}")
        put("sample_idx_mapping", s, -1, f"padded sample row {s}")
    for i in range(batch.num_reqs * nq, batch.max_num_tokens):
        put("query_slot_mapping", i, PAD_SLOT_ID, f"padded query slot {i}")
    return values, labels


def kernel_violations(speculator: Path, device: str, batch: DraftBatch) -> list[str]:
    """Entries where ``speculator``'s kernel output differs from the reference, one line each."""
    kernel = dspark_kernel.load_dflash_kernel(speculator, device)
    actual = dspark_kernel.run_prepare_inputs(kernel, batch)
    expected, labels = expected_outputs(batch)
    violations = []
    for name, want in expected.items():
        for i, (got, exp) in enumerate(zip(actual[name], want, strict=True)):
            if got != exp:
                violations.append(f"{labels[name][i]}: {name}[{i}] = {got}, expected {exp}")
    return violations


def categories(violations: list[str]) -> Counter[str]:
    """How many violations fall into each row category (the text before the first ' (' or ':')."""
    return Counter(v.split(":")[0].split(" (")[0] for v in violations)


# --------------------------------------------------------------------------------------------
# Allocation and capture() of sample_idx_mapping, executed from the speculator's own source.
# --------------------------------------------------------------------------------------------

STUB_MAX_NUM_REQS = 4
STUB_STEPS = 3


class _DraftModelSpeculatorStub:
    """The attributes DFlashSpeculator.__init__ and capture() read from their base class."""

    def __init__(self, vllm_config: Any, device: Any) -> None:
        import torch

        self.vllm_config = vllm_config
        self.device = device
        self.max_num_reqs = STUB_MAX_NUM_REQS
        self.num_speculative_steps = STUB_STEPS
        self.max_num_tokens = 32
        self.hidden_size = 8
        self.dtype = torch.float32
        self.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace())
        self.input_buffers = self.block_tables = self.attn_groups = self.kv_cache_config = None
        self.max_model_len = 128

    def _generate_draft(self, *args: Any, **kwargs: Any) -> None:
        """Stands in for the forward that the graph manager captures."""


class _GraphCaptureRecorder:
    """A graph manager whose capture() records the sampling rows the captured graph would bake in."""

    def __init__(self, speculator: Any) -> None:
        self.speculator = speculator
        self.captured_idx_mapping: list[int] | None = None

    def capture(self, forward_fn: Any, *args: Any, **kwargs: Any) -> None:
        self.captured_idx_mapping = self.speculator.sample_idx_mapping.cpu().tolist()


def _inert(*args: Any, **kwargs: Any) -> None:
    """Stands in for the vLLM config readers that __init__ calls."""


def load_speculator_class(speculator: Path) -> type:
    """DFlashSpeculator with only its class attributes, __init__ and capture(), on a stub base."""
    import torch

    source = speculator.read_text()
    module = ast.parse(source, filename=str(speculator))
    classes = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "DFlashSpeculator"]
    if len(classes) != 1:
        raise AssertionError(f"{speculator}: {len(classes)} classes named DFlashSpeculator, expected 1")
    methods = {n.name: n for n in classes[0].body if isinstance(n, ast.FunctionDef)}
    missing = sorted({"__init__", "capture"} - set(methods))
    if missing:
        raise AssertionError(f"{speculator}: DFlashSpeculator lacks {missing}, expected __init__ and capture")
    lines = source.splitlines(keepends=True)
    # Class attributes (e.g. _speculator_name) and the two methods, as written in the file.
    nodes = [n for n in classes[0].body if isinstance(n, ast.Assign | ast.AnnAssign)]
    nodes += [methods["__init__"], methods["capture"]]
    body = []
    free: set[str] = set()
    for node in nodes:
        decorators = node.decorator_list if isinstance(node, ast.FunctionDef) else []
        first = min([d.lineno for d in decorators] + [node.lineno])
        assert node.end_lineno is not None
        body.append("".join(lines[first - 1 : node.end_lineno]))
        free |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    namespace: dict[str, Any] = {
        "torch": torch,
        "logger": SimpleNamespace(info=_inert, warning=_inert, debug=_inert),
        "_DraftModelSpeculatorStub": _DraftModelSpeculatorStub,
    }
    for name in free - set(namespace) - set(dir(builtins)):
        namespace[name] = _inert
    text = "class DFlashSpeculator(_DraftModelSpeculatorStub):\n" + "\n".join(body)
    exec(compile(text, f"<DFlashSpeculator methods of {speculator}>", "exec"), namespace)
    return namespace["DFlashSpeculator"]


def capture_violations(speculator: Path, device: str) -> list[str]:
    """Padded sample rows that act as a request slot after allocation or in a captured graph."""
    import torch

    cls = load_speculator_class(speculator)
    spec = cls(None, torch.device(device))
    rows = STUB_MAX_NUM_REQS * STUB_STEPS
    mapping = spec.sample_idx_mapping
    violations = []
    if mapping.dtype != torch.int32 or mapping.numel() != rows:
        violations.append(
            f"allocation: sample_idx_mapping is {mapping.dtype}[{mapping.numel()}], "
            f"expected torch.int32[{rows}]"
        )
    for i, v in enumerate(mapping.cpu().tolist()):
        if v != -1:
            violations.append(f"allocation: padded sample row {i} maps to request slot {v}, expected -1")

    # A dummy run before capture leaves live request slots in the buffer.
    mapping.copy_(torch.arange(mapping.numel(), device=mapping.device) % STUB_MAX_NUM_REQS)
    recorder = _GraphCaptureRecorder(spec)
    spec.query_cudagraph_manager = recorder
    spec.capture()
    if recorder.captured_idx_mapping is None:
        return [*violations, "capture: query_cudagraph_manager.capture() was not called, expected 1 call"]
    for i, v in enumerate(recorder.captured_idx_mapping):
        if v != -1:
            violations.append(
                f"capture: padded sample row {i} maps to request slot {v} in the captured graph, expected -1"
            )
    return violations


# --------------------------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------------------------


def make_batch(**overrides: Any) -> DraftBatch:
    """A small DFlash-layout batch (1 + N query rows) with a full block table; fields overridable."""
    max_num_reqs = overrides.get("max_num_reqs", 4)
    fields: dict[str, Any] = {
        "query_lens": [4, 1, 6],
        "first_positions": [10, 3, 20],
        "num_rejected": [0, 0, 0],
        "num_sampled": [1, 1, 1],
        "req_state_idx": [2, 0, 3],
        "block_table": [[10 * (r + 1) + b for b in range(8)] for r in range(max_num_reqs)],
        "last_sampled": [100 + i for i in range(max_num_reqs)],
        "next_prefill_tokens": [200 + i for i in range(max_num_reqs)],
        "block_size": 4,
        "num_speculative_steps": 3,
        "sample_from_anchor": False,
        "max_num_reqs": max_num_reqs,
        "max_num_tokens": 32,
        "max_model_len": 1000,
        "parallel_drafting_token_id": 99,
    }
    fields.update(overrides)
    return DraftBatch(**fields)


def random_batch(rng: random.Random, sample_from_anchor: bool) -> DraftBatch:
    """A random batch: rejected suffixes, chunked-prefill rows, null-block entries, padding."""
    max_num_reqs, max_blocks = 6, 10
    steps = rng.randint(1, 4)
    block_size = rng.choice([2, 4, 8])
    num_reqs = rng.randint(1, max_num_reqs)
    query_lens = [rng.randint(1, 8) for _ in range(num_reqs)]
    num_sampled = [0 if rng.random() < 0.2 else rng.randint(1, steps + 1) for _ in range(num_reqs)]
    num_rejected = [
        rng.randint(0, n - 1) if sampled and rng.random() < 0.7 else 0
        for n, sampled in zip(query_lens, num_sampled, strict=True)
    ]
    span = block_size * max_blocks
    first_positions = [rng.randint(0, span - 2) for _ in range(num_reqs)]
    ids = rng.sample(range(1, 500), max_num_reqs * max_blocks)
    block_table = [
        [0 if rng.random() < 0.2 else ids[r * max_blocks + b] for b in range(max_blocks)]
        for r in range(max_num_reqs)
    ]
    return DraftBatch(
        query_lens=query_lens,
        first_positions=first_positions,
        num_rejected=num_rejected,
        num_sampled=num_sampled,
        req_state_idx=rng.sample(range(max_num_reqs), num_reqs),
        block_table=block_table,
        last_sampled=[rng.randint(1000, 1999) for _ in range(max_num_reqs)],
        next_prefill_tokens=[rng.randint(2000, 2999) for _ in range(max_num_reqs)],
        block_size=block_size,
        num_speculative_steps=steps,
        sample_from_anchor=sample_from_anchor,
        max_num_reqs=max_num_reqs,
        max_num_tokens=64,
        max_model_len=rng.choice([4096, span // 2]),
        parallel_drafting_token_id=rng.randint(3000, 3999),
    )


def random_batches() -> list[DraftBatch]:
    """NUM_RANDOM_BATCHES batches from SEED, alternating DSpark (anchor) and DFlash layouts."""
    rng = random.Random(SEED)
    return [random_batch(rng, sample_from_anchor=i % 2 == 0) for i in range(NUM_RANDOM_BATCHES)]


# --------------------------------------------------------------------------------------------
# Fixtures.
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    """``cpu`` everywhere; ``cuda`` only where torch sees a CUDA GPU."""
    torch = pytest.importorskip("torch")
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is false")
    return request.param


@pytest.fixture
def kernel_device(device: str) -> str:
    """``device``, when Triton can launch the kernel there in this process."""
    # find_spec, not import: triton must first be imported after TRITON_INTERPRET is chosen.
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    conflict = dspark_kernel.triton_mode_conflict(device)
    if conflict is not None:
        pytest.skip(conflict)
    return device


def _speculator(tree: Path) -> Path:
    return tree / SPECULATOR_RELPATH


# --------------------------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------------------------


def test_rejected_rows_get_pad_slot_and_position_zero(
    pristine_vllm_tree: Path, patched_vllm_tree: Path, kernel_device: str
) -> None:
    batch = make_batch(num_rejected=[2, 0, 3])
    assert kernel_violations(_speculator(patched_vllm_tree), kernel_device, batch) == []

    pristine = kernel_violations(_speculator(pristine_vllm_tree), kernel_device, batch)
    # Request 0 rows 2-3 (positions 12, 13) and request 2 rows 3-5 (positions 23-25), flat 2-3 and
    # 8-10: the pristine kernel keeps their positions and slots (position 25: block 6 of request 2's
    # table, id 36, slot 36 * 4 + 1 = 145).
    assert categories(pristine) == {REJECTED_CTX: 10}, pristine
    assert (
        "rejected context row (request 0, context row 2): context_positions[2] = 12, expected 0" in pristine
    )
    assert (
        "rejected context row (request 2, context row 5): context_slot_mapping[10] = 145, expected -1"
        in pristine
    )


def test_null_block_rows_get_pad_slot(
    pristine_vllm_tree: Path, patched_vllm_tree: Path, kernel_device: str
) -> None:
    table = [[10 * (r + 1) + b for b in range(8)] for r in range(4)]
    table[0][2] = 0  # request 0: context rows 0-1 (positions 10-11) sit in block 2
    table[2][7] = 0  # request 2: query rows 2-3 (positions 28-29) sit in block 7
    batch = make_batch(block_table=table)
    assert kernel_violations(_speculator(patched_vllm_tree), kernel_device, batch) == []

    pristine = kernel_violations(_speculator(pristine_vllm_tree), kernel_device, batch)
    # The pristine kernel puts these rows into physical block 0: slot = position % block_size.
    assert categories(pristine) == {NULL_BLOCK_CTX: 2, NULL_BLOCK_QUERY: 2}, pristine
    assert (
        "null-block context row (request 0, context row 0): context_slot_mapping[0] = 2, expected -1"
        in pristine
    )
    assert (
        "null-block query row (request 2, query row 3): query_slot_mapping[11] = 1, expected -1" in pristine
    )


def test_random_batches_match_reference(
    pristine_vllm_tree: Path, patched_vllm_tree: Path, kernel_device: str
) -> None:
    patched: list[str] = []
    pristine: list[str] = []
    for batch in random_batches():
        patched += kernel_violations(_speculator(patched_vllm_tree), kernel_device, batch)
        pristine += kernel_violations(_speculator(pristine_vllm_tree), kernel_device, batch)
    assert patched == []
    # The pristine kernel differs from the reference only on the rows the patch fixes, and the
    # seeded batches hit every one of those kinds.
    assert set(categories(pristine)) == FIXED_BY_PATCH, pristine


def test_sample_idx_mapping_is_inert_after_allocation_and_capture(
    pristine_vllm_tree: Path, patched_vllm_tree: Path, device: str
) -> None:
    assert capture_violations(_speculator(patched_vllm_tree), device) == []

    pristine = capture_violations(_speculator(pristine_vllm_tree), device)
    rows = STUB_MAX_NUM_REQS * STUB_STEPS
    assert len(pristine) == 2 * rows, pristine
    assert "allocation: padded sample row 5 maps to request slot 0, expected -1" in pristine
    assert (
        "capture: padded sample row 5 maps to request slot 0 in the captured graph, expected -1" in pristine
    )


def test_dspark_inherits_the_fixed_buffers(patched_vllm_tree: Path) -> None:
    path = patched_vllm_tree / DSPARK_RELPATH
    if not path.exists():
        pytest.skip(f"{path} is not in this tree")
    module = ast.parse(path.read_text(), filename=str(path))
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "DSparkSpeculator"]
    bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
    assert bases == ["DFlashSpeculator"], f"{path}: DSparkSpeculator bases {bases}, expected DFlashSpeculator"
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "capture" not in methods, f"{path}: DSparkSpeculator overrides capture(), expected inherited"
    rebinds = [
        t.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and t.attr == "sample_idx_mapping"
    ]
    assert rebinds == [], f"{path}: DSparkSpeculator reassigns sample_idx_mapping, expected inherited"


def test_pad_slot_id_matches_tree(pristine_vllm_tree: Path) -> None:
    if not (pristine_vllm_tree / dspark_kernel.PAD_SLOT_ID_RELPATH).exists():
        pytest.skip(f"{pristine_vllm_tree / dspark_kernel.PAD_SLOT_ID_RELPATH} is not in this tree")
    assert dspark_kernel.read_pad_slot_id(pristine_vllm_tree) == PAD_SLOT_ID


def test_loader_names_file_and_missing_kernel(tmp_path: Path) -> None:
    path = tmp_path / "speculator.py"
    path.write_text(
        "from vllm.v1.attention.backends.utils import PAD_SLOT_ID\n\ndef prepare_dflash_inputs():\n    pass\n"
    )
    with pytest.raises(dspark_kernel.KernelLoadError) as err:
        dspark_kernel.load_dflash_kernel(path, "cpu")
    assert str(err.value) == f"{path}: no @triton.jit function '_prepare_dflash_inputs_kernel'"


def test_loader_names_wrong_pad_slot_source(tmp_path: Path) -> None:
    path = tmp_path / "speculator.py"
    path.write_text("from other.module import PAD_SLOT_ID\n")
    with pytest.raises(dspark_kernel.KernelLoadError) as err:
        dspark_kernel.load_dflash_kernel(path, "cpu")
    assert str(err.value) == (
        f"{path}: PAD_SLOT_ID is imported from 'other.module', expected 'vllm.v1.attention.backends.utils'"
    )
