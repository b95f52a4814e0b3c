"""Argument checks and the fake implementations of sparkseal::sparse_mla_decode and its in-place variant
sparkseal::sparse_mla_decode_into (CPU and meta tensors).

None of these need a GPU or the kernel library.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sparkseal.kernels import sparse_mla
from sparkseal.kernels.sparse_mla import check_inputs, sparse_mla_decode, sparse_mla_decode_into
from sparkseal.kernels.sparse_mla_ref import LAYOUTS, PAGE_SIZE, Layout

HEADER = Path(__file__).resolve().parents[2] / "kernels_sm121" / "include" / "sparkseal" / "sparse_mla.h"


def _inputs(
    layout: Layout, *, tokens: int = 3, heads: int = 16, topk: int = 128, pages: int = 4, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    return {
        "q": torch.zeros(tokens, heads, layout.q_dim, dtype=torch.bfloat16, device=device),
        "cache": torch.zeros(pages, PAGE_SIZE, layout.record_elems, dtype=layout.cache_dtype, device=device),
        "indices": torch.zeros(tokens, topk, dtype=torch.int32, device=device),
    }


def _check(layout: str = "v4_fp8", **overrides: object) -> sparse_mla.DecodeSpec:
    args = {**_inputs(LAYOUTS.get(layout, LAYOUTS["v4_fp8"])), "softmax_scale": 0.1, "layout": layout}
    args.update(overrides)
    return check_inputs(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_valid_inputs_pass_on_cpu_and_meta(name: str) -> None:
    layout = LAYOUTS[name]
    for device in ("cpu", "meta"):
        args = _inputs(layout, tokens=5, heads=32, topk=192, pages=7, device=device)
        spec = check_inputs(**args, softmax_scale=0.5, layout=name)
        assert (spec.layout, spec.num_tokens, spec.num_heads) == (layout, 5, 32)
        assert spec.caches[0].num_pages == 7
        assert spec.caches[0].topk == 192
        assert spec.caches[0].page_stride_bytes == PAGE_SIZE * layout.record_bytes


def test_second_cache_sink_lengths_and_4d_cache_pass() -> None:
    layout = LAYOUTS["v4_fp8"]
    args = _inputs(layout)
    spec = check_inputs(
        args["q"],
        args["cache"].unsqueeze(2),
        args["indices"].unsqueeze(1),
        0.1,
        "v4_fp8",
        topk_length=torch.zeros(3, dtype=torch.int32),
        extra_cache=torch.zeros(9, PAGE_SIZE, 584, dtype=torch.float8_e4m3fn),
        extra_indices=torch.zeros(3, 64, dtype=torch.int32),
        extra_topk_length=torch.zeros(3, dtype=torch.int32),
        attn_sink=torch.zeros(16),
    )
    assert [(c.num_pages, c.topk) for c in spec.caches] == [(4, 128), (9, 64)]


def test_page_size_comes_from_each_cache() -> None:
    # DeepSeek V4: a 64-token window cache beside a C128A cache of 2 records per 256-token block, each
    # page padded to a multiple of 576 bytes as vLLM allocates them.
    window = torch.zeros(4, 65 * 576, dtype=torch.uint8)[:, : 64 * 584].view(4, 64, 584)
    c128a = torch.zeros(9, 3 * 576, dtype=torch.uint8)[:, : 2 * 584].view(9, 2, 584)
    spec = _check(
        cache=window,
        extra_cache=c128a,
        extra_indices=torch.zeros(3, 128, dtype=torch.int32),
    )
    assert [(c.num_pages, c.page_size, c.page_stride_bytes) for c in spec.caches] == [
        (4, 64, 65 * 576),
        (9, 2, 3 * 576),
    ]


def test_more_slots_than_int32_ids_are_refused() -> None:
    args = _inputs(LAYOUTS["v4_fp8"], device="meta")
    huge = torch.empty(2**25, PAGE_SIZE, 584, dtype=torch.uint8, device="meta")
    with pytest.raises(
        ValueError,
        match=r"cache slots \(pages x page size\): expected <= 2147483647 \(int32 slot ids\), got 2147483648",
    ):
        check_inputs(args["q"], huge, args["indices"], 0.1, "v4_fp8")


def test_padded_pages_report_their_stride() -> None:
    buffer = torch.zeros(4, PAGE_SIZE * 584 + 64, dtype=torch.uint8)
    cache = buffer[:, : PAGE_SIZE * 584].view(4, PAGE_SIZE, 584)
    assert _check(cache=cache).caches[0].page_stride_bytes == PAGE_SIZE * 584 + 64


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"q": torch.zeros(3, 16, 512)}, r"q.dtype: expected torch.bfloat16, got torch.float32"),
        (
            {"q": torch.zeros(3, 16, 576, dtype=torch.bfloat16)},
            r"q.shape: expected \[num_tokens, num_heads, 512\] for layout v4_fp8, got \[3, 16, 576\]",
        ),
        (
            {"q": torch.zeros(3, 24, 512, dtype=torch.bfloat16)},
            r"q num_heads \(dim 1\): expected one of \(16, 32, 64, 128\), got 24",
        ),
        (
            {"q": torch.zeros(16, 3, 512, dtype=torch.bfloat16).transpose(0, 1)},
            r"q: expected a contiguous tensor, got strides",
        ),
        (
            {"cache": torch.zeros(4, 0, 584, dtype=torch.uint8)},
            r"cache page size \(dim 1\): expected >= 1, got 0",
        ),
        (
            {"cache": torch.zeros(4, 64, 656, dtype=torch.uint8)},
            r"cache record size \(last dim\): expected 584 bytes for layout v4_fp8, got 656",
        ),
        (
            {"cache": torch.zeros(4, 64, 584, dtype=torch.bfloat16)},
            r"cache.dtype: expected torch.uint8 or torch.float8_e4m3fn for layout v4_fp8, got torch.bfloat16",
        ),
        (
            {"cache": torch.zeros(4, 2, 64, 584, dtype=torch.uint8)},
            r"cache.shape: expected \[num_pages, page_size, record\] or \[num_pages, page_size, 1, record\], "
            r"got \[4, 2, 64, 584\]",
        ),
        (
            {"cache": torch.zeros(4, 584, 64, dtype=torch.uint8).transpose(1, 2)},
            r"cache strides: expected \(page stride, 584, 1\)",
        ),
        (
            {"cache": torch.zeros(4, 64 * 584 + 8, dtype=torch.uint8)[:, : 64 * 584].view(4, 64, 584)},
            r"cache page stride: expected a multiple of 16 bytes >= 37376, got 37384",
        ),
        (
            {"indices": torch.zeros(3, 100, dtype=torch.int32)},
            r"indices topk \(last dim\): expected a positive multiple of 64, got 100",
        ),
        (
            {"indices": torch.zeros(3, 128, dtype=torch.int64)},
            r"indices.dtype: expected torch.int32, got torch.int64",
        ),
        (
            {"indices": torch.zeros(4, 128, dtype=torch.int32)},
            r"indices.shape: expected \[3, topk\] or \[3, 1, topk\], got \[4, 128\]",
        ),
        (
            {"indices": torch.zeros(128, 3, dtype=torch.int32).t()},
            r"indices: expected a contiguous tensor, got strides",
        ),
        (
            {"topk_length": torch.zeros(3, dtype=torch.int64)},
            r"topk_length.dtype: expected torch.int32, got torch.int64",
        ),
        ({"topk_length": torch.zeros(2, dtype=torch.int32)}, r"topk_length.shape: expected \[3\], got \[2\]"),
        (
            {"extra_indices": torch.zeros(3, 64, dtype=torch.int32)},
            r"extra_indices: expected None when extra_cache is None, got a tensor",
        ),
        (
            {"extra_cache": torch.zeros(2, 64, 584, dtype=torch.uint8)},
            r"extra_indices: expected a tensor when extra_cache is given, got None",
        ),
        (
            {
                "extra_cache": torch.zeros(2, 64, 656, dtype=torch.uint8),
                "extra_indices": torch.zeros(3, 64, dtype=torch.int32),
            },
            r"extra_cache record size \(last dim\): expected 584 bytes for layout v4_fp8, got 656",
        ),
        ({"attn_sink": torch.zeros(8)}, r"attn_sink.shape: expected contiguous \[16\], got \[8\]"),
        (
            {"attn_sink": torch.zeros(16, dtype=torch.bfloat16)},
            r"attn_sink.dtype: expected torch.float32, got torch.bfloat16",
        ),
        ({"softmax_scale": float("nan")}, r"softmax_scale: expected a finite float, got nan"),
        ({"layout": "v5_fp4"}, r"layout: expected one of \['v32_bf16', 'v32_fp8', 'v4_fp8'\], got 'v5_fp4'"),
        ({"cache": torch.zeros(4, 64, 584, dtype=torch.uint8, device="meta")}, r"cache.device: expected cpu"),
    ],
)
def test_invalid_inputs_are_rejected_with_expected_and_actual(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        _check(**overrides)
    assert str(info.value).startswith("sparkseal/kernels/sparse_mla.py: sparkseal::sparse_mla_decode: ")


def test_bf16_layout_record_size_is_counted_in_values() -> None:
    with pytest.raises(ValueError, match=r"expected 576 bf16 values for layout v32_bf16, got 584"):
        _check("v32_bf16", cache=torch.zeros(4, 64, 584, dtype=torch.bfloat16))


def test_public_function_checks_before_dispatch() -> None:
    args = _inputs(LAYOUTS["v32_fp8"])
    with pytest.raises(ValueError, match=r"q.dtype: expected torch.bfloat16, got torch.float16"):
        sparse_mla_decode(
            args["q"].half(), args["cache"], args["indices"], softmax_scale=0.1, layout="v32_fp8"
        )
    with pytest.raises(ValueError, match=r"num_splits: expected >= 0, got -1"):
        sparse_mla_decode(**args, softmax_scale=0.1, layout="v32_fp8", num_splits=-1)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_fake_implementation_gives_output_shapes_on_meta(name: str) -> None:
    args = _inputs(LAYOUTS[name], tokens=6, heads=64, device="meta")
    out, lse = sparse_mla_decode(**args, softmax_scale=0.1, layout=name)
    assert (out.shape, out.dtype, out.device.type) == ((6, 64, 512), torch.bfloat16, "meta")
    assert (lse.shape, lse.dtype) == ((6, 64), torch.float32)


def test_fake_implementation_checks_too() -> None:
    args = _inputs(LAYOUTS["v4_fp8"], device="meta")
    with pytest.raises(
        ValueError, match=r"indices topk \(last dim\): expected a positive multiple of 64, got 65"
    ):
        torch.ops.sparkseal.sparse_mla_decode(
            args["q"],
            args["cache"],
            torch.zeros(3, 65, dtype=torch.int32, device="meta"),
            None,
            None,
            None,
            None,
            None,
            0.1,
            "v4_fp8",
            0,
            0,
        )


WHERE = "sparkseal/kernels/sparse_mla.py: sparkseal::sparse_mla_decode: "


def _buffers(tokens: int = 3, heads: int = 16, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(tokens, heads, 512, dtype=torch.bfloat16, device=device)
    return out, torch.empty(tokens, heads, dtype=torch.float32, device=device)


@pytest.mark.parametrize(
    ("out", "lse", "message"),
    [
        (
            torch.zeros(3, 16, 512),
            None,
            "out.dtype: expected torch.bfloat16, got torch.float32",
        ),
        (
            torch.zeros(3, 16, 512, dtype=torch.bfloat16, device="meta"),
            None,
            "out.device: expected cpu (the device of q), got meta",
        ),
        (
            torch.zeros(3, 64, 512, dtype=torch.bfloat16),
            None,
            "out.shape: expected [3, 16, 512] (q's tokens and heads), got [3, 64, 512]",
        ),
        (
            torch.zeros(3, 16, 576, dtype=torch.bfloat16),
            None,
            "out.shape: expected [3, 16, 512] (q's tokens and heads), got [3, 16, 576]",
        ),
        (
            torch.zeros(16, 3, 512, dtype=torch.bfloat16).transpose(0, 1),
            None,
            "out: expected a contiguous tensor, got strides (512, 1536, 1)",
        ),
        (
            # vLLM's buffer padded to 64 heads, sliced to the 16 of q: the kernel could write it, the
            # binding does not take it.
            torch.zeros(3, 64, 512, dtype=torch.bfloat16)[:, :16],
            None,
            "out: expected a contiguous tensor, got strides (32768, 512, 1)",
        ),
        (
            torch.zeros(3, 16, 512, dtype=torch.bfloat16),
            torch.zeros(3, 16, dtype=torch.bfloat16),
            "lse.dtype: expected torch.float32, got torch.bfloat16",
        ),
        (
            torch.zeros(3, 16, 512, dtype=torch.bfloat16),
            torch.zeros(3, 16, 1),
            "lse.shape: expected [3, 16] (q's tokens and heads), got [3, 16, 1]",
        ),
        (
            torch.zeros(3, 16, 512, dtype=torch.bfloat16),
            torch.zeros(16, 3).t(),
            "lse: expected a contiguous tensor, got strides (1, 3)",
        ),
        (
            torch.zeros(3, 16, 512, dtype=torch.bfloat16),
            torch.zeros(3, 16, device="meta"),
            "lse.device: expected cpu (the device of q), got meta",
        ),
    ],
)
def test_in_place_buffers_are_checked_before_dispatch(
    out: torch.Tensor, lse: torch.Tensor | None, message: str
) -> None:
    args = _inputs(LAYOUTS["v4_fp8"])
    with pytest.raises(ValueError) as info:
        sparse_mla_decode_into(out, **args, softmax_scale=0.1, layout="v4_fp8", lse=lse)
    assert str(info.value) == WHERE + message


def test_in_place_inputs_are_checked_like_the_allocating_op() -> None:
    args = _inputs(LAYOUTS["v32_fp8"])
    out, _ = _buffers()
    with pytest.raises(ValueError) as info:
        sparse_mla_decode_into(out, **args, softmax_scale=0.1, layout="v32_fp8", max_smem_bytes=-1)
    assert str(info.value) == WHERE + "max_smem_bytes: expected >= 0, got -1"
    with pytest.raises(ValueError) as info:
        sparse_mla_decode_into(out, **{**args, "q": args["q"].half()}, softmax_scale=0.1, layout="v32_fp8")
    assert str(info.value) == WHERE + "q.dtype: expected torch.bfloat16, got torch.float16"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_in_place_fake_implementation_on_meta(name: str) -> None:
    args = _inputs(LAYOUTS[name], tokens=6, heads=64, device="meta")
    out, lse = _buffers(6, 64, "meta")
    assert sparse_mla_decode_into(out, **args, softmax_scale=0.1, layout=name, lse=lse) is lse
    allocated = sparse_mla_decode_into(out, **args, softmax_scale=0.1, layout=name)
    assert (allocated.shape, allocated.dtype, allocated.device.type) == ((6, 64), torch.float32, "meta")


def test_in_place_fake_implementation_checks_the_buffers_too() -> None:
    args = _inputs(LAYOUTS["v4_fp8"], device="meta")
    out, lse = _buffers(device="meta")
    with pytest.raises(ValueError) as info:
        torch.ops.sparkseal.sparse_mla_decode_into(
            out[:2], lse, args["q"], args["cache"], args["indices"], *[None] * 5, 0.1, "v4_fp8", 0, 0
        )
    assert (
        str(info.value) == WHERE + "out.shape: expected [3, 16, 512] (q's tokens and heads), got [2, 16, 512]"
    )


def test_in_place_op_declares_what_it_writes() -> None:
    schema = torch.ops.sparkseal.sparse_mla_decode_into.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out", "lse"]
    assert schema.returns == []
    assert all(a.alias_info is None for a in torch.ops.sparkseal.sparse_mla_decode.default._schema.arguments)


def test_in_place_op_passes_opcheck_on_meta() -> None:
    """Schema, fake-tensor and AOT-dispatch checks (torch.compile functionalises the writes into
    auto_functionalized and copies them back); meta tensors carry no values, so the kernel is not run."""
    layout = LAYOUTS["v4_fp8"]
    args = _inputs(layout, device="meta")
    out, lse = _buffers(device="meta")
    extra = torch.zeros(9, 2, layout.record_elems, dtype=torch.uint8, device="meta")
    lengths = torch.zeros(3, dtype=torch.int32, device="meta")
    sink = torch.zeros(16, device="meta")
    op = torch.ops.sparkseal.sparse_mla_decode_into.default
    for tail in (
        (None, None, None, None, None),
        (lengths, extra, torch.zeros(3, 64, dtype=torch.int32, device="meta"), lengths, sink),
    ):
        call = (out, lse, args["q"], args["cache"], args["indices"], *tail, 0.1, "v4_fp8", 0, 0, "auto")
        torch.library.opcheck(op, call)


def _header_fields(struct: str) -> list[str]:
    body = re.search(r"typedef struct " + struct + r" \{(.*?)\} " + struct + ";", HEADER.read_text(), re.S)
    assert body is not None, f"{HEADER}: struct {struct}: expected a typedef, found none"
    text = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    names: list[str] = []
    for declaration in text.split(";"):
        for part in declaration.split(","):
            match = re.search(r"(\w+)\s*(\[\d+\])?\s*$", part.strip())
            if match:
                names.append(match.group(1))
    return names


@pytest.mark.parametrize(
    ("struct", "mirror"),
    [
        ("sparkseal_sparse_mla_cache", sparse_mla._Cache),
        ("sparkseal_sparse_mla_params", sparse_mla._Params),
        ("sparkseal_sparse_mla_plan", sparse_mla.Plan),
    ],
)
def test_ctypes_mirror_follows_the_header(struct: str, mirror: type) -> None:
    assert [name for name, _ in mirror._fields_] == _header_fields(struct)


@pytest.fixture
def lib(kernels_library: Path) -> object:
    """The compiled library (the one this run's Bazel build made, unless one is installed or named)."""
    return sparse_mla._library()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_heads", 24, r"params.num_heads: expected 16, 32, 64 or 128, got 24"),
        ("layout", 7, r"params.layout: expected 0 \(V4_FP8\), 1 \(V32_FP8\) or 2 \(V32_BF16\), got 7"),
        ("qk_mode", 4, r"params.qk_mode: expected 0 \(AUTO\), 1 \(BF16\), 2 \(FP8\) or 3 \(FP8X2\), got 4"),
        ("cache1_topk", 100, r"params.caches\[1\].topk: expected a positive multiple of 64, got 100"),
        (
            "cache1_stride",
            64 * 584 + 8,
            r"params.caches\[1\].page_stride_bytes: expected a multiple of 16 >= 37376",
        ),
        # even, but the fp8 paths' 8-byte stores need rows at multiples of 4 elements
        ("out_stride_head", 514, r"params.out_stride_head: expected a multiple of 4 >= 512, got 514"),
        (
            "out_stride_token",
            16 * 512 + 2,
            r"params.out_stride_token: expected a multiple of 4 >= 8192, got 8194",
        ),
    ],
)
def test_library_rejects_bad_params_before_touching_the_gpu(
    lib: object, field: str, value: int, message: str
) -> None:
    p = sparse_mla._Params(layout=0, num_tokens=2, num_heads=16, num_caches=2, softmax_scale=0.1)
    p.q_stride_token, p.q_stride_head = 16 * 512, 512
    p.out_stride_token, p.out_stride_head, p.lse_stride_token = 16 * 512, 512, 16
    for c in p.caches:
        c.page_stride_bytes, c.num_pages, c.indices_stride, c.page_size, c.topk = 64 * 584, 4, 128, 64, 128
    if field == "cache1_topk":
        p.caches[1].topk = value
    elif field == "cache1_stride":
        p.caches[1].page_stride_bytes = value
    else:
        setattr(p, field, value)
    rc = lib.sparkseal_sparse_mla_plan_decode(p, sparse_mla.Plan())
    assert rc == -2
    text = lib.sparkseal_sparse_mla_last_error().decode()
    assert text.startswith("kernels_sm121/csrc/sparse_mla.cu: ")
    assert re.search(message, text), text


