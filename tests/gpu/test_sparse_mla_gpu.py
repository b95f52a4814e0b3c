"""The sparse-MLA decode kernel against the float32 reference, on a CUDA GPU.

Run with ``pytest -m gpu`` on a machine with an NVIDIA GPU and the kernel library
(``$SPARKSEAL_KERNELS_LIB`` or the packaged copy); skipped otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from types import ModuleType

import pytest
import torch

from sparkseal.kernels import _lib
from sparkseal.kernels.sparse_mla_ref import (
    EMPTY_LSE,
    LAYOUTS,
    PAGE_SIZE,
    Layout,
    random_cache,
    sparse_mla_decode_ref,
    unpack_cache,
)

pytestmark = pytest.mark.gpu

SMALL_SMEM = 101376  # the SM120/SM121 per-block limit: runs the configurations GB10 uses


@pytest.fixture(scope="module")
def sparse_mla() -> ModuleType:
    """The binding module, once a GPU and the kernel library are there."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    try:
        _lib.load()
    except OSError as exc:
        pytest.skip(str(exc))
    from sparkseal.kernels import sparse_mla as module

    module._library()  # checks the ABI version and the struct sizes
    return module


@dataclasses.dataclass(frozen=True)
class Case:
    layout: str
    heads: int
    topk: int
    batch: int
    minus_one: bool = False
    lengths: bool = False
    extra_topk: int = 0
    sink: bool = False
    splits: int = 0
    max_smem: int = 0
    extra_page_size: int = PAGE_SIZE

    def __str__(self) -> str:
        parts = [self.layout, f"h{self.heads}", f"k{self.topk}", f"b{self.batch}"]
        parts += [name for name in ("minus_one", "lengths", "sink") if getattr(self, name)]
        if self.extra_topk:
            parts.append(f"extra{self.extra_topk}")
        if self.extra_page_size != PAGE_SIZE:
            parts.append(f"extra_page{self.extra_page_size}")
        if self.splits:
            parts.append(f"splits{self.splits}")
        if self.max_smem:
            parts.append("small_smem")
        return "-".join(parts)


def _cases() -> list[Case]:
    """A sample of heads x topk x batch x layout x features that covers every value of each axis."""
    heads = (16, 32, 64, 128)
    topks = (64, 512, 2048)
    batches = (1, 8, 64, 256)
    layouts = ("v4_fp8", "v32_fp8", "v32_bf16")
    cases = []
    for i, (h, k, b) in enumerate(itertools.product(heads, topks, batches)):
        if h * k * b > 128 * 2048 * 64:  # keep each case under a second
            continue
        layout = layouts[i % 3]
        cases.append(
            Case(
                layout,
                h,
                k,
                b,
                minus_one=i % 2 == 0,
                lengths=i % 5 in (1, 3),
                extra_topk=(128 if i % 4 == 1 else 0) if layout == "v4_fp8" else (64 if i % 4 == 2 else 0),
                sink=i % 7 in (2, 5),
            )
        )
    cases += [
        Case("v4_fp8", 128, 2048, 256, minus_one=True, extra_topk=128, sink=True),
        Case("v32_fp8", 16, 2048, 256, lengths=True),
        Case("v4_fp8", 64, 512, 8, minus_one=True, lengths=True, splits=3),
        Case("v32_bf16", 32, 512, 8, lengths=True, extra_topk=64, splits=5),
        # DeepSeek V4's C128A layers: the compressed cache holds 2 records per page.
        Case(
            "v4_fp8", 64, 128, 64, minus_one=True, lengths=True, extra_topk=512, sink=True, extra_page_size=2
        ),
        Case(
            "v4_fp8",
            128,
            128,
            8,
            lengths=True,
            extra_topk=128,
            sink=True,
            extra_page_size=2,
            max_smem=SMALL_SMEM,
        ),
    ]
    for layout, h in itertools.product(layouts, (16, 64)):
        cases.append(
            Case(
                layout, h, 512, 8, minus_one=True, lengths=True, extra_topk=64, sink=True, max_smem=SMALL_SMEM
            )
        )
    return cases


