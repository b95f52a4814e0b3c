"""The ``sparkseal::dspark_prepare_inputs`` torch op and its C ABI binding, on CPU.

The ctypes structure must match dspark.h byte for byte (checked with a C compiler), the op must
reject bad arguments with messages that name the argument, the expected and the actual value, its
fake implementation must validate without touching data, and the library loader must name the file
it could not use.
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sparkseal.kernels import _lib, dspark  # noqa: E402 (needs torch)
from sparkseal.kernels.dspark_ref import PAD_SLOT_ID  # noqa: E402
from tests.dspark_kernel import STALE  # noqa: E402
from tests.unit.test_dspark_ref import (  # noqa: E402
    DFLASH_BATCH,
    DSPARK_BATCH,
    op_arguments,
    outputs_of,
    random_batches,
    reference_outputs,
)

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "kernels_sm121" / "include"
HEADER = INCLUDE / "sparkseal" / "dspark.h"
C_COMPILER = shutil.which("cc") or shutil.which("gcc")


def _compile(tmp_path: Path, source: str, *, shared: bool) -> Path:
    if C_COMPILER is None:
        pytest.skip("no C compiler (cc) on PATH")
    src = tmp_path / ("lib.c" if shared else "main.c")
    src.write_text(source)
    out = tmp_path / ("lib.so" if shared else "main")
    flags = ["-shared", "-fPIC"] if shared else []
    proc = subprocess.run(
        [C_COMPILER, *flags, f"-I{INCLUDE}", "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"{C_COMPILER} failed on {src}:\n{proc.stderr}"
    return out


def test_struct_layout_and_constants_match_header(tmp_path: Path) -> None:
    fields = [name for name, _ in dspark.PrepareArgs._fields_]
    offsets = "\n".join(
        f'  printf("\\"{n}\\": %zu,\\n", offsetof(sparkseal_dspark_prepare_args, {n}));' for n in fields
    )
    program = _compile(
        tmp_path,
        f"""#include <stddef.h>
