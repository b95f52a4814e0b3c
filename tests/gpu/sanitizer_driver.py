"""Runs small sparse-MLA decode calls over every kernel configuration the planner can choose, for
compute-sanitizer (tests/gpu/test_sparse_mla_sanitizers.py runs it under memcheck, synccheck, initcheck and
racecheck)::

    python -m tests.gpu.sanitizer_driver --list             # the cases' names (no GPU needed)
    python -m tests.gpu.sanitizer_driver --all              # run every case
    python -m tests.gpu.sanitizer_driver --case NAME ...    # run the named cases
    python -m tests.gpu.sanitizer_driver --case NAME --repeat 200   # each 200 times, bitwise equal
    python -m tests.gpu.sanitizer_driver --enumerate        # the planner's choices over a grid of shapes

For each case it prints ``CASE {json}`` (the case and the plan the binding's ``plan()`` reports for it)
before the call and ``DONE name`` once the call's results are back and match the float32 reference;
it exits 1 at the first case whose results are wrong or whose call fails.

The cases (:data:`CASES`) are a fixed list: each layout x each QK^T path x the device's shared-memory
limit and GB10's 101376 bytes x head counts that select each table entry (16, 32, 64 heads a CTA; 128
heads for the qk="auto" cases) x one split and several (the split combine), with top-k lengths that
give the warp-specialised kernel its 16 tiles per CTA or not, and two cases for the combine's 2- and
4-warp groups. Token 0 of each case has valid indices only; token 1 has -1 entries and out-of-range
ones and, in the cases with ``topk_length``, rows cut short (to nothing without a second cache: an
empty row). :func:`planner_choices` asks ``plan()``
over a grid of shapes for every configuration it can pick, so the test can check that the cases cover
them all.

Inputs are built on the host and copied to the GPU, and the checks run on the host: under the tools
the only kernels are ours (no PyTorch kernel writes the inputs, so initcheck sees them initialised by
the copies).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import zlib

import torch

from sparkseal.kernels import sparse_mla
from sparkseal.kernels.sparse_mla_ref import (
    EMPTY_LSE,
    LAYOUTS,
    PAGE_SIZE,
    random_cache,
    sparse_mla_decode_ref,
)

SMALL_SMEM = 101376  # GB10's per-block limit (SM120 / SM121)
# Threads of the warp-specialised kernel's producer warpgroups (WsConfig::kProducerThreads in
# kernels_sm121/csrc/sparse_mla_ws.cuh). The single-role kernels run at most 256 threads a CTA
# (Config: (ROWS / 16) x C warps, at most 8; Fp8Config: 8 warps); the warp-specialised one adds these
# 256 to its consumers' (ROWS / 16) x 4 warps, so a plan of more than 256 threads is that kernel.
WS_PRODUCER_THREADS = 256
MAX_SINGLE_ROLE_THREADS = 256


@dataclasses.dataclass(frozen=True)
class SanCase:
    layout: str
    qk: str
    heads: int
    topk: int
    splits: int
    max_smem: int = 0
    batch: int = 2
    extra_topk: int = 0
    extra_page_size: int = PAGE_SIZE
    lengths: bool = False
    sink: bool = False

    @property
    def name(self) -> str:
        parts = [self.layout, self.qk, f"h{self.heads}", f"k{self.topk}", f"s{self.splits}"]
        parts.append("cap" if self.max_smem else "limit")
        if self.extra_topk:
            page = "" if self.extra_page_size == PAGE_SIZE else f"p{self.extra_page_size}"
            parts.append(f"extra{self.extra_topk}{page}")
        parts += [flag for flag in ("lengths", "sink") if getattr(self, flag)]
        return "-".join(parts)


# (layout, qk, heads, max_smem, top-k per split): one row per table entry the planner can reach on a
# GPU with the sm_90 opt-in limit (227 KiB), i.e. an H100 / H200, and the same rows under 101376 bytes.
_ROWS: tuple[tuple[str, str, int, int, int], ...] = (
    # V4, bf16 QK^T: 64/32/16 heads a CTA at the device limit; under 101376 the warp-specialised
    # kernel (>= 16 tiles of 32 keys per CTA) or the single-role 32-head one (fewer), and 16 heads.
    ("v4_fp8", "bf16", 64, 0, 256),
    ("v4_fp8", "bf16", 32, 0, 256),
    ("v4_fp8", "bf16", 32, SMALL_SMEM, 512),
    ("v4_fp8", "bf16", 32, SMALL_SMEM, 64),
    ("v4_fp8", "bf16", 16, 0, 256),
    ("v4_fp8", "bf16", 16, SMALL_SMEM, 256),
    ("v32_fp8", "bf16", 64, 0, 256),
    ("v32_fp8", "bf16", 32, 0, 256),
    ("v32_fp8", "bf16", 32, SMALL_SMEM, 256),
    ("v32_fp8", "bf16", 16, 0, 256),
    ("v32_fp8", "bf16", 16, SMALL_SMEM, 256),
    ("v32_bf16", "bf16", 64, 0, 256),
    ("v32_bf16", "bf16", 32, 0, 256),
    ("v32_bf16", "bf16", 16, 0, 256),
    ("v32_bf16", "bf16", 16, SMALL_SMEM, 256),
    # The e4m3 QK^T kernels of both fp8 layouts: 32 and 16 heads a CTA, both budgets.
    *(
        (layout, qk, heads, smem, 256)
        for layout, qk, heads, smem in itertools.product(
            ("v4_fp8", "v32_fp8"), ("fp8", "fp8x2"), (32, 16), (0, SMALL_SMEM)
        )
    ),
    # qk="auto" (the library's default path) with 128 heads: several head groups per token.
    ("v4_fp8", "auto", 128, SMALL_SMEM, 512),
    ("v32_fp8", "auto", 128, 0, 256),
    ("v32_bf16", "auto", 128, SMALL_SMEM, 256),
)


def _cases() -> tuple[SanCase, ...]:
    cases = []
    for i, (layout, qk, heads, smem, per_split) in enumerate(_ROWS):
        for splits in (1, 2):
            variant = i + splits
            extra = (128 if layout == "v4_fp8" else 64) if variant % 2 == 0 else 0
            cases.append(
                SanCase(
                    layout,
                    qk,
                    heads,
                    per_split * splits,
                    splits,
                    max_smem=smem,
                    extra_topk=extra,
                    # V4's C128A caches: 2 records a page
                    extra_page_size=2 if extra and layout == "v4_fp8" and i % 3 == 0 else PAGE_SIZE,
                    lengths=variant % 3 != 2,
                    sink=i % 2 == 1,
                )
            )
    # The split combine with 2 and 4 warps per (token, head): >= 16 and >= 32 splits, few pairs.
    for splits in (16, 32):
        cases.append(SanCase("v4_fp8", "bf16", 16, 32 * splits, splits, max_smem=SMALL_SMEM, lengths=True))
    return tuple(cases)


CASES: tuple[SanCase, ...] = _cases()
CASES_BY_NAME = {case.name: case for case in CASES}


def build_inputs(case: SanCase, device: str = "cuda") -> tuple[dict[str, object], dict[str, object]]:
    """``(kwargs on device, the same on the host)`` for ``sparse_mla_decode``: built on the host and
    copied (whole contiguous tensors, so each copy is a plain host-to-device memcpy)."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    layout = LAYOUTS[case.layout]
    pages = 4
    cache = random_cache(layout, pages, generator=gen)
    q = torch.randn(case.batch, case.heads, layout.q_dim, generator=gen).to(torch.bfloat16)

    def index_rows(topk: int, slots: int) -> torch.Tensor:
        idx = torch.randint(0, slots, (case.batch, topk), generator=gen, dtype=torch.int32)
        if case.batch > 1:
            row = idx[1]
            drop = torch.rand(topk, generator=gen) < 0.25
            row[drop] = -1
            row[3::7] = slots + 3  # out of range: skipped like -1
        return idx

    def length_rows(topk: int, second: int) -> torch.Tensor:
        lengths = torch.full((case.batch,), second, dtype=torch.int32)
        lengths[0] = topk + 100  # longer than the row: clamped
        return lengths

    host: dict[str, object] = {
        "q": q,
        "cache": cache,
        "indices": index_rows(case.topk, pages * PAGE_SIZE),
        "softmax_scale": layout.q_dim**-0.5,
        "layout": case.layout,
    }
    if case.lengths:
        # token 1: a third of its row, or (with no second cache) nothing at all: an empty row
        host["topk_length"] = length_rows(case.topk, case.topk // 3 if case.extra_topk else 0)
    if case.extra_topk:
        extra_pages = 2 * PAGE_SIZE // case.extra_page_size
        host["extra_cache"] = random_cache(layout, extra_pages, generator=gen, page_size=case.extra_page_size)
        host["extra_indices"] = index_rows(case.extra_topk, extra_pages * case.extra_page_size)
        if case.lengths:
            host["extra_topk_length"] = length_rows(case.extra_topk, 0)
    if case.sink:
        host["attn_sink"] = torch.randn(case.heads, generator=gen)
    on_device = {
        key: value.contiguous().to(device) if isinstance(value, torch.Tensor) else value
        for key, value in host.items()
    }
    return on_device, host


def combine_groups(pairs: int, splits: int, num_sms: int) -> int:
    """Warps per (token, head) of the split combine: a copy of ``combine_groups`` in
    kernels_sm121/csrc/sparse_mla.cu (the plan does not report it)."""
    for groups in (4, 2):
        if splits >= groups * 8 and pairs * groups <= num_sms * 8:
            return groups
    return 1


def plan_key(layout: str, plan: sparse_mla.Plan) -> str:
    """The configuration a plan launches: layout, QK^T path as run, heads x keys a CTA, threads, bytes."""
    qk = sparse_mla.QK_NAMES[plan.qk_mode]
    shape = f"{plan.heads_per_cta}hx{plan.keys_per_tile}k"
    return f"{layout}:{qk}:{shape}:{plan.threads_per_cta}t:{plan.smem_bytes}B"


def is_ws(plan: sparse_mla.Plan) -> bool:
    """Whether ``plan`` launches the warp-specialised kernel (see :data:`WS_PRODUCER_THREADS`)."""
    return plan.threads_per_cta > MAX_SINGLE_ROLE_THREADS


def case_plan(case: SanCase, args: dict[str, object]) -> sparse_mla.Plan:
    """The plan the binding's ``plan()`` reports for ``case``'s call (``args`` from :func:`build_inputs`)."""
    return sparse_mla.plan(
        args["q"],
        args["cache"],
        args["indices"],
        case.layout,
        extra_cache=args.get("extra_cache"),
        extra_indices=args.get("extra_indices"),
        num_splits=case.splits,
        max_smem_bytes=case.max_smem,
        qk=case.qk,
    )


def describe(case: SanCase, args: dict[str, object]) -> dict[str, object]:
    """:func:`case_plan` as one JSON-able record."""
    plan = case_plan(case, args)
    splits = plan.num_splits
    return {
        "name": case.name,
        "key": plan_key(case.layout, plan),
        "ws": is_ws(plan),
        "split": splits > 1,
        "num_splits": splits,
        "num_ctas": plan.num_ctas,
        "threads_per_cta": plan.threads_per_cta,
        "combine_groups": combine_groups(case.batch * case.heads, splits, plan.num_sms) if splits > 1 else 0,
    }


def planner_choices(device: str = "cuda") -> set[str]:
    """Every configuration :func:`plan_key` names that ``plan()`` picks over a grid of shapes: each layout
    x each QK^T path x 16-128 heads x the device limit and 101376 bytes x 1-256 tokens x top-k 64-2048 x
    automatic and one split. Only shapes are read, so the tensors are left uninitialised."""
    found = set()
    batches = (1, 2, 8, 33, 64, 256)
    topks = (64, 128, 512, 2048)
    for name, layout in LAYOUTS.items():
        modes = ("auto", "bf16") if layout.cache_dtype == torch.bfloat16 else tuple(sparse_mla.QK_MODES)
        cache = torch.empty(8, PAGE_SIZE, layout.record_elems, dtype=layout.cache_dtype, device=device)
        indices = {k: torch.empty(max(batches), k, dtype=torch.int32, device=device) for k in topks}
        for heads in sparse_mla.SUPPORTED_HEADS:
            q = torch.empty(max(batches), heads, layout.q_dim, dtype=torch.bfloat16, device=device)
            for qk, smem, batch, topk, splits in itertools.product(
                modes, (0, SMALL_SMEM), batches, topks, (0, 1)
            ):
                rows = indices[topk][:batch]
                plan = sparse_mla.plan(
                    q[:batch], cache, rows, name, num_splits=splits, max_smem_bytes=smem, qk=qk
                )
                found.add(plan_key(name, plan))
    return found


# Allowed (out relative error, lse max error) per QK^T path: twice what tests/gpu/test_sparse_mla_gpu.py
# allows; this is a check that the call ran, the accuracy is that file's.
TOLERANCES = {"bf16": (2e-2, 4e-2), "fp8x2": (2e-2, 4e-2), "fp8": (1e-1, 1.6e-1)}


def check_results(case: SanCase, out: torch.Tensor, lse: torch.Tensor, host: dict[str, object]) -> str | None:
    """What is wrong with ``(out, lse)`` (on the host) against the float32 reference, or None."""
    kwargs = dict(host)
    layout = LAYOUTS[str(kwargs.pop("layout"))]
    q, cache, indices, scale = (kwargs.pop(k) for k in ("q", "cache", "indices", "softmax_scale"))
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, indices, scale, layout, **kwargs)  # type: ignore[arg-type]
    if not bool(torch.isfinite(out.float()).all()) or not bool(torch.isfinite(lse).all()):
        return "non-finite values in out or lse"
    empty = ref_lse == EMPTY_LSE
    if not torch.equal(lse[empty], ref_lse[empty]) or not torch.equal(
        out[empty].float(), torch.zeros_like(ref_out[empty])
    ):
        return "a row with no valid index: lse is not EMPTY_LSE or out is not 0"
    full = ~empty
    if not bool(full.any()):
        return None
    qk = "bf16" if case.qk == "auto" else case.qk
    max_rel, max_lse = TOLERANCES[qk]
    diff = out.float()[full] - ref_out[full]
    rel = (diff.norm() / ref_out[full].norm().clamp(min=1e-30)).item()
    lse_err = (lse[full] - ref_lse[full]).abs().max().item()
    if rel >= max_rel or lse_err >= max_lse:
        return (
            f"out relative error {rel:.2e} (expected < {max_rel:.0e}), "
            f"lse max error {lse_err:.2e} (expected < {max_lse:.0e})"
        )
    return None


