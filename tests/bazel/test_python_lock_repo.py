"""The python_lock hub in a fixture workspace, against a loopback index; layers install its wheels."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, REPO, Workspace, base_env, make_fixture_workspace
from tests.fixture_wheels import locked_installer_wheel, make_wheel
from tests.servers.fixture_index import FixtureIndex

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

PLATFORMS = ("linux_aarch64", "linux_x86_64")
# Real wheels are kept in the repository cache every workspace of this user shares (see .bazelrc).
REPO_CACHE = Path.home() / ".cache" / "sparkseal" / "repository"
SITE = "opt/venv/lib/python3.11/site-packages"
SO = b"\x7fELF fake torch extension"

WORKSPACE = (
    MINIMAL_WORKSPACE
    + """
load("//rules/private:python_lock.bzl", "python_lock")

python_lock(
    name = "python_deps",
    locks = {
        "//locks:requirements_linux_aarch64.txt": "linux_aarch64",
        "//locks:requirements_linux_x86_64.txt": "linux_x86_64",
    },
    files = {
        "//locks:requirements_linux_aarch64.files.json": "linux_aarch64",
        "//locks:requirements_linux_x86_64.files.json": "linux_x86_64",
    },
)

python_lock(
    name = "python_tools",
    locks = {"//locks:tools.txt": "any"},
    files = {"//locks:tools.files.json": "any"},
)

# The checked-in locks of the repository, to check that the hub reads them.
python_lock(
    name = "real_deps",
    locks = {
        "//third_party/python:requirements_linux_aarch64.txt": "linux_aarch64",
        "//third_party/python:requirements_linux_x86_64.txt": "linux_x86_64",
    },
    files = {
        "//third_party/python:requirements_linux_aarch64.files.json": "linux_aarch64",
        "//third_party/python:requirements_linux_x86_64.files.json": "linux_x86_64",
    },
)

load("@python_deps//:repositories.bzl", "python_deps_repositories")

python_deps_repositories()

load("@python_tools//:repositories.bzl", "python_tools_repositories")

python_tools_repositories()

load("@real_deps//:repositories.bzl", "real_deps_repositories")

real_deps_repositories()
"""
)

VENV_BUILD = """\
load("@python_deps//:requirements.bzl", "WHEELS_BY_LAYER", "wheel")
load(
    "@real_deps//:requirements.bzl",
    REAL_LAYERS = "WHEELS_BY_LAYER",
    REAL_PINS = "PINS",
    REAL_WHEELS = "WHEELS",
)
load("//rules:defs.bzl", "oci_layer", "python_venv")

REAL_SMALL = ["certifi", "charset-normalizer", "idna", "requests", "urllib3"]

# name -> (platform, pyvenv_cfg, wheels): each venv in a layer of its own that keeps its plain tar, which
# the tests read. No scan: what is installed is the fixture's.
VENVS = {
    "torch_x86_64": ("linux_x86_64", True, WHEELS_BY_LAYER["linux_x86_64"]["torch"]),
    "deps_x86_64": ("linux_x86_64", False, WHEELS_BY_LAYER["linux_x86_64"]["deps"]),
    "wrong_platform": ("linux_x86_64", True, [wheel("linux_aarch64", "beta")]),
    # A few small wheels of the checked-in aarch64 lock, from the configured index (one of them compiled).
    "real_requests_aarch64": (
        "linux_aarch64",
        True,
        [REAL_PINS["linux_aarch64"][p]["label"] for p in REAL_SMALL],
    ),
}

[
    python_venv(
        name = name + "_venv",
        installer = "@python_tools_any_installer//file",
        platform = venv[0],
        pyvenv_cfg = venv[1],
        wheels = venv[2],
    )
    for name, venv in VENVS.items()
]

[oci_layer(name = name, keep_tar = True, scan = False, venv = name + "_venv") for name in VENVS]

genrule(
    name = "real_summary",
    outs = ["real_summary.json"],
    cmd = "echo '%s' > $@" % json.encode({
        "pins": {p: {k: v["label"] for k, v in REAL_PINS[p].items()} for p in REAL_PINS},
        "wheels": REAL_WHEELS,
        "layers": REAL_LAYERS,
    }),
)
"""


@dataclass
class Fixture:
    ws: Workspace
    index: FixtureIndex
    locks: Path

    def build(self, *targets: str) -> tuple[int, str]:
        result = self.ws.bazel("build", *targets)
        return result.returncode, result.output

    def tree(self, target: str) -> Path:
        return layer_tree(self.ws, target)


def layer_tree(ws: Workspace, target: str) -> Path:
    """The files of layer ``//venv:<target>``, unpacked from its plain tar beside it (once)."""
    tar = ws.bin_path(f"venv/{target}.tar")
    tree = ws.root.parent / "unpacked" / target
    if not tree.exists():
        with tarfile.open(tar) as archive:
            archive.extractall(tree)
    return tree