#include <stdio.h>
#include "sparkseal/dspark.h"
int main(void) {{
  printf("{{\\n");
{offsets}
  printf("\\"sizeof\\": %zu, \\"abi\\": %d, \\"pad\\": %d}}\\n",
         sizeof(sparkseal_dspark_prepare_args), SPARKSEAL_DSPARK_ABI_VERSION,
         SPARKSEAL_DSPARK_PAD_SLOT_ID);
  return 0;
}}
""",
        shared=False,
    )
    layout = json.loads(subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout)
    ctypes_layout = {n: getattr(dspark.PrepareArgs, n).offset for n in fields}
    ctypes_layout |= {
        "sizeof": ctypes.sizeof(dspark.PrepareArgs),
        "abi": dspark.ABI_VERSION,
        "pad": PAD_SLOT_ID,
    }
    assert ctypes_layout == layout, f"{HEADER} and sparkseal/kernels/dspark.py disagree"


def test_header_declares_every_struct_field() -> None:
    # offsetof above fails to compile for a field the header lacks; this catches the reverse.
    text = HEADER.read_text()
    body = text[
        text.index("typedef struct sparkseal_dspark_prepare_args") : text.index(
            "} sparkseal_dspark_prepare_args;"
        )
    ]
    declared = re.findall(r"^\s*(?:const\s+)?\w+\s*\*?\s*(\w+);", body, flags=re.MULTILINE)
    assert declared == [name for name, _ in dspark.PrepareArgs._fields_], f"{HEADER}: struct fields differ"


@pytest.mark.parametrize(
    "batch",
    [DFLASH_BATCH, DSPARK_BATCH, *random_batches(7, 6)],
    ids=lambda b: f"reqs{b.num_reqs}-steps{b.num_speculative_steps}-anchor{int(b.sample_from_anchor)}",
)
def test_cpu_op_equals_reference(batch: Any) -> None:
    args = op_arguments(batch, "cpu")
    torch.ops.sparkseal.dspark_prepare_inputs(**args)
    assert outputs_of(args) == reference_outputs(batch)


# (argument, its replacement given DFLASH_BATCH's arguments, expected message). DFLASH_BATCH has
# num_reqs 2, max_num_reqs 3, 2 steps (3 query rows), max_num_tokens 10, 5 target tokens and a 3x3
# block table.
BAD_ARGUMENTS = {
    "dtype": (
        "target_positions",
        lambda a: a["target_positions"].int(),
        "target_positions must have dtype torch.int64, got torch.int32",
    ),
    "output-dtype": (
        "sample_idx_mapping",
        lambda a: a["sample_idx_mapping"].long(),
        "sample_idx_mapping must have dtype torch.int32, got torch.int64",
    ),
    "contiguity": (
        "block_table",
        lambda a: a["block_table"].t().contiguous().t(),
        "block_table must be contiguous, got strides (1, 3) for shape (3, 3)",
    ),
    "strided-1d": (
        "positions",
        lambda a: torch.zeros(20, dtype=torch.int64)[::2],
        "positions must be contiguous, got strides (2,) for shape (10,)",
    ),
    "rank": (
        "num_sampled",
        lambda a: a["num_sampled"].view(2, 1),
        "num_sampled must be 1-D, got shape (2, 1)",
    ),
    "table-rank": (
        "block_table",
        lambda a: a["block_table"].view(-1),
        "block_table must be 2-D [rows, blocks], got shape (9,)",
    ),
    "query-slots-short": (
        "query_slot_mapping",
        lambda a: a["query_slot_mapping"][:9],
        "query_slot_mapping must have at least 10 elements, got 9",
    ),
    "context-short": (
        "context_slot_mapping",
        lambda a: a["context_slot_mapping"][:4],
        "context_slot_mapping must have at least 5 elements, got 4",
    ),
    "query-start-short": (
        "query_start_loc",
        lambda a: a["query_start_loc"][:3],
        "query_start_loc must have at least 4 elements, got 3",
    ),
    "samples-short": (
        "sample_pos",
        lambda a: a["sample_pos"][:5],
        "sample_pos must have at least 6 elements, got 5",
    ),
    "state-buffer-short": (
        "last_sampled",
        lambda a: a["last_sampled"][:2],
        "last_sampled must have at least 3 elements, got 2",
    ),
    "table-rows": (
        "block_table",
        lambda a: a["block_table"][:1],
        "block_table must have >= num_reqs=2 rows and >= 1 column, got (1, 3)",
    ),
    "too-many-reqs": ("num_reqs", lambda a: 4, "num_reqs must be in [1, max_num_reqs=3], got 4"),
    "no-reqs": ("num_reqs", lambda a: 0, "num_reqs must be in [1, max_num_reqs=3], got 0"),
    "query-rows": (
        "num_query_per_req",
        lambda a: 2,
        "num_query_per_req must be 3 for num_speculative_steps=2 and sample_from_anchor=False, got 2",
    ),
    "anchor-rows": (
        "sample_from_anchor",
        lambda a: True,
        "num_query_per_req must be 2 for num_speculative_steps=2 and sample_from_anchor=True, got 3",
    ),
    "max-tokens": (
        "max_num_tokens",
        lambda a: 5,
        "max_num_tokens must be in [num_reqs * num_query_per_req = 6, 2147483647], got 5",
    ),
    "block-size": ("block_size", lambda a: 0, "block_size must be >= 1, got 0"),
    "max-model-len": ("max_model_len", lambda a: 0, "max_model_len must be >= 1, got 0"),
    "max-query-len": ("max_query_len", lambda a: -1, "max_query_len must be in [0, 2147483647], got -1"),
    "device": (
        "seq_lens",
        lambda a: a["seq_lens"].to("meta"),
        "seq_lens must be on target_positions' device cpu, got meta",
    ),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_are_named(case: str) -> None:
    name, replacement, message = BAD_ARGUMENTS[case]
    args = op_arguments(DFLASH_BATCH, "cpu")
    args[name] = replacement(args)
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and v.device.type == "cpu"}
    with pytest.raises(ValueError, match=f"^{re.escape(f'{dspark.OP_NAME}: {message}')}$"):
        torch.ops.sparkseal.dspark_prepare_inputs(**args)
    # Validation happens before anything is written.
    assert all(torch.equal(args[k], v) for k, v in before.items())


def test_fake_impl_validates_without_writing() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = op_arguments(DSPARK_BATCH, "cpu")
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        assert torch.ops.sparkseal.dspark_prepare_inputs(**fake) is None
        fake["num_rejected"] = mode.from_tensor(args["num_rejected"].long())
        with pytest.raises(ValueError, match=r"num_rejected must have dtype torch\.int32, got torch\.int64$"):
            torch.ops.sparkseal.dspark_prepare_inputs(**fake)
    assert {v for values in outputs_of(args).values() for v in values} == {STALE}


def test_opcheck_registration() -> None:
    args = op_arguments(DFLASH_BATCH, "cpu")
    torch.library.opcheck(
        torch.ops.sparkseal.dspark_prepare_inputs.default,
        args=(),
        kwargs=args,
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.fixture
def fresh_library() -> Iterator[None]:
    """Forget the loaded kernel library before and after the test."""
    _lib.load.cache_clear()
    dspark._kernel.cache_clear()
    yield
    _lib.load.cache_clear()
    dspark._kernel.cache_clear()


def test_missing_library_names_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_library: None
) -> None:
    missing = tmp_path / "libsparkseal_kernels.so"
    monkeypatch.setenv(_lib.LIBRARY_ENV, str(missing))
    with pytest.raises(OSError, match=f"kernel library not found at {missing}"):
        dspark._kernel()


def test_abi_mismatch_names_library_and_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_library: None
) -> None:
    lib = _compile(tmp_path, "int sparkseal_dspark_abi_version(void) { return 99; }\n", shared=True)
    monkeypatch.setenv(_lib.LIBRARY_ENV, str(lib))
    with pytest.raises(RuntimeError, match=f"^{lib}: sparkseal_dspark_abi_version\\(\\) is 99, expected 1$"):
        dspark._kernel()
