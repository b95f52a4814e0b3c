"""bench/hosts.py's comparison of two hosts' execution logs, and of their provenance statements."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench import hosts

SDIST = "vllm-0.25.1.tar.gz"


def _log(path: Path, spawns: list[dict]) -> Path:
    """A JSON execution log as Bazel writes it: one object after another."""
    path.write_text("\n".join(json.dumps(spawn, indent=1) for spawn in spawns) + "\n")
    return path


def _spawn(mnemonic: str, outputs: list[str], inputs: dict[str, str]) -> dict:
    return {
        "mnemonic": mnemonic,
        "actualOutputs": [{"path": path} for path in outputs],
        "inputs": [
            {"path": path, "digest": {"hash": digest, "sizeBytes": "1"}} for path, digest in inputs.items()
        ],
    }


def _spawns(config: str, external: str, main_runfiles: str, sdist_digest: str = "aa") -> list[dict]:
    """Two actions as one Bazel mode logs them: ``external`` names a repository as that mode does."""
    tool = f"bazel-out/{config}-exec/bin/sparkseal/actions/vllm_source_tree.runfiles/{main_runfiles}"
    return [
        _spawn(
            "VllmSourceTree",
            [f"bazel-out/{config}/bin/third_party/vllm/source_tree"],
            {
                f"external/{external('vllm_sdist')}/file/{SDIST}": sdist_digest,
                f"{tool}/sparkseal/core/sdist.py": "bb",
                f"bazel-out/{config}/bin/third_party/vllm/source_tree.params": "cc",
            },
        ),
        _spawn(
            "WheelInstall",
            [f"bazel-out/{config}/bin/external/{external('python_deps')}/site"],
            {f"external/{external('python_deps')}/file/numpy.whl": "dd"},
        ),
    ]


WORKSPACE = ("k8-fastbuild", lambda name: name, "sparkseal")
BZLMOD_7 = ("k8-fastbuild-ST-1234", lambda name: f"_main~sparkseal~{name}", "_main")
BZLMOD_8 = ("k8-fastbuild-ST-5678", lambda name: f"+sparkseal+{name}", "_main")


@pytest.mark.parametrize("bzlmod", [BZLMOD_7, BZLMOD_8], ids=["bazel7", "bazel8"])
def test_external_inputs_are_compared_under_bzlmod(tmp_path: Path, bzlmod: tuple) -> None:
    """Canonical repository names are read as WORKSPACE names, so every input pairs up."""
    workspace = hosts.spawns(_log(tmp_path / "ws.json", _spawns(*WORKSPACE)))
    same = hosts.spawns(_log(tmp_path / "same.json", _spawns(*bzlmod)))
    assert hosts.compare(workspace, same) == (
        "2 actions in both logs, 0 with different input lists, 0 in one log only; of the 3 inputs both "
        "logs name, 0 have another digest."
    )
    other = hosts.spawns(_log(tmp_path / "other.json", _spawns(*bzlmod, sdist_digest="ee")))
    assert hosts.compare(workspace, other) == (
        "2 actions in both logs, 1 with different input lists (VllmSourceTree), 0 in one log only; of the 3 "
        "inputs both logs name, 1 have another digest (VllmSourceTree; files: "
        f"`external/vllm_sdist/file/{SDIST}`)."
    )


def test_workspace_path() -> None:
    assert hosts.workspace_path(
        "bazel-out/k8-opt-exec-ST-1/bin/sparkseal/actions/sbom.runfiles/_main~sparkseal~python_deps/site/a.py"
    ) == ("bazel-out/bin/sparkseal/actions/sbom.runfiles/python_deps/site/a.py")
    assert hosts.workspace_path("bazel-out/k8-opt/bin/x.runfiles/_main/sparkseal/core/tar.py") == (
        "bazel-out/bin/x.runfiles/sparkseal/sparkseal/core/tar.py"
    )
    assert hosts.workspace_path("external/debian_linux_x86_64/file/g++-12_12.2.0-14+deb12u1_arm64.deb") == (
        "external/debian_linux_x86_64/file/g++-12_12.2.0-14+deb12u1_arm64.deb"
    )


def _statement(record: dict, builder: dict, targets: list[str]) -> dict:
    return {
        "predicate": {
            "buildDefinition": {
                "externalParameters": {"targets": targets},
                "internalParameters": {"bazel": record, "sourceDateEpoch": 315532800},
            },
            "runDetails": {"builder": {"id": "urn:sparkseal:builder:bazel-rules:v1", "version": builder}},
        }
    }


def test_provenance_compared_without_the_bazel_record() -> None:
    """Two hosts' statements that differ only in what they record of Bazel compare equal; nothing else is
    blanked."""
    old = {"declared": None, "inferred": "< 6.2 (from features: ...absent)", "release": None}
    new = {"declared": "7.7.1", "inferred": ">= 6.2 (from features: ...present)", "release": "8.1.0"}
    python = {"python": "CPython 3.11.2"}
    bookworm = _statement(old, python, ["//:image"])
    sid = _statement(new, {**python, "bazel": "8.1.0"}, ["//:image"])
    assert hosts.without_bazel_record(copy.deepcopy(bookworm)) == hosts.without_bazel_record(sid)
    other = _statement(old, python, ["//:image_linux_x86_64"])
    assert hosts.without_bazel_record(copy.deepcopy(bookworm)) != hosts.without_bazel_record(other)
