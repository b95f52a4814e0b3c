"""The vLLM plugin (sparkseal/vllm_integration/plugin.py): its backend switch, and the cross-rank module
check in two real processes over torch.distributed (gloo on 127.0.0.1).

Each rank hashes its own copy of an installed tree; rank 1's copy is tampered in the failing cases, and
both ranks must stop with the same message naming the file and the ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sparkseal.core import manifest as mm
from sparkseal.live_check.logs import MODULE_CHECK
from sparkseal.vllm_integration import plugin
from tests.installed_tree import install, make_venv
from tests.servers.loopback import free_port

pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[2]
MODULES = ("vllm", "torch", "sparkseal")
TIMEOUT = 120

# A stand-in for vLLM 0.25.1's vllm/distributed/parallel_state.py: the names the plugin relies on, reached the
# way vLLM reaches them (ensure_model_parallel_initialized looks up initialize_model_parallel at call time).
PARALLEL_STATE = b"""import torch.distributed

_WORLD = None


class _Coordinator:
    def __init__(self):
        self.cpu_group = torch.distributed.new_group(backend="gloo")
        self.rank_in_group = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()


def initialize_model_parallel(tensor_model_parallel_size=1):
    global _WORLD
    _WORLD = _Coordinator()


def get_world_group():
    return _WORLD


def ensure_model_parallel_initialized(tensor_model_parallel_size):
    initialize_model_parallel(tensor_model_parallel_size)
"""

WORKER = """
import json, sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from sparkseal.vllm_integration import plugin

rank, port, site, out, mode, manifest, backend = sys.argv[1:8]
# "all": the default scope, every distribution of the rank's site-packages directory.
modules = None if sys.argv[8:] == ["all"] else ("vllm", "torch", "sparkseal")
manifest = Path(manifest) if manifest != "-" else None
if backend == "nccl":
    import torch

    torch.cuda.set_device(int(rank))
dist.init_process_group(
    backend,
    init_method=f"tcp://127.0.0.1:{port}",
    rank=int(rank),
    world_size=2,
    timeout=timedelta(seconds=60),
)
try:
    if mode == "core":
        where = Path(site) if modules is None else None
        result = {"digest": plugin.check_ranks(plugin.local_state(modules, [site], manifest, where))}
    else:
        sys.path.insert(0, site)
        import io, logging
        from vllm.distributed import parallel_state
        captured = io.StringIO()
        logging.getLogger("vllm").addHandler(logging.StreamHandler(captured))  # as vLLM's logging set-up does
        logging.getLogger("vllm").setLevel(logging.INFO)
        plugin.install_hook(parallel_state, modules, [site], manifest)
        plugin.install_hook(parallel_state, modules, [site], manifest)  # loaded twice: wraps once
        parallel_state.ensure_model_parallel_initialized(2)
        result = {"hooked": True, "log": captured.getvalue()}
except plugin.RankMismatchError as error:
    result = {"error": str(error)}
Path(out).write_text(json.dumps(result))
dist.destroy_process_group()
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# vLLM 0.25.1's attention backend registry and CUDA priority list, reduced to what the plugin touches:
# `AttentionBackendEnum.CUSTOM` resolves through `register_backend`'s overrides, and the CUDA platform
# looks `_get_backend_priorities` up in its module at call time.
REGISTRY = b"""
import enum
_ATTN_OVERRIDES = {}
class AttentionBackendEnum(enum.Enum):
    TRITON_MLA = "vllm.TritonMLA"
    FLASHINFER_MLA_SPARSE_SM120 = "vllm.FlashInferSM120"
    FLASHMLA_SPARSE = "vllm.FlashMLASparse"
    CUSTOM = None
def register_backend(backend, class_path=None, is_mamba=False):
    _ATTN_OVERRIDES[backend] = class_path
    return lambda x: x
"""
CUDA_PLATFORM = b"""
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
def _get_backend_priorities(use_mla, device_capability, num_heads=None, kv_cache_dtype=None):
    if use_mla and device_capability.major == 12:
        return [E.TRITON_MLA, E.FLASHINFER_MLA_SPARSE_SM120]
    return [E.FLASHMLA_SPARSE] if use_mla else []
"""


