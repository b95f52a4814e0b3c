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


@pytest.mark.parametrize(
    ("tokens", "hidden", "covers"),
    [
        (1, 512, False),  # the test model: 8 splits of 64, none a whole stride of 256 threads
        (6, 512, False),  # a verification step of 1 + 5 draft tokens
        (16, 512, False),  # V4's mixed warm-up step
        (17, 512, None),  # more than 16 tokens: the separate post and pre kernels
        (48, 512, None),  # the generic warm-up's decode step
        (6, 4096, True),  # DeepSeek V4's hidden size
        (12, 4096, True),
        (6, 7168, True),  # 4 splits above 4096
        (6, 2048, True),
        (6, 1024, False),
    ],
)
def test_the_small_mhc_kernel_covers_v4s_hidden_sizes_and_not_the_test_models(
    tokens: int, hidden: int, covers: bool | None
) -> None:
    assert dspark_probe.small_fma_covers(tokens, hidden) is covers


def mhc_inputs(tokens: int, hc: int = 4, hidden: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    residual = torch.randn(tokens, hc, hidden, generator=gen).to(torch.bfloat16)
    post_mix = torch.rand(tokens, hc, 1, generator=gen)
    comb_mix = torch.rand(tokens, hc, hc, generator=gen)
    return x, residual, post_mix, comb_mix


def fake_post(x, residual, post_mix, comb_mix):  # what vLLM's mhc_post computes, in bf16
    return dspark_probe.mhc_post_reference(x, residual, post_mix, comb_mix).to(torch.bfloat16)


def fake_pre(residual, *args, norm_weight=None, norm_eps=1e-6):
    tokens, hc, _ = residual.shape
    return torch.ones(tokens, hc, 1), torch.eye(hc).expand(tokens, hc, hc), residual.sum(dim=1)


def test_the_mhc_reference_is_comb_transposed_times_the_streams_plus_post_times_x() -> None:
    x, residual, post_mix, comb_mix = mhc_inputs(3, hc=2, hidden=4)
    got = dspark_probe.mhc_post_reference(x, residual, post_mix, comb_mix)
    for t in range(3):
        for j in range(2):
            want = (
                sum(comb_mix[t, i, j] * residual[t, i].float() for i in range(2))
                + post_mix[t, j] * x[t].float()
            )
            assert torch.allclose(got[t, j], want)


def test_an_inherited_nan_row_is_not_a_difference_and_a_new_one_is() -> None:
    want = torch.ones(4, 3)
    want[1, 0] = float("nan")
    got = want.clone()
    got[2, 1] = float("nan")
    got[3] *= 1.01  # within the 2% tolerance
    found = dspark_probe.residual_mismatch(got, want)
    assert (found["differ_rows"], found["ref_nan_rows"], found["ref_absmax"]) == ([2], [1], 1.0)


def test_unfused_runs_post_then_pre_on_posts_result_with_the_norm() -> None:
    x, residual, post_mix, comb_mix = mhc_inputs(2)
    seen = {}

    def pre(residual_cur, *args, norm_weight=None, norm_eps=1e-6):
        seen.update(residual=residual_cur, args=args, norm_weight=norm_weight, norm_eps=norm_eps)
        return fake_pre(residual_cur)

    out = dspark_probe.unfused_post_pre(
        fake_post, pre, x, residual, post_mix, comb_mix, "fn", "scale", "base", 1e-6, 2e-6, 3e-6, 2.0, 20,
        n_splits=1, tile_n=1, norm_weight="w", norm_eps=1e-5,
    )  # fmt: skip
    assert torch.equal(out[0], fake_post(x, residual, post_mix, comb_mix))
    assert seen["residual"] is out[0]
    assert seen["args"] == ("fn", "scale", "base", 1e-6, 2e-6, 3e-6, 2.0, 20)
    assert (seen["norm_weight"], seen["norm_eps"]) == ("w", 1e-5)
    assert torch.equal(out[3], out[0].sum(dim=1))


@pytest.fixture
def mhc_state(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    for key, value in {
        "mhc_bad": 0,
        "mhc_clean": 0,
        "mhc_clean_sizes": set(),
        "mhc_tally": {},
        "phase": "real",
        "forwards": 1,
        "layer": "model.layers.2",
        "mhc_parts": ["attn", "ffn"],
        "unfused_said": False,
    }.items():
        monkeypatch.setitem(dspark_probe._state, key, value)
    return monkeypatch


def unwritten_residual_fused(x, residual, post_mix, comb_mix, *args, **kwargs):
    """The small kernel at hidden 512: the new residual is what its fresh buffer held (here NaN in row 1)."""
    residual_cur = torch.zeros_like(residual)
    residual_cur[1] = float("nan")
    return residual_cur, post_mix, comb_mix, residual_cur.sum(dim=1)


def mhc_events(capsys) -> list[dict]:
    return [
        json.loads(line.removeprefix("[dspark-probe] "))
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("[dspark-probe] ")
    ]


def test_the_check_names_a_fused_step_that_left_the_residual_unwritten(capsys, mhc_state) -> None:
    step = dspark_probe.mhc_step(unwritten_residual_fused, None, check=True)
    x, residual, post_mix, comb_mix = mhc_inputs(6, hidden=512)
    step(x, residual, post_mix, comb_mix, "fn", "scale", "base", 1e-6, 1e-6, 1e-6, 2.0, 20)
    (event,) = mhc_events(capsys)
    assert event["kind"] == "mhc"
    assert (event["layer"], event["part"], event["tokens"], event["small"], event["covers"]) == (
        "model.layers.2",
        "attn",
        6,
        True,
        False,
    )
    assert event["differ_rows"] == [0, 1, 2, 3, 4, 5]
    assert event["layer_input_nan_rows"] == [1]
    assert event["residual_in_nan_rows"] == []
    dspark_probe.mhc_tally("draft step 1")
    (tally,) = mhc_events(capsys)
    assert tally["calls"] == {"6 tokens bad": 1}


def test_the_unfused_switch_replaces_only_steps_the_small_kernel_would_not_cover(capsys, mhc_state) -> None:
    calls = []

    def fused(*args, **kwargs):
        calls.append(args[1].shape[0])
        return fake_post(*args[:4]), *fake_pre(fake_post(*args[:4]))

    step = dspark_probe.mhc_step(fused, (fake_post, fake_pre), check=True)
    for tokens, hidden in ((6, 512), (6, 4096), (20, 512)):
        mhc_state.setitem(dspark_probe._state, "mhc_parts", ["ffn"])
        x, residual, post_mix, comb_mix = mhc_inputs(tokens, hidden=hidden)
        step(
            x,
            residual,
            post_mix,
            comb_mix,
            "fn",
            "scale",
            "base",
            1e-6,
            1e-6,
            1e-6,
            2.0,
            20,
            norm_weight=None,
        )
    assert calls == [6, 20]  # hidden 4096 is covered; 20 tokens take vLLM's separate kernels anyway
    events = mhc_events(capsys)
    assert events[0] == {"kind": "mhc-unfused", "tokens": 6, "hidden": 512}
    checks = [e for e in events if e["kind"] == "mhc"]
    assert [(e["tokens"], e["hidden"], e["unfused"], e["differ_rows"]) for e in checks] == [
        (6, 512, True, []),
        (20, 512, False, []),
    ]  # the second 6-token step is clean and of a size already shown


def test_the_metadata_summary_gives_each_kinds_split_once() -> None:
    swa = SimpleNamespace(
        num_decodes=1,
        num_prefills=0,
        num_decode_tokens=6,
        num_prefill_tokens=0,
        block_size=64,
        query_start_loc_cpu=torch.tensor([0, 6]),
        seq_lens=torch.tensor([72]),
    )

    class DeepseekSparseSWAMetadata(SimpleNamespace):
        pass

    class CompressorMetadata(SimpleNamespace):
        pass

    summary = dspark_probe.metadata_summary(
        {
            "model.layers.0.attn.swa_cache": DeepseekSparseSWAMetadata(**vars(swa)),
            "model.layers.1.attn.swa_cache": DeepseekSparseSWAMetadata(**vars(swa)),
            "model.layers.1.attn.compressor.state_cache": CompressorMetadata(block_size=8),
        }
    )
    assert summary == {
        "DeepseekSparseSWAMetadata": {
            "layers": 2,
            "first": "model.layers.0.attn.swa_cache",
            "num_decodes": 1,
            "num_prefills": 0,
            "num_decode_tokens": 6,
            "num_prefill_tokens": 0,
            "block_size": 64,
            "query_start_loc_cpu": [0, 6],
            "seq_lens": [72],
        },
        "CompressorMetadata": {
            "layers": 1,
            "first": "model.layers.1.attn.compressor.state_cache",
            "block_size": 8,
        },
    }
    assert dspark_probe.metadata_summary(None) == {"kind": "NoneType"}
