"""``torch.ops.sparkseal.sparse_mla_decode``: the sparse-MLA decode kernel as a PyTorch custom op.

The op calls ``sparkseal_sparse_mla_decode`` of the kernel library (a plain C ABI, see
``kernels_sm121/include/sparkseal/sparse_mla.h``) through ctypes on
``torch.cuda.current_stream()``. It has a fake (meta) implementation, so it traces under
``torch.compile``, and it only enqueues kernels (its float32 workspace comes from PyTorch's
caching allocator), so it can be captured in a CUDA graph.

``torch.ops.sparkseal.sparse_mla_decode_into`` is the same call writing a caller's buffers
(``mutates_args=("out", "lse")``): vLLM's attention layers own their output buffer, and writing it
directly saves the copy of a fresh ``out`` into it at every layer.

Every argument is checked on the host before the kernel runs (:func:`check_inputs`, which needs
neither a GPU nor the library). Index *values* are not read on the host: the kernel skips any
index outside ``[0, num_pages * page_size)`` exactly like ``-1``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math

import torch

from sparkseal.kernels import _lib
from sparkseal.kernels.sparse_mla_ref import LAYOUTS, V_DIM, Layout

SUPPORTED_HEADS = (16, 32, 64, 128)
# Slot ids are int32 in vLLM and in the kernel.
_MAX_SLOTS = 2**31 - 1
ABI_VERSION = 2
# QK^T paths (``qk=``; SPARKSEAL_SPARSE_MLA_QK_* in the C header): "auto" lets the library pick the
# layout's measured default; "bf16" dequantises the fp8 records to bf16; "fp8" multiplies them on
# e4m3 tensor cores with q quantised to e4m3 per token and head; "fp8x2" adds q's rounding residual
# as a second e4m3 term (bf16-level accuracy).
QK_MODES = {"auto": 0, "bf16": 1, "fp8": 2, "fp8x2": 3}
QK_NAMES = {code: name for name, code in QK_MODES.items()}
_WHERE = "sparkseal/kernels/sparse_mla.py: sparkseal::sparse_mla_decode"


class SparseMLAError(RuntimeError):
    """The kernel library rejected a call or a CUDA call failed."""


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """Shape facts of one checked cache."""

    num_pages: int
    page_size: int
    page_stride_bytes: int
    topk: int


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Shape facts of a checked call."""

    layout: Layout
    num_tokens: int
    num_heads: int
    caches: tuple[CacheSpec, ...]


def _fail(arg: str, expected: str, got: object) -> ValueError:
    return ValueError(f"{_WHERE}: {arg}: expected {expected}, got {got}")


def _check_cache(
    name: str, cache: torch.Tensor, layout: Layout, device: torch.device
) -> tuple[torch.Tensor, int, int, int]:
    """Validate one cache; return its 3-D view, page count, page size and page stride in bytes.

    Any page size is accepted: DeepSeek V3.2 caches and V4's window and C4A caches have 64 tokens per
    page, V4's C128A cache (one record per 128 tokens of a 256-token block) has 2.
    """
    allowed = (torch.uint8, torch.float8_e4m3fn) if layout.cache_dtype == torch.uint8 else (torch.bfloat16,)
    if cache.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise _fail(f"{name}.dtype", f"{names} for layout {layout.name}", cache.dtype)
    if cache.device != device:
        raise _fail(f"{name}.device", f"{device} (the device of q)", cache.device)
    if cache.dim() == 4:
        if cache.shape[2] != 1:
            raise _fail(
                f"{name}.shape",
                "[num_pages, page_size, record] or [num_pages, page_size, 1, record]",
                list(cache.shape),
            )
        cache = cache.squeeze(2)
    if cache.dim() != 3:
        raise _fail(
            f"{name}.shape",
            "[num_pages, page_size, record] or [num_pages, page_size, 1, record]",
            list(cache.shape),
        )
    num_pages, page_size, record = cache.shape
    if page_size < 1:
        raise _fail(f"{name} page size (dim 1)", ">= 1", page_size)
    if record != layout.record_elems:
        unit = "bytes" if layout.cache_dtype == torch.uint8 else "bf16 values"
        raise _fail(
            f"{name} record size (last dim)", f"{layout.record_elems} {unit} for layout {layout.name}", record
        )
    if num_pages < 1:
        raise _fail(f"{name} page count (dim 0)", ">= 1", num_pages)
    if cache.stride(2) != 1 or cache.stride(1) != record:
        raise _fail(
            f"{name} strides", f"(page stride, {record}, 1): pages of contiguous records", cache.stride()
        )
    itemsize = cache.element_size()
    page_stride_bytes = cache.stride(0) * itemsize
    if page_stride_bytes < page_size * layout.record_bytes or page_stride_bytes % 16 != 0:
        raise _fail(
            f"{name} page stride",
            f"a multiple of 16 bytes >= {page_size * layout.record_bytes}",
            page_stride_bytes,
        )
    if num_pages * page_size > _MAX_SLOTS:
        slots = num_pages * page_size
        raise _fail(f"{name} slots (pages x page size)", f"<= {_MAX_SLOTS} (int32 slot ids)", slots)
    return cache, num_pages, page_size, page_stride_bytes


