"""tests/gpu/sanitizer_report.py on sample compute-sanitizer output (no GPU).

The samples are written in the formats compute-sanitizer 2025.3 prints (the message pieces in its
binary: ``: Race reported between``, `` access at``, `` hazards]``, `` Potential``, `` hazard detected``,
`` at __shared__ 0x``, `` Thread (``, ``RACECHECK SUMMARY: ``, `` hazard``, `` displayed (``,
``ERROR SUMMARY: ``) and in published examples of its racecheck reports; they are not captured from a
GPU run.
"""

from __future__ import annotations

from tests.gpu import sanitizer_report as report

WS = "sparkseal::sparse_mla::sparse_mla_decode_ws_kernel<0, 32, 101376>(sparkseal::sparse_mla::KernelArgs)"
SINGLE = "void sparkseal::sparse_mla::sparse_mla_decode_kernel<0, 64, 64, 2, 232448>(KernelArgs)"

ANALYSIS = f"""\
========= COMPUTE-SANITIZER
CASE {{"name": "v4_fp8-bf16-h32-k512-s1-cap-lengths"}}
========= Error: Race reported between Write access at {WS}+0x7410
=========     and Read access at {WS}+0x15c0 [15360 hazards]
=========     and Read access at {WS}+0x2f90 [15104 hazards]
=========
========= Warning: Race reported between Read access at {WS}+0x1a20
=========     and Write access at {WS}+0x8f00 [512 hazards]
=========
DONE v4_fp8-bf16-h32-k512-s1-cap-lengths
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

OLD_ANALYSIS = """\
========= Error: Race reported between Write access at 0x00000278 in /u/task1.cu:113:MatMulKernel(Matrix)
=========     and Read access at 0x00000298 in /u/task1.cu:121:MatMulKernel(Matrix) [6144 hazards]
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

HANDOVER = "void named_barrier_handover_kernel<true>(unsigned int *)"

HAZARDS = f"""\
========= COMPUTE-SANITIZER
========= Error: Potential RAW hazard detected at __shared__ 0x40 in block (1, 0, 0) :
=========     Write Thread (70, 0, 0) at {HANDOVER}+0x1b0 in named_barrier_handover.cu:60
=========     Read Thread (3, 0, 0) at {HANDOVER}+0x2d0 in named_barrier_handover.cu:71
=========     Current Value : 0, Incoming Value : 100012
=========
========= Error: Potential WAR hazard detected at __shared__ 0x400 in block (0, 0, 0) :
=========     Read Thread (12, 0, 0) at {HANDOVER}+0x2d0 in named_barrier_handover.cu:71
=========     Write Thread (127, 0, 0) at {HANDOVER}+0x1b0 in named_barrier_handover.cu:60
=========     Current Value : 1009, Incoming Value : 3027
=========
========= Warning: Potential WAW hazard detected at __shared__ 0x8 in block (0, 0, 0) :
=========     Write Thread (5, 0, 0) at {HANDOVER}+0x100 in named_barrier_handover.cu:55
=========     Write Thread (66, 0, 0) at {HANDOVER}+0x1b0 in named_barrier_handover.cu:60
=========     Current Value : 0, Incoming Value : 1
=========
========= Error: Potential RAW hazard detected at __shared__ 0x80 in block (0, 0, 0) :
=========     Write Thread (4, 0, 0) at {HANDOVER}+0x100 in named_barrier_handover.cu:55
=========     Read Thread (9, 0, 0) at {HANDOVER}+0x2d0 in named_barrier_handover.cu:71
=========     Current Value : 0, Incoming Value : 1
=========
========= Error: Potential RAW hazard detected at __shared__ 0xc0 in block (0, 0, 0) :
=========     Write Thread (80, 0, 0) at {SINGLE}+0x100
=========     Read Thread (9, 0, 0) at {HANDOVER}+0x2d0 in named_barrier_handover.cu:71
=========     Current Value : 0, Incoming Value : 1
=========
========= RACECHECK SUMMARY: 5 hazards displayed (4 errors, 1 warning)
"""


