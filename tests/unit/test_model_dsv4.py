"""The tiny DeepSeek V4 target and its DSpark draft (bench/vllm_backend/model_dsv4.py), on CPU, without vLLM.

vLLM 0.25.1 builds V4's DSpark draft (``vllm/models/deepseek_v4/nvidia/dspark.py``) from two
configurations: its V4 decoder layers from the target's (they are built under the target's model config),
the rest from the draft's. These tests hold the draft configuration to the target's for every key both
read, to the values the DSpark keys must have for vLLM's checks (``vllm/config/speculative.py``) and
for our kernel, and the serving command to the speculative config that puts the draft's layers on our
class. The last test reads the locked vLLM source for the keys and lines these rules rest on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model_dsv4 = _load("bench_model_dsv4", REPO / "bench/vllm_backend/model_dsv4.py")
serve = _load("bench_live_serve", REPO / "bench/live/serve.py")

DSPARK_KEYS = {
    "n_mtp_layers": 3,
    "dspark_target_layer_ids": [3, 4, 5],
    "dspark_markov_rank": 32,
    "dspark_noise_token_id": 4095,
    "dspark_block_size": 5,
}


@pytest.fixture
def written(tmp_path: Path) -> tuple[dict, dict]:
    paths = model_dsv4.write(tmp_path, heads=16, topk=512, dspark=True)
    assert paths == [tmp_path / "target" / "config.json", tmp_path / "draft" / "config.json"]
    return json.loads(paths[0].read_text()), json.loads(paths[1].read_text())


def test_the_draft_is_the_target_configuration_plus_dsparks_keys(written: tuple[dict, dict]) -> None:
    target, draft = written
    assert set(draft) - set(target) == set(DSPARK_KEYS)
    assert {key: draft[key] for key in DSPARK_KEYS} == DSPARK_KEYS
    # vLLM replaces architectures by DSparkDraftModel only for a deepseek_v4 draft configuration.
    assert draft["architectures"] == ["DeepseekV4ForCausalLM"] and draft["model_type"] == "deepseek_v4"
    # The one target key that differs: vLLM's n_predict (see the next test); the target has no MTP layer.
    assert (target["num_nextn_predict_layers"], draft["num_nextn_predict_layers"]) == (0, 1)
    assert {key: value for key, value in draft.items() if key not in DSPARK_KEYS} == {
        **target,
        "num_nextn_predict_layers": 1,
    }


def test_keys_both_configurations_are_read_for_agree(written: tuple[dict, dict]) -> None:
    target, draft = written
    # dspark.py reads these from the draft; the draft's layers read them (and the rest) from the target.
    read_by_the_draft = {
        "hidden_size": 512,
        "vocab_size": 4096,
        "hc_mult": 4,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "num_hidden_layers": 6,
        "num_attention_heads": 16,
        "n_routed_experts": 8,
        "expert_dtype": "fp8",
    }
    assert {key: target[key] for key in read_by_the_draft} == read_by_the_draft
    assert {key: draft[key] for key in read_by_the_draft} == read_by_the_draft
    assert draft["quantization_config"] == target["quantization_config"]


def test_the_draft_passes_vllms_checks(written: tuple[dict, dict]) -> None:
    target, draft = written
    layers = target["num_hidden_layers"]
    # The draft's layers are named layers.{num_hidden_layers + i}: after the target's 0..5, no duplicate.
    draft_layers = [draft["num_hidden_layers"] + i for i in range(draft["n_mtp_layers"])]
    assert draft_layers == [6, 7, 8]
    assert set(draft_layers).isdisjoint(range(layers))
    # Layer ids >= num_hidden_layers get compress ratio 1 (attention.py): window-only draft layers.
    assert all(i >= len(target["compress_ratios"]) for i in draft_layers)
    # The target taps the output of layer i for each id (eagle3_utils.py adds 1; the last is the output).
    taps = [i + 1 for i in draft["dspark_target_layer_ids"]]
    assert taps == [4, 5, 6] and max(taps) <= layers
    # main_proj: the tapped states side by side, block-fp8 (128 x 128) like every linear of the target.
    block = target["quantization_config"]["weight_block_size"]
    main_proj = (draft["hidden_size"] * len(taps), draft["hidden_size"])
    assert main_proj == (1536, 512) and main_proj[0] % block[1] == 0 and main_proj[1] % block[0] == 0
    # vLLM's n_predict rule: num_speculative_tokens at most n_predict or a multiple of it.
    tokens, n_predict = serve.NUM_SPECULATIVE_TOKENS, draft["num_nextn_predict_layers"]
    assert (tokens, n_predict) == (5, 1)
    assert n_predict > 0 and (tokens <= n_predict or tokens % n_predict == 0)
    assert draft["dspark_block_size"] == tokens
    # The block's noise token: a real id, not bos/eos, never drawn by live-check's prompts (100..999).
    noise = draft["dspark_noise_token_id"]
    assert noise == draft["vocab_size"] - 1
    assert noise not in (target["bos_token_id"], target["eos_token_id"]) and not 100 <= noise < 1000
    # A draft row attends the window and the whole block (sparse_swa.py rounds it up to 128 entries);
    # our kernel reads index rows in 64-entry tiles.
    width = math.ceil((target["sliding_window"] + tokens) / 128) * 128
    assert width == 256 and width % 64 == 0


def test_the_target_does_not_change_with_the_draft(tmp_path: Path) -> None:
    [alone] = model_dsv4.write(tmp_path / "alone", heads=16, topk=512)
    [with_draft, _] = model_dsv4.write(tmp_path / "pair", heads=16, topk=512, dspark=True)
    assert alone.read_bytes() == with_draft.read_bytes()
    assert not (tmp_path / "alone" / "draft").exists()


def _speculative(dspark: bool, draft_attention_backend: str | None = None) -> dict | None:
    """The speculative config ``bench/live/serve.py`` passes to ``vllm serve``, or None."""
    args = argparse.Namespace(
        model_dir=Path("/m"),
        load_format="dummy",
        port=8000,
        max_model_len=4096,
        max_num_seqs=8,
        tensor_parallel_size=1,
        vllm_arg=["--attention-backend", "CUSTOM"],
        dspark=dspark,
        draft_sample_method=None,
        draft_attention_backend=draft_attention_backend,
    )
    command = serve.serve_command(args)
    if "--speculative-config" not in command:
        return None
    return json.loads(command[command.index("--speculative-config") + 1])


def test_the_draft_is_served_on_our_class_only_when_asked() -> None:
    # --attention-backend CUSTOM alone leaves the draft to vLLM's choice (FlashMLA's class on an H200).
    assert _speculative(dspark=False) is None
    assert _speculative(dspark=True) == {"method": "dspark", "model": "/m/draft", "num_speculative_tokens": 5}
    assert _speculative(dspark=True, draft_attention_backend="CUSTOM") == {
        "method": "dspark",
        "model": "/m/draft",
        "num_speculative_tokens": 5,
        "attention_backend": "CUSTOM",
    }


# (file under vllm/, text that must be in it): what the rules above rest on, in vLLM v0.25.1.
VLLM_SOURCE = [
    (
        "models/deepseek_v4/nvidia/dspark.py",
        "config = vllm_config.speculative_config.draft_model_config.hf_config",
    ),
    ("models/deepseek_v4/nvidia/dspark.py", "self.target_layer_ids = tuple(config.dspark_target_layer_ids)"),
    ("models/deepseek_v4/nvidia/dspark.py", 'getattr(config, "n_mtp_layers", None) or 3'),
    (
        "models/deepseek_v4/nvidia/dspark.py",
        'prefix=maybe_prefix(prefix, f"layers.{self.num_hidden_layers + i}")',
    ),
    ("models/deepseek_v4/nvidia/dspark.py", "config.dspark_markov_rank,"),
    ("models/deepseek_v4/nvidia/dspark.py", "current_vllm_config = get_current_vllm_config()"),
    ("models/deepseek_v4/attention.py", "if layer_id < config.num_hidden_layers:"),
    ("v1/worker/gpu/spec_decode/utils.py", "return int(hf_config.dspark_noise_token_id)"),
    ("v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", "layer_ids = [i + 1 for i in dspark_layer_ids]"),
    ("v1/worker/gpu/spec_decode/dspark/utils.py", "backend=speculative_config.attention_backend,"),
    ("config/speculative.py", '"DSparkDraftModel"'),
    ("config/speculative.py", "self.num_speculative_tokens % n_predict != 0"),
    (
        "v1/attention/backends/mla/sparse_swa.py",
        "cdiv(self.window_size + self.num_speculative_tokens, 128) * 128",
    ),
    # The fused mHC kernel's coverage (fused_mhc_uncovered): steps of at most 16 tokens, split 8 or 4,
    # 256 threads each taking (hidden // split) // 256 elements.
    ("model_executor/kernels/mhc/tilelang.py", "use_small_fma = num_tokens <= 16"),
    (
        "model_executor/kernels/mhc/tilelang.py",
        "n_splits = 8 if (num_tokens < 8 and hidden_size <= 4096) else 4",
    ),
    ("model_executor/kernels/mhc/tilelang_kernels.py", "    n_thr: int = 256,"),
    ("model_executor/kernels/mhc/tilelang_kernels.py", "    h_iters = h_per_split // n_thr"),
]


def test_the_vllm_source_reads_what_the_configuration_provides(pristine_vllm_tree: Path) -> None:
    missing = [
        f"vllm/{path}: {text}"
        for path, text in VLLM_SOURCE
        if text not in (pristine_vllm_tree / "vllm" / path).read_text()
    ]
    assert missing == []
    # speculative.py turns every deepseek_v4 draft configuration into an MTP one first (n_predict).
    speculative = (pristine_vllm_tree / "vllm/config/speculative.py").read_text()
    override = speculative[speculative.index('if hf_config.model_type == "deepseek_v4":') :][:400]
    assert 'n_predict = getattr(hf_config, "num_nextn_predict_layers", None)' in override


@pytest.mark.parametrize(
    ("hidden", "uncovered"), [(512, [8, 4]), (1024, [8]), (2048, []), (4096, []), (7168, [])]
)
def test_which_hidden_sizes_the_fused_mhc_kernel_writes_whole(hidden: int, uncovered: list[int]) -> None:
    """512, the size of the runs so far, is written by neither split; DeepSeek V4's 4096 and 7168 are."""
    assert model_dsv4.fused_mhc_uncovered(hidden) == uncovered


def test_the_hidden_size_is_written_and_an_uncovered_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert model_dsv4.main(["--out", str(tmp_path / "w"), "--hidden", "2048", "--dspark"]) == 0
    for name in ("target", "draft"):
        assert json.loads((tmp_path / "w" / name / "config.json").read_text())["hidden_size"] == 2048
    assert capsys.readouterr().err == ""
    assert model_dsv4.main(["--out", str(tmp_path / "n")]) == 0
    assert "hidden size 512: vLLM 0.25.1's fused mHC kernel" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        model_dsv4.main(["--out", str(tmp_path / "x"), "--hidden", "300"])
    assert "--hidden: expected a positive multiple of 256, got 300" in capsys.readouterr().err