def _check_indices(
    name: str, indices: torch.Tensor, num_tokens: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    if indices.dtype != torch.int32:
        raise _fail(f"{name}.dtype", "torch.int32", indices.dtype)
    if indices.device != device:
        raise _fail(f"{name}.device", f"{device} (the device of q)", indices.device)
    if indices.dim() == 3 and indices.shape[1] == 1:
        indices = indices.squeeze(1)
    if indices.dim() != 2 or indices.shape[0] != num_tokens:
        raise _fail(f"{name}.shape", f"[{num_tokens}, topk] or [{num_tokens}, 1, topk]", list(indices.shape))
    topk = indices.shape[1]
    if topk < 64 or topk % 64 != 0:
        raise _fail(f"{name} topk (last dim)", "a positive multiple of 64", topk)
    if not indices.is_contiguous():
        raise _fail(f"{name}", "a contiguous tensor", f"strides {indices.stride()}")
    return indices, topk


def _check_lengths(name: str, lengths: torch.Tensor | None, num_tokens: int, device: torch.device) -> None:
    if lengths is None:
        return
    if lengths.dtype != torch.int32:
        raise _fail(f"{name}.dtype", "torch.int32", lengths.dtype)
    if lengths.device != device:
        raise _fail(f"{name}.device", f"{device} (the device of q)", lengths.device)
    if lengths.dim() != 1 or lengths.shape[0] != num_tokens:
        raise _fail(f"{name}.shape", f"[{num_tokens}]", list(lengths.shape))
    if not lengths.is_contiguous():
        raise _fail(f"{name}", "a contiguous tensor", f"strides {lengths.stride()}")


def check_qk(qk: str, layout: Layout) -> int:
    """The C header's code of QK^T path ``qk`` for ``layout``; the bf16 layout has no fp8 path."""
    if qk not in QK_MODES:
        raise _fail("qk", f"one of {sorted(QK_MODES)}", repr(qk))
    if layout.cache_dtype != torch.uint8 and qk in ("fp8", "fp8x2"):
        raise _fail("qk", f"'auto' or 'bf16' for layout {layout.name} (no fp8 records)", repr(qk))
    return QK_MODES[qk]


def check_inputs(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    layout: str,
    topk_length: torch.Tensor | None = None,
    extra_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    qk: str = "auto",
) -> DecodeSpec:
    """Validate the arguments of :func:`sparse_mla_decode`; raise ``ValueError`` naming the argument.

    Only dtypes, shapes, strides and devices are looked at, so this runs on CPU and meta tensors.
    """
    if layout not in LAYOUTS:
        raise _fail("layout", f"one of {sorted(LAYOUTS)}", repr(layout))
    spec = LAYOUTS[layout]
    check_qk(qk, spec)
    if q.dtype != torch.bfloat16:
        raise _fail("q.dtype", "torch.bfloat16", q.dtype)
    if q.dim() != 3 or q.shape[2] != spec.q_dim:
        raise _fail("q.shape", f"[num_tokens, num_heads, {spec.q_dim}] for layout {layout}", list(q.shape))
    num_tokens, num_heads, _ = q.shape
    if num_heads not in SUPPORTED_HEADS:
        raise _fail("q num_heads (dim 1)", f"one of {SUPPORTED_HEADS}", num_heads)
    if not q.is_contiguous():
        raise _fail("q", "a contiguous tensor", f"strides {q.stride()}")
    if not isinstance(softmax_scale, float | int) or not math.isfinite(softmax_scale):
        raise _fail("softmax_scale", "a finite float", softmax_scale)
    device = q.device
    _, pages, page_size, page_stride = _check_cache("cache", cache, spec, device)
    _, topk = _check_indices("indices", indices, num_tokens, device)
    _check_lengths("topk_length", topk_length, num_tokens, device)
    caches = [CacheSpec(pages, page_size, page_stride, topk)]
    if extra_cache is None:
        for name, value in (("extra_indices", extra_indices), ("extra_topk_length", extra_topk_length)):
            if value is not None:
                raise _fail(name, "None when extra_cache is None", "a tensor")
    else:
        if extra_indices is None:
            raise _fail("extra_indices", "a tensor when extra_cache is given", None)
        _, extra_pages, extra_page_size, extra_stride = _check_cache("extra_cache", extra_cache, spec, device)
        _, extra_topk = _check_indices("extra_indices", extra_indices, num_tokens, device)
        _check_lengths("extra_topk_length", extra_topk_length, num_tokens, device)
        caches.append(CacheSpec(extra_pages, extra_page_size, extra_stride, extra_topk))
    if attn_sink is not None:
        if attn_sink.dtype != torch.float32:
            raise _fail("attn_sink.dtype", "torch.float32", attn_sink.dtype)
        if attn_sink.device != device:
            raise _fail("attn_sink.device", f"{device} (the device of q)", attn_sink.device)
        if attn_sink.dim() != 1 or attn_sink.shape[0] != num_heads or not attn_sink.is_contiguous():
            raise _fail("attn_sink.shape", f"contiguous [{num_heads}]", list(attn_sink.shape))
    return DecodeSpec(spec, num_tokens, num_heads, tuple(caches))


# ---------------------------------------------------------------------------------------------
# ctypes mirror of the C structs
# ---------------------------------------------------------------------------------------------
class _Cache(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("page_stride_bytes", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("indices", ctypes.c_void_p),
        ("indices_stride", ctypes.c_int64),
        ("topk_length", ctypes.c_void_p),
        ("page_size", ctypes.c_int32),
        ("topk", ctypes.c_int32),
    ]


class _Params(ctypes.Structure):
    _fields_ = [
        ("layout", ctypes.c_int32),
        ("num_tokens", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("num_caches", ctypes.c_int32),
        ("q", ctypes.c_void_p),
        ("q_stride_token", ctypes.c_int64),
        ("q_stride_head", ctypes.c_int64),
        ("caches", _Cache * 2),
        ("attn_sink", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("out_stride_token", ctypes.c_int64),
        ("out_stride_head", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
        ("lse_stride_token", ctypes.c_int64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("softmax_scale", ctypes.c_float),
        ("num_splits", ctypes.c_int32),
        ("max_smem_bytes", ctypes.c_int32),
        ("qk_mode", ctypes.c_int32),
    ]


class Plan(ctypes.Structure):
    """Mirror of ``sparkseal_sparse_mla_plan``: what a call launches."""

    _fields_ = [
        ("workspace_bytes", ctypes.c_size_t),
        ("heads_per_cta", ctypes.c_int32),
        ("keys_per_tile", ctypes.c_int32),
        ("threads_per_cta", ctypes.c_int32),
        ("smem_bytes", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("num_ctas", ctypes.c_int32),
        ("ctas_per_sm", ctypes.c_int32),
        ("num_sms", ctypes.c_int32),
        ("qk_mode", ctypes.c_int32),
    ]


@functools.cache
def _library() -> ctypes.CDLL:
    lib = _lib.load()
    lib.sparkseal_sparse_mla_abi_version.restype = ctypes.c_int
    lib.sparkseal_sparse_mla_params_size.restype = ctypes.c_size_t
    lib.sparkseal_sparse_mla_plan_size.restype = ctypes.c_size_t
    lib.sparkseal_sparse_mla_last_error.restype = ctypes.c_char_p
    lib.sparkseal_sparse_mla_plan_decode.argtypes = [ctypes.POINTER(_Params), ctypes.POINTER(Plan)]
    lib.sparkseal_sparse_mla_plan_decode.restype = ctypes.c_int
    lib.sparkseal_sparse_mla_decode.argtypes = [ctypes.POINTER(_Params), ctypes.c_void_p]
    lib.sparkseal_sparse_mla_decode.restype = ctypes.c_int
    version = lib.sparkseal_sparse_mla_abi_version()
    if version != ABI_VERSION:
        raise SparseMLAError(
            f"{_lib.library_path()}: sparse-MLA ABI version: expected {ABI_VERSION}, got {version}"
        )
    for what, native, mirror in (
        ("sparkseal_sparse_mla_params", lib.sparkseal_sparse_mla_params_size(), ctypes.sizeof(_Params)),
        ("sparkseal_sparse_mla_plan", lib.sparkseal_sparse_mla_plan_size(), ctypes.sizeof(Plan)),
    ):
        if native != mirror:
            raise SparseMLAError(f"{_lib.library_path()}: sizeof({what}): expected {mirror}, got {native}")
    return lib


def _raise_on_error(lib: ctypes.CDLL, rc: int, call: str) -> None:
    if rc != 0:
        message = lib.sparkseal_sparse_mla_last_error().decode(errors="replace")
        raise SparseMLAError(f"{_lib.library_path()}: {call} returned {rc}: {message}")


def _fill_params(
    spec: DecodeSpec,
    q: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
    softmax_scale: float,
    attn_sink: torch.Tensor | None,
    num_splits: int,
    max_smem_bytes: int,
    qk: str,
) -> _Params:
    p = _Params()
    p.layout = spec.layout.code
    p.num_tokens = spec.num_tokens
    p.num_heads = spec.num_heads
    p.num_caches = len(caches)
    p.q = q.data_ptr()
    p.q_stride_token = spec.num_heads * spec.layout.q_dim
    p.q_stride_head = spec.layout.q_dim
    for slot, ((cache, indices, lengths), cspec) in enumerate(zip(caches, spec.caches, strict=True)):
        c = p.caches[slot]
        c.data = cache.data_ptr()
        c.page_stride_bytes = cspec.page_stride_bytes
        c.num_pages = cspec.num_pages
        c.indices = indices.data_ptr()
        c.indices_stride = cspec.topk
        c.topk_length = None if lengths is None else lengths.data_ptr()
        c.page_size = cspec.page_size
        c.topk = cspec.topk
    p.attn_sink = None if attn_sink is None else attn_sink.data_ptr()
    p.out_stride_token = spec.num_heads * V_DIM
    p.out_stride_head = V_DIM
    p.lse_stride_token = spec.num_heads
    p.softmax_scale = float(softmax_scale)
    p.num_splits = num_splits
    p.max_smem_bytes = max_smem_bytes
    p.qk_mode = QK_MODES[qk]
    return p


def _caches(
    cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    caches = [(cache, indices, topk_length)]
    if extra_cache is not None and extra_indices is not None:
        caches.append((extra_cache, extra_indices, extra_topk_length))
    return caches


def plan(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    layout: str,
    *,
    extra_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    num_splits: int = 0,
    max_smem_bytes: int = 0,
    qk: str = "auto",
) -> Plan:
    """The kernel configuration a call with these shapes launches on the current CUDA device."""
    spec = check_inputs(
        q, cache, indices, 1.0, layout, extra_cache=extra_cache, extra_indices=extra_indices, qk=qk
    )
    lib = _library()
    caches = _caches(cache, indices, None, extra_cache, extra_indices, None)
    params = _fill_params(spec, q, caches, 1.0, None, num_splits, max_smem_bytes, qk)
    result = Plan()
    with torch.cuda.device(q.device):
        _raise_on_error(
            lib, lib.sparkseal_sparse_mla_plan_decode(params, result), "sparkseal_sparse_mla_plan_decode"
        )
    return result


def _check_call(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    layout: str,
    num_splits: int,
    max_smem_bytes: int,
    qk: str,
) -> DecodeSpec:
    """:func:`check_inputs` and the launch knobs, in the ops' argument order.

    Both the wrappers and the ops' implementations (real and fake) call it: ``torch.ops.sparkseal.*`` can
    be called without the wrappers, and the wrappers must name a bad CPU tensor before the dispatcher
    finds no CPU kernel.
    """
    spec = check_inputs(
        q,
        cache,
        indices,
        softmax_scale,
        layout,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        qk,
    )
    if num_splits < 0:
        raise _fail("num_splits", ">= 0", num_splits)
    if max_smem_bytes < 0:
        raise _fail("max_smem_bytes", ">= 0", max_smem_bytes)
    return spec


def check_outputs(spec: DecodeSpec, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Validate the buffers :func:`sparse_mla_decode_into` writes; like :func:`check_inputs`, on any device.

    The kernel takes row strides (``sparse_mla.h``), but the binding passes those of contiguous
    ``[T, H, 512]`` and ``[T, H]`` tensors and asks for exactly that: vLLM's output buffers are contiguous,
    and a strided ``out`` would need alignment rules per QK^T path (the e4m3 kernels store 4 bf16 values at
    a time) that no caller has needed.
    """
    shape = [spec.num_tokens, spec.num_heads]
    for name, tensor, dtype, dims in (
        ("out", out, torch.bfloat16, [*shape, V_DIM]),
        ("lse", lse, torch.float32, shape),
    ):
        if tensor.dtype != dtype:
            raise _fail(f"{name}.dtype", str(dtype), tensor.dtype)
        if tensor.device != q.device:
            raise _fail(f"{name}.device", f"{q.device} (the device of q)", tensor.device)
        if list(tensor.shape) != dims:
            raise _fail(f"{name}.shape", f"{dims} (q's tokens and heads)", list(tensor.shape))
        if not tensor.is_contiguous():
            raise _fail(name, "a contiguous tensor", f"strides {tensor.stride()}")


def _launch(
    spec: DecodeSpec,
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    num_splits: int,
    max_smem_bytes: int,
    qk: str,
) -> None:
    """Plan and enqueue one checked call writing ``out`` and ``lse``, on q's device's current stream.

    The split workspace comes from PyTorch's caching allocator, so under CUDA-graph capture it is the
    graph's own memory.
    """
    if spec.num_tokens == 0:
        return
    # The library checks 4 bytes (sparse_mla.h); its e4m3 QK^T kernels store 8 at a time. Buffers the
    # caching allocator hands out are aligned far beyond; only an offset view can miss.
    if out.data_ptr() % 8 != 0:
        raise _fail("out data pointer", "an 8-byte aligned address", hex(out.data_ptr()))
    lib = _library()
    params = _fill_params(spec, q, caches, softmax_scale, attn_sink, num_splits, max_smem_bytes, qk)
    params.out = out.data_ptr()
    params.lse = lse.data_ptr()
    with torch.cuda.device(q.device):
        result = Plan()
        _raise_on_error(
            lib, lib.sparkseal_sparse_mla_plan_decode(params, result), "sparkseal_sparse_mla_plan_decode"
        )
        workspace = None
        if result.workspace_bytes > 0:
            workspace = torch.empty(result.workspace_bytes, dtype=torch.uint8, device=q.device)
            params.workspace = workspace.data_ptr()
            params.workspace_bytes = result.workspace_bytes
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _raise_on_error(lib, lib.sparkseal_sparse_mla_decode(params, stream), "sparkseal_sparse_mla_decode")


@torch.library.custom_op("sparkseal::sparse_mla_decode", mutates_args=(), device_types="cuda")
def _sparse_mla_decode_op(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    layout: str,
    num_splits: int,
    max_smem_bytes: int,
    qk: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    spec = _check_call(
        q,
        cache,
        indices,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        softmax_scale,
        layout,
        num_splits,
        max_smem_bytes,
        qk,
    )
    out = torch.empty(spec.num_tokens, spec.num_heads, V_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(spec.num_tokens, spec.num_heads, dtype=torch.float32, device=q.device)
    caches = _caches(cache, indices, topk_length, extra_cache, extra_indices, extra_topk_length)
    _launch(spec, out, lse, q, caches, attn_sink, softmax_scale, num_splits, max_smem_bytes, qk)
    return out, lse


@_sparse_mla_decode_op.register_fake
def _sparse_mla_decode_fake(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    layout: str,
    num_splits: int,
    max_smem_bytes: int,
    qk: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    spec = _check_call(
        q,
        cache,
        indices,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        softmax_scale,
        layout,
        num_splits,
        max_smem_bytes,
        qk,
    )
    out = q.new_empty(spec.num_tokens, spec.num_heads, V_DIM)
    lse = q.new_empty(spec.num_tokens, spec.num_heads, dtype=torch.float32)
    return out, lse


# The in-place variant: vLLM hands each layer a preallocated output buffer, which the allocating op can
# only fill with a second kernel (a copy). Declaring the writes in mutates_args keeps torch.compile's
# functionalisation and CUDA-graph capture correct: the graph records the kernel writing into the
# caller's buffer, so a replay refreshes that buffer.
@torch.library.custom_op(
    "sparkseal::sparse_mla_decode_into", mutates_args=("out", "lse"), device_types="cuda"
)
def _sparse_mla_decode_into_op(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    layout: str,
    num_splits: int,
    max_smem_bytes: int,
    qk: str = "auto",
) -> None:
    spec = _check_call(
        q,
        cache,
        indices,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        softmax_scale,
        layout,
        num_splits,
        max_smem_bytes,
        qk,
    )
    check_outputs(spec, q, out, lse)
    caches = _caches(cache, indices, topk_length, extra_cache, extra_indices, extra_topk_length)
    _launch(spec, out, lse, q, caches, attn_sink, softmax_scale, num_splits, max_smem_bytes, qk)


@_sparse_mla_decode_into_op.register_fake
def _sparse_mla_decode_into_fake(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    extra_cache: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    layout: str,
    num_splits: int,
    max_smem_bytes: int,
    qk: str = "auto",
) -> None:
    spec = _check_call(
        q,
        cache,
        indices,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        softmax_scale,
        layout,
        num_splits,
        max_smem_bytes,
        qk,
    )
    check_outputs(spec, q, out, lse)


def sparse_mla_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    softmax_scale: float,
    layout: str,
    topk_length: torch.Tensor | None = None,
    extra_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    num_splits: int = 0,
    max_smem_bytes: int = 0,
    qk: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode: ``(out bf16 [T, H, 512], lse float32 [T, H])``.

    ``q`` is bf16 ``[T, H, 512]`` (``v4_fp8``) or ``[T, H, 576]`` (``v32_fp8``, ``v32_bf16``);
    ``cache`` is ``[num_pages, page_size, record]`` (or with a singleton dim 2) in ``layout``;
    ``indices`` int32 ``[T, topk]`` global slot ids (``-1`` = skip); ``topk_length`` int32 ``[T]``
    limits each row to its first entries. ``extra_cache`` / ``extra_indices`` /
    ``extra_topk_length`` name a second cache of the same layout attended in the same softmax;
    ``attn_sink`` float32 ``[H]`` adds ``exp(sink)`` to the softmax denominator. ``num_splits``
    (0 = automatic) and ``max_smem_bytes`` (0 = the device's limit) steer the kernel choice; ``qk``
    picks the QK^T path of the fp8 layouts (:data:`QK_MODES`: "auto" is the library's measured
    default; "fp8" trades accuracy for speed, see ``bench/results/sparse_mla.md``).

    The arguments are checked here as well as in the op: the op has no CPU kernel, so a CPU tensor
    would otherwise fail in the dispatcher without naming the argument.
    """
    args = (
        q,
        cache,
        indices,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        float(softmax_scale),
        layout,
        num_splits,
        max_smem_bytes,
        qk,
    )
    _check_call(*args)
    return torch.ops.sparkseal.sparse_mla_decode(*args)


def sparse_mla_decode_into(
    out: torch.Tensor,
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    softmax_scale: float,
    layout: str,
    topk_length: torch.Tensor | None = None,
    extra_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    num_splits: int = 0,
    max_smem_bytes: int = 0,
    qk: str = "auto",
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`sparse_mla_decode` writing into ``out`` (bf16, contiguous ``[T, H, 512]``); returns ``lse``.

    For callers that own the output buffer (vLLM's attention layers): the kernel writes it directly, so
    there is no second kernel copying a fresh tensor into it, and a CUDA graph captured around the call
    keeps writing the caller's buffer on replay. ``lse`` (float32, contiguous ``[T, H]``) is allocated
    when not given, because the kernel always writes the log-sum-exp: the library refuses a null ``lse``
    pointer. ``out`` must not overlap the inputs: the kernel's CTAs write rows of ``out`` while others
    still read ``q``.
    """
    args = (
        q,
        cache,
        indices,
        topk_length,
        extra_cache,
        extra_indices,
        extra_topk_length,
        attn_sink,
        float(softmax_scale),
        layout,
        num_splits,
        max_smem_bytes,
        qk,
    )
    spec = _check_call(*args)
    if lse is None:
        lse = torch.empty(spec.num_tokens, spec.num_heads, dtype=torch.float32, device=q.device)
    check_outputs(spec, q, out, lse)
    torch.ops.sparkseal.sparse_mla_decode_into(out, lse, *args)
    return lse
