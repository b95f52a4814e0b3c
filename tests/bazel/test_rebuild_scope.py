"""Editing an action program re-runs only the actions that use it (Bazel's execution log and action graph).

A fixture workspace holds the real rules and action programs, the fixture vLLM chain (unpack, patch,
overlay, repack), an image layer over the patched tree, and the kernels wheel rule wired to a stand-in
CUDA toolchain (it is analysed, never run: its real build needs the locked CUDA wheels, see
tests/unit/test_kernels_wheel.py). After the layer writer is edited, the rebuild's execution log must hold
the layer action and nothing else, and the kernels action must keep its key and inputs. After a patch is
edited, of the fixture vLLM's two image layers only the one of our changed files runs again.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel.test_bazel_fixture import GOOD_PATCH, SPECULATOR, Fixture, _artifacts, _workspace
from tests.bazel_remote import read_execution_log
from tests.bazel_util import BAZEL, REPO
from tests.fixture_wheels import locked_installer_wheel
from tests.servers.fixture_index import FixtureIndex

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

LAYER_WRITER = "sparkseal/actions/oci_layer.py"
KERNELS = "//kernels_sm121:wheel_linux_x86_64"
TARGETS = ("//third_party/vllm:wheel_linux_x86_64", "//scope:vllm_layer")
SPLIT_LAYERS = ("//scope:vllm_upstream", "//scope:vllm_patched")
SITE = "opt/venv/lib/python3.11/site-packages"

# The fixture vLLM as the image installs it: the upstream wheel without the files our wheel changes, and
# our wheel with only those (sparkseal/core/wheel_split.py). No scan: the scanner is not in the fixture.
SPLIT_BUILD = """
SPLIT_PARTS = [
    ("vllm_upstream", "lower", "@vllm_wheel_linux_x86_64//file"),
    ("vllm_patched", "upper", "//third_party/vllm:wheel_linux_x86_64"),
]

[
    python_venv(
        name = name + "_venv",
        bytecode = True,
        installer = "{installer}",
        platform = "linux_x86_64",
        split = "//third_party/vllm:wheel_linux_x86_64_split",
        split_part = part,
        wheels = [wheel],
    )
    for name, part, wheel in SPLIT_PARTS
]