def _tree(root: Path) -> Path:
    stand_in = {"vllm/distributed/__init__.py": b"", "vllm/distributed/parallel_state.py": PARALLEL_STATE}
    for package in ("vllm/v1", "vllm/v1/attention", "vllm/v1/attention/backends", "vllm/platforms"):
        stand_in[f"{package}/__init__.py"] = b""
    stand_in["vllm/v1/attention/backends/registry.py"] = REGISTRY
    stand_in["vllm/platforms/cuda.py"] = CUDA_PLATFORM
    return make_venv(root, vllm_extra=stand_in)


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    """Two identical installed trees, one per rank; returns their site-packages directories."""
    site0 = _tree(tmp_path / "rank0")
    shutil.copytree(tmp_path / "rank0", tmp_path / "rank1")
    return site0, tmp_path / "rank1" / site0.relative_to(tmp_path / "rank0")


def _run_ranks(
    tmp_path: Path,
    sites: tuple[Path, Path],
    mode: str,
    manifest: Path | None = None,
    backend: str = "gloo",
    scope: str = "modules",
) -> list[dict]:
    """Start both ranks, wait at most TIMEOUT seconds, return what each wrote."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(worker),
                str(rank),
                port,
                str(site),
                str(tmp_path / f"out{rank}.json"),
                mode,
                str(manifest) if manifest else "-",
                backend,
                scope,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, site in enumerate(sites)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT)[0])
    finally:
        for proc in procs:
            proc.kill()
    for rank, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{output}"
    return [json.loads((tmp_path / f"out{rank}.json").read_text()) for rank in range(2)]


def test_identical_trees_pass(tmp_path: Path, trees: tuple[Path, Path]) -> None:
    results = _run_ranks(tmp_path, trees, "core")
    expected = plugin.local_state(MODULES, [str(trees[0])], None)
    assert expected.problems == ()
    assert sorted(expected.files) == ["sparkseal", "torch", "vllm"]
    assert results == [{"digest": expected.digest()}] * 2


def _two_gpus() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "nccl",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA GPUs")],
        ),
    ],
)
def test_tampered_module_on_rank_1_stops_both_ranks(
    tmp_path: Path, trees: tuple[Path, Path], backend: str
) -> None:
    site0, site1 = trees
    (site1 / "vllm/config.py").write_bytes(b"MAX_MODEL_LEN = 8192\n")
    results = _run_ranks(tmp_path, trees, "core", backend=backend)
    assert results[0] == results[1], "both ranks must raise the same message"
    message = results[0]["error"]
    digest0 = plugin.local_state(MODULES, [str(site0)], None).digest()
    digest1 = plugin.local_state(MODULES, [str(site1)], None).digest()
    assert message.splitlines() == [
        "sparkseal: the ranks of this deployment do not run the same verified module files",
        f"module digests differ: rank 0 {digest0}, rank 1 {digest1}",
        f"  vllm: vllm/config.py: rank 0 sha256 {_sha(b'MAX_MODEL_LEN = 4096' + bytes([10]))}, "
        f"rank 1 sha256 {_sha(b'MAX_MODEL_LEN = 8192' + bytes([10]))}",
    ]


def test_hook_checks_ranks_when_vllm_builds_its_groups(tmp_path: Path, trees: tuple[Path, Path]) -> None:
    results = _run_ranks(tmp_path, trees, "hook")
    assert [result["hooked"] for result in results] == [True, True]
    # The line `sparkseal live-check` reads from the server log, one per rank, the same digest on both.
    lines = [result["log"].strip() for result in results]
    matches = [MODULE_CHECK.search(line) for line in lines]
    assert all(matches), lines
    assert [(m["rank"], m["ranks"], m["modules"]) for m in matches] == [
        ("0", "2", "vllm, torch, sparkseal"),
        ("1", "2", "vllm, torch, sparkseal"),
    ]
    assert matches[0]["digest"] == matches[1]["digest"]
    (trees[1] / "torch/evil.py").write_bytes(b"import os\n")
    results = _run_ranks(tmp_path, trees, "hook")
    assert results[0] == results[1]
    assert f"  torch: torch/evil.py: rank 0 no file, rank 1 sha256 {_sha(b'import os' + bytes([10]))}" in (
        results[0]["error"].splitlines()
    )


def test_a_module_missing_on_one_rank_stops_both(tmp_path: Path, trees: tuple[Path, Path]) -> None:
    shutil.rmtree(trees[1] / "sparkseal")
    results = _run_ranks(tmp_path, trees, "core")
    assert results[0] == results[1]
    lines = results[0]["error"].splitlines()
    assert lines[-1] == f"rank 1: module sparkseal: not installed (searched {trees[1]})"
    assert "  sparkseal: sparkseal/__init__.py: rank 0 sha256 " in "\n".join(lines)


def test_every_rank_reports_a_difference_from_the_image_manifest(
    tmp_path: Path, trees: tuple[Path, Path]
) -> None:
    image = tmp_path / "image"
    site = _tree(image)
    (site / "vllm/config.py").write_bytes(b"MAX_MODEL_LEN = 2048\n")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(mm.dumps(mm.tree_manifest(image, "/opt/venv")))
    results = _run_ranks(tmp_path, trees, "core", manifest)
    assert results[0] == results[1]
    expected = _sha(b"MAX_MODEL_LEN = 2048" + bytes([10]))
    actual = _sha(b"MAX_MODEL_LEN = 4096" + bytes([10]))
    assert results[0]["error"].splitlines() == [
        "sparkseal: the ranks of this deployment do not run the same verified module files",
        *(
            f"rank {rank}: changed vllm/config.py: expected sha256 {expected}, actual sha256 {actual} "
            f"(manifest {manifest})"
            for rank in (0, 1)
        ),
    ]


def test_long_difference_lists_are_cut() -> None:
    per_rank = [{"vllm": {f"vllm/f{i:02}.py": "a" * 64 for i in range(25)}}, {"vllm": {}}]
    message = plugin.describe_mismatch([0, 1], ["d0", "d1"], [], per_rank)
    lines = message.splitlines()
    assert lines[1] == "module digests differ: rank 0 d0, rank 1 d1"
    assert lines[2] == f"  vllm: vllm/f00.py: rank 0 sha256 {'a' * 64}, rank 1 no file"
    assert len(lines) == 2 + plugin.MAX_LISTED + 1
    assert lines[-1] == "  ... and 5 more differing files"


def test_register_wraps_vllm_parallel_state_once(tmp_path: Path) -> None:
    site = _tree(tmp_path)
    shutil.rmtree(site / "torch")  # the stand-in imports the real torch.distributed
    script = """