def _fixture_files(tmp: Path) -> dict[str, dict[str, tuple[str, bytes]]]:
    """platform -> project -> (filename, bytes) of the fixture closure."""
    closure: dict[str, dict[str, tuple[str, bytes]]] = {}
    for platform in PLATFORMS:
        arch = platform.removeprefix("linux_")
        directory = tmp / platform
        directory.mkdir()
        native = f"cp311-cp311-manylinux_2_28_{arch}"
        wheels = [
            make_wheel(
                directory, "torch", "2.11.0", tag=native, files={"torch/__init__.py": b"", "torch/_C.so": SO},
                modes={"torch/_C.so": 0o755}, console_scripts={"torchrun": "torch:main"},
            ),
            make_wheel(directory, "nvidia-cublas", "13.1.0.3", tag=f"py3-none-manylinux_2_27_{arch}",
                       files={"nvidia/cu13/lib/libcublas.so.13": b"\x7fELF cublas"}),
            make_wheel(directory, "alpha", "1.0", files={"alpha/__init__.py": b"def main():\n    return 0\n"},
                       console_scripts={"alpha": "alpha:main"}),
            make_wheel(directory, "beta", "2.0", tag=native, files={"beta/__init__.py": b""}),
        ]  # fmt: skip
        closure[platform] = {w.name.split("-")[0].replace("_", "-"): (w.name, w.read_bytes()) for w in wheels}
    installer = locked_installer_wheel()
    closure["any"] = {"installer": ("installer-1.1.0-py3-none-any.whl", installer.read_bytes())}
    return closure


def _write_locks(directory: Path, closure: dict[str, dict[str, tuple[str, bytes]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "BUILD").write_text('exports_files(glob(["*"]))\n')
    for platform, wheels in closure.items():
        stem = "tools" if platform == "any" else f"requirements_{platform}"
        lines, entries = ["# fixture lock"], {}
        for project in sorted(wheels):
            filename, data = wheels[project]
            version = filename.split("-")[1]
            sha = hashlib.sha256(data).hexdigest()
            lines += [f"{project}=={version} \\", f"    --hash=sha256:{sha}", "    # via fixture"]
            entries[project] = {"filename": filename, "sha256": sha, "version": version}
        (directory / f"{stem}.txt").write_text("\n".join(lines) + "\n")
        sidecar = {"format": 1, "platform": platform, "requirements": f"{stem}.txt", "wheels": entries}
        (directory / f"{stem}.files.json").write_text(json.dumps(sidecar, indent=2) + "\n")


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    tmp = tmp_path_factory.mktemp("python-lock")
    closure = _fixture_files(tmp)
    served = {filename: data for wheels in closure.values() for filename, data in wheels.values()}
    root = tmp / "ws"
    make_fixture_workspace(root)
    shutil.copytree(REPO / "third_party/python", root / "third_party/python")
    (root / "WORKSPACE").write_text(WORKSPACE)
    (root / "venv").mkdir()
    (root / "venv/BUILD").write_text(VENV_BUILD)
    _write_locks(root / "locks", closure)
    with FixtureIndex(served) as index:
        ws = Workspace(root, tmp / "output-base", tmp / "repository-cache", base_env(PIP_INDEX_URL=index.url))
        yield Fixture(ws, index, root / "locks")
        ws.shutdown()


@pytest.mark.network
def test_layers_install_from_the_hub_and_only_needed_wheels_download(fixture: Fixture) -> None:
    code, output = fixture.build("//venv:torch_x86_64", "//venv:deps_x86_64")
    assert code == 0, output
    torch = fixture.tree("torch_x86_64")
    deps = fixture.tree("deps_x86_64")
    assert (torch / SITE / "torch/_C.so").read_bytes() == SO
    assert (torch / SITE / "nvidia/cu13/lib/libcublas.so.13").is_file()
    assert (torch / "opt/venv/bin/torchrun").read_text().startswith("#!/opt/venv/bin/python3\n")
    assert (torch / "opt/venv/pyvenv.cfg").read_text().startswith("home = /usr/bin\n")
    assert sorted(p.name for p in (deps / SITE).iterdir()) == [
        "alpha", "alpha-1.0.dist-info", "beta", "beta-2.0.dist-info",
    ]  # fmt: skip
    assert not (deps / "opt/venv/pyvenv.cfg").exists()
    # Declaring the aarch64 repositories fetched nothing of them.
    fetched = {path.rsplit("/", 1)[1] for path in fixture.index.requests if path.startswith("/packages/")}
    assert fetched == {
        "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl",
        "alpha-1.0-py3-none-any.whl",
        "beta-2.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "installer-1.1.0-py3-none-any.whl",
    }


@pytest.mark.network
def test_wheel_for_another_platform_fails_the_action(fixture: Fixture) -> None:
    code, output = fixture.build("//venv:wrong_platform")
    assert code != 0
    assert (
        "beta-2.0-cp311-cp311-manylinux_2_28_aarch64.whl: tags cp311-cp311-manylinux_2_28_aarch64 "
        "do not install on CPython 3.11 on linux_x86_64, manylinux glibc <= 2.36"
    ) in output


def test_hub_reads_the_checked_in_locks(fixture: Fixture) -> None:
    code, output = fixture.build("//venv:real_summary")
    assert code == 0, output
    summary = json.loads(fixture.ws.bin_path("venv/real_summary.json").read_text())
    for platform in PLATFORMS:
        sidecar = json.loads((REPO / f"third_party/python/requirements_{platform}.files.json").read_text())
        labels = summary["pins"][platform]
        assert sorted(labels) == sorted(sidecar["wheels"])
        # Resolved in the hub (so that they work under bzlmod too): the full form of the label.
        assert labels["torch"] == f"@real_deps_{platform}_torch//file:file"
        assert labels["nvidia-cublas"] == f"@real_deps_{platform}_nvidia_cublas//file:file"
        assert summary["wheels"][platform] == [labels[p] for p in sorted(labels)]
        layers = summary["layers"][platform]
        assert sorted(layers["torch"] + layers["deps"]) == sorted(summary["wheels"][platform])
        assert labels["torch"] in layers["torch"] and labels["nvidia-cublas"] in layers["torch"]
        assert labels["transformers"] in layers["deps"]


def _edit_sidecar(fixture: Fixture, platform: str, project: str, **changes: str) -> str:
    path = fixture.locks / f"requirements_{platform}.files.json"
    original = path.read_text()
    sidecar = json.loads(original)
    sidecar["wheels"][project].update(changes)
    path.write_text(json.dumps(sidecar, indent=2) + "\n")
    return original


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"sha256": "0" * 64},
            'sparkseal: //locks:requirements_linux_x86_64.files.json: alpha: sha256 "%s", expected one of %s '
            "(//locks:requirements_linux_x86_64.txt:2)",
        ),
        (
            {"version": "9.9"},
            'sparkseal: //locks:requirements_linux_x86_64.files.json: alpha: version "9.9", expected "1.0" '
            "(//locks:requirements_linux_x86_64.txt:2)",
        ),
    ],
)
def test_sidecar_that_disagrees_with_the_lock_is_refused(
    fixture: Fixture, change: dict[str, str], expected: str
) -> None:
    lock_text = (fixture.locks / "requirements_linux_x86_64.txt").read_text()
    locked_sha = lock_text.split("alpha==1.0 \\\n    --hash=sha256:")[1][:64]
    original = _edit_sidecar(fixture, "linux_x86_64", "alpha", **change)
    try:
        code, output = fixture.build("//venv:deps_x86_64")
    finally:
        (fixture.locks / "requirements_linux_x86_64.files.json").write_text(original)
    assert code != 0
    if "sha256" in change:
        expected = expected % (change["sha256"], locked_sha)
    assert expected in output, output