def test_summaries() -> None:
    assert report.error_summary("========= ERROR SUMMARY: 0 errors\n") == 0
    assert report.error_summary("========= ERROR SUMMARY: 1 error\n") == 1
    assert report.error_summary("x\n========= ERROR SUMMARY: 3 errors\n=== ERROR SUMMARY: 17 errors\n") == 17
    assert report.error_summary("no summary: the tool did not finish\n") is None
    assert report.racecheck_summary(ANALYSIS) == report.RaceSummary(displayed=2, errors=1, warnings=1)
    assert report.racecheck_summary(OLD_ANALYSIS) == report.RaceSummary(displayed=1, errors=1, warnings=0)
    assert report.racecheck_summary(
        "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    ) == (report.RaceSummary(0, 0, 0))
    assert report.racecheck_summary("========= ERROR SUMMARY: 0 errors") is None


def test_kernel_names() -> None:
    assert report.kernel_name(WS) == "sparse_mla_decode_ws_kernel"
    assert report.kernel_name(SINGLE) == "sparse_mla_decode_kernel"
    assert report.kernel_name(HANDOVER) == "named_barrier_handover_kernel"
    assert report.kernel_name("MatMulKernel(Matrix)") == "MatMulKernel"
    assert report.kernel_name("p10_shared_memory_race_kernel") == "p10_shared_memory_race_kernel"


def test_locations_in_both_formats() -> None:
    assert report.parse_location("ka_race(int *)+0x90 in probe.cu:13") == report.Location(
        "ka_race(int *)", 0x90, "probe.cu:13"
    )
    assert report.parse_location(f"{WS}+0x7410") == report.Location(WS, 0x7410, None)
    assert report.parse_location("0x00000278 in /u/task1.cu:113:MatMulKernel(Matrix)") == (
        report.Location("MatMulKernel(Matrix)", 0x278, "/u/task1.cu:113")
    )
    assert report.parse_location("0x278 in MatMulKernel(Matrix)") == report.Location(
        "MatMulKernel(Matrix)", 0x278, None
    )
    assert report.parse_location("somewhere") == report.Location("somewhere", None, None)


def test_analysis_reports() -> None:
    reports = report.parse_race_reports(ANALYSIS)
    assert len(reports) == 2
    first, second = reports
    assert first.severity == "Error" and second.severity == "Warning"
    assert [a.kind for a in first.accesses] == ["Write", "Read", "Read"]
    assert [a.location.offset for a in first.accesses] == [0x7410, 0x15C0, 0x2F90]
    assert [a.hazards for a in first.accesses] == [None, 15360, 15104]
    assert first.hazards == 30464
    assert first.kinds == second.kinds == frozenset({"Read", "Write"})
    assert first.kernels == second.kernels == frozenset({"sparse_mla_decode_ws_kernel"})
    assert str(second).splitlines() == [
        f"Warning: Race reported between Read access at {WS}",
        f"    and Write access at {WS} [512 hazards]",
    ]
    (old,) = report.parse_race_reports(OLD_ANALYSIS)
    assert old.kernels == {"MatMulKernel"} and old.hazards == 6144
    assert [a.location.source for a in old.accesses] == ["/u/task1.cu:113", "/u/task1.cu:121"]
    assert report.parse_race_reports(HAZARDS) == []
    assert report.parse_race_reports("========= ERROR SUMMARY: 0 errors\n") == []


def test_hazard_reports() -> None:
    hazards = report.parse_hazards(HAZARDS)
    assert [h.type for h in hazards] == ["RAW", "WAR", "WAW", "RAW", "RAW"]
    assert [h.severity for h in hazards] == ["Error", "Error", "Warning", "Error", "Error"]
    first = hazards[0]
    assert first.space == "__shared__" and first.address == 0x40 and first.block == "1, 0, 0"
    assert [(a.kind, a.thread) for a in first.accesses] == [("Write", (70, 0, 0)), ("Read", (3, 0, 0))]
    assert first.accesses[1].location.source == "named_barrier_handover.cu:71"
    assert report.parse_hazards(ANALYSIS) == []


def test_hazard_signatures_name_the_type_the_space_and_each_access_by_role() -> None:
    hazards = report.parse_hazards(HAZARDS)
    signatures = [report.hazard_signature(h, lambda x: x >= 64) for h in hazards]
    assert signatures == [
        "RAW __shared__: Read by consumer, Write by producer",
        "WAR __shared__: Read by consumer, Write by producer",
        "WAW __shared__: Write by consumer, Write by producer",
        "RAW __shared__: Read by consumer, Write by consumer",
        "RAW __shared__: Read by consumer, Write by producer",
    ]
    assert set(signatures[:2]) == report.HANDOVER_SIGNATURES
    # another split of the threads: thread 70 is a consumer now
    assert report.hazard_signature(hazards[0], lambda x: x >= 100) == (
        "RAW __shared__: Read by consumer, Write by consumer"
    )
    assert report.outside(hazards, "named_barrier_handover_kernel") == [hazards[4]]
    assert report.outside(hazards[:4], "named_barrier_handover_kernel") == []