def test_qk_modes_follow_the_header() -> None:
    defines = dict(re.findall(r"#define SPARKSEAL_SPARSE_MLA_QK_(\w+) (\d+)", HEADER.read_text()))
    assert {name.lower(): int(code) for name, code in defines.items()} == sparse_mla.QK_MODES
    assert {code: name for name, code in sparse_mla.QK_MODES.items()} == sparse_mla.QK_NAMES


@pytest.mark.parametrize(
    ("layout", "qk", "message"),
    [
        ("v4_fp8", "fp16", r"qk: expected one of \['auto', 'bf16', 'fp8', 'fp8x2'\], got 'fp16'"),
        (
            "v32_bf16",
            "fp8",
            r"qk: expected 'auto' or 'bf16' for layout v32_bf16 \(no fp8 records\), got 'fp8'",
        ),
        (
            "v32_bf16",
            "fp8x2",
            r"qk: expected 'auto' or 'bf16' for layout v32_bf16 \(no fp8 records\), got 'fp8x2'",
        ),
    ],
)
def test_qk_is_checked_before_dispatch(layout: str, qk: str, message: str) -> None:
    args = _inputs(LAYOUTS[layout])
    with pytest.raises(ValueError, match=message):
        sparse_mla_decode(**args, softmax_scale=0.1, layout=layout, qk=qk)


