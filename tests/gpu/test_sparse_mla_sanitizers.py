"""compute-sanitizer over the sparse-MLA decode kernels, on every configuration the planner can choose.

- memcheck, synccheck and initcheck run ``python -m tests.gpu.sanitizer_driver --all`` (every case of
  :data:`tests.gpu.sanitizer_driver.CASES`: each layout x each QK^T path x the device's shared-memory
  limit and 101376 bytes x one split and several) and must report no error; the cases' plans, as the
  driver prints them, must cover every configuration ``plan()`` picks over a grid of shapes.
- racecheck: the warp-specialised kernel (``sparse_mla_decode_ws_kernel``, kernels_sm121/csrc/
  sparse_mla_ws.cuh) hands its K tiles from producer to consumer warps with ``bar.arrive`` / ``bar.sync``
  on named barriers. ``tests/gpu/named_barrier_handover.cu`` is a minimal, correct handover with the
  same barrier discipline and PTX; racecheck reports shared-memory hazards on it, so such reports are the
  tool's view of ``bar.arrive``, not a race. The kernels' racecheck run must report hazards, if any, only
  of that kind: in the warp-specialised kernel only, shared-memory Write/Read pairs (RAW or WAR), each a
  producer thread's write against a consumer thread's read; none in any other kernel.
- a stress: every warp-specialised case called 1,000 times (the driver's ``--repeat``), the first call
  against the float32 reference, every later one bitwise against the first; and the same stress on a
  test-only library with a real race of the handover's kind (:data:`tests.kernel_variant.EARLY_RELEASE`,
  built with nvcc), which racecheck cannot tell from the correct handover, must fail.

Skipped without a CUDA GPU, the kernel library, compute-sanitizer or (for the handover) nvcc.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from sparkseal.kernels import _lib, sparse_mla
from tests import kernel_variant
from tests.gpu import sanitizer_driver as drv
from tests.gpu import sanitizer_report as report

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
HANDOVER_SOURCE = Path(__file__).with_name("named_barrier_handover.cu")
WS_KERNEL = "sparse_mla_decode_ws_kernel"
HANDOVER_KERNEL = "named_barrier_handover_kernel"
STRESS_REPEATS = 1000
# Seconds one sanitizer process may take (the driver's 70 cases under racecheck are the slowest).
TOOL_TIMEOUT_S = 1800
# A sanitizer log is read up to this size.
LOG_LIMIT_BYTES = 64 << 20
# Hazard reports (one per hazard) printed for a warp-specialised case; the handover's are all printed.
HAZARD_PRINT_LIMIT = 200
# The handover under racecheck: launches per process, and processes at most until it reports a hazard
# (racecheck_handover says why).
HANDOVER_LAUNCHES = 64
HANDOVER_ATTEMPTS = 4


# ---------------------------------------------------------------------------------------------
# Fixtures: the GPU, the library, the tools
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is false")


@pytest.fixture(scope="module")
def kernels(gpu: None) -> None:
    """The kernel library (``$SPARKSEAL_KERNELS_LIB`` or the packaged copy), its ABI checked."""
    try:
        _lib.load()
    except OSError as exc:
        pytest.skip(str(exc))
    sparse_mla._library()


def _cuda_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent / name] if nvcc else []
    candidates += [Path("/usr/local/cuda/bin") / name, Path("/usr/local/cuda/compute-sanitizer") / name]
    return next((str(path) for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


@pytest.fixture(scope="module")
def sanitizer(gpu: None) -> str:
    tool = _cuda_tool("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer not found (PATH, beside nvcc, /usr/local/cuda/bin)")
    return tool


@pytest.fixture(scope="module")
def handover(gpu: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """named_barrier_handover.cu built for this GPU (sm_90a on an sm_90 one)."""
    nvcc = _cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin)")
    major, minor = torch.cuda.get_device_capability()
    arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    exe = tmp_path_factory.mktemp("handover") / "named_barrier_handover"
    command = [nvcc, "-O2", "-lineinfo", f"-arch={arch}", "-o", str(exe), str(HANDOVER_SOURCE)]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    assert built.returncode == 0, f"{' '.join(command)}:\n{built.stdout}{built.stderr}"
    return exe


@pytest.fixture(scope="module")
def planner_choices(kernels: None) -> set[str]:
    return drv.planner_choices()


@pytest.fixture(scope="module")
def case_records(kernels: None) -> dict[str, dict[str, object]]:
    """Each driver case's plan record (:func:`tests.gpu.sanitizer_driver.describe`), by name."""
    return {case.name: drv.describe(case, drv.build_inputs(case)[0]) for case in drv.CASES}