[oci_layer(name = name, scan = False, venv = name + "_venv") for name, _, _ in SPLIT_PARTS]
"""

# The labels of @sparkseal_cuda that the kernels_wheel rule reads, as files of a stand-in repository.
STAND_IN_CUDA = {
    "cuda": "cuda/bin/nvcc",
    "cuda_root": "cuda/toolkit.json",
    "cmake": "cmake/bin/cmake",
    "cmake_files": "cmake/share/cmake.cmake",
    "ninja": "ninja/bin/ninja",
    "python": "python/scikit_build_core/__init__.py",
    "python_root": "python/site.json",
}


def _stand_in_cuda(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "WORKSPACE").write_text('workspace(name = "sparkseal_cuda")\n')
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, rel in STAND_IN_CUDA.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"stand-in for {name}\n")
        build.append(f"filegroup(name = {name!r}, srcs = [{rel!r}])")
    (root / "BUILD").write_text("\n".join(build) + "\n")


@pytest.fixture(scope="module")
def scope(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    tmp = tmp_path_factory.mktemp("rebuild-scope")
    artifacts = _artifacts(tmp)
    with FixtureIndex(artifacts) as index:
        ws = _workspace(tmp / "ws", tmp / "repository-cache", index)
        root = ws.root
        shutil.copytree(REPO / "kernels_sm121", root / "kernels_sm121")
        for name in ("README.md", "pyproject.toml"):
            shutil.copyfile(REPO / name, root / name)
        # The real top-level BUILD needs the locked Python closure; the kernels wheel needs only these.
        (root / "BUILD").write_text('exports_files(["README.md", "pyproject.toml"])\n')
        _stand_in_cuda(tmp / "cuda")
        with (root / "WORKSPACE").open("a") as workspace:
            workspace.write(f'\nlocal_repository(name = "sparkseal_cuda", path = "{tmp / "cuda"}")\n')
        (root / "scope").mkdir()
        installer = locked_installer_wheel()
        shutil.copyfile(installer, root / "scope" / installer.name)
        (root / "scope" / "BUILD").write_text(
            'load("//rules:defs.bzl", "oci_layer", "python_venv")\n\n'
            'oci_layer(name = "vllm_layer", trees = {"//third_party/vllm:patched_tree": "/opt/vllm"})\n'
            + SPLIT_BUILD.format(installer=installer.name)
        )
        fixture = Fixture(ws, index, artifacts)
        fixture.configure()
        yield fixture
        ws.shutdown()


def _kernels_action(fixture: Fixture) -> tuple[str, list[str]]:
    """The key and the input paths of the kernels wheel's action, from Bazel's action graph."""
    result = fixture.ws.bazel("aquery", "--output=jsonproto", f"mnemonic(KernelsWheel, {KERNELS})")
    assert result.returncode == 0, result.output
    # Bazel's own messages share the output with the JSON document.
    graph, _ = json.JSONDecoder().raw_decode(result.output, result.output.index("{"))
    fragments = {f["id"]: f for f in graph["pathFragments"]}

    def path(fragment_id: int) -> str:
        parts = []
        while fragment_id:
            fragment = fragments[fragment_id]
            parts.append(fragment["label"])
            fragment_id = fragment.get("parentId", 0)
        return "/".join(reversed(parts))

    artifacts = {a["id"]: path(a["pathFragmentId"]) for a in graph["artifacts"]}
    depsets = {d["id"]: d for d in graph["depSetOfFiles"]}

    def files(depset_id: int) -> list[str]:
        entry = depsets[depset_id]
        found = [artifacts[i] for i in entry.get("directArtifactIds", [])]
        for child in entry.get("transitiveDepSetIds", []):
            found += files(child)
        return found

    (action,) = graph["actions"]
    inputs = sorted({p for d in action["inputDepSetIds"] for p in files(d)})
    return action["actionKey"], inputs


def test_editing_the_layer_writer_reruns_the_layer_only(scope: Fixture, tmp_path: Path) -> None:
    code, output = scope.build(*TARGETS)
    assert code == 0, output
    key_before, kernels_inputs = _kernels_action(scope)
    python_inputs = sorted(p for p in kernels_inputs if p.startswith("sparkseal/"))
    assert "sparkseal/kernels/_lib.py" in python_inputs, kernels_inputs
    assert "sparkseal/core/manifest.py" in python_inputs, kernels_inputs
    # Its own program (a py_tool launcher, its sources among the launcher's runfiles) is an input; no other
    # action program, fetch helper or auditor is.
    assert any(p.endswith("/bin/sparkseal/actions/kernels_wheel") for p in kernels_inputs), kernels_inputs
    foreign = [p for p in python_inputs if p.split("/")[1] in {"actions", "fetch", "audit"}]
    assert foreign == [], f"foreign inputs of the kernels wheel: {foreign}"
    assert not [p for p in kernels_inputs if p.endswith(LAYER_WRITER)], kernels_inputs

    writer = scope.ws.root / LAYER_WRITER
    writer.write_text(writer.read_text() + "\n# an edit that changes no output\n")
    log = tmp_path / "exec.json"
    code, output = scope.build(f"--execution_log_json_file={log}", *TARGETS)
    assert code == 0, output
    ran = sorted(str(spawn.get("mnemonic")) for spawn in read_execution_log(log))
    assert ran == ["OciLayer"], f"after editing {LAYER_WRITER}, expected only the layer to run, ran {ran}"
    assert _kernels_action(scope) == (key_before, kernels_inputs)


def test_the_log_sees_a_patch_action_rerun(scope: Fixture, tmp_path: Path) -> None:
    """The same check notices when an edit does reach the patch chain (so it can fail)."""
    code, output = scope.build(*TARGETS)
    assert code == 0, output
    reader = scope.ws.root / "sparkseal/core/patchset.py"
    reader.write_text(reader.read_text() + "\n# an edit to the patch reader\n")
    log = tmp_path / "exec.json"
    code, output = scope.build(f"--execution_log_json_file={log}", *TARGETS)
    assert code == 0, output
    ran = {str(spawn.get("mnemonic")) for spawn in read_execution_log(log)}
    assert {"VllmPatch", "VllmOverlay"} <= ran, ran
    assert "VllmUnpack" not in ran, ran


def test_editing_a_patch_rebuilds_the_layer_of_our_files_and_not_the_upstream_one(
    scope: Fixture, tmp_path: Path
) -> None:
    code, output = scope.build(*SPLIT_LAYERS)
    assert code == 0, output
    upstream_layer = scope.ws.bin_path("scope/vllm_upstream.tar.gz")
    before = upstream_layer.read_bytes()
    scope.configure(patches={"0001-fix.patch": GOOD_PATCH.replace("return -1", "return -2")})
    try:
        log = tmp_path / "exec.json"
        code, output = scope.build(f"--execution_log_json_file={log}", *SPLIT_LAYERS)
        assert code == 0, output
        spawns = read_execution_log(log)
        ran = sorted(str(spawn.get("mnemonic")) for spawn in spawns)
        assert ran == ["OciLayer", "VllmOverlay", "VllmPatch", "VllmRepack"], ran
        (layer,) = [spawn for spawn in spawns if spawn.get("mnemonic") == "OciLayer"]
        outputs = [str(path) for path in layer.get("listedOutputs", [])]
        assert outputs and all("/scope/vllm_patched." in path for path in outputs), outputs
        assert upstream_layer.read_bytes() == before
        with tarfile.open(scope.ws.bin_path("scope/vllm_patched.tar.gz")) as archive:
            spec = archive.extractfile(f"{SITE}/{SPECULATOR}")
            assert spec is not None and spec.read() == b"def mapping():\n    return -2\n"
            names = archive.getnames()
        assert f"{SITE}/vllm/__init__.py" not in names
        with tarfile.open(upstream_layer) as archive:
            assert f"{SITE}/{SPECULATOR}" not in archive.getnames()
            assert f"{SITE}/vllm/__init__.py" in archive.getnames()
    finally:
        scope.configure()
