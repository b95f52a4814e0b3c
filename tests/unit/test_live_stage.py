"""bench/live/stage.py: wheels split into checked parts, reassembled, and a wheel rebuilt from a delta."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "bench" / "live" / "stage.py"


def _module():
    spec = importlib.util.spec_from_file_location("live_stage", STAGE)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


stage = _module()


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STAGE), *args], capture_output=True, text=True, cwd=REPO)


def test_delta_rebuilds_the_upstream_wheel_byte_for_byte(tmp_path: Path):
    binary = bytes(range(256)) * 4096  # a shared compiled member, large enough to matter
    ours = _wheel(
        tmp_path / "ours.whl", {"pkg/_C.so": binary, "pkg/a.py": b"fixed = True\n", "pkg/new.py": b"x\n"}
    )
    upstream = _wheel(
        tmp_path / "up.whl", {"pkg/_C.so": binary, "pkg/a.py": b"fixed = False\n", "pkg/old.py": b""}
    )
    info = stage.delta_make(ours, upstream, tmp_path / "up.delta")
    assert info["copied"] > 0 and info["delta_size"] < upstream.stat().st_size // 4
    rebuilt = tmp_path / "rebuilt.whl"
    stage.delta_apply(ours, tmp_path / "up.delta", rebuilt)
    assert rebuilt.read_bytes() == upstream.read_bytes()

    other = _wheel(tmp_path / "other.whl", {"pkg/_C.so": b"different"})
    result = _run(
        "delta", "apply", "--base", str(other), "--delta", str(tmp_path / "up.delta"), "--out", str(rebuilt)
    )
    assert result.returncode == 1
    assert (
        f"{other}: sha256 mismatch: expected {hashlib.sha256(ours.read_bytes()).hexdigest()}" in result.stderr
    )


def test_pack_receive_unpack_checks_every_part_and_file(tmp_path: Path):
    files = []
    for index in range(3):
        path = tmp_path / f"w{index}-1.0-py3-none-any.whl"
        path.write_bytes(bytes([index]) * (300_000 + index))
        files.append(path)
    out = tmp_path / "stage"
    manifest = stage.pack("deps", files, out, 400_000)
    assert len(manifest["parts"]) == 3 and [p["file"] for p in manifest["parts"]] == [
        "deps.part01",
        "deps.part02",
        "deps.part03",
    ]
    root = tmp_path / "remote"
    assert stage.receive([out / "deps-01"], root) == ["deps.part02", "deps.part03"]
    result = _run("unpack", "deps", "--root", str(root), "--dest", str(tmp_path / "w"))
    assert result.returncode == 1 and "parts missing: deps.part02, deps.part03" in result.stderr

    # A part damaged in transit is refused by name with both digests.
    damaged = out / "deps-02" / "deps.part02"
    good = damaged.read_bytes()
    damaged.write_bytes(b"\0" + good[1:])
    result = _run("receive", str(out / "deps-02"), "--root", str(root))
    assert result.returncode == 1
    assert f"deps.part02: sha256 mismatch: expected {manifest['parts'][1]['sha256']}" in result.stderr
    damaged.write_bytes(good)

    assert stage.receive([out / "deps-02", out / "deps-03"], root) == []
    unpacked = stage.unpack("deps", root, tmp_path / "w")
    assert sorted(p.read_bytes() for p in unpacked) == sorted(p.read_bytes() for p in files)


def test_plan_reuses_equal_versions_and_stages_the_rest(tmp_path: Path):
    lock = tmp_path / "lock.files.json"
    lock.write_text(
        json.dumps(
            {
                "wheels": {
                    "torch": {
                        "filename": "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                        "sha256": "a" * 64,
                        "version": "2.11.0",
                    },
                    "numpy": {
                        "filename": "numpy-2.3.5-cp311-cp311-manylinux_2_28_x86_64.whl",
                        "sha256": "b" * 64,
                        "version": "2.3.5",
                    },
                    "openai": {
                        "filename": "openai-2.0-py3-none-any.whl",
                        "sha256": "c" * 64,
                        "version": "2.0",
                    },
                    "flashinfer-cubin": {
                        "filename": "flashinfer_cubin-0.6.13-py3-none-any.whl",
                        "sha256": "d" * 64,
                        "version": "0.6.13",
                    },
                }
            }
        )
    )
    installed = tmp_path / "pip.json"
    installed.write_text(
        json.dumps([{"name": "torch", "version": "2.11.0"}, {"name": "NumPy", "version": "2.5.2"}])
    )
    plan = stage.plan(lock, installed)
    assert [e["name"] for e in plan["reuse"]] == ["torch"]
    assert {e["name"]: (e["same_file"], e["installed_version"]) for e in plan["stage"]} == {
        "numpy": (False, "2.5.2"),
        "openai": (True, None),
    }
    assert [e["name"] for e in plan["not_staged"]] == ["flashinfer-cubin"]


def test_plan_stages_what_deepseek_v4_needs_only_when_asked(tmp_path: Path):
    wheels = {
        name: {
            "filename": f"{name.replace('-', '_')}-1.0-py3-none-any.whl",
            "sha256": "e" * 64,
            "version": "1.0",
        }
        for name in ("tilelang", "quack-kernels", "tokenspeed-mla")
    }
    lock = tmp_path / "lock.files.json"
    lock.write_text(json.dumps({"wheels": wheels}))
    installed = tmp_path / "pip.json"
    installed.write_text("[]")
    plain = stage.plan(lock, installed)
    assert plain["stage"] == [] and len(plain["not_staged"]) == 3
    v4 = stage.plan(lock, installed, deepseek_v4=True)
    assert [e["name"] for e in v4["stage"]] == ["quack-kernels", "tilelang"]
    assert [e["name"] for e in v4["not_staged"]] == ["tokenspeed-mla"]


@pytest.mark.parametrize("name", ["target", "draft"])
def test_test_model_configs(tmp_path: Path, name: str):
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "live" / "test_model.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{tmp_path}/{name}/config.json" in result.stdout
    config = json.loads((tmp_path / name / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    if name == "draft":
        assert config["architectures"] == ["Qwen3DSparkModel"]
        mask = config["dflash_config"]["mask_token_id"]
        assert 1000 <= mask < config["vocab_size"]  # outside the live-check's default prompt ids
        assert max(config["dflash_config"]["target_layer_ids"]) < 4  # layers the target has
    else:
        assert config["architectures"] == ["Qwen3ForCausalLM"] and config["num_hidden_layers"] == 4


def test_seeded_weights_cover_the_target_and_the_draft_without_embedding_or_head():
    spec = importlib.util.spec_from_file_location(
        "live_test_model", REPO / "bench" / "live" / "test_model.py"
    )
    model = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(model)
    target = model.weight_shapes("target", model.target_config())
    draft = model.weight_shapes("draft", model.draft_config())
    assert target["model.embed_tokens.weight"] == target["lm_head.weight"] == (4096, 256)
    assert len([name for name in target if name.startswith("model.layers.3.")]) == 11
    assert not any("embed_tokens" in name or "lm_head" in name for name in draft)  # shared from the target
    assert draft["fc.weight"] == (256, 2 * 256)  # two target layers' hidden states in, hidden out
    assert draft["markov_head.markov_w1.weight"] == draft["markov_head.markov_w2.weight"] == (4096, 32)
    assert {name.split(".")[1] for name in draft if name.startswith("layers.")} == {"0", "1"}