# ---------------------------------------------------------------------------------------------
# Running a program under a tool
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    command: list[str]
    returncode: int
    stdout: str
    log: str

    def tail(self, lines: int = 40) -> str:
        out = "\n".join(self.stdout.splitlines()[-lines:])
        log = "\n".join(self.log.splitlines()[-lines:])
        head = f"$ {' '.join(self.command)}\n-- exit status {self.returncode}"
        return f"{head}; stdout:\n{out}\n-- tool log:\n{log}"


def _run(command: list[str], log: Path | None = None, library: Path | None = None) -> Run:
    """Run ``command`` in the repository root, in its own process group (killed whole on timeout); with
    ``library``, the kernel library it loads is that one."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if library is not None:
        env[_lib.LIBRARY_ENV] = str(library)
    with subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, _ = process.communicate(timeout=TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
            pytest.fail(f"{' '.join(command)}: still running after {TOOL_TIMEOUT_S} s\n{stdout[-4000:]}")
    text = ""
    if log is not None and log.is_file():
        with log.open("rb") as f:
            text = f.read(LOG_LIMIT_BYTES).decode(errors="replace")
    return Run(command, process.returncode, stdout, text)


def _sanitize(sanitizer: str, tool: str, options: list[str], program: list[str], log: Path) -> Run:
    return _run([sanitizer, "--tool", tool, "--log-file", str(log), *options, *program], log)


def _driver_program(*cases: str, repeat: int = 1) -> list[str]:
    which = ["--case", *cases] if cases else ["--all"]
    return [sys.executable, "-m", "tests.gpu.sanitizer_driver", *which, "--repeat", str(repeat)]


def _driver_records(run: Run) -> tuple[dict[str, dict[str, object]], set[str]]:
    """The driver's ``CASE`` records by name, and the names of its ``DONE`` lines."""
    records, done = {}, set()
    for line in run.stdout.splitlines():
        if line.startswith("CASE "):
            record = json.loads(line[len("CASE ") :])
            records[str(record["name"])] = record
        elif line.startswith("DONE "):
            done.add(line[len("DONE ") :].strip())
    return records, done


def _assert_every_case_ran(run: Run) -> dict[str, dict[str, object]]:
    records, done = _driver_records(run)
    names = [case.name for case in drv.CASES]
    assert run.returncode == 0, run.tail()
    missing = [name for name in names if name not in done]
    assert not missing, f"the driver did not finish {missing}\n{run.tail()}"
    return records


def _coverage_gaps(records: dict[str, dict[str, object]], choices: set[str]) -> list[str]:
    """What the cases' plans miss of the planner's choices: each configuration with one split and with
    several, and the split combine's 1, 2 and 4 warps per (token, head)."""
    covered = {(str(r["key"]), bool(r["split"])) for r in records.values()}
    gaps = [
        f"{key} with {'several splits' if split else 'one split'}"
        for key in sorted(choices)
        for split in (False, True)
        if (key, split) not in covered
    ]
    gaps += [
        f"{key}: not among the planner's choices over the grid" for key, _ in covered if key not in choices
    ]
    groups = {r["combine_groups"] for r in records.values()}
    gaps += [f"the split combine with {g} warps per (token, head)" for g in (1, 2, 4) if g not in groups]
    return gaps


# ---------------------------------------------------------------------------------------------
# Coverage, and memcheck / synccheck / initcheck
# ---------------------------------------------------------------------------------------------
def test_cases_cover_every_planner_choice(
    planner_choices: set[str], case_records: dict[str, dict[str, object]]
) -> None:
    gaps = _coverage_gaps(case_records, planner_choices)
    assert not gaps, "the driver's cases miss:\n" + "\n".join(gaps)
    assert any(r["ws"] for r in case_records.values()), "no case runs the warp-specialised kernel"