def _make_inputs(case: Case, seed: int) -> dict[str, object]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    layout: Layout = LAYOUTS[case.layout]
    dev = "cuda"
    pages = max(8, case.batch * case.topk // (2 * PAGE_SIZE))  # rows repeat across tokens now and then
    cache = random_cache(layout, pages, generator=gen, device=dev)
    q = torch.randn(case.batch, case.heads, layout.q_dim, generator=gen, device=dev).to(torch.bfloat16)

    def index_rows(topk: int, slots: int) -> torch.Tensor:
        idx = torch.randint(0, slots, (case.batch, topk), generator=gen, device=dev, dtype=torch.int32)
        if case.minus_one:
            drop = torch.rand(case.batch, topk, generator=gen, device=dev) < 0.2
            idx = torch.where(drop, torch.full_like(idx, -1), idx)
            idx[0] = -1  # one row with nothing valid
            if case.batch > 2:
                idx[1, ::7] = slots + 3  # out of range: skipped like -1
        return idx

    def length_rows(topk: int) -> torch.Tensor:
        lengths = torch.randint(0, topk + 1, (case.batch,), generator=gen, device=dev, dtype=torch.int32)
        lengths[-1] = topk + 100  # longer than the row: clamped
        return lengths

    args: dict[str, object] = {
        "q": q,
        "cache": cache,
        "indices": index_rows(case.topk, pages * PAGE_SIZE),
        "softmax_scale": layout.q_dim**-0.5,
        "layout": case.layout,
    }
    if case.lengths:
        args["topk_length"] = length_rows(case.topk)
    if case.extra_topk:
        extra_pages = 5 * PAGE_SIZE // case.extra_page_size
        args["extra_cache"] = random_cache(
            layout, extra_pages, generator=gen, device=dev, page_size=case.extra_page_size
        )
        args["extra_indices"] = index_rows(case.extra_topk, extra_pages * case.extra_page_size)
        if case.lengths:
            args["extra_topk_length"] = length_rows(case.extra_topk)
    if case.sink:
        args["attn_sink"] = torch.randn(case.heads, generator=gen, device=dev)
    return args


def _reference(args: dict[str, object]) -> tuple[torch.Tensor, torch.Tensor]:
    kwargs = dict(args)
    layout = LAYOUTS[str(kwargs.pop("layout"))]
    q, cache, indices, scale = (kwargs.pop(k) for k in ("q", "cache", "indices", "softmax_scale"))
    return sparse_mla_decode_ref(q, cache, indices, scale, layout, **kwargs)  # type: ignore[arg-type]


# (out relative error, worst row's relative error, lse max error) allowed per QK^T path. bf16 and
# fp8x2 (q as two e4m3 terms) measure about 2e-3 / 4e-3 / 2e-3 on these inputs; fp8 (q as one e4m3
# term, 3 mantissa bits) about 2.5e-2 / 5.7e-2 / 3e-2 (bench/results/sparse_mla.md).
TOLERANCES = {"bf16": (1e-2, 3e-2, 2e-2), "fp8x2": (1e-2, 3e-2, 2e-2), "fp8": (5e-2, 1e-1, 8e-2)}


def _assert_matches(
    out: torch.Tensor,
    lse: torch.Tensor,
    ref_out: torch.Tensor,
    ref_lse: torch.Tensor,
    tolerance: tuple[float, float, float] = TOLERANCES["bf16"],
) -> None:
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert bool(torch.isfinite(out).all()), "non-finite values in out"
    assert bool(torch.isfinite(lse).all()), "non-finite values in lse"
    empty = ref_lse == EMPTY_LSE
    assert torch.equal(lse[empty], ref_lse[empty]), "empty rows: lse differs from EMPTY_LSE"
    assert torch.equal(out[empty].float(), torch.zeros_like(ref_out[empty])), "empty rows: out is not 0"
    full = ~empty
    if not bool(full.any()):
        return
    diff = out.float()[full] - ref_out[full]
    rel = (diff.norm() / ref_out[full].norm().clamp(min=1e-30)).item()
    row_rel = (diff.norm(dim=-1) / ref_out[full].norm(dim=-1).clamp(min=1e-30)).max().item()
    lse_err = (lse[full] - ref_lse[full]).abs().max().item()
    max_rel, max_row, max_lse = tolerance
    assert rel < max_rel and row_rel < max_row and lse_err < max_lse, (
        f"out relative error {rel:.2e} (expected < {max_rel:.0e}), worst row {row_rel:.2e} (expected < "
        f"{max_row:.0e}), lse max error {lse_err:.2e} (expected < {max_lse:.0e})"
    )


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_kernel_matches_reference(sparse_mla: ModuleType, case: Case) -> None:
    args = _make_inputs(case, seed=zlib.crc32(str(case).encode()))
    out, lse = sparse_mla.sparse_mla_decode(**args, num_splits=case.splits, max_smem_bytes=case.max_smem)
    torch.cuda.synchronize()
    ref_out, ref_lse = _reference(args)
    _assert_matches(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_valid_index_reproduces_the_dequantised_row_exactly(sparse_mla: ModuleType, layout: str) -> None:
    spec = LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(21)
    cache = random_cache(spec, 4, generator=gen, device="cuda")
    slot = 2 * PAGE_SIZE + 17
    if spec.cache_dtype == torch.uint8:
        # Subnormal, zero and negative-zero e4m3 codes in the row's first scale group.
        codes = torch.tensor(
            [0x01, 0x07, 0x81, 0x85, 0x00, 0x80, 0x7E, 0xFE], dtype=torch.uint8, device="cuda"
        )
        flat = cache.view(4, -1)
        start = 17 * (576 if spec.name == "v4_fp8" else spec.record_bytes)
        flat[2, start : start + 8] = codes
    rows = unpack_cache(cache, spec)
    q = torch.randn(3, 16, spec.q_dim, generator=gen, device="cuda").to(torch.bfloat16)
    indices = torch.full((3, 64), -1, dtype=torch.int32, device="cuda")
    indices[:, 5] = slot
    out, _ = sparse_mla.sparse_mla_decode(q, cache, indices, softmax_scale=0.1, layout=layout, num_splits=1)
    expected = rows[slot, :512].to(torch.bfloat16).expand(3, 16, 512)
    assert torch.equal(out, expected), f"max difference {(out.float() - expected.float()).abs().max().item()}"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_split_count_gives_the_same_function(sparse_mla: ModuleType, layout: str) -> None:
    case = Case(layout, 32, 512, 4, minus_one=True, lengths=True, extra_topk=64, sink=True)
    args = _make_inputs(case, seed=11)
    ref_out, ref_lse = _reference(args)
    for splits in (1, 2, 7, 9):
        out, lse = sparse_mla.sparse_mla_decode(**args, num_splits=splits)
        _assert_matches(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize(("layout", "heads"), [(name, h) for name in sorted(LAYOUTS) for h in (16, 128)])
def test_gb10_configurations_with_many_splits(sparse_mla: ModuleType, layout: str, heads: int) -> None:
    """The small-shared-memory configurations (Q fragments held in registers where they fit) and
    the split combine over split counts that leave its groups and unrolled steps partly empty."""
    case = Case(layout, heads, 2048, 2, minus_one=True, lengths=True, sink=True, max_smem=SMALL_SMEM)
    args = _make_inputs(case, seed=zlib.crc32(str(case).encode()))
    ref_out, ref_lse = _reference(args)
    for splits in (1, 6, 37, 64):
        out, lse = sparse_mla.sparse_mla_decode(**args, num_splits=splits, max_smem_bytes=SMALL_SMEM)
        _assert_matches(out, lse, ref_out, ref_lse)


def test_results_are_deterministic(sparse_mla: ModuleType) -> None:
    args = _make_inputs(Case("v4_fp8", 64, 2048, 2, extra_topk=128), seed=5)
    first = sparse_mla.sparse_mla_decode(**args)
    second = sparse_mla.sparse_mla_decode(**args)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_plan_reports_the_launch(sparse_mla: ModuleType) -> None:
    args = _make_inputs(Case("v32_fp8", 128, 2048, 1), seed=3)
    plan = sparse_mla.plan(args["q"], args["cache"], args["indices"], "v32_fp8")
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    assert 0 < plan.smem_bytes <= limit
    assert 128 % plan.heads_per_cta == 0
    assert plan.num_splits > 1, "one token should be split over the top-k to fill the GPU"
    assert plan.workspace_bytes >= plan.num_splits * 128 * 512 * 4
    small = sparse_mla.plan(args["q"], args["cache"], args["indices"], "v32_fp8", max_smem_bytes=SMALL_SMEM)
    assert small.smem_bytes <= SMALL_SMEM - 1024


def test_library_errors_come_back_as_exceptions(sparse_mla: ModuleType) -> None:
    args = _make_inputs(Case("v4_fp8", 16, 64, 1), seed=1)
    with pytest.raises(
        sparse_mla.SparseMLAError, match=r"no kernel configuration of layout V4_FP8 .* fits 4096 bytes"
    ):
        sparse_mla.sparse_mla_decode(**args, max_smem_bytes=4096)


def test_cuda_graph_capture_and_replay(sparse_mla: ModuleType) -> None:
    for case in (Case("v4_fp8", 64, 512, 2, extra_topk=128, sink=True), Case("v32_fp8", 16, 2048, 64)):
        args = _make_inputs(case, seed=7)
        static_q = args["q"]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            sparse_mla.sparse_mla_decode(**args)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out, graph_lse = sparse_mla.sparse_mla_decode(**args)
        for seed in (1, 2):
            fresh = torch.randn(
                static_q.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
            )
            static_q.copy_(fresh.to(torch.bfloat16))
            graph_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager_out, eager_lse = sparse_mla.sparse_mla_decode(**args)
            assert torch.equal(graph_out, eager_out), f"{case}: replayed out differs from an eager call"
            assert torch.equal(graph_lse, eager_lse), f"{case}: replayed lse differs from an eager call"


def test_torch_compile_traces_the_op(sparse_mla: ModuleType) -> None:
    args = _make_inputs(Case("v4_fp8", 16, 128, 3, lengths=True, sink=True), seed=9)

    def step(q: torch.Tensor) -> torch.Tensor:
        out, lse = torch.ops.sparkseal.sparse_mla_decode(
            q,
            args["cache"],
            args["indices"],
            args["topk_length"],
            None,
            None,
            None,
            args["attn_sink"],
            args["softmax_scale"],
            "v4_fp8",
            0,
            0,
        )
        return out.float() * 2.0 + lse.unsqueeze(-1)

    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(args["q"]), step(args["q"]), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The e4m3 QK^T paths (qk="fp8": q as one e4m3 term, "fp8x2": two)
# ---------------------------------------------------------------------------------------------
FP8_QK = ("fp8", "fp8x2")


def _fp8_cases() -> list[Case]:
    """Both fp8 layouts: batch 1 (split top-k), padded -1 indices, a second cache, lengths and
    sinks, a large batch, forced split counts and both shared-memory budgets."""
    cases = []
    for layout in ("v4_fp8", "v32_fp8"):
        extra = 128 if layout == "v4_fp8" else 64
        cases += [
            Case(layout, 128, 2048, 1),
            Case(layout, 128, 2048, 1, minus_one=True, max_smem=SMALL_SMEM),
            Case(layout, 64, 512, 8, minus_one=True, lengths=True, extra_topk=extra, sink=True),
            Case(layout, 16, 2048, 256, minus_one=True, max_smem=SMALL_SMEM),
            Case(layout, 32, 512, 64, minus_one=True, sink=True, max_smem=SMALL_SMEM),
            Case(
                layout, 128, 2048, 2, minus_one=True, lengths=True, sink=True, splits=37, max_smem=SMALL_SMEM
            ),
        ]
    cases.append(
        Case(
            "v4_fp8", 64, 128, 64, minus_one=True, lengths=True, extra_topk=512, sink=True, extra_page_size=2
        )
    )
    return cases


@pytest.mark.parametrize("qk", FP8_QK)
@pytest.mark.parametrize("case", _fp8_cases(), ids=str)
def test_fp8_qk_matches_reference(sparse_mla: ModuleType, case: Case, qk: str) -> None:
    args = _make_inputs(case, seed=zlib.crc32(str(case).encode()))
    out, lse = sparse_mla.sparse_mla_decode(
        **args, num_splits=case.splits, max_smem_bytes=case.max_smem, qk=qk
    )
    torch.cuda.synchronize()
    plan = sparse_mla.plan(
        args["q"], args["cache"], args["indices"], case.layout, max_smem_bytes=case.max_smem, qk=qk
    )
    assert plan.qk_mode == sparse_mla.QK_MODES[qk]
    ref_out, ref_lse = _reference(args)
    _assert_matches(out, lse, ref_out, ref_lse, TOLERANCES[qk])


@pytest.mark.parametrize("qk", FP8_QK)
@pytest.mark.parametrize("layout", ("v4_fp8", "v32_fp8"))
def test_fp8_qk_one_valid_index_reproduces_the_row(sparse_mla: ModuleType, layout: str, qk: str) -> None:
    """V4 exactly (its power-of-two scale moves into P exactly); V3.2 within one bf16 rounding (its
    float32 scale is rounded to bf16 inside P)."""
    spec = LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(21)
    cache = random_cache(spec, 4, generator=gen, device="cuda")
    codes = torch.tensor([0x01, 0x07, 0x81, 0x85, 0x00, 0x80, 0x7E, 0xFE], dtype=torch.uint8, device="cuda")
    start = 17 * (576 if layout == "v4_fp8" else spec.record_bytes)
    cache.view(4, -1)[2, start : start + 8] = codes
    slot = 2 * PAGE_SIZE + 17
    expected = unpack_cache(cache, spec)[slot, :512].to(torch.bfloat16).expand(3, 32, 512)
    q = torch.randn(3, 32, spec.q_dim, generator=gen, device="cuda").to(torch.bfloat16)
    indices = torch.full((3, 64), -1, dtype=torch.int32, device="cuda")
    indices[:, 5] = slot
    for max_smem in (0, SMALL_SMEM):
        out, _ = sparse_mla.sparse_mla_decode(
            q, cache, indices, softmax_scale=0.1, layout=layout, num_splits=1, max_smem_bytes=max_smem, qk=qk
        )
        if layout == "v4_fp8":
            assert torch.equal(out, expected), (
                f"max difference {(out.float() - expected.float()).abs().max()}"
            )
        else:
            rel = (out.float() - expected.float()).abs() / expected.float().abs().clamp(min=1e-30)
            assert float(rel[expected != 0].max()) <= 2.0**-7, f"worst relative difference {rel.max()}"
            assert torch.equal(out[expected == 0], expected[expected == 0])


def test_bf16_qk_stays_selectable(sparse_mla: ModuleType) -> None:
    case = Case("v4_fp8", 64, 512, 8, minus_one=True, sink=True, max_smem=SMALL_SMEM)
    args = _make_inputs(case, seed=17)
    ref_out, ref_lse = _reference(args)
    runs = {}
    for qk in ("bf16", "fp8x2"):
        plan = sparse_mla.plan(
            args["q"], args["cache"], args["indices"], "v4_fp8", max_smem_bytes=SMALL_SMEM, qk=qk
        )
        assert sparse_mla.QK_NAMES[plan.qk_mode] == qk
        runs[qk] = sparse_mla.sparse_mla_decode(**args, max_smem_bytes=SMALL_SMEM, qk=qk)
        _assert_matches(*runs[qk], ref_out, ref_lse, TOLERANCES[qk])
    assert not torch.equal(runs["bf16"][0], runs["fp8x2"][0]), "qk='bf16' and qk='fp8x2' ran the same kernel"
    auto = sparse_mla.plan(args["q"], args["cache"], args["indices"], "v4_fp8", max_smem_bytes=SMALL_SMEM)
    default = sparse_mla.QK_NAMES[auto.qk_mode]
    assert torch.equal(sparse_mla.sparse_mla_decode(**args, max_smem_bytes=SMALL_SMEM)[0], runs[default][0])


@pytest.mark.parametrize("qk", FP8_QK)
@pytest.mark.parametrize("layout", ("v4_fp8", "v32_fp8"))
def test_fp8_qk_gb10_plans_fit_its_shared_memory(sparse_mla: ModuleType, layout: str, qk: str) -> None:
    for heads in (16, 32, 64, 128):
        args = _make_inputs(Case(layout, heads, 512, 4), seed=heads)
        plan = sparse_mla.plan(
            args["q"], args["cache"], args["indices"], layout, max_smem_bytes=SMALL_SMEM, qk=qk
        )
        assert plan.smem_bytes <= SMALL_SMEM - 1024 and plan.qk_mode == sparse_mla.QK_MODES[qk]
        assert heads % plan.heads_per_cta == 0


def test_fp8_qk_is_deterministic_and_graph_capturable(sparse_mla: ModuleType) -> None:
    args = _make_inputs(Case("v32_fp8", 32, 512, 3, minus_one=True, extra_topk=64, sink=True), seed=23)
    first = sparse_mla.sparse_mla_decode(**args, qk="fp8x2")
    second = sparse_mla.sparse_mla_decode(**args, qk="fp8x2")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sparse_mla.sparse_mla_decode(**args, qk="fp8")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, _ = sparse_mla.sparse_mla_decode(**args, qk="fp8")
    graph_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, sparse_mla.sparse_mla_decode(**args, qk="fp8")[0])


# ---------------------------------------------------------------------------------------------
# sparkseal::sparse_mla_decode_into: the same kernels writing the caller's buffers
# ---------------------------------------------------------------------------------------------
INTO_CASES = [
    (Case("v4_fp8", 64, 512, 8, minus_one=True, lengths=True, sink=True), "auto"),
    (Case("v4_fp8", 64, 128, 8, lengths=True, extra_topk=512, sink=True, extra_page_size=2), "auto"),
    (Case("v32_fp8", 16, 2048, 2, minus_one=True), "auto"),
    (Case("v32_fp8", 32, 512, 8, lengths=True, extra_topk=64, max_smem=SMALL_SMEM), "auto"),
    (Case("v32_bf16", 128, 512, 4, sink=True), "auto"),
    (Case("v32_bf16", 32, 512, 8, lengths=True, extra_topk=64, splits=5), "auto"),
    # The e4m3 kernels store 8 bytes at a time, the split combine 4.
    (Case("v4_fp8", 64, 512, 8, minus_one=True, extra_topk=128, sink=True, max_smem=SMALL_SMEM), "fp8"),
    (Case("v32_fp8", 128, 2048, 1, minus_one=True, splits=37), "fp8x2"),
]


def _into_buffers(case: Case, spare_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` and ``lse`` as a prefix of larger buffers filled with a sentinel, the way vLLM hands a
    layer the first rows of its output."""
    out = torch.full((case.batch + spare_rows, case.heads, 512), 7.0, dtype=torch.bfloat16, device="cuda")
    lse = torch.full((case.batch + spare_rows, case.heads), 7.0, device="cuda")
    return out, lse


@pytest.mark.parametrize(("case", "qk"), INTO_CASES, ids=[f"{c}-{qk}" for c, qk in INTO_CASES])
def test_in_place_op_equals_the_allocating_op(sparse_mla: ModuleType, case: Case, qk: str) -> None:
    args = _make_inputs(case, seed=zlib.crc32(str(case).encode()))
    knobs = {"num_splits": case.splits, "max_smem_bytes": case.max_smem, "qk": qk}
    expected_out, expected_lse = sparse_mla.sparse_mla_decode(**args, **knobs)
    out, lse = _into_buffers(case, spare_rows=3)
    returned = sparse_mla.sparse_mla_decode_into(out[: case.batch], **args, **knobs, lse=lse[: case.batch])
    torch.cuda.synchronize()
    assert returned.data_ptr() == lse.data_ptr()
    assert torch.equal(out[: case.batch], expected_out), f"{case}: out differs from the allocating op"
    assert torch.equal(lse[: case.batch], expected_lse), f"{case}: lse differs from the allocating op"
    assert bool((out[case.batch :] == 7).all() and (lse[case.batch :] == 7).all()), "rows past T written"
    allocated = sparse_mla.sparse_mla_decode_into(out[: case.batch], **args, **knobs)
    assert torch.equal(allocated, expected_lse)


def test_in_place_op_in_a_cuda_graph(sparse_mla: ModuleType) -> None:
    """Captured once, replayed with the next step's query and rows written into the captured inputs: the
    caller's buffers hold what an eager call of the allocating op computes."""
    for case in (
        Case("v4_fp8", 64, 512, 4, lengths=True, extra_topk=128, sink=True),
        Case("v32_fp8", 16, 2048, 64),
    ):
        args = _make_inputs(case, seed=31)
        out, lse = _into_buffers(case)

        def step(args: dict[str, object] = args, out: torch.Tensor = out, lse: torch.Tensor = lse) -> None:
            sparse_mla.sparse_mla_decode_into(out, **args, lse=lse)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for seed in (1, 2):
            fresh = _make_inputs(case, seed=seed)
            for name, value in fresh.items():
                if isinstance(value, torch.Tensor) and name not in ("cache", "extra_cache"):
                    args[name].copy_(value)  # type: ignore[union-attr]
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager_out, eager_lse = sparse_mla.sparse_mla_decode(**args)
            assert torch.equal(out, eager_out), f"{case}: replayed out differs from an eager call"
            assert torch.equal(lse, eager_lse), f"{case}: replayed lse differs from an eager call"


def test_torch_compile_functionalises_the_in_place_op(sparse_mla: ModuleType) -> None:
    case = Case("v4_fp8", 16, 128, 3, lengths=True, sink=True)
    args = _make_inputs(case, seed=9)

    def step(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        torch.ops.sparkseal.sparse_mla_decode_into(
            out,
            lse,
            q,
            args["cache"],
            args["indices"],
            args["topk_length"],
            None,
            None,
            None,
            args["attn_sink"],
            args["softmax_scale"],
            "v4_fp8",
            0,
            0,
        )
        return out.float() * 2.0 + lse.unsqueeze(-1)

    compiled = torch.compile(step, fullgraph=True)
    eager_buffers, compiled_buffers = _into_buffers(case), _into_buffers(case)
    torch.testing.assert_close(
        compiled(*compiled_buffers, args["q"]), step(*eager_buffers, args["q"]), rtol=0, atol=0
    )
    assert torch.equal(compiled_buffers[0], eager_buffers[0]) and torch.equal(
        compiled_buffers[1], eager_buffers[1]
    )


def test_in_place_op_refuses_an_out_its_kernels_cannot_store_to(sparse_mla: ModuleType) -> None:
    case = Case("v4_fp8", 16, 128, 2)
    args = _make_inputs(case, seed=3)
    # Contiguous, 4-byte aligned (what the library checks), but not 8.
    out = torch.empty(2 * 16 * 512 + 2, dtype=torch.bfloat16, device="cuda")[2:].view(2, 16, 512)
    with pytest.raises(ValueError, match=r"out data pointer: expected an 8-byte aligned address, got 0x"):
        sparse_mla.sparse_mla_decode_into(out, **args, qk="fp8")
