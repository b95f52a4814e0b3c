"""The kernel library built from an edited copy of ``kernels_sm121/csrc``, for tests and benchmarks.

A test-only variant proves that a check can fail: ``tests/gpu/test_sparse_mla_sanitizers.py`` builds the
library with the warp-specialised kernel's K-tile handover broken (:data:`EARLY_RELEASE`) and asserts that
its functional stress catches the race that makes; ``bench/sparse_mla_stages.py`` builds one library per
stage compiled out. Each edit names the text it replaces, and a copy is refused when that text is not in the
source exactly once, so a variant cannot silently stop being the variant it says it is when the kernel
changes (``tests/unit/test_kernel_variant.py`` checks the edits against today's sources on any machine).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CSRC = REPO / "kernels_sm121" / "csrc"
INCLUDE = REPO / "kernels_sm121" / "include"


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once in ``file``, a name in csrc/) by ``new``."""

    file: str
    old: str
    new: str


class EditError(ValueError):
    """An edit's text is not in its source file exactly once."""


# The consumers of the warp-specialised kernel (kernels_sm121/csrc/sparse_mla_ws.cuh) tell the producers
# that K tile b is free (bar.arrive on EMPTY + b) only after they have read it for tile t. Arriving
# before reading lets the producers overwrite tile b with tile t + 2 while the consumers still read tile t:
# a real shared-memory race of exactly the kind (a producer's write against a consumer's read) that
# racecheck also reports on the correct kernel. Barrier counts stay as they are, so nothing hangs.
EARLY_RELEASE: tuple[Edit, ...] = (
    Edit(
        "sparse_mla_ws.cuh",
        "    tm.attend(k_tiles + b * NT * Cfg::kKStride, k_valid + b * Cfg::kKValidBytes, p_s, red_max, "
        "args.scale_log2);\n"
        "    if (t + 2 < num_tiles) named_barrier_arrive(Cfg::kBarEmpty + b, Cfg::kThreads);\n",
        "    if (t + 2 < num_tiles) named_barrier_arrive(Cfg::kBarEmpty + b, Cfg::kThreads);\n"
        "    tm.attend(k_tiles + b * NT * Cfg::kKStride, k_valid + b * Cfg::kKValidBytes, p_s, red_max, "
        "args.scale_log2);\n",
    ),
)


def apply_edits(src: Path, edits: Iterable[Edit]) -> None:
    """Apply ``edits`` to the sources in ``src`` in place (each checked before any file is written)."""
    texts: dict[str, str] = {}
    for edit in edits:
        path = src / edit.file
        text = texts.get(edit.file)
        if text is None:
            text = path.read_text()
        count = text.count(edit.old)
        if count != 1:
            raise EditError(
                f"{path}: expected the text to replace exactly once, found it {count} times: {edit.old!r}"
            )
        texts[edit.file] = text.replace(edit.old, edit.new)
    for name, text in texts.items():
        (src / name).write_text(text)


def edited_copy(dst: Path, edits: Iterable[Edit] = ()) -> Path:
    """A copy of kernels_sm121/csrc at ``dst`` with ``edits`` applied; returns ``dst``."""
    shutil.copytree(CSRC, dst)
    apply_edits(dst, edits)
    return dst


def build_library(src: Path, lib: Path, nvcc: str, arch: str, defines: Sequence[str] = ()) -> None:
    """One shared library from every ``sparse_mla*.cu`` of ``src`` for the one GPU target ``arch`` (e.g.
    ``sm_90a``), the files compiled in parallel. Not the product's build (that is CMake through
    scikit-build-core for its listed targets): only what a test or a benchmark on one GPU needs."""
    objs = lib.parent / f"{lib.stem}.objs"
    objs.mkdir()
    flags = [
        "-O3",
        "-std=c++17",
        "-Xcompiler",
        "-fPIC",
        f"-I{INCLUDE}",
        "-gencode",
        f"arch={arch.replace('sm_', 'compute_')},code={arch}",
        *defines,
    ]
    sources = sorted(src.glob("sparse_mla*.cu"))

    def compile_one(cu: Path) -> None:
        command = [nvcc, *flags, "-c", str(cu), "-o", str(objs / f"{cu.stem}.o")]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}\n{done.stdout}{done.stderr}")

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        for job in [pool.submit(compile_one, cu) for cu in sources]:
            job.result()
    command = [nvcc, "-shared", "-o", str(lib), *(str(objs / f"{cu.stem}.o") for cu in sources)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