@pytest.mark.parametrize("qk", ["auto", "bf16", "fp8", "fp8x2"])
def test_fake_implementation_takes_every_qk_path(qk: str) -> None:
    args = _inputs(LAYOUTS["v32_fp8"], tokens=2, heads=32, device="meta")
    out, lse = sparse_mla_decode(**args, softmax_scale=0.1, layout="v32_fp8", qk=qk)
    assert (out.shape, lse.shape) == ((2, 32, 512), (2, 32))


def test_library_rejects_fp8_qk_for_the_bf16_cache(lib: object) -> None:
    p = sparse_mla._Params(layout=2, num_tokens=2, num_heads=16, num_caches=1, softmax_scale=0.1, qk_mode=2)
    p.q_stride_token, p.q_stride_head = 16 * 576, 576
    p.out_stride_token, p.out_stride_head, p.lse_stride_token = 16 * 512, 512, 16
    c = p.caches[0]
    c.page_stride_bytes, c.num_pages, c.indices_stride, c.page_size, c.topk = 64 * 1152, 4, 128, 64, 128
    assert lib.sparkseal_sparse_mla_plan_decode(p, sparse_mla.Plan()) == -2
    assert "params.qk_mode: expected 0 (AUTO) or 1 (BF16) for layout V32_BF16 (no fp8 records), got 2" in (
        lib.sparkseal_sparse_mla_last_error().decode()
    )


