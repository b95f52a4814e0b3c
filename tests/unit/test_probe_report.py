"""bench/vllm_backend/probe_report.py: the probe's log lines as tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "vllm_backend"))
import probe_report

WRITTEN = {
    "nope_zero": 3,
    "nope_fe": 0,
    "nope_nan": 0,
    "scale": [105] * 7 + [0],
    "rope_nan": 0,
    "rope_head": ["3f80"] * 4,
}
BROKEN = {
    "nope_zero": 448,
    "nope_fe": 0,
    "nope_nan": 0,
    "scale": [0] * 8,
    "rope_nan": 64,
    "rope_head": ["7fff"] * 4,
}


def line(kind: str, **fields: object) -> str:
    return "(EngineCore pid=1) [dspark-probe] " + json.dumps({"kind": kind, **fields})


def test_a_record_that_was_never_written_and_one_overwritten_are_named(tmp_path: Path) -> None:
    row = {
        "req": 0,
        "row": 65,
        "position": 65,
        "target_position": 65,
        "slot": 129,
        "kernel_slot": 129,
        "read": 193,
        "before": None,
        "inserted": WRITTEN,
        "after_draft": WRITTEN,
        "read_record": BROKEN,
    }
    log = tmp_path / "server.log"
    log.write_text(
        "\n".join(
            [
                "INFO unrelated",
                line(
                    "context",
                    step=1,
                    layer="model.layers.6.attn.swa_cache",
                    gid=2,
                    block_size=64,
                    kernel_block_size=64,
                    block_table_rows=[[1, 2]],
                    seq_lens=[71],
                    rows=[row],
                ),
                line(
                    "changed",
                    step=1,
                    check=4,
                    where="decode model.layers.2.attn (ours)",
                    layer="model.layers.6.attn.swa_cache",
                    position=65,
                    slot=129,
                    before=WRITTEN,
                    after=BROKEN,
                ),
                "[dspark-probe] {not json",
            ]
        )
        + "\n"
    )
    text = "\n".join(probe_report.report(log))
    assert (
        "  req 0 pos 65 (target 65): slot 129 kernel 129 read 193 | before - | inserted ok (scale 105) | "
        "after draft ok (scale 105) | read record scale 00, NoPE 00, RoPE NaN x64 (7fff)"
    ) in text
    assert (
        "CHANGED step 1 check 4 in decode model.layers.2.attn (ours): model.layers.6.attn.swa_cache pos 65 "
        "slot 129: ok (scale 105) -> scale 00, NoPE 00, RoPE NaN x64 (7fff)"
    ) in text
    assert "unreadable:" in text


def test_a_missing_log_is_named(tmp_path: Path, capsys) -> None:
    assert probe_report.main([str(tmp_path / "absent.log")]) == 2
    assert capsys.readouterr().err == f"probe_report: no such log: {tmp_path / 'absent.log'}\n"


def test_the_combine_step_and_a_target_op_are_shown_op_by_op(tmp_path: Path) -> None:
    zero = {"rows": 2, "nan_rows": [], "zero_rows": 2, "absmax": 0.0}
    nan = {"rows": 2, "nan_rows": [0], "zero_rows": 1, "absmax": 0.0}
    log = tmp_path / "server.log"
    log.write_text(
        line("combine", step=1, tokens=2, aux=[zero, zero], main_proj=nan, main_norm=nan)
        + "\n"
        + line("target", where="model.layers.2 output", proposes=0, **nan)
        + "\n"
    )
    assert probe_report.report(log)[1:] == [
        "combine step 1 (2 tokens): aux 0: 2 rows, NaN rows [], 2 all-zero, max 0; aux 1: 2 rows, "
        "NaN rows [], 2 all-zero, max 0; main_proj: 2 rows, NaN rows [0], 1 all-zero, max 0; main_norm: "
        "2 rows, NaN rows [0], 1 all-zero, max 0",
        "TARGET after 0 draft steps, model.layers.2 output: 2 rows, NaN rows [0], 1 all-zero, max 0",
    ]


def test_an_mhc_step_its_tally_and_a_steps_metadata_are_shown(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    bad = {
        "phase": "real",
        "forward": 2,
        "layer": "model.layers.2",
        "part": "ffn",
        "tokens": 6,
        "hidden": 512,
        "small": True,
        "covers": False,
        "unfused": False,
        "x_nan_rows": [],
        "residual_in_nan_rows": [],
        "layer_input_nan_rows": [3, 4],
        "differ_rows": [0, 1, 2, 3, 4, 5],
        "ref_nan_rows": [],
        "max_rel": 1e30,
        "ref_absmax": 2e-8,
    }
    kinds = {
        "DeepseekSparseSWAMetadata": {
            "layers": 9,
            "first": "model.layers.0.attn.swa_cache",
            "num_decodes": 1,
            "num_prefills": 0,
            "num_decode_tokens": 6,
            "num_prefill_tokens": 0,
            "block_size": 64,
            "query_start_loc_cpu": [0, 6],
            "seq_lens": [72],
        },
        "CompressorMetadata": {"layers": 4, "first": "model.layers.1.attn.compressor.state_cache"},
    }
    log.write_text(
        line("mhc", **bad)
        + "\n"
        + line(
            "mhc",
            **{**bad, "small": False, "covers": None, "tokens": 66, "differ_rows": [], "max_rel": 0.004},
        )
        + "\n"
        + line(
            "mhc-tally", where="draft step 1", phase="real", calls={"6 tokens bad": 11, "66 tokens clean": 11}
        )
        + "\n"
        + line("metadata", forward=2, tokens=6, positions=[66, 67], input_ids=[5, 977], kinds=kinds)
        + "\n"
    )
    assert probe_report.report(log)[1:] == [
        "MHC real forward 2 model.layers.2 ffn: 6 tokens, hidden 512 (small kernel, does NOT cover the "
        "hidden size): residual differs in rows [0, 1, 2, 3, 4, 5] (max relative 1e+30 of 2e-08), "
        "reference NaN rows [], next input NaN rows [3, 4]",
        "MHC real forward 2 model.layers.2 ffn: 66 tokens, hidden 512 (separate post and pre kernels): "
        "residual differs in rows [] (max relative 0.004 of 2e-08), reference NaN rows [], next input NaN "
        "rows [3, 4]",
        "mhc tally draft step 1 (real): 6 tokens bad x11, 66 tokens clean x11",
        "metadata forward 2 (6 tokens, positions [66, 67], input ids [5, 977]): "
        "DeepseekSparseSWAMetadata x9: decodes 1 (6 tokens), prefills 0 (0 tokens), query_start_loc_cpu "
        "[0, 6], seq_lens [72], block_size 64; CompressorMetadata x4:",
    ]
