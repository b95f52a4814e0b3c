"""The DSpark context-record probe (bench/vllm_backend/hooks/dspark_probe.py): V4 records, the watch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "vllm_backend" / "hooks"))
import dspark_probe  # noqa: E402

BLOCK = 64


def page_cache(pages: int, pad: int = 0) -> torch.Tensor:
    """A V4 fp8_ds_mla cache ``[pages, 64, 584]`` whose pages are ``pad`` bytes apart beyond 64 x 584."""
    stride = BLOCK * 584 + pad
    storage = torch.zeros(pages * stride, dtype=torch.uint8)
    return torch.as_strided(storage, (pages, BLOCK, 584), (stride, 584, 1))


def write_record(cache: torch.Tensor, slot: int, data: bytes, scale: bytes) -> None:
    """Write as vLLM's fused insert does: token data at offset*576, scales after the page's 64 x 576 bytes."""
    flat = cache.view(cache.shape[0], -1)
    page, off = divmod(slot, BLOCK)
    flat[page, off * 576 : off * 576 + 576] = torch.tensor(list(data), dtype=torch.uint8)
    start = BLOCK * 576 + off * 8
    flat[page, start : start + 8] = torch.tensor(list(scale), dtype=torch.uint8)


@pytest.mark.parametrize("pad", [0, 1024])
def test_a_record_is_read_from_the_page_layout_the_insert_writes(pad: int) -> None:
    cache = page_cache(3, pad)
    data = bytes(range(256)) + bytes(range(256)) + bytes(64)
    write_record(cache, 65, data, bytes([105] * 7 + [0]))
    got = dspark_probe.records(cache, torch.tensor([65, 64]))
    assert bytes(got[0].tolist()) == data + bytes([105] * 7 + [0])
    assert bytes(got[1].tolist()) == bytes(584)


def test_the_summary_tells_an_unwritten_record_with_a_nan_rope_from_a_written_one() -> None:
    broken = torch.tensor(list(bytes(448) + b"\xff\x7f" * 64 + bytes(8)), dtype=torch.uint8)
    summary = dspark_probe.summary(broken)
    assert summary == {
        "nope_zero": 448,
        "nope_fe": 0,
        "nope_nan": 0,
        "scale": [0] * 8,
        "rope_nan": 64,
        "rope_head": ["7fff"] * 4,
    }
    written = torch.tensor(list(b"\xfe" * 448 + b"\x80\x3f" * 64 + bytes([105] * 7 + [0])), dtype=torch.uint8)
    summary = dspark_probe.summary(written)
    assert (summary["nope_fe"], summary["rope_nan"], summary["scale"][0], summary["rope_head"][0]) == (
        448,
        0,
        105,
        "3f80",
    )


@pytest.fixture
def watching(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The probe's watch, run eagerly on CPU tensors with fresh counters."""
    monkeypatch.setattr(dspark_probe, "capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setitem(dspark_probe._state, "changes", 0)
    monkeypatch.setitem(dspark_probe._state, "freed", 0)
    return monkeypatch


def test_a_watched_record_changed_by_a_call_is_reported_with_that_call(capsys, watching) -> None:
    cache = page_cache(2)
    write_record(cache, 65, bytes([7]) * 576, bytes([105] * 7 + [0]))
    watching.setitem(
        dspark_probe._state,
        "watch",
        [
            {
                "layer": "model.layers.6.attn.swa_cache",
                "cache": cache,
                "slots": torch.tensor([65]),
                "positions": [65],
                "bytes": dspark_probe.records(cache, torch.tensor([65])).clone(),
            }
        ],
    )

    class Layer:
        prefix = "model.layers.2.attn"

        def forward(self) -> None:
            write_record(cache, 65, bytes(448) + b"\xff\x7f" * 64, bytes(8))

        def untouched(self) -> None:
            pass

    dspark_probe.wrap_method(Layer, "untouched", lambda self: f"other {self.prefix}")
    dspark_probe.wrap_method(Layer, "forward", lambda self: f"layer {self.prefix}")
    Layer().untouched()
    assert capsys.readouterr().err == ""
    Layer().forward()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[dspark-probe] ")]
    assert len(lines) == 1
    event = json.loads(lines[0].removeprefix("[dspark-probe] "))
    assert (event["kind"], event["where"], event["position"], event["slot"]) == (
        "changed",
        "layer model.layers.2.attn",
        65,
        65,
    )
    assert event["before"]["nope_zero"] == 0 and event["after"]["rope_nan"] == 64
    # Re-snapshotted: the same bytes are no news the second time.
    Layer().forward()
    assert capsys.readouterr().err == ""


def test_a_record_whose_block_was_freed_and_handed_on_is_dropped_not_reported(capsys, watching) -> None:
    cache = page_cache(4)
    write_record(cache, 65, bytes([7]) * 576, bytes([105] * 7 + [0]))
    monkeypatch = watching
    # The live block table of group 2 no longer holds block 1 (slot 65's block): it went to another group.
    tables = SimpleNamespace(input_block_tables={2: torch.tensor([[3, 0], [0, 0]], dtype=torch.int32)})
    monkeypatch.setitem(dspark_probe._state, "block_tables", tables)
    entry = {
        "layer": "model.layers.6.attn.swa_cache",
        "gid": 2,
        "block": BLOCK,
        "cache": cache,
        "slots": torch.tensor([65]),
        "positions": [65],
        "bytes": dspark_probe.records(cache, torch.tensor([65])).clone(),
    }
    monkeypatch.setitem(dspark_probe._state, "watch", [entry])
    write_record(cache, 65, bytes([9]) * 576, bytes([106] * 7 + [0]))
    dspark_probe.check_watch("K insert model.layers.7.attn")
    assert capsys.readouterr().err == ""
    assert dspark_probe._state["freed"] == 1
    # While the block is live, the same write is news.
    tables.input_block_tables[2][1, 0] = 1
    write_record(cache, 65, bytes([11]) * 576, bytes([106] * 7 + [0]))
    dspark_probe.check_watch("K insert model.layers.7.attn")
    assert '"kind": "changed", "where": "K insert model.layers.7.attn"' in capsys.readouterr().err


def test_rows_state_names_nan_and_all_zero_rows() -> None:
    tensor = torch.zeros(4, 2, 3)
    tensor[1, 0, 2] = float("nan")
    tensor[3, 1, 1] = -2.5
    assert dspark_probe.rows_state(tensor) == {"rows": 4, "nan_rows": [1], "zero_rows": 2, "absmax": 2.5}


def test_the_null_block_report_names_layers_whose_block_0_is_not_zero(capsys, monkeypatch) -> None:
    clean, dirty = torch.zeros(3, 4, 8), torch.zeros(3, 4, 8)
    dirty[0, 1, 2] = float("nan")
    dirty[2, 0, 0] = 1.0  # a live block: not the null block's business
    layers = {
        "model.layers.0.attn.swa_cache": SimpleNamespace(kv_cache=clean),
        "model.layers.6.attn.swa_cache": SimpleNamespace(kv_cache=dirty),
        "model.layers.1.attn": SimpleNamespace(kv_cache=torch.tensor([])),
    }
    config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=layers))
    monkeypatch.setitem(dspark_probe._state, "vllm_config", config)
    dspark_probe.null_block_report("after warm-up")
    event = json.loads(capsys.readouterr().err.removeprefix("[dspark-probe] "))
    # One float32 NaN (0x7fc00000) is four bytes, two of them non-zero.
    assert event == {
        "kind": "null-block",
        "where": "after warm-up",
        "layers": 2,
        "dirty": {"model.layers.6.attn.swa_cache": 2},
    }