# Options per tool. memcheck: API errors are not reported: a failing call of our library comes back as
# an exception and the driver exits 1, while a CUDA call PyTorch makes and expects to fail could count as
# an error. No --kernel-name filter: the driver builds its inputs on the host and copies them, so the only
# kernels it launches are ours, and initcheck sees the inputs initialised by those copies (with a filter,
# the writes of kernels left unchecked might not count as initialisation).
TOOL_OPTIONS = {
    "memcheck": ["--report-api-errors", "no"],
    "synccheck": [],
    "initcheck": [],
}


@pytest.mark.parametrize("tool", sorted(TOOL_OPTIONS))
def test_tool_reports_no_error(planner_choices: set[str], sanitizer: str, tool: str, tmp_path: Path) -> None:
    options = ["--error-exitcode", "99", "--print-limit", "100", *TOOL_OPTIONS[tool]]
    run = _sanitize(sanitizer, tool, options, _driver_program(), tmp_path / f"{tool}.log")
    assert report.error_summary(run.log) == 0, f"{tool} reports errors\n{run.tail()}"
    records = _assert_every_case_ran(run)
    gaps = _coverage_gaps(records, planner_choices)
    assert not gaps, "the plans the driver printed miss:\n" + "\n".join(gaps)


# ---------------------------------------------------------------------------------------------
# racecheck
# ---------------------------------------------------------------------------------------------
def _handover_consumers() -> int:
    match = re.search(r"constexpr int kConsumerThreads = (\d+);", HANDOVER_SOURCE.read_text())
    assert match, f"{HANDOVER_SOURCE}: expected a kConsumerThreads constant"
    return int(match.group(1))


def test_named_barrier_handover_is_correct(handover: Path) -> None:
    for mode in ("arrive", "sync"):
        run = _run([str(handover), mode])
        assert run.returncode == 0 and f"{mode}: ok" in run.stdout, run.tail()


@dataclass
class HandoverRacecheck:
    reports: list[report.RaceReport]
    hazards: list[report.Hazard]
    control_reports: list[report.RaceReport]
    # racecheck processes run (of HANDOVER_ATTEMPTS) until both report forms showed a hazard
    attempts: int

    @property
    def signatures(self) -> set[str]:
        consumers = _handover_consumers()
        return {report.hazard_signature(h, lambda x: x >= consumers) for h in self.hazards}


def racecheck_handover(handover: Path, sanitizer: str, logs: Path) -> HandoverRacecheck:
    """racecheck on the handover (``HANDOVER_LAUNCHES`` launches per process): its analysis and hazard
    reports, and the bar.sync control's analysis.

    racecheck reports only the interleavings that happen under it: one launch showed it no hazard in 2 of 8
    runs on an H100. So the handover is launched many times per process, and the process repeated, up to
    ``HANDOVER_ATTEMPTS`` times, until both report forms show a hazard; the attempts used are recorded.
    """
    found: dict[tuple[str, str], Run] = {}
    for attempt in range(1, HANDOVER_ATTEMPTS + 1):
        for mode, form in (("arrive", "analysis"), ("arrive", "hazard"), ("sync", "analysis")):
            # every report and every hazard (the handover is small)
            options = ["--racecheck-report", form, "--print-limit", "0"]
            program = [str(handover), mode, str(HANDOVER_LAUNCHES)]
            run = _sanitize(sanitizer, "racecheck", options, program, logs / f"{mode}-{form}-{attempt}.log")
            assert run.returncode == 0 and f"{mode}: ok" in run.stdout, (
                f"wrong results under racecheck\n{run.tail()}"
            )
            found[mode, form] = run
        arrive = found["arrive", "analysis"]
        if report.parse_race_reports(arrive.log) and report.parse_hazards(found["arrive", "hazard"].log):
            break
    reports = report.parse_race_reports(arrive.log)
    summary = report.racecheck_summary(arrive.log)
    assert summary is not None and summary.displayed == len(reports), (
        f"parsed {len(reports)} reports, racecheck's summary says {summary}\n{arrive.tail()}"
    )
    return HandoverRacecheck(
        reports,
        report.parse_hazards(found["arrive", "hazard"].log),
        report.parse_race_reports(found["sync", "analysis"].log),
        attempt,
    )


