"""Parsing real NCCL 2.28.9 logs (tests/fixtures/nccl) into records, and which rank wrote a log.

Comparing the ranks' sequences, and `sparkseal nccl-diff`: test_nccl_diff.py.
"""

from __future__ import annotations

from pathlib import Path

from sparkseal.core import nccl

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nccl"
EQUAL = [FIXTURES / "equal.rank0.log", FIXTURES / "equal.rank1.log"]


def test_real_log_records_are_normalised() -> None:
    log = nccl.parse_log(EQUAL[0])
    assert [e.line for e in log.collectives] == [2, 3, 4, 5, 6]
    assert log.collectives[4].record == nccl.Record(
        op="AllReduce", op_count=0, count=256, datatype=9, reduction=2, root=0, nranks=2, comm=0
    )
    assert (
        log.collectives[4].record.describe()
        == "AllReduce opCount 0 count 256 bfloat16 max root 0 nranks 2 comm#0"
    )
    assert [e.record.op for e in log.collectives] == [
        "AllReduce",
        "AllGather",
        "Broadcast",
        "ReduceScatter",
        "AllReduce",
    ]
    assert (log.p2p, nccl.parse_log(EQUAL[1]).p2p) == (1, 1)  # rank 0's Send, rank 1's Recv


def test_rank_comes_from_init_complete_else_from_the_cuda_device(tmp_path: Path):
    assert [nccl.parse_log(path).position for path in EQUAL] == [0, 1]  # COLL only: the device
    assert nccl.parse_log(EQUAL[1]).rank is None
    log = tmp_path / "worker.log"
    log.write_text(
        "vm:700:700 [0] NCCL INFO ncclCommInitRankConfig comm 0x5580 rank 1 nranks 2 cudaDev 0 nvmlDev 0 "
        "busId 6000 commId 0x1d2f - Init COMPLETE\n"
        + EQUAL[1].read_text().replace("vm:641:641 [1]", "vm:700:700 [0]")
    )
    parsed = nccl.parse_log(log)
    assert (parsed.rank, parsed.device, parsed.position) == (1, 0, 1)