# The e4m3 QK^T configurations (sparse_mla_fp8qk.cuh, Fp8Config) against GB10's 99 KB: the tables'
# small-budget entries must fit 101376 bytes less the 1 KiB the runtime keeps, with at least two
# staging buffers (one tile computed while the next arrives). The C++ static_asserts enforce the
# same at build time; this reads the tables without a compiler.
CSRC = HEADER.parent.parent.parent / "csrc"
GB10_SMEM = 101376
_RAW_STRIDE = {"kV4": 592, "kV32Fp8": 656}  # staging row bytes (LayoutTraits::kRawStride)


def _fp8_entries() -> list[tuple[str, int, int, str]]:
    entries = []
    for path in sorted(CSRC.glob("sparse_mla_*_qk_*.cu")):
        for const, rows, nt, _nq, budget in re.findall(
            r"make_fp8qk_entry<(\w+?)Qk\w+, (\d+), (\d+), (\d), (\w+)>", path.read_text()
        ):
            entries.append((const, int(rows), int(nt), budget))
    return entries


def _fp8_smem(const: str, rows: int, nt: int, budget: int) -> tuple[int, int]:
    """(stages, bytes) as Fp8Config computes them."""
    warps_per_tile = 8 // (rows // 16)
    fixed = rows * (nt + 8) * 2 + rows * 72 * 2 + 2 * warps_per_tile * rows * 4
    stage = nt * _RAW_STRIDE[const] + (nt + 15) // 16 * 16
    stages = min(4, (budget - 1024 - fixed) // stage)
    return stages, fixed + stages * stage


def test_fp8_qk_gb10_configurations_fit_99_kb() -> None:
    entries = _fp8_entries()
    assert len(entries) == 16, entries  # 2 layouts x 2 q terms x 4 configurations
    small = [e for e in entries if e[3] == "kSmallSmem"]
    assert {(const, rows) for const, rows, _, _ in small} == {(c, r) for c in _RAW_STRIDE for r in (16, 32)}
    for const, rows, nt, _ in small:
        stages, smem = _fp8_smem(const, rows, nt, GB10_SMEM)
        assert stages >= 2 and smem <= GB10_SMEM - 1024, (const, rows, nt, stages, smem)
        assert nt % (8 * (8 // (rows // 16))) == 0, "each S warp needs whole 8-key n-tiles"
