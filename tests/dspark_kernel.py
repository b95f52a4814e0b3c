"""Run the draft-input Triton kernel of a vLLM speculator.py without importing vLLM.

DSpark's speculator inherits vLLM's DFlash speculator, whose ``prepare_dflash_inputs`` launches
``_prepare_dflash_inputs_kernel`` to build the draft step's inputs, slot mappings and sampling rows.
This module parses a given ``speculator.py`` with ``ast``, executes that file's own ``@triton.jit``
functions and its own launcher with ``triton``/``tl``/``torch`` in scope, and calls the launcher
with the argument contract the speculator uses. On ``cpu`` the kernel runs in Triton's interpreter
(``TRITON_INTERPRET=1``); on ``cuda`` it is compiled and run by real Triton.
"""

from __future__ import annotations

import ast
import builtins
import functools
import linecache
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SPECULATOR_RELPATH = Path("vllm/v1/worker/gpu/spec_decode/dflash/speculator.py")
KERNEL_NAME = "_prepare_dflash_inputs_kernel"
LAUNCHER_NAME = "prepare_dflash_inputs"

# The speculator imports PAD_SLOT_ID from this vLLM module, which defines it as -1 (the slot value
# that makes a K/V cache write skip its row). The value is provided here so vLLM is never imported.
PAD_SLOT_ID_MODULE = "vllm.v1.attention.backends.utils"
PAD_SLOT_ID_RELPATH = Path("vllm/v1/attention/backends/utils.py")
PAD_SLOT_ID = -1

# Every output buffer starts filled with this value, so an entry the kernel leaves untouched (and
# a graph replay would read as left over from an earlier step) is visible in the results.
STALE = 7777

# Output buffers in the order the launcher receives them, with the dtypes vLLM allocates them with
# (InputBuffers, BlockTables.slot_mappings and the speculator's own buffers).
OUTPUT_DTYPES = {
    "input_ids": "int32",
    "positions": "int64",
    "query_start_loc": "int32",
    "seq_lens": "int32",
    "query_slot_mapping": "int64",
    "context_positions": "int64",
    "context_slot_mapping": "int64",
    "sample_indices": "int64",
    "sample_pos": "int64",
    "sample_idx_mapping": "int32",
}


class KernelLoadError(RuntimeError):
    """A speculator.py does not have the shape this harness expects."""


@dataclass(frozen=True)
class DraftBatch:
    """One target step as the draft input preparation sees it.

    Per-request lists are in batch order. ``block_table`` has ``max_num_reqs`` rows in batch order
    (vLLM gathers the table per batch row before the launch); ``last_sampled`` and
    ``next_prefill_tokens`` are indexed by request state slot (``req_state_idx``).
    """

    query_lens: list[int]
    first_positions: list[int]
    num_rejected: list[int]
    num_sampled: list[int]
    req_state_idx: list[int]
    block_table: list[list[int]]
    last_sampled: list[int]
    next_prefill_tokens: list[int]
    block_size: int
    num_speculative_steps: int
    sample_from_anchor: bool
    max_num_reqs: int
    max_num_tokens: int
    max_model_len: int
    parallel_drafting_token_id: int

    @property
    def num_reqs(self) -> int:
        """Number of live requests in the batch."""
        return len(self.query_lens)

    @property
    def num_query_per_req(self) -> int:
        """Draft query tokens per request: N when sampling from the anchor (DSpark), else 1 + N."""
        steps = self.num_speculative_steps
        return steps if self.sample_from_anchor else 1 + steps

    @property
    def query_start_loc(self) -> list[int]:
        """Cumulative target query lengths, ``num_reqs + 1`` entries."""
        starts = [0]
        for n in self.query_lens:
            starts.append(starts[-1] + n)
        return starts

    @property
    def target_positions(self) -> list[int]:
        """Position of every scheduled target token, flattened in batch order."""
        return [p0 + k for p0, n in zip(self.first_positions, self.query_lens, strict=True) for k in range(n)]


@dataclass(frozen=True)
class DFlashKernel:
    """The kernel and launcher of one speculator.py, ready to launch on one device."""

    path: Path
    device: str
    launcher: Callable[..., None]