def test_lock_without_a_hash_is_refused(fixture: Fixture) -> None:
    path = fixture.locks / "requirements_linux_aarch64.txt"
    original = path.read_text()
    path.write_text(original.replace("beta==2.0 \\\n    --hash=sha256:", "beta==2.0\n    # sha256:"))
    try:
        code, output = fixture.build("//venv:deps_x86_64")
    finally:
        path.write_text(original)
    assert code != 0
    assert (
        "sparkseal: //locks:requirements_linux_aarch64.txt:5: beta==2.0 has no --hash (expected at least one)"
        in output
    )


@pytest.mark.network
def test_real_hub_installs_small_locked_aarch64_wheels_from_the_index(fixture: Fixture) -> None:
    """End to end with the configured index: five small wheels of the real lock, nothing else downloaded."""
    ws = Workspace(
        fixture.ws.root,
        fixture.ws.output_base.with_name("output-base-real"),
        REPO_CACHE,
        base_env(),
    )
    try:
        result = ws.bazel("build", "//venv:real_requests_aarch64")
        assert result.returncode == 0, result.output
        tree = layer_tree(ws, "real_requests_aarch64")
    finally:
        ws.shutdown()
    site = tree / SITE
    assert (site / "requests/__init__.py").is_file()
    extensions = sorted((site / "charset_normalizer").glob("*.so"))
    assert extensions, sorted(p.name for p in (site / "charset_normalizer").iterdir())
    # An aarch64 ELF (e_machine 183), installed on an x86_64 host without running it.
    assert extensions[0].read_bytes()[18:20] == (183).to_bytes(2, "little")
    assert (tree / "opt/venv/bin/normalizer").read_text().startswith("#!/opt/venv/bin/python3\n")
    sidecar = json.loads((REPO / "third_party/python/requirements_linux_aarch64.files.json").read_text())
    for project in ("certifi", "charset-normalizer", "idna", "requests", "urllib3"):
        version = sidecar["wheels"][project]["version"]
        dist = project.replace("-", "_")
        assert (site / f"{dist}-{version}.dist-info/INSTALLER").read_text() == "sparkseal\n"
