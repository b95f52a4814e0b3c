"""End to end: build each platform's image, load it into podman and run it (no GPU needed).

The linux/amd64 image runs natively on an x86_64 machine; the linux/arm64 image (the product, for GB10)
runs there under qemu-user emulation, through the binfmt_misc handler that `make setup` registers. Each
builds the whole image from the locked closure (~4 GB of wheels per platform, fetched once into the
repository cache), so the module is marked ``image``; ``make test`` runs it, ``pytest -m "not image"``
skips it. Both images are built by one Bazel command (``built_images``). The product's image goes into
podman as a user puts it there, ``bazel run //:image.load``; the linux/amd64 one, which these tests only
run, by ``skopeo copy`` from its layout (``copy_into_podman``: no temporary archive). One platform's image
is removed from podman before the next is loaded (~10 GB of storage each). The serving recipe of
docs/serving.md runs here too, on the linux/amd64 image this module has loaded, so that it is never loaded
a second time.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.core.manifest import IMAGE_MANIFEST_PATH
from sparkseal.core.oci import read_image
from sparkseal.core.platforms import MACHINES
from tests.bazel_util import REPO, Workspace
from tests.bytecode_probe import PROBE
from tests.podman import PODMAN_RUN, copy_into_podman
from tests.recipe import (
    PAGE,
    container_names,
    fake_image_commands,
    podman_shim,
    recipe_steps,
    script,
    steps_by_name,
    substitute,
)
from tests.servers.loopback import free_port

pytestmark = [pytest.mark.bazel, pytest.mark.network, pytest.mark.image]

LOCK = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
# The platform whose image `bazel run //:image.load` (the alias a user runs) loads here.
PRODUCT = "linux_aarch64"
SPECULATOR = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"
BINFMT = Path("/proc/sys/fs/binfmt_misc")


def _podman(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


def _tag(bazel_platform: str) -> str:
    return f"localhost/sparkseal/vllm:{LOCK['version']}-{bazel_platform}"


def _check_emulation(machine: str) -> None:
    if platform.machine() == machine:
        return
    handler = BINFMT / f"qemu-{machine}"
    if not handler.is_file() or "enabled" not in handler.read_text():
        pytest.fail(f"{handler}: no enabled qemu-user handler to run {machine} binaries: run make setup")


@pytest.fixture(scope="module", params=list(MACHINES))
def loaded_image(
    request: pytest.FixtureRequest,
    real_workspace: Workspace,
    built_images: dict[str, Path],
) -> Iterator[str]:
    bazel_platform: str = request.param
    for tool in ("podman", "skopeo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run make setup")
    _check_emulation(MACHINES[bazel_platform])
    tag = _tag(bazel_platform)
    if bazel_platform == PRODUCT:
        # The .load target streams the docker-archive from the OCI layout into podman (no .tar is built).
        loaded = real_workspace.bazel("run", "//:image.load", timeout=1800)
        assert loaded.returncode == 0, loaded.output[-6000:]
        assert f"Loaded image: {tag}" in loaded.output, loaded.output[-6000:]
    else:
        # On the output base's file system, so that the complete layout's blobs are hard links.
        scratch = real_workspace.output_base.with_name(real_workspace.output_base.name + ".image-load")
        scratch.mkdir(exist_ok=True)
        try:
            copy_into_podman(built_images[bazel_platform], tag, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    # Either way podman holds the image the layout describes: its ID is the config's digest.
    config = read_image(built_images[bazel_platform]).manifest["config"]["digest"]
    inspected = _podman("image", "inspect", "--format", "{{.Id}}", tag)
    assert inspected.stdout.strip() == config.removeprefix("sha256:"), inspected.stdout + inspected.stderr
    yield tag
    _podman("rmi", "--force", tag)  # ~10 GB of container storage


def _run(image: str, *command: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    args = [*PODMAN_RUN]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    return subprocess.run([*args, image, *command], capture_output=True, text=True, timeout=600, check=False)


def test_imports_load_our_patch_and_the_shipped_bytecode(loaded_image: str) -> None:
    """vLLM and sparkseal import; the speculator imported is our patched one; nothing is compiled.

    One container start for both checks: under qemu each ``import vllm`` costs about a minute. Every module
    compiled from source during the imports is recorded; with the layers' pycs (the venv's and the
    standard library's) there is none.
    """
    script = PROBE + (
        "import importlib.util, sys, vllm, torch, sparkseal\n"
        f"spec = importlib.util.find_spec({SPECULATOR!r})\n"
        "source = open(spec.origin).read()\n"
        "patched = 'fill_(-1)' in source and 'torch.full(' in source\n"
        "flags = int.from_bytes(open(torch.__cached__, 'rb').read(8)[4:8], 'little')\n"
        "loaded = len([m for m in sys.modules.values() if getattr(m, '__cached__', None)])\n"
        "print('RESULT', vllm.__version__, spec.origin, patched, sys.prefix, loaded, len(compiled), flags,"
        " compiled[:3])\n"
    )
    done = _run(loaded_image, "-c", script, entrypoint="/opt/venv/bin/python3")
    assert done.returncode == 0, done.stderr[-4000:]
    # vLLM logs to stdout while it imports; the answer is the one line marked RESULT.
    results = [line.split(maxsplit=8)[1:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 1, done.stdout[-4000:]
    version, origin, patched, prefix, loaded, from_source, flags, examples = results[0]
    assert version == LOCK["version"]
    assert (
        origin == "/opt/venv/lib/python3.11/site-packages/vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
    )
    assert patched == "True"
    assert prefix == "/opt/venv" and int(loaded) > 1000  # vLLM and torch import well over a thousand modules
    assert (from_source, examples) == ("0", "[]")
    assert flags == "1"  # PEP 552: hash-based, unchecked


def _whole_venv_check_natively(image: str) -> subprocess.CompletedProcess[str]:
    """The default verify-modules of the image's venv, by this checkout's sparkseal on the host's CPU.

    The image's files are read where podman keeps them (``podman image mount``; a user other than root
    needs podman's user namespace for that, ``podman unshare``); the code is the same as the image's (both
    come from this tree; the image's own copy runs it natively on linux/amd64).
    """
    script = (
        'root=$(podman image mount "$1") || exit 2\n'
        "trap 'podman image unmount \"$1\" >/dev/null' EXIT\n"
        '"$2" -m sparkseal verify-modules --manifest "$root$3" '
        '--site-packages "$root/opt/venv/lib/python3.11/site-packages"\n'
    )
    command = ["sh", "-c", script, "sh", image, sys.executable, str(IMAGE_MANIFEST_PATH)]
    if os.geteuid() != 0:
        command = ["podman", "unshare", *command]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def test_manifest_check_passes_inside_the_image(loaded_image: str) -> None:
    """The image's entrypoint checks every distribution of its venv against the manifest it carries.

    On the linux/arm64 image under qemu, hashing the whole venv (~10 GB) costs minutes of emulated SHA-256:
    there the image's own command checks sparkseal in the image (it runs on arm64), and the whole venv is
    hashed natively by the same code from the mounted image.
    """
    sparkseal = "/opt/venv/bin/sparkseal"
    if loaded_image.endswith("-linux_aarch64"):
        own = _run(loaded_image, "verify-modules", "--modules", "sparkseal", entrypoint=sparkseal)
        assert own.returncode == 0, own.stdout + own.stderr
        assert own.stdout.startswith("sparkseal:") and own.stdout.rstrip().endswith("OK"), own.stdout
        done = _whole_venv_check_natively(loaded_image)
    else:
        done = _run(loaded_image, "verify-modules", entrypoint=sparkseal)
    assert done.returncode == 0, done.stdout + done.stderr
    # The default covers every distribution of the venv (sorted by name), then the files no RECORD names.
    names = [line.split(":")[0] for line in done.stdout.splitlines()]
    assert names[-1] == "(unowned)" and names[:-1] == sorted(names[:-1]), names
    assert {"vllm", "torch", "sparkseal", "numpy", "nvidia-nccl-cu13"} <= set(names), names
    assert all(line.endswith("OK") for line in done.stdout.splitlines())


def test_serve_refuses_an_image_whose_torch_differs(loaded_image: str) -> None:
    """An image derived from ours with one torch file changed: the entrypoint names it and exits 1."""
    if loaded_image.endswith("-linux_aarch64"):
        # The refusal is the same Python on both images (the arm64 image's own check passes in
        # test_manifest_check_passes_inside_the_image); under qemu a second start costs over a minute.
        pytest.skip("the refusal of a changed module is checked on the linux/amd64 image (native)")
    changed = "/opt/venv/lib/python3.11/site-packages/torch/version.py"
    name = f"sparkseal-derive-{os.getpid()}"
    derived = f"localhost/sparkseal/derived:{os.getpid()}"
    _podman("rm", "--force", name)
    # PODMAN_RUN's options, but the container is kept (no --rm) to be committed.
    keep = [arg for arg in PODMAN_RUN if arg != "--rm"]
    script = f"echo '# changed' >> {changed}"
    edit = subprocess.run(
        [*keep, "--name", name, "--entrypoint", "/bin/sh", loaded_image, "-c", script],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    try:
        assert edit.returncode == 0, edit.stderr[-4000:]
        # The container ran a shell; the derived image keeps our entrypoint, as a `FROM` of ours would.
        inspected = _podman("image", "inspect", "--format", "{{json .Config.Entrypoint}}", loaded_image)
        assert json.loads(inspected.stdout) == ["/opt/venv/bin/sparkseal", "serve"], inspected.stdout
        entrypoint = f"ENTRYPOINT {inspected.stdout.strip()}"
        committed = _podman("commit", "--change", entrypoint, name, derived)
        assert committed.returncode == 0, committed.stderr[-4000:]
        done = _run(derived, "/models/none")
    finally:
        _podman("rm", "--force", name)
        _podman("rmi", "--force", derived)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-4000:]
    assert "torch/version.py" in done.stderr, done.stderr[-4000:]
    assert "sparkseal: refusing to serve: the installed modules differ from the image" in done.stderr
    assert "starting vllm serve" not in done.stderr


# Runs inside the image (CPU only): our attention backend as vLLM resolves and validates it, the layer
# implementation's refusals, one forward_mqa with the kernel replaced by the float32 reference, and
# DeepSeek V4's refusal of CUSTOM (patch 0002).
BACKEND_SCRIPT = """
import json
from types import SimpleNamespace

import torch

from sparkseal.kernels import sparse_mla_ref
from sparkseal.vllm_integration import plugin, sparse_mla_vllm, vllm_backend

plugin.register_attention_backend({})
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

backend = E.CUSTOM.get_class()
out = {"class": f"{backend.__module__}.{backend.__qualname__}", "name": backend.get_name()}


def reasons(**change):
    config = dict(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="fp8_ds_mla", block_size=64, use_mla=True,
        has_sink=False, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(12, 1), attn_type="decoder",
    )
    config.update(change)
    return backend.validate_configuration(**config)


out["reasons"] = {
    "ok": reasons(),
    "bf16": reasons(kv_cache_dtype="auto"),
    "fp8": reasons(kv_cache_dtype="fp8"),
    "dense": reasons(use_sparse=False),
    "ampere": reasons(device_capability=DeviceCapability(8, 0)),
    "block16": reasons(block_size=16),
    "fp16": reasons(dtype=torch.float16),
}
impl_args = dict(
    num_heads=16, head_size=576, scale=0.07, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
    kv_cache_dtype="fp8_ds_mla", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
    q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, qk_head_dim=192,
    v_head_dim=128, kv_b_proj=None,
)
gen = torch.Generator().manual_seed(7)
positions = torch.randint(0, 200, (5, 128), generator=gen, dtype=torch.int32)
positions[:, 100:] = -1
positions[3, 7] = 10_000
refused = {}
for name, change in {"heads": {"num_heads": 8}, "window": {"sliding_window": 128}}.items():
    try:
        backend.get_impl_cls()(**{**impl_args, **change}, topk_indices_buffer=positions)
    except sparse_mla_vllm.UnsupportedConfiguration as error:
        refused[name] = str(error)
out["refused"] = refused

impl = backend.get_impl_cls()(**impl_args, topk_indices_buffer=positions)
layout = sparse_mla_ref.V32_FP8
cache = sparse_mla_ref.pack_cache(torch.randn(12 * 64, 576, generator=gen), layout)
table = torch.tensor([[3, 5, 7, 9], [11, 0, 2, 4]], dtype=torch.int32)
request = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
expected = (table[request.long()[:, None], (positions // 64).clamp(0, 3).long()] * 64 + positions % 64)
expected = torch.where((positions >= 0) & (positions < 4 * 64), expected, -1).to(torch.int32)
seen = {}


def fake_kernel(q, cache, indices, *, softmax_scale, layout, topk_length, max_smem_bytes):
    seen.update(indices=indices, lengths=topk_length, layout=layout, smem=max_smem_bytes, q=q)
    ref, _ = sparse_mla_ref.sparse_mla_decode_ref(
        q, cache, indices, softmax_scale, sparse_mla_ref.LAYOUTS[layout], topk_length=topk_length
    )
    return ref.to(torch.bfloat16), None


vllm_backend.sparse_mla_decode = fake_kernel
q = torch.randn(5, 16, 576, generator=gen).to(torch.bfloat16)
metadata = vllm_backend.SparksealSparseMLAMetadata(
    num_actual_tokens=5, req_id_per_token=request, block_table=table, block_size=64
)
split = (q[..., :512].transpose(0, 1).contiguous().transpose(0, 1), q[..., 512:])
result, lse = impl.forward_mqa(split, cache, metadata, None)
direct, _ = sparse_mla_ref.sparse_mla_decode_ref(q, cache, expected, 0.07, layout)
out["forward"] = {
    "slots_equal": torch.equal(seen["indices"], expected),
    "lengths": seen["lengths"].tolist(),
    "layout": seen["layout"],
    "smem": seen["smem"],
    "q_contiguous": seen["q"].is_contiguous() and torch.equal(seen["q"], q),
    "out_close": bool(torch.allclose(result.float(), direct, atol=1e-2, rtol=1e-2)),
    "lse": lse,
}
from vllm.models.deepseek_v4.nvidia import model as dsv4
from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention

from sparkseal.vllm_integration import vllm_dsv4

custom = SimpleNamespace(attention_config=SimpleNamespace(backend=E.CUSTOM))
chosen = dsv4._select_dsv4_attn_cls(custom)
out["dsv4"] = {
    "class": f"{chosen.__module__}.{chosen.__qualname__}",
    "keeps_flashmla": issubclass(chosen, DeepseekV4FlashMLAAttention),
    "one_class": chosen is dsv4._select_dsv4_attn_cls(custom),
}
# A C128A layer's decode rows (16 heads padded to 64, as FlashInfer's SM120 class hands them over),
# with the kernel replaced by the float32 reference: what reaches the kernel, and what comes back.
v4 = sparse_mla_ref.V4_FP8
layer = object.__new__(chosen)
torch.nn.Module.__init__(layer)
layer.prefix, layer.compress_ratio, layer.scale = "layers.2.attn", 128, 0.05
layer.sparkseal_max_smem_bytes = 101376
sink = torch.cat([torch.randn(16, generator=gen), torch.full((48,), float("-inf"))])
layer.attn_sink = torch.nn.Parameter(sink, requires_grad=False)
padded = torch.zeros(4, 65 * 576, dtype=torch.uint8)
padded[:, : 64 * 584] = sparse_mla_ref.pack_cache(torch.randn(4 * 64, 512, generator=gen), v4).view(4, -1)
layer.swa_cache_layer = SimpleNamespace(kv_cache=padded[:, : 64 * 584].view(4, 64, 584))
c128a = sparse_mla_ref.pack_cache(torch.randn(6 * 2, 512, generator=gen), v4, page_size=2)
window = torch.randint(0, 4 * 64, (3, 1, 128), generator=gen, dtype=torch.int32)
window[1, 0, 40:] = -1
compressed = torch.randint(0, 12, (3, 1, 128), generator=gen, dtype=torch.int32)
swa_meta = SimpleNamespace(
    num_decode_tokens=3, num_decodes=3, is_valid_token=torch.ones(3, dtype=torch.bool),
    decode_swa_indices=window, decode_swa_lens=torch.tensor([128, 40, 100], dtype=torch.int32),
)
attn_meta = SimpleNamespace(
    c128a_global_decode_topk_indices=compressed,
    c128a_decode_topk_lens=torch.tensor([5, 0, 128], dtype=torch.int32),
)
seen4 = {}


def fake_v4_kernel(out, q, cache, indices, *, softmax_scale, layout, topk_length, extra_cache,
                   extra_indices, extra_topk_length, attn_sink, max_smem_bytes):
    seen4.update(layout=layout, smem=max_smem_bytes, q=q, cache=cache, extra=extra_cache, sink=attn_sink,
                 out=out)
    result, lse = sparse_mla_ref.sparse_mla_decode_ref(
        q, cache, indices.squeeze(1), softmax_scale, sparse_mla_ref.LAYOUTS[layout], topk_length=topk_length,
        extra_cache=extra_cache, extra_indices=extra_indices.squeeze(1), extra_topk_length=extra_topk_length,
        attn_sink=attn_sink,
    )
    out.copy_(result)
    return lse


vllm_dsv4.sparse_mla_decode_into = fake_v4_kernel
q4 = torch.randn(3, 16, 512, generator=gen).to(torch.bfloat16)
output = torch.zeros(3, 64, 512, dtype=torch.bfloat16)
layer._forward_decode(q4, c128a, swa_meta, attn_meta, False, output)
expected4, _ = sparse_mla_ref.sparse_mla_decode_ref(
    torch.cat([q4, torch.zeros(3, 48, 512, dtype=torch.bfloat16)], 1), layer.swa_cache_layer.kv_cache,
    window.squeeze(1), 0.05, v4, topk_length=swa_meta.decode_swa_lens, extra_cache=c128a,
    extra_indices=compressed.squeeze(1), extra_topk_length=attn_meta.c128a_decode_topk_lens, attn_sink=sink,
)
out["dsv4"]["decode"] = {
    "layout": seen4["layout"],
    "smem": seen4["smem"],
    "q_shape": list(seen4["q"].shape),
    "caches": [seen4["cache"] is layer.swa_cache_layer.kv_cache, seen4["extra"] is c128a],
    "sink": seen4["sink"] is layer.attn_sink,
    "in_place": seen4["out"] is output,
    "out_close": bool(torch.allclose(output.float(), expected4, atol=1e-2, rtol=1e-2)),
}
# The start-up checks, on a stand-in for vLLM's class (its own needs an engine to be built).
class StandIn:
    def __init__(self, heads=64, window=128):
        self.prefix, self.kv_cache_dtype, self.padded_heads = "model.layers.1.attn", "fp8_ds_mla", heads
        self.head_dim, self.rope_head_dim, self.compress_ratio, self.window_size = 512, 64, 4, window
        self.topk_indices_buffer = torch.zeros(8, 512, dtype=torch.int32)

    def _uses_fp8_ds_mla_layout(self):
        return True

    def _forward_decode(self, *args):
        raise AssertionError("not called here")


built = vllm_dsv4.attention_class(StandIn)()
bases = [c.__name__ for c in type(built).__mro__]
out["dsv4"]["built"] = {"cap": built.sparkseal_max_smem_bytes, "bases": bases}
refusals = {}
for name, change in {"heads": {"heads": 8}, "window": {"window": 100}}.items():
    try:
        vllm_dsv4.attention_class(StandIn)(**change)
    except sparse_mla_vllm.UnsupportedConfiguration as error:
        refusals[name] = str(error)
out["dsv4"]["refused"] = refusals
# Without --attention-backend: vLLM's own class, unless the operator's switch is on and the GPU is 12.x.
import os

unset = SimpleNamespace(attention_config=SimpleNamespace(backend=None))
platform = dsv4.current_platform
defaults = {}
for switch, capability in (("0", (12, 1)), ("1", (12, 1)), ("1", (9, 0))):
    os.environ["SPARKSEAL_SPARSE_MLA"] = switch
    dsv4.current_platform = SimpleNamespace(get_device_capability=lambda c=capability: DeviceCapability(*c))
    defaults[f"{switch} {capability[0]}.{capability[1]}"] = dsv4._select_dsv4_attn_cls(unset).__qualname__
dsv4.current_platform = platform
out["dsv4"]["defaults"] = defaults
# Another CUSTOM backend (one without a V4 class) is refused when the model is built.
from vllm.v1.attention.backends.registry import register_backend

register_backend(E.CUSTOM, "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend")
try:
    dsv4._select_dsv4_attn_cls(custom)
    out["dsv4"]["other_custom"] = "accepted"
except ValueError as error:
    out["dsv4"]["other_custom"] = str(error)
print("RESULT " + json.dumps(out))
"""


def test_our_attention_backend_inside_vllm(loaded_image: str) -> None:
    if loaded_image.endswith("-linux_aarch64"):
        # The check is the same Python on both images; under qemu it costs over four minutes of CI time.
        pytest.skip("our backend's CPU check runs on the linux/amd64 image (native), not again under qemu")
    done = _run(loaded_image, "-c", BACKEND_SCRIPT, entrypoint="/opt/venv/bin/python3")
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, done.stdout[-4000:]
    found = json.loads(lines[0][len("RESULT ") :])
    assert found["class"] == "sparkseal.vllm_integration.vllm_backend.SparksealSparseMLABackend"
    assert found["name"] == "CUSTOM"
    reasons = found["reasons"]
    assert reasons["ok"] == [] and reasons["bf16"] == []
    assert any("pass --kv-cache-dtype fp8_ds_mla" in r for r in reasons["fp8"]), reasons["fp8"]
    assert "non-sparse not supported" in reasons["dense"]
    assert "compute capability not supported" in reasons["ampere"]
    assert "block_size not supported" in reasons["block16"]
    assert "dtype not supported" in reasons["fp16"]
    assert "attention heads per rank: expected one of (16, 32, 64, 128)" in found["refused"]["heads"]
    assert "got 8" in found["refused"]["heads"]
    assert "unsupported: a sliding window" in found["refused"]["window"]
    forward = found["forward"]
    assert forward["slots_equal"] and forward["out_close"] and forward["q_contiguous"]
    assert forward["layout"] == "v32_fp8" and forward["smem"] == 0 and forward["lse"] is None
    assert forward["lengths"] == [100, 100, 100, 100, 100]
    dsv4 = found["dsv4"]
    assert dsv4["class"] == "sparkseal.vllm_integration.vllm_dsv4.SparksealDeepseekV4FlashMLAAttention"
    assert dsv4["keeps_flashmla"] and dsv4["one_class"]
    decode = dsv4["decode"]
    assert decode["layout"] == "v4_fp8" and decode["smem"] == 101376 and decode["q_shape"] == [3, 64, 512]
    assert decode["caches"] == [True, True] and decode["sink"] and decode["in_place"]
    assert decode["out_close"]
    assert dsv4["built"] == {"cap": 0, "bases": ["SparksealStandIn", "SparksealDecode", "StandIn", "object"]}
    assert dsv4["refused"]["heads"].startswith(
        "model.layers.1.attn: sparkseal DeepSeek V4 decode (sparkseal/vllm_integration/vllm_dsv4.py): "
        "attention heads "
        "per rank (padded): expected one of (16, 32, 64, 128), got 8"
    )
    assert dsv4["refused"]["window"].endswith("sliding_window: expected a positive multiple of 64, got 100")
    assert dsv4["defaults"] == {
        "0 12.1": "DeepseekV4FlashInferSM120Attention",
        "1 12.1": "SparksealDeepseekV4FlashInferSM120Attention",
        "1 9.0": "DeepseekV4FlashMLAAttention",
    }
    assert dsv4["other_custom"].startswith(
        "CUSTOM is not a DeepSeek V4 attention backend: the registered CUSTOM backend "
        "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend "
        "has no deepseek_v4_attention_cls"
    )


# The one-GB10 recipe's steps, in the page's order; the test runs all of them but `pull`.
RECIPE_STEPS = ["vars", "pull", "verify", "serve-reference", "record", "stop-reference", "serve", "check"]


def _container_state(name: str) -> str | None:
    """The container's state (running, exited, ...), or None where podman has no container of that name."""
    inspected = _podman("container", "inspect", "--format", "{{.State.Status}}", name, timeout=60)
    return inspected.stdout.strip() if inspected.returncode == 0 else None


def _gone(name: str, seconds: float) -> bool:
    """Whether the container (started with --rm) is gone within ``seconds``."""
    deadline = time.monotonic() + seconds
    while _container_state(name) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_the_serving_recipe_runs_as_written(loaded_image: str, tmp_path: Path) -> None:
    """docs/serving.md's one-GB10 recipe, its commands read from the page (tests/recipe.py), never retyped.

    The page's ``vars`` step runs with five values substituted, nothing else changed: ``IMAGE`` is the
    linux/amd64 image with one layer more, the fake vLLM server (tests/servers/fake_vllm.py) as its
    entrypoint, so the server containers run the fake on the recipe's own arguments while ``live-check``
    and ``verify-modules`` run the image's own sparkseal; ``GPUS`` is empty (no GPU here); ``MODELS`` and
    ``WORK`` are scratch folders, ``PORT`` a free loopback port. ``pull`` is skipped: the image is loaded
    already. podman runs through a shim that adds what this host's podman needs (runc, ulimits:
    tests/podman.py). What differs from a GB10: the fake answers instead of vLLM, and without a GPU the
    check's gpu-idle step is skipped with its reason. Each step must exit 0; after it, what it is for must
    hold: the record written, the reference server stopped by its name within the stop's grace time, the
    reference validation passed, its teardown stopped the server's process and its container is gone.
    """
    if loaded_image.endswith("-linux_aarch64"):
        pytest.skip("the serving recipe runs on the linux/amd64 image (native), not again under qemu")
    steps = steps_by_name(recipe_steps(PAGE.read_text(), "gb10"), RECIPE_STEPS, "gb10")
    reference, dspark = container_names(steps["serve-reference"]) + container_names(steps["serve"])
    for name in (reference, dspark):
        if _container_state(name) is not None:
            pytest.fail(f"podman already has a container {name}: the recipe starts its own; remove it first")
    models, work, shims = tmp_path / "models", tmp_path / "work", tmp_path / "bin"
    models.mkdir()
    shims.mkdir()
    podman = shutil.which("podman")
    assert podman is not None, "podman is not installed: run make setup"
    runtime = PODMAN_RUN[PODMAN_RUN.index("--runtime") : PODMAN_RUN.index("run")]
    ulimits = [w for i, arg in enumerate(PODMAN_RUN) if arg == "--ulimit" for w in PODMAN_RUN[i : i + 2]]
    (shims / "podman").write_text(podman_shim(podman, runtime, ulimits))
    (shims / "podman").chmod(0o755)
    environment = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    tag = f"localhost/sparkseal/recipe-fake:{os.getpid()}"
    maker = f"sparkseal-recipe-fake-{os.getpid()}"
    values = {"IMAGE": tag, "GPUS": "", "MODELS": str(models), "WORK": str(work), "PORT": str(free_port())}
    variables = substitute(steps["vars"], values)

    def run_step(name: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", script(variables, steps[name])],
            env=environment, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{PAGE}:{steps[name].line}: step {name}: expected exit 0, got {done.returncode}\n"
            f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )
        return done

    keep = [arg for arg in PODMAN_RUN if arg != "--rm"]
    try:
        for command in fake_image_commands(keep, loaded_image, maker, tag):
            made = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            assert made.returncode == 0, f"{' '.join(command)[:300]}: {made.stderr[-3000:]}"
        run_step("verify")
        run_step("serve-reference")
        assert _container_state(reference) == "running", f"step serve-reference: {reference} is not running"
        recorded = run_step("record")
        assert "result: pass" in recorded.stdout, recorded.stdout[-3000:]
        assert json.loads((work / "reference.json").read_text())["max_tokens"] == 64
        started = time.monotonic()
        run_step("stop-reference")
        stopped_in = time.monotonic() - started
        assert _gone(reference, 30), f"step stop-reference: the container {reference} is still there"
        # SIGTERM stopped it: podman's SIGKILL would have come only after the step's -t 120 seconds.
        assert stopped_in < 60, f"step stop-reference: {stopped_in:.0f} s: the server did not stop on SIGTERM"
        served = (work / "reference.log").read_text()
        assert f"listening on http://127.0.0.1:{values['PORT']}" in served, served[-2000:]

        run_step("serve")
        assert _container_state(dspark) == "running", f"step serve: {dspark} is not running"
        run_step("check")
        report = (work / "dspark-check.txt").read_text()
        assert report.startswith(f"live-check http://127.0.0.1:{values['PORT']} ("), report
        assert "profile reference)" in report.splitlines()[0], report
        assert report.rstrip().endswith("result: pass"), report
        for passed in ("soak", "prefix-cache", "long-context", "speculation", "lossless", "teardown"):
            assert re.search(rf"^  {passed}\s+ok ", report, re.MULTILINE), f"{passed}: {report}"
        assert re.search(r"^  teardown\s+ok .*: pid \d+, signal SIGTERM, exit_s ", report, re.MULTILINE), (
            report
        )
        # No GPU in the check's container here: the step says why it did not run (on a GB10, $GPUS gives
        # it one).
        idle = (
            r"^  gpu-idle\s+skipped: no nvidia-smi on PATH: the GPUs' memory and utilisation cannot be read"
        )
        assert re.search(idle, report, re.MULTILINE), report
        assert _gone(dspark, 30), f"step check: the teardown left the container {dspark}"
    finally:
        for name in (reference, dspark, maker):
            _podman("rm", "--force", name)
        _podman("rmi", "--force", tag)