import sys
from sparkseal.vllm_integration import plugin
assert "vllm" not in sys.modules and "torch" not in sys.modules, sorted(sys.modules)
plugin.register()
from vllm.distributed import parallel_state
wrapped = parallel_state.initialize_model_parallel
assert wrapped._sparkseal_rank_check and wrapped.__name__ == "initialize_model_parallel"
plugin.register()
assert parallel_state.initialize_model_parallel is wrapped
from vllm.v1.attention.backends import registry
assert registry._ATTN_OVERRIDES == {registry.AttentionBackendEnum.CUSTOM: plugin.BACKEND_CLASS}
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


@pytest.mark.parametrize(
    ("switch", "expected"), [("0", "TRITON_MLA FLASHINFER_MLA_SPARSE_SM120"), ("1", "CUSTOM TRITON_MLA")]
)
def test_the_switch_puts_our_backend_first_for_mla_on_capability_12(
    tmp_path: Path, switch: str, expected: str
) -> None:
    site = _tree(tmp_path)
    shutil.rmtree(site / "torch")
    script = """
from types import SimpleNamespace as N
from sparkseal.vllm_integration import plugin
plugin.register()
plugin.register_attention_backend()
from vllm.platforms import cuda
gb10, h200 = N(major=12, minor=1), N(major=9, minor=0)
print(" ".join(b.name for b in cuda._get_backend_priorities(True, gb10)))
print(" ".join(b.name for b in cuda._get_backend_priorities(True, h200)))
print(" ".join(b.name for b in cuda._get_backend_priorities(False, gb10)) or "-")
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "SPARKSEAL_SPARSE_MLA": switch},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [expected, "FLASHMLA_SPARSE", "-"]


def test_an_unclear_switch_stops_the_plugin(tmp_path: Path) -> None:
    site = _tree(tmp_path)
    shutil.rmtree(site / "torch")
    done = subprocess.run(
        [sys.executable, "-c", "from sparkseal.vllm_integration import plugin; plugin.register()"],
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "SPARKSEAL_SPARSE_MLA": "yes please"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 1
    assert "SPARKSEAL_SPARSE_MLA: expected 1 or 0, got 'yes please'" in done.stderr


def test_entry_point_is_declared_for_vllm() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {
        "sparkseal": "sparkseal.vllm_integration.plugin:register"
    }


def test_local_state_reports_manifest_problems(tmp_path: Path, trees: tuple[Path, Path]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    state = plugin.local_state(("vllm",), [str(trees[0])], bad)
    assert state.problems == (
        f"{bad}: expected format 'sparkseal-module-manifest/1' with a distributions object, found 'list'",
    )
    other = tmp_path / "other"
    make_venv(other)
    manifest = tmp_path / "manifest.json"
    document = mm.tree_manifest(other, "/opt/venv")
    del document["distributions"]["torch"]
    manifest.write_text(mm.dumps(document))
    state = plugin.local_state(("torch", "nosuchmodule"), [str(trees[0])], manifest)
    assert state.problems == (
        f"module nosuchmodule: not installed (searched {trees[0]})",
        f"distribution torch is not in the manifest {manifest}",
    )
    assert plugin.local_state(("vllm",), [str(trees[0])], tmp_path / "absent.json").problems == ()


def test_the_default_scope_is_every_distribution_and_the_unowned_files(tmp_path: Path) -> None:
    site = _tree(tmp_path / "image")
    install(site, "numpy", "2.4.6", {"numpy/__init__.py": b"", "numpy/core.py": b"DOT = 1\n"})
    (site / "extra.pth").write_bytes(b"import os\n")
    state = plugin.local_state(None, None, None, site)
    assert sorted(state.files) == [mm.UNOWNED, "numpy", "sparkseal", "torch", "vllm"]
    assert sorted(state.files[mm.UNOWNED]) == ["extra.pth"]
    assert state.files["numpy"]["numpy/core.py"] == _sha(b"DOT = 1\n")
    assert state.problems == ()
    assert plugin.local_state(None, None, None, site, jobs=1) == state
    assert plugin.local_state(None, None, None, site, jobs=4) == state
    # The line `sparkseal live-check` reads names the scope.
    line = f"sparkseal: rank 0 of 2: {plugin.scope(None, site)} identical on every rank (digest 0a1b)"
    match = MODULE_CHECK.search(line)
    assert match is not None and match["modules"] == f"every distribution in {site}"

    manifest = tmp_path / "manifest.json"
    manifest.write_text(mm.dumps(mm.tree_manifest(tmp_path / "image", "/opt/venv")))
    install(site, "shadow", "1.0", {"numpy_shadow.py": b""})
    (site / "numpy/core.py").write_bytes(b"DOT = 2\n")
    state = plugin.local_state(None, None, manifest, site)
    assert state.problems == (
        f"changed numpy/core.py: expected sha256 {_sha(b'DOT = 1' + bytes([10]))}, actual sha256 "
        f"{_sha(b'DOT = 2' + bytes([10]))} (manifest {manifest})",
        f"distribution shadow 1.0 ({site / 'shadow-1.0.dist-info'}) is not in the manifest {manifest}; a "
        "distribution the image does not have can shadow the image's modules",
    )
    absent = tmp_path / "absent"
    assert plugin.local_state(None, None, None, absent).problems == (
        f"site-packages {absent}: expected a directory, found none",
    )


def test_default_scope_a_distribution_changed_on_rank_1_stops_both_ranks(
    tmp_path: Path, trees: tuple[Path, Path]
) -> None:
    for site in trees:
        install(site, "numpy", "2.4.6", {"numpy/__init__.py": b"", "numpy/core.py": b"DOT = 1\n"})
    results = _run_ranks(tmp_path, trees, "core", scope="all")
    assert results[0] == results[1] and "digest" in results[0]
    (trees[1] / "numpy/core.py").write_bytes(b"DOT = 2\n")
    results = _run_ranks(tmp_path, trees, "core", scope="all")
    assert results[0] == results[1], "both ranks must raise the same message"
    assert results[0]["error"].splitlines()[2:] == [
        f"  numpy: numpy/core.py: rank 0 sha256 {_sha(b'DOT = 1' + bytes([10]))}, "
        f"rank 1 sha256 {_sha(b'DOT = 2' + bytes([10]))}",
    ]