def run_case(case: SanCase, repeat: int = 1) -> str | None:
    """Plan, print, run and check one case; what went wrong, or None. With ``repeat`` > 1 the call is made
    that many times (a stress for races): the first result is checked against the reference and every
    later one must equal it bit for bit."""
    args, host = build_inputs(case)
    print("CASE " + json.dumps(describe(case, args), sort_keys=True), flush=True)
    kwargs = {"num_splits": case.splits, "max_smem_bytes": case.max_smem, "qk": case.qk}
    out, lse = sparse_mla.sparse_mla_decode(**args, **kwargs)
    torch.cuda.synchronize()
    problem = check_results(case, out.cpu(), lse.cpu(), host)
    for call in range(2, repeat + 1):
        if problem is not None:
            break
        again_out, again_lse = sparse_mla.sparse_mla_decode(**args, **kwargs)
        if not torch.equal(again_out, out) or not torch.equal(again_lse, lse):
            rows = (again_out != out).flatten(2).any(-1) | (again_lse != lse)
            problem = (
                f"call {call} of {repeat} differs bitwise from call 1 in {int(rows.sum())} of {rows.numel()} "
                "(token, head) rows"
            )
    if problem is None:
        print(f"DONE {case.name}", flush=True)
    return problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Small sparse-MLA decode calls over every configuration the planner can choose, for "
        "compute-sanitizer (tests/gpu/test_sparse_mla_sanitizers.py)."
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--list", action="store_true", help="print the cases' names and exit")
    which.add_argument("--all", action="store_true", help="run every case")
    which.add_argument("--case", nargs="+", metavar="NAME", help="run these cases")
    which.add_argument("--enumerate", action="store_true", help="print the planner's choices over a grid")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="call each case N times: the first checked against the reference, the rest bitwise against it",
    )
    options = parser.parse_args(argv)
    if options.list:
        print("\n".join(case.name for case in CASES))
        return 0
    if not torch.cuda.is_available():
        print("sanitizer_driver: no CUDA GPU", file=sys.stderr)
        return 2
    sparse_mla._library()  # loads the kernel library, checks its ABI version and struct sizes
    if options.enumerate:
        print("\n".join(sorted(planner_choices())))
        return 0
    names = [case.name for case in CASES] if options.all else options.case
    unknown = [name for name in names if name not in CASES_BY_NAME]
    if unknown:
        print(f"sanitizer_driver: unknown cases {unknown}; --list names them", file=sys.stderr)
        return 2
    if options.repeat < 1:
        print(f"sanitizer_driver: --repeat {options.repeat}: expected 1 or more", file=sys.stderr)
        return 2
    for name in names:
        problem = run_case(CASES_BY_NAME[name], options.repeat)
        if problem is not None:
            print(f"FAILED {name}: {problem}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
