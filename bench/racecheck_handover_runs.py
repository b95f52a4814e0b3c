"""Run the racecheck handover check (tests/gpu/test_sparse_mla_sanitizers.py) N times in a row on one build.

The GPU test and its gate must give the same verdict every time (bench/results/sparse_mla_sanitizers.md):
this builds the handover program once, runs ``racecheck_handover`` N times and prints each run's attempts,
reports, hazards and control reports, then N single-launch processes (the old check) for comparison.

    PYTHONPATH=$PWD python3 bench/racecheck_handover_runs.py 10     # a CUDA GPU, nvcc and compute-sanitizer
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tests.gpu import test_sparse_mla_sanitizers as sanitizers


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 10
    sanitizer, nvcc = sanitizers._cuda_tool("compute-sanitizer"), sanitizers._cuda_tool("nvcc")
    major, minor = torch.cuda.get_device_capability()
    arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    program = Path(tempfile.mkdtemp()) / "handover"
    source = str(sanitizers.HANDOVER_SOURCE)
    subprocess.run([nvcc, "-O2", "-lineinfo", f"-arch={arch}", "-o", str(program), source], check=True)
    for run in range(1, runs + 1):
        start = time.monotonic()
        found = sanitizers.racecheck_handover(program, sanitizer, Path(tempfile.mkdtemp()))
        print(
            f"run {run}: attempts={found.attempts} reports={len(found.reports)} hazards={len(found.hazards)} "
            f"control={len(found.control_reports)} {time.monotonic() - start:.1f}s",
            flush=True,
        )
    reported = 0
    for _ in range(runs):
        log = Path(tempfile.mkdtemp()) / "one.log"
        options = ["--racecheck-report", "analysis", "--print-limit", "0"]
        sanitizers._sanitize(sanitizer, "racecheck", options, [str(program), "arrive", "1"], log)
        reported += bool(sanitizers.report.parse_race_reports(log.read_text()))
    print(f"one launch per process: {reported} of {runs} processes reported", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
