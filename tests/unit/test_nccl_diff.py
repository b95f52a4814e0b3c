"""`sparkseal nccl-diff` on real NCCL 2.28.9 logs (tests/fixtures/nccl) and on variants made from them.

The parser of one log: test_nccl.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.audit import nccl_diff as nd
from sparkseal.core import nccl
from tests.unit.test_nccl import EQUAL, FIXTURES, REPO

DIVERGENT = [FIXTURES / "divergent.rank0.log", FIXTURES / "divergent.rank1.log"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "nccl-diff", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_equal_run_has_identical_sequences() -> None:
    done = _cli(*map(str, EQUAL))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "2 ranks, 5 collectives each, identical sequences",
        f"rank 0 ({EQUAL[0]}): 1 send/recv records not compared",
        f"rank 1 ({EQUAL[1]}): 1 send/recv records not compared",
    ]


def test_divergent_run_reports_the_skipped_broadcast() -> None:
    done = _cli(*map(str, DIVERGENT), "--context", "1")
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        "divergence at collective #2 (differs in: op, count, datatype)",
        f"rank 0 ({DIVERGENT[0]}): 5 collectives",
        "    #1 line 3: AllGather opCount 0 count 1024 float32 sum root 0 nranks 2 comm#0",
        "  > #2 line 4: Broadcast opCount 0 count 512 float16 sum root 0 nranks 2 comm#0",
        "    #3 line 5: ReduceScatter opCount 0 count 1024 float32 sum root 0 nranks 2 comm#0",
        f"rank 1 ({DIVERGENT[1]}): 4 collectives",
        "    #1 line 3: AllGather opCount 0 count 1024 float32 sum root 0 nranks 2 comm#0",
        "  > #2 line 4: ReduceScatter opCount 0 count 1024 float32 sum root 0 nranks 2 comm#0",
        "    #3 line 5: AllReduce opCount 0 count 256 bfloat16 max root 0 nranks 2 comm#0",
    ]


def test_divergence_as_json() -> None:
    done = _cli(*map(str, DIVERGENT), "--json", "--context", "2")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["equal"] is False
    assert report["divergence"] == {"index": 2, "fields": ["op", "count", "datatype"]}
    rank1 = report["ranks"][1]
    assert (rank1["log"], rank1["collectives"], rank1["p2p"]) == (str(DIVERGENT[1]), 4, 0)
    assert [c["index"] for c in rank1["context"]] == [0, 1, 2, 3, 4]
    assert rank1["context"][4] == {"index": 4, "record": None}
    assert rank1["context"][2]["record"]["op"] == "ReduceScatter"


def _variant(tmp_path: Path, source: Path, name: str, edit: dict[str, str]) -> Path:
    text = source.read_text()
    for old, new in edit.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def test_pointers_hosts_pids_and_timestamps_are_ignored(tmp_path: Path) -> None:
    rank1 = _variant(
        tmp_path,
        EQUAL[1],
        "rank1.log",
        {
            "vm:641:641 [1]": "[2026-11-30 00:36:28] node-b:9:12 [5]",
            "0x7fc752c0": "0x11112222",
            "0x1f5b6cc0": "0xbeef",
        },
    )
    result = nd.diff_logs([EQUAL[0], rank1])
    assert result.divergence is None
    assert len(result.logs[1].collectives) == 5


def test_opcount_is_hexadecimal_and_compared(tmp_path: Path) -> None:
    rank1 = _variant(
        tmp_path, EQUAL[1], "rank1.log", {"ReduceScatter: opCount 0": "ReduceScatter: opCount 1a"}
    )
    result = nd.diff_logs([EQUAL[0], rank1])
    assert result.divergence == nccl.Divergence(3, ("op_count",))
    assert result.logs[1].collectives[3].record.op_count == 26
    assert "ReduceScatter opCount 1a count 1024" in nd.render(result, as_json=False)


def test_communicators_are_numbered_by_first_appearance(tmp_path: Path) -> None:
    lines = EQUAL[0].read_text().splitlines()
    second_comm = lines[4].replace("comm 0xf879e60", "comm 0xabc")
    log = tmp_path / "two_comms.log"
    log.write_text("\n".join([*lines[:4], second_comm, *lines[5:]]) + "\n")
    assert [e.record.comm for e in nccl.parse_log(log).collectives] == [0, 0, 0, 1, 0]
    assert nd.diff_logs([EQUAL[0], log]).divergence == nccl.Divergence(3, ("comm",))


def test_a_rank_whose_log_ends_early(tmp_path: Path) -> None:
    short = tmp_path / "short.log"
    short.write_text("".join(EQUAL[1].read_text().splitlines(keepends=True)[:4]))
    result = nd.diff_logs([EQUAL[0], short, EQUAL[1]], context=0)
    assert result.divergence == nccl.Divergence(3, ("missing",))
    assert nd.render(result, as_json=False).splitlines() == [
        "divergence at collective #3 (differs in: missing)",
        f"rank 0 ({EQUAL[0]}): 5 collectives",
        "  > #3 line 5: ReduceScatter opCount 0 count 1024 float32 sum root 0 nranks 2 comm#0",
        f"rank 1 ({short}): 3 collectives",
        "  > #3 (no record: the log ends here)",
        f"rank 2 ({EQUAL[1]}): 5 collectives",
        "  > #3 line 5: ReduceScatter opCount 0 count 1024 float32 sum root 0 nranks 2 comm#0",
    ]


def test_errors(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.log"
    mixed.write_text(EQUAL[0].read_text() + EQUAL[1].read_text())
    with pytest.raises(nd.NcclLogError) as error:
        nd.diff_logs([mixed, EQUAL[1]])
    assert str(error.value) == (
        f"{mixed}: expected the lines of one process, found pids 640, 641 "
        "(write one log per rank, e.g. NCCL_DEBUG_FILE=DIR/rank.%h.%p.log)"
    )
    empty = tmp_path / "empty.log"
    empty.write_text("vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
    with pytest.raises(nd.NcclLogError) as error:
        nd.diff_logs([empty, empty])
    assert str(error.value) == (
        f"no collective records in {empty}, {empty}: "
        "were they written with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL?"
    )
    absent = tmp_path / "absent.log"
    with pytest.raises(nd.NcclLogError, match=f"^{absent}: cannot read the log: No such file or directory$"):
        nd.diff_logs([absent, EQUAL[1]])
    with pytest.raises(nd.NcclLogError, match=r"^--context -1: expected 0 or more records$"):
        nd.diff_logs(EQUAL, context=-1)


def test_cli_usage_errors(tmp_path: Path) -> None:
    one = _cli(str(EQUAL[0]))
    assert one.returncode == 2
    assert "expected the logs of two or more ranks, got 1" in one.stderr
    missing = _cli(str(EQUAL[0]), str(tmp_path / "none.log"))
    assert missing.returncode == 2
    assert f"{tmp_path / 'none.log'}: cannot read the log" in missing.stderr
    helped = _cli("--help")
    assert helped.returncode == 0 and "NCCL_DEBUG_SUBSYS=COLL" in helped.stdout