def _interpret_requested() -> bool:
    """Whether TRITON_INTERPRET in the environment asks for Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_mode_conflict(device: str) -> str | None:
    """Why ``device`` cannot run in this process, or None when it can.

    Triton fixes interpreter mode when it is imported (its own library functions are decorated
    then), so one process runs either the interpreter (``cpu``) or real Triton (``cuda``).
    """
    want = device == "cpu"
    if "triton" not in sys.modules or _interpret_requested() == want:
        return None
    have = "1" if _interpret_requested() else "0"
    return (
        f"triton was imported with TRITON_INTERPRET={have} in this process; device {device!r} needs "
        f"TRITON_INTERPRET={int(want)}: run the cpu and cuda variants in separate processes"
    )


def _select_triton_mode(device: str) -> None:
    """Set TRITON_INTERPRET for ``device`` before triton is first imported."""
    conflict = triton_mode_conflict(device)
    if conflict is not None:
        raise KernelLoadError(conflict)
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1" if device == "cpu" else "0"


def _is_triton_jit(node: ast.FunctionDef) -> bool:
    """True when ``node`` is decorated with ``@triton.jit`` (bare or called)."""
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "jit"
            and isinstance(target.value, ast.Name)
            and target.value.id == "triton"
        ):
            return True
    return False


def _segment(lines: list[str], node: ast.FunctionDef) -> str:
    """The source text of ``node``, decorators included, exactly as written in the file."""
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    assert node.end_lineno is not None
    return "".join(lines[first - 1 : node.end_lineno])


def _free_names(node: ast.FunctionDef) -> set[str]:
    """Names that ``node``'s body reads but neither binds nor receives as parameters."""
    params = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
    loaded: set[str] = set()
    stored: set[str] = set()
    for stmt in node.body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Name):
                (loaded if isinstance(sub.ctx, ast.Load) else stored).add(sub.id)
    return loaded - stored - params - set(dir(builtins))


def _annotation_names(node: ast.FunctionDef) -> set[str]:
    """Bare names used in ``node``'s parameter and return annotations."""
    annotations = [a.annotation for a in node.args.args + node.args.kwonlyargs if a.annotation]
    if node.returns is not None:
        annotations.append(node.returns)
    names = {n.id for ann in annotations for n in ast.walk(ann) if isinstance(n, ast.Name)}
    return names - set(dir(builtins))


def _check_pad_slot_import(tree: ast.Module, path: Path) -> None:
    """Require that the speculator takes PAD_SLOT_ID from the module whose value we provide."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "PAD_SLOT_ID" for a in node.names):
            if node.module == PAD_SLOT_ID_MODULE:
                return
            raise KernelLoadError(
                f"{path}: PAD_SLOT_ID is imported from {node.module!r}, expected {PAD_SLOT_ID_MODULE!r}"
            )
    raise KernelLoadError(f"{path}: no import of PAD_SLOT_ID, expected one from {PAD_SLOT_ID_MODULE!r}")


def read_pad_slot_id(tree_root: Path) -> int:
    """PAD_SLOT_ID as defined (``PAD_SLOT_ID = <int>``) in a vLLM tree, read without importing it."""
    path = tree_root / PAD_SLOT_ID_RELPATH
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if (
            isinstance(node, ast.Assign)
            and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["PAD_SLOT_ID"]
            and isinstance(node.value, ast.UnaryOp | ast.Constant)
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, int):
                return value
    raise KernelLoadError(f"{path}: no module-level 'PAD_SLOT_ID = <int>', expected one")


@functools.cache
def load_dflash_kernel(speculator: Path, device: str) -> DFlashKernel:
    """Execute ``speculator``'s Triton kernel(s) and launcher in a private namespace.

    Only the ``@triton.jit`` functions and ``prepare_dflash_inputs`` are executed; names the kernel
    reads must be ``triton``, ``tl``, another extracted Triton function or PAD_SLOT_ID.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"{speculator}: device {device!r} is not supported, expected 'cpu' or 'cuda'")
    source = speculator.read_text()
    module = ast.parse(source, filename=str(speculator))
    _check_pad_slot_import(module, speculator)
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    jit_functions = [n for n in functions.values() if _is_triton_jit(n)]
    if KERNEL_NAME not in {n.name for n in jit_functions}:
        raise KernelLoadError(f"{speculator}: no @triton.jit function {KERNEL_NAME!r}")
    if LAUNCHER_NAME not in functions:
        raise KernelLoadError(f"{speculator}: no module-level function {LAUNCHER_NAME!r}")
    launcher = functions[LAUNCHER_NAME]

    _select_triton_mode(device)
    import torch
    import triton
    import triton.language as tl

    namespace: dict[str, Any] = {
        "__name__": f"dflash_kernel_{abs(hash(str(speculator)))}",
        "triton": triton,
        "tl": tl,
        "torch": torch,
        "PAD_SLOT_ID": PAD_SLOT_ID,
    }
    known = set(namespace) | {n.name for n in jit_functions}
    for node in [*jit_functions, launcher]:
        unresolved = sorted(_free_names(node) - known)
        if unresolved:
            raise KernelLoadError(
                f"{speculator}: {node.name} reads {unresolved}, expected only names in {sorted(known)}"
            )
    # The launcher's annotations (InputBuffers, InputBatch, ...) are evaluated at definition
    # time; they carry no behaviour, so they are bound to Any.
    for name in _annotation_names(launcher) - known:
        namespace[name] = Any

    exec_functions(speculator, source, [*jit_functions, launcher], namespace)
    return DFlashKernel(path=speculator, device=device, launcher=namespace[LAUNCHER_NAME])


