"""``sparkseal::dspark_prepare_inputs``: the compiled DSpark/DFlash draft-input preparation as a torch op.

The op takes the arguments of vLLM's ``_prepare_dflash_inputs_kernel`` (v0.25.1, with
``patches/vllm/0001-dspark-graph-replay-safety.patch``) as tensors and ints, writes its ten output
tensors in place, and returns nothing. On CUDA tensors it enqueues the kernel of
``libsparkseal_kernels.so`` (C ABI in ``kernels_sm121/include/sparkseal/dspark.h``) on the current
stream, with no host synchronization, so it can be captured into a CUDA graph. On CPU tensors it
runs the PyTorch reference (:mod:`sparkseal.kernels.dspark_ref`). Arguments are checked on the host
before anything runs; a bad one raises ``ValueError`` naming the argument, the expected and the
actual value.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
from typing import Any

import torch

from sparkseal.kernels import _lib
from sparkseal.kernels.dspark_ref import num_query_per_req_for, prepare_inputs_reference

OP_NAME = "sparkseal::dspark_prepare_inputs"
# SPARKSEAL_DSPARK_ABI_VERSION of the header this module was written against.
ABI_VERSION = 1
_INT32_MAX = 2**31 - 1

OUTPUTS = (
    "input_ids",
    "positions",
    "query_start_loc",
    "seq_lens",
    "query_slot_mapping",
    "context_positions",
    "context_slot_mapping",
    "sample_indices",
    "sample_pos",
    "sample_idx_mapping",
)
INPUTS = (
    "target_positions",
    "target_query_start_loc",
    "idx_mapping",
    "last_sampled",
    "next_prefill_tokens",
    "num_sampled",
    "num_rejected",
    "block_table",
)
# vLLM's dtype of every tensor argument.
DTYPES = {
    "input_ids": torch.int32,
    "positions": torch.int64,
    "query_start_loc": torch.int32,
    "seq_lens": torch.int32,
    "query_slot_mapping": torch.int64,
    "context_positions": torch.int64,
    "context_slot_mapping": torch.int64,
    "sample_indices": torch.int64,
    "sample_pos": torch.int64,
    "sample_idx_mapping": torch.int32,
    "target_positions": torch.int64,
    "target_query_start_loc": torch.int32,
    "idx_mapping": torch.int32,
    "last_sampled": torch.int64,
    "next_prefill_tokens": torch.int32,
    "num_sampled": torch.int32,
    "num_rejected": torch.int32,
    "block_table": torch.int32,
}


class PrepareArgs(ctypes.Structure):
    """``sparkseal_dspark_prepare_args`` of dspark.h, field for field."""

    _fields_ = (
        *((name, ctypes.c_void_p) for name in OUTPUTS + INPUTS),
        ("block_table_stride", ctypes.c_int64),
        ("num_reqs", ctypes.c_int64),
        ("max_query_len", ctypes.c_int64),
        ("parallel_drafting_token_id", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("num_query_per_req", ctypes.c_int64),
        ("num_speculative_steps", ctypes.c_int64),
        ("max_num_reqs", ctypes.c_int64),
        ("max_num_tokens", ctypes.c_int64),
        ("max_model_len", ctypes.c_int64),
        ("sample_from_anchor", ctypes.c_int32),
        ("device", ctypes.c_int32),
    )


def _fail(message: str) -> None:
    raise ValueError(f"{OP_NAME}: {message}")


def _check_scalars(
    num_reqs: int,
    max_query_len: int,
    block_size: int,
    num_query_per_req: int,
    num_speculative_steps: int,
    max_num_reqs: int,
    max_num_tokens: int,
    max_model_len: int,
    sample_from_anchor: bool,
) -> None:
    if not 1 <= max_num_reqs <= _INT32_MAX:
        _fail(f"max_num_reqs must be in [1, {_INT32_MAX}], got {max_num_reqs}")
    if not 1 <= num_reqs <= max_num_reqs:
        _fail(f"num_reqs must be in [1, max_num_reqs={max_num_reqs}], got {num_reqs}")
    if not 1 <= num_speculative_steps <= _INT32_MAX:
        _fail(f"num_speculative_steps must be in [1, {_INT32_MAX}], got {num_speculative_steps}")
    expected_nq = num_query_per_req_for(num_speculative_steps, sample_from_anchor)
    if num_query_per_req != expected_nq:
        _fail(
            f"num_query_per_req must be {expected_nq} for num_speculative_steps="
            f"{num_speculative_steps} and sample_from_anchor={sample_from_anchor}, got {num_query_per_req}"
        )
    if block_size < 1:
        _fail(f"block_size must be >= 1, got {block_size}")
    if max_model_len < 1:
        _fail(f"max_model_len must be >= 1, got {max_model_len}")
    if not 0 <= max_query_len <= _INT32_MAX:
        _fail(f"max_query_len must be in [0, {_INT32_MAX}], got {max_query_len}")
    if not num_reqs * num_query_per_req <= max_num_tokens <= _INT32_MAX:
        _fail(
            f"max_num_tokens must be in [num_reqs * num_query_per_req = {num_reqs * num_query_per_req}, "
            f"{_INT32_MAX}], got {max_num_tokens}"
        )


def _check_tensors(tensors: dict[str, torch.Tensor], minimum: dict[str, int]) -> None:
    device = tensors["target_positions"].device
    for name, t in tensors.items():
        if t.dtype != DTYPES[name]:
            _fail(f"{name} must have dtype {DTYPES[name]}, got {t.dtype}")
        if t.device != device:
            _fail(f"{name} must be on target_positions' device {device}, got {t.device}")
        if not t.is_contiguous():
            _fail(f"{name} must be contiguous, got strides {tuple(t.stride())} for shape {tuple(t.shape)}")
        if name == "block_table":
            if t.dim() != 2:
                _fail(f"block_table must be 2-D [rows, blocks], got shape {tuple(t.shape)}")
            continue
        if name != "last_sampled" and t.dim() != 1:
            _fail(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.numel() < minimum[name]:
            _fail(f"{name} must have at least {minimum[name]} elements, got {t.numel()}")


def validate(
    tensors: dict[str, torch.Tensor],
    *,
    num_reqs: int,
    max_query_len: int,
    block_size: int,
    num_query_per_req: int,
    num_speculative_steps: int,
    max_num_reqs: int,
    max_num_tokens: int,
    max_model_len: int,
    sample_from_anchor: bool,
) -> None:
    """Check dtypes, devices, contiguity and sizes of the op's tensors (by name) against its scalars.

    Raises ``ValueError`` naming the argument, the expected and the actual value.
    """
    _check_scalars(
        num_reqs,
        max_query_len,
        block_size,
        num_query_per_req,
        num_speculative_steps,
        max_num_reqs,
        max_num_tokens,
        max_model_len,
        sample_from_anchor,
    )
    num_query_tokens = num_reqs * num_query_per_req
    num_samples = max_num_reqs * num_speculative_steps
    num_target_tokens = tensors["target_positions"].numel()
    minimum = {
        "input_ids": num_query_tokens,
        "positions": num_query_tokens,
        "query_start_loc": max_num_reqs + 1,
        "seq_lens": max_num_reqs,
        "query_slot_mapping": max_num_tokens,
        "context_positions": num_target_tokens,
        "context_slot_mapping": num_target_tokens,
        "sample_indices": num_samples,
        "sample_pos": num_samples,
        "sample_idx_mapping": num_samples,
        "target_positions": 1,
        "target_query_start_loc": num_reqs + 1,
        "idx_mapping": num_reqs,
        "last_sampled": max_num_reqs,
        "next_prefill_tokens": max_num_reqs,
        "num_sampled": num_reqs,
        "num_rejected": num_reqs,
    }
    _check_tensors(tensors, minimum)
    table = tensors["block_table"]
    if table.shape[0] < num_reqs or table.shape[1] < 1:
        _fail(f"block_table must have >= num_reqs={num_reqs} rows and >= 1 column, got {tuple(table.shape)}")


@functools.cache
def _kernel() -> ctypes._CFuncPtr:
    """``sparkseal_dspark_prepare_inputs`` of the kernel library, after an ABI version check."""
    lib = _lib.load()
    lib.sparkseal_dspark_abi_version.restype = ctypes.c_int
    lib.sparkseal_dspark_abi_version.argtypes = ()
    version = lib.sparkseal_dspark_abi_version()
    if version != ABI_VERSION:
        raise RuntimeError(
            f"{_lib.library_path()}: sparkseal_dspark_abi_version() is {version}, expected {ABI_VERSION}"
        )
    lib.sparkseal_dspark_error_string.restype = ctypes.c_char_p
    lib.sparkseal_dspark_error_string.argtypes = (ctypes.c_int,)
    fn = lib.sparkseal_dspark_prepare_inputs
    fn.restype = ctypes.c_int
    fn.argtypes = (ctypes.POINTER(PrepareArgs), ctypes.c_void_p)
    return fn


def _error_string(code: int) -> str:
    return _lib.load().sparkseal_dspark_error_string(code).decode()


def _prepare_inputs(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    query_slot_mapping: torch.Tensor,
    context_positions: torch.Tensor,
    context_slot_mapping: torch.Tensor,
    sample_indices: torch.Tensor,
    sample_pos: torch.Tensor,
    sample_idx_mapping: torch.Tensor,
    target_positions: torch.Tensor,
    target_query_start_loc: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled: torch.Tensor,
    next_prefill_tokens: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    block_table: torch.Tensor,
    num_reqs: int,
    max_query_len: int,
    parallel_drafting_token_id: int,
    block_size: int,
    num_query_per_req: int,
    num_speculative_steps: int,
    max_num_reqs: int,
    max_num_tokens: int,
    max_model_len: int,
    sample_from_anchor: bool,
) -> None:
    """Build the draft step's inputs from the target batch, writing the ten output tensors in place.

    ``max_query_len`` is the longest target query of the batch (vLLM's
    ``num_scheduled_tokens.max()``); it sizes the CUDA grid only. ``num_rejected`` must leave at
    least one accepted context token per row. This body serves CPU (and any non-CUDA) tensors.
    """
    tensors, scalars = _checked(locals())
    prepare_inputs_reference(**tensors, **scalars)


_SIGNATURE = inspect.signature(_prepare_inputs)
_SCALARS = tuple(name for name in _SIGNATURE.parameters if name not in OUTPUTS + INPUTS)

dspark_prepare_inputs = torch.library.custom_op(OP_NAME, _prepare_inputs, mutates_args=OUTPUTS)


def _checked(arguments: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split the op's arguments into tensors and the scalars the reference takes; validate them."""
    tensors = {name: arguments[name] for name in OUTPUTS + INPUTS}
    scalars = {name: arguments[name] for name in _SCALARS if name != "max_query_len"}
    checked = {k: v for k, v in scalars.items() if k != "parallel_drafting_token_id"}
    validate(tensors, max_query_len=arguments["max_query_len"], **checked)
    return tensors, scalars


@dspark_prepare_inputs.register_kernel("cuda")
def _launch(*args: Any, **kwargs: Any) -> None:
    arguments = _SIGNATURE.bind(*args, **kwargs).arguments
    tensors, scalars = _checked(arguments)
    fn = _kernel()
    device = tensors["target_positions"].device
    pointers = {name: t.data_ptr() for name, t in tensors.items()}
    args_struct = PrepareArgs(
        **pointers,
        **scalars,
        block_table_stride=tensors["block_table"].stride(0),
        max_query_len=arguments["max_query_len"],
        device=device.index,
    )
    stream = torch.cuda.current_stream(device).cuda_stream
    code = fn(ctypes.byref(args_struct), ctypes.c_void_p(stream))
    if code != 0:
        raise RuntimeError(
            f"{OP_NAME}: sparkseal_dspark_prepare_inputs in {_lib.library_path()} returned {code} "
            f"({_error_string(code)}), expected 0"
        )


@dspark_prepare_inputs.register_fake
def _fake(*args: Any, **kwargs: Any) -> None:
    _checked(_SIGNATURE.bind(*args, **kwargs).arguments)
