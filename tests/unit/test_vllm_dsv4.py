"""Our DeepSeek V4 decode class (sparkseal/vllm_integration/vllm_dsv4.py) on CPU, imported against a
stand-in for the one vLLM module it needs: its refusals, its log line, and the in-place decode."""

from __future__ import annotations

import pytest
import torch

from sparkseal.vllm_integration import sparse_mla_vllm as rules


@pytest.fixture
def vllm_dsv4(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``vllm_integration.vllm_dsv4`` imported against a stand-in for the one vLLM module it needs."""
    import importlib
    import sys
    import types

    for name in ("vllm", "vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.common"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    ops = types.ModuleType("vllm.models.deepseek_v4.common.ops")
    ops.compute_global_topk_indices_and_lens = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, ops.__name__, ops)
    monkeypatch.delitem(sys.modules, "sparkseal.vllm_integration.vllm_dsv4", raising=False)
    yield importlib.import_module("sparkseal.vllm_integration.vllm_dsv4")
    # Not left importable against the stand-in.
    sys.modules.pop("sparkseal.vllm_integration.vllm_dsv4", None)
    monkeypatch.delattr("sparkseal.vllm_integration.vllm_dsv4", raising=False)


def test_deepseek_v4_class_needs_a_base_with_a_decode_step(vllm_dsv4) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError) as raised:
        vllm_dsv4.attention_class(dict)
    assert str(raised.value) == (
        f"{rules.DSV4_WHERE}: builtins.dict: expected a DeepSeek V4 attention class with _forward_decode "
        "(vLLM 0.25.1's FlashMLA or FlashInfer SM120 class)"
    )


def test_a_compressed_v4_layer_without_metadata_is_an_error(vllm_dsv4) -> None:  # type: ignore[no-untyped-def]
    class Base:
        def _forward_decode(self, *args: object) -> None:
            raise AssertionError("replaced by ours")

    layer = object.__new__(vllm_dsv4.attention_class(Base))
    layer.prefix, layer.compress_ratio = "model.layers.2.attn", 4
    meta = type("Meta", (), {"num_decode_tokens": 1, "is_valid_token": None})()
    with pytest.raises(RuntimeError) as raised:
        layer._forward_decode(
            torch.zeros(1, 64, 512), torch.zeros(1), meta, None, False, torch.zeros(1, 64, 512)
        )
    assert (
        str(raised.value)
        == f"{rules.DSV4_WHERE}: model.layers.2.attn: a compressed layer without its metadata"
    )


def _window_layer(vllm_dsv4):  # type: ignore[no-untyped-def]
    """A window-only V4 layer of our class, with what ``sparkseal_decode_args`` reads."""
    from types import SimpleNamespace

    class Base:
        def _forward_decode(self, *args: object) -> None:
            raise AssertionError("replaced by ours")

    layer = object.__new__(vllm_dsv4.attention_class(Base))
    layer.prefix, layer.compress_ratio, layer.scale = "model.layers.0.attn", 1, 0.05
    layer.swa_cache_layer = SimpleNamespace(kv_cache=torch.zeros(2, 64, 584, dtype=torch.uint8))
    layer.attn_sink, layer.sparkseal_max_smem_bytes = torch.zeros(64), 101376
    meta = SimpleNamespace(
        num_decode_tokens=2,
        decode_swa_indices=torch.zeros(2, 1, 128, dtype=torch.int32),
        decode_swa_lens=torch.ones(2, dtype=torch.int32),
    )
    return layer, meta


def test_v4_decode_writes_vllms_output_buffer_in_place(vllm_dsv4, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[tuple[str, torch.Tensor]] = []

    def into(
        out: torch.Tensor, q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, **kw: object
    ) -> torch.Tensor:
        calls.append(("into", out))
        out.fill_(1.0)
        return torch.zeros(out.shape[:2])

    def allocating(
        q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, **kw: object
    ) -> tuple[torch.Tensor, None]:
        calls.append(("allocating", q))
        return torch.full((q.shape[0], q.shape[1], 512), 2.0, dtype=torch.bfloat16), None

    monkeypatch.setattr(vllm_dsv4, "sparse_mla_decode_into", into)
    monkeypatch.setattr(vllm_dsv4, "sparse_mla_decode", allocating)
    layer, meta = _window_layer(vllm_dsv4)
    q = torch.zeros(2, 16, 512, dtype=torch.bfloat16)
    # vLLM 0.25.1's buffer: a prefix of the layer's contiguous [tokens, padded_heads, 512] tensor.
    output = torch.zeros(5, 64, 512, dtype=torch.bfloat16)[:2]
    layer._forward_decode(q, None, meta, None, True, output)
    assert [(name, t is output) for name, t in calls] == [("into", True)]
    assert bool((output == 1).all())
    # A strided buffer (not what vLLM hands over) takes the allocating op and a copy.
    calls.clear()
    strided = torch.zeros(64, 2, 512, dtype=torch.bfloat16).transpose(0, 1)
    layer._forward_decode(q, None, meta, None, True, strided)
    assert [name for name, _ in calls] == ["allocating"]
    assert calls[0][1].shape == (2, 64, 512), "q padded to the output's heads"
    assert bool((strided == 2).all())


class V4Base:
    """The attributes vLLM's V4 attention classes give our mix-in (a window-only layer)."""

    def __init__(self, vllm_config: object, prefix: str, **_: object) -> None:
        self.prefix, self.kv_cache_dtype, self.padded_heads = prefix, "fp8_ds_mla", 64
        self.head_dim, self.rope_head_dim, self.compress_ratio, self.window_size = 512, 64, 1, 128
        self.topk_indices_buffer = None  # the draft's layers get none: they are window-only

    def _uses_fp8_ds_mla_layout(self) -> bool:
        return True

    def _forward_decode(self, *args: object) -> None:
        raise AssertionError("replaced by ours")


def _v4_config(non_causal: bool, speculative: object = None) -> object:
    """The parts of vLLM's configuration the class reads: the draft's attention config sets non-causal."""
    from types import SimpleNamespace

    attention = SimpleNamespace(backend=None, use_non_causal=non_causal)
    return SimpleNamespace(attention_config=attention, speculative_config=speculative)


def test_the_server_log_names_the_draft_layers_on_our_v4_class(  # type: ignore[no-untyped-def]
    vllm_dsv4, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM builds V4's DSpark draft under an attention config with ``use_non_causal`` set (and the
    speculative config's backend); our class says so in one more line, which the H200 phase looks for."""
    assert vllm_dsv4.draft_layer(_v4_config(True)) is True
    assert vllm_dsv4.draft_layer(_v4_config(False)) is False
    assert vllm_dsv4.draft_layer(None) is False
    monkeypatch.delenv(rules.MAX_SMEM_ENV, raising=False)
    cls = vllm_dsv4.attention_class(V4Base)
    caplog.set_level("INFO", logger="vllm.sparkseal")
    for prefix, non_causal in (("model.layers.0.attn", False), ("model.layers.1.attn", False)):
        cls(_v4_config(non_causal), prefix=prefix)
    for prefix in ("model.layers.6.attn", "model.layers.7.attn"):
        cls(_v4_config(True), prefix=prefix)
    assert [r.getMessage() for r in caplog.records if r.name == "vllm.sparkseal"] == [
        "sparkseal: DeepSeek V4 decode runs the sparkseal kernel (SparksealV4Base, shared memory cap "
        "the device's limit)",
        "sparkseal: DeepSeek V4 decode runs the sparkseal kernel in the speculative draft (SparksealV4Base, "
        "shared memory cap the device's limit)",
    ]


def test_a_v4_target_on_our_class_is_refused_under_speculative_decoding(  # type: ignore[no-untyped-def]
    vllm_dsv4, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target's layers under a speculative config are refused when vLLM builds them (with patch 0004 an
    H200 run served, but not losslessly against vLLM's own class); the draft's own layers, and the override
    for measuring, are not."""
    monkeypatch.delenv(rules.MAX_SMEM_ENV, raising=False)
    monkeypatch.delenv(rules.V4_SPECULATIVE_ENV, raising=False)
    cls = vllm_dsv4.attention_class(V4Base)
    speculative = object()  # vLLM's SpeculativeConfig; only its presence is read
    with pytest.raises(rules.UnsupportedConfiguration) as refused:
        cls(_v4_config(False, speculative), prefix="model.layers.0.attn")
    assert str(refused.value) == (
        "model.layers.0.attn: sparkseal DeepSeek V4 decode (sparkseal/vllm_integration/vllm_dsv4.py): "
        "speculative decoding with the target's layers on this kernel: expected no --speculative-config "
        "(on vLLM 0.25.1 with patch 0004 a DeepSeek V4 target with a DSpark draft serves on this kernel, but "
        "its greedy answers differed from vLLM's FlashMLA class without speculation in 113 of 120 requests: "
        "not shown lossless; bench/results/vllm_backend.md, 7); serve DeepSeek V4 without speculative "
        "decoding, or set SPARKSEAL_SPARSE_MLA_V4_SPECULATIVE=1 to measure it"
    )
    cls(_v4_config(True, speculative), prefix="model.layers.6.attn")  # the draft's layer
    cls(_v4_config(False), prefix="model.layers.0.attn")  # no speculative decoding
    monkeypatch.setenv(rules.V4_SPECULATIVE_ENV, "1")
    cls(_v4_config(False, speculative), prefix="model.layers.0.attn")
    monkeypatch.setenv(rules.V4_SPECULATIVE_ENV, "later")
    with pytest.raises(
        rules.UnsupportedConfiguration,
        match=r"^SPARKSEAL_SPARSE_MLA_V4_SPECULATIVE: expected 1 or 0, got 'later'$",
    ):
        cls(_v4_config(False, speculative), prefix="model.layers.0.attn")