@pytest.fixture(scope="module")
def handover_racecheck(
    handover: Path, sanitizer: str, tmp_path_factory: pytest.TempPathFactory
) -> HandoverRacecheck:
    return racecheck_handover(handover, sanitizer, tmp_path_factory.mktemp("handover-racecheck"))


def test_racecheck_reports_the_correct_named_barrier_handover(handover_racecheck: HandoverRacecheck) -> None:
    """The tool's side: racecheck reports shared-memory hazards on a handover that is correct (its output
    checks), between the producers' writes and the consumers' reads."""
    reports, hazards = handover_racecheck.reports, handover_racecheck.hazards
    assert reports, (
        f"racecheck reports nothing on the bar.arrive / bar.sync handover in {handover_racecheck.attempts} "
        f"processes of {HANDOVER_LAUNCHES} launches: it models named-barrier arrivals, so hazards it reports "
        "in the warp-specialised kernel are not explained by the tool"
    )
    assert all(r.kernels == {HANDOVER_KERNEL} for r in reports), "\n".join(map(str, reports))
    assert any(r.kinds == {"Read", "Write"} for r in reports), "\n".join(map(str, reports))
    assert hazards, (
        f"racecheck --racecheck-report hazard printed no hazard for the handover in "
        f"{handover_racecheck.attempts} processes of {HANDOVER_LAUNCHES} launches"
    )
    consumers = _handover_consumers()
    assert not report.outside(hazards, HANDOVER_KERNEL), "\n".join(map(str, hazards[:5]))
    one_role = [h for h in hazards if len({a.thread[0] >= consumers for a in h.accesses}) != 2]
    assert not one_role, "hazards between threads of one role:\n" + "\n".join(map(str, one_role[:10]))
    signatures = handover_racecheck.signatures
    assert signatures & report.HANDOVER_SIGNATURES, f"no producer-write / consumer-read hazard: {signatures}"
    if handover_racecheck.control_reports:
        # Informational: the same data flow with bar.sync on both sides reported too would mean racecheck
        # does not model these named barriers at all (still the tool's, but worth knowing).
        warnings.warn(
            "racecheck also reports the bar.sync-only handover: "
            + "; ".join(str(r).replace("\n", " ") for r in handover_racecheck.control_reports[:3]),
            stacklevel=1,
        )


def test_racecheck_reports_only_the_handover_kind(
    kernels: None, sanitizer: str, handover_racecheck: HandoverRacecheck, tmp_path: Path
) -> None:
    options = ["--racecheck-report", "analysis", "--print-limit", "0"]
    run = _sanitize(sanitizer, "racecheck", options, _driver_program(), tmp_path / "racecheck.log")
    _assert_every_case_ran(run)
    reports = report.parse_race_reports(run.log)
    summary = report.racecheck_summary(run.log)
    assert summary is not None and summary.displayed == len(reports), (
        f"parsed {len(reports)} reports, racecheck's summary says {summary}\n{run.tail()}"
    )
    outside = [r for r in reports if r.kernels != {WS_KERNEL}]
    assert not outside, "hazards outside the warp-specialised kernel:\n" + "\n".join(map(str, outside[:10]))
    not_rw = [r for r in reports if r.kinds != {"Read", "Write"}]
    assert not not_rw, "hazards other than Write/Read pairs:\n" + "\n".join(map(str, not_rw[:10]))
    if reports:
        handover_kinds = {r.kinds for r in handover_racecheck.reports}
        assert {r.kinds for r in reports} <= handover_kinds, (
            f"the warp-specialised kernel's hazards are {[sorted(r.kinds) for r in reports]}, the handover's "
            f"{[sorted(k) for k in handover_kinds]}"
        )


def _ws_cases(case_records: dict[str, dict[str, object]]) -> list[tuple[drv.SanCase, dict[str, object]]]:
    """The driver's cases that run the warp-specialised kernel, with their plan records."""
    return [(case, case_records[case.name]) for case in drv.CASES if case_records[case.name]["ws"]]