def exec_functions(path: Path, source: str, nodes: list[ast.FunctionDef], namespace: dict[str, Any]) -> None:
    """Execute the source text of ``nodes`` (functions of ``path``) into ``namespace``."""
    lines = source.splitlines(keepends=True)
    text = "\n\n".join(_segment(lines, n) for n in nodes)
    filename = f"<triton kernels of {path}>"
    # Triton reads a kernel's source through inspect/linecache; register the executed text.
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    exec(compile(text, filename, "exec"), namespace)


def load_launcher(path: Path, launcher_name: str, device: str) -> Callable[..., Any]:
    """Execute every ``@triton.jit`` function of ``path`` and its function ``launcher_name``.

    Names they read must be ``triton``, ``tl``, ``torch`` or another extracted function.
    """
    source = path.read_text()
    module = ast.parse(source, filename=str(path))
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    if launcher_name not in functions:
        raise KernelLoadError(f"{path}: no module-level function {launcher_name!r}")
    jit_functions = [n for n in functions.values() if _is_triton_jit(n)]
    _select_triton_mode(device)
    import torch
    import triton
    import triton.language as tl

    namespace: dict[str, Any] = {"__name__": f"kernels_{abs(hash(str(path)))}", "triton": triton, "tl": tl}
    namespace["torch"] = torch
    known = set(namespace) | {n.name for n in jit_functions}
    for node in [*jit_functions, functions[launcher_name]]:
        unresolved = sorted(_free_names(node) - known)
        if unresolved:
            raise KernelLoadError(
                f"{path}: {node.name} reads {unresolved}, expected only names in {sorted(known)}"
            )
    exec_functions(path, source, [*jit_functions, functions[launcher_name]], namespace)
    return namespace[launcher_name]


def run_prepare_inputs(kernel: DFlashKernel, batch: DraftBatch) -> dict[str, list[int]]:
    """Launch the speculator's ``prepare_dflash_inputs`` on ``batch``; return every output buffer.

    Output buffers are allocated at the speculator's sizes and pre-filled with STALE.
    """
    import torch

    dev = torch.device(kernel.device)

    def tensor(values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=dev)

    sizes = {
        "input_ids": batch.max_num_tokens,
        "positions": batch.max_num_tokens,
        "query_start_loc": batch.max_num_reqs + 1,
        "seq_lens": batch.max_num_reqs,
        "query_slot_mapping": batch.max_num_tokens,
        "context_positions": batch.max_num_tokens,
        "context_slot_mapping": batch.max_num_tokens,
        "sample_indices": batch.max_num_reqs * batch.num_speculative_steps,
        "sample_pos": batch.max_num_reqs * batch.num_speculative_steps,
        "sample_idx_mapping": batch.max_num_reqs * batch.num_speculative_steps,
    }
    out = {
        name: torch.full((sizes[name],), STALE, dtype=getattr(torch, dtype), device=dev)
        for name, dtype in OUTPUT_DTYPES.items()
    }
    input_buffers = SimpleNamespace(
        input_ids=out["input_ids"],
        positions=out["positions"],
        query_start_loc=out["query_start_loc"],
        seq_lens=out["seq_lens"],
    )
    input_batch = SimpleNamespace(
        num_reqs=batch.num_reqs,
        # vLLM passes a host array here; the launcher only takes its max().
        num_scheduled_tokens=torch.tensor(batch.query_lens, dtype=torch.int32),
        positions=tensor(batch.target_positions, torch.int64),
        query_start_loc=tensor(batch.query_start_loc, torch.int32),
        idx_mapping=tensor(batch.req_state_idx, torch.int32),
    )
    kernel.launcher(
        input_buffers=input_buffers,
        query_slot_mapping=out["query_slot_mapping"],
        context_positions=out["context_positions"],
        context_slot_mapping=out["context_slot_mapping"],
        sample_indices=out["sample_indices"],
        sample_pos=out["sample_pos"],
        sample_idx_mapping=out["sample_idx_mapping"],
        input_batch=input_batch,
        num_sampled=tensor(batch.num_sampled, torch.int32),
        num_rejected=tensor(batch.num_rejected, torch.int32),
        # vLLM keeps last sampled tokens as [max_num_reqs, 1] int64 and prefill tokens as int32.
        last_sampled=tensor([[t] for t in batch.last_sampled], torch.int64),
        next_prefill_tokens=tensor(batch.next_prefill_tokens, torch.int32),
        block_table=tensor(batch.block_table, torch.int32),
        block_size=batch.block_size,
        parallel_drafting_token_id=batch.parallel_drafting_token_id,
        num_query_per_req=batch.num_query_per_req,
        num_speculative_steps=batch.num_speculative_steps,
        max_num_reqs=batch.max_num_reqs,
        max_num_tokens=batch.max_num_tokens,
        max_model_len=batch.max_model_len,
        sample_from_anchor=batch.sample_from_anchor,
    )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {name: buf.cpu().tolist() for name, buf in out.items()}