def test_racecheck_ws_hazards_pair_producer_writes_with_consumer_reads(
    case_records: dict[str, dict[str, object]],
    sanitizer: str,
    handover_racecheck: HandoverRacecheck,
    tmp_path: Path,
) -> None:
    """Hazard by hazard (thread indices): each is a RAW or WAR on shared memory in the warp-specialised
    kernel between a producer thread's write and a consumer thread's read, and of a kind racecheck also
    reports on the handover. The warp-specialised cases of the fewest CTAs with one split and with
    several; the first HAZARD_PRINT_LIMIT hazards of each."""
    ws = _ws_cases(case_records)
    assert ws, "no case runs the warp-specialised kernel"
    for split in (False, True):
        case, record = min((c for c in ws if c[1]["split"] == split), key=lambda c: int(c[1]["num_ctas"]))
        consumers = int(record["threads_per_cta"]) - drv.WS_PRODUCER_THREADS
        options = ["--racecheck-report", "hazard", "--print-limit", str(HAZARD_PRINT_LIMIT)]
        log = tmp_path / f"{case.name}.log"
        run = _sanitize(sanitizer, "racecheck", options, _driver_program(case.name), log)
        assert run.returncode == 0 and f"DONE {case.name}" in run.stdout, run.tail()
        hazards = report.parse_hazards(run.log)
        summary = report.racecheck_summary(run.log)
        assert summary is not None, run.tail()
        assert bool(hazards) == (summary.displayed > 0), (
            f"parsed {len(hazards)} hazards; {summary}\n{run.tail()}"
        )
        assert not report.outside(hazards, WS_KERNEL), f"{case.name}: hazards outside {WS_KERNEL}:\n" + (
            "\n".join(map(str, report.outside(hazards, WS_KERNEL)[:10]))
        )
        signatures = {report.hazard_signature(h, lambda x, c=consumers: x >= c) for h in hazards}
        handover = handover_racecheck.signatures
        assert signatures <= report.HANDOVER_SIGNATURES & handover, (
            f"{case.name}: hazards {sorted(signatures)}; expected only a producer's write against a "
            f"consumer's read ({sorted(report.HANDOVER_SIGNATURES)}) of the kinds racecheck reports on the "
            f"handover ({sorted(handover)})"
        )


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------
def test_ws_configurations_are_bitwise_deterministic(case_records: dict[str, dict[str, object]]) -> None:
    """The stress: each warp-specialised case STRESS_REPEATS times, the first call checked against the
    reference, every later one bitwise against the first (the driver's ``--repeat``)."""
    ws = [case.name for case, _ in _ws_cases(case_records)]
    assert ws, "no case runs the warp-specialised kernel"
    run = _run(_driver_program(*ws, repeat=STRESS_REPEATS))
    assert run.returncode == 0, run.tail()
    _, done = _driver_records(run)
    assert set(ws) <= done, f"the stress did not finish {sorted(set(ws) - done)}\n{run.tail()}"


@pytest.fixture(scope="module")
def early_release_library(kernels: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library built with the warp-specialised kernel's consumers releasing a K tile before they read
    it (:data:`tests.kernel_variant.EARLY_RELEASE`): a real producer-write / consumer-read race."""
    nvcc = _cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin)")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"
    work = tmp_path_factory.mktemp("early-release")
    src = kernel_variant.edited_copy(work / "csrc", kernel_variant.EARLY_RELEASE)
    library = work / _lib.LIBRARY_NAME
    kernel_variant.build_library(src, library, nvcc, arch)
    return library


def test_the_stress_catches_a_k_tile_released_before_it_is_read(
    case_records: dict[str, dict[str, object]], early_release_library: Path
) -> None:
    """Racecheck cannot tell this race from the correct handover (both are a producer's write against a
    consumer's read, docs/kernels.md); the stress must: the same command as the determinism test fails on
    the broken library, naming a warp-specialised case."""
    ws = [case.name for case, _ in _ws_cases(case_records)]
    run = _run(_driver_program(*ws, repeat=STRESS_REPEATS), library=early_release_library)
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED ")]
    assert run.returncode == 1 and failed, f"the stress passed a racy kernel\n{run.tail()}"
    assert failed[0].split()[1].rstrip(":") in ws, run.tail()
    print(failed[0])
