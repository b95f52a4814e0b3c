"""OCI assembly: layout and digest, the docker-archive streamed from it; checked by skopeo, umoci, podman and
a Bazel fixture."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkseal.actions import oci_image as oci
from sparkseal.actions import oci_layer as layer
from sparkseal.actions import oci_load
from sparkseal.core import oci as oci_core
from sparkseal.core.docker_archive import write_docker_archive
from sparkseal.core.oci import LAYER_MEDIA_TYPE, ZSTD_LAYER_MEDIA_TYPE
from sparkseal.core.platforms import PLATFORMS, oci_platform
from sparkseal.core.pzstd import MAGIC as ZSTD_MAGIC
from tests.bazel_util import (
    BAZEL,
    MINIMAL_WORKSPACE,
    REPO,
    Workspace,
    base_env,
    make_fixture_workspace,
    process_summary,
)
from tests.fixture_wheels import zstd_wheel_into
from tests.podman import copy_into_podman, working_podman
from tests.servers.nginx_cache import NGINX, NginxCache
from tests.servers.registry_server import REGISTRY, Registry

SCRIPT = b"#!/bin/sh\necho tool\n"
TAG = "sparkseal/fixture:test"
CONFIG = oci.ImageConfig(
    entrypoint=["/opt/venv/bin/tool"],
    cmd=["--port", "8000"],
    env=["PATH=/opt/venv/bin:/usr/bin"],
    workdir="/opt/venv",
    labels={"org.opencontainers.image.title": "fixture"},
    user="0:0",
)
# What unpacking the fixture image must give: path -> (kind, mode, content or link target).
EXPECTED_ROOTFS = {
    "etc": ("dir", 0o755, None),
    "etc/app.conf": ("file", 0o644, b"key = value\n"),
    "tmp": ("dir", 0o1777, None),
    "usr": ("dir", 0o755, None),
    "usr/bin": ("dir", 0o755, None),
    "usr/bin/tool": ("link", None, "/opt/venv/bin/tool"),
    "opt": ("dir", 0o755, None),
    "opt/venv": ("dir", 0o755, None),
    "opt/venv/bin": ("dir", 0o755, None),
    "opt/venv/bin/tool": ("file", 0o755, SCRIPT),
    "opt/venv/bin/tool3": ("link", None, "tool"),
    "opt/venv/lib": ("dir", 0o755, None),
    "opt/venv/lib/mod.py": ("file", 0o644, b"X = 1\n"),
    "var": ("dir", 0o755, None),
    "var/tmp": ("dir", 0o1777, None),
}
DIRS_SPEC = {"var/tmp": {"gid": 0, "mode": "1777", "uid": 0}}


@dataclass
class Image:
    """An assembled fixture image and the paths of its parts."""

    layers: list[oci.Layer]
    layout: Path
    archive: Path
    digest: str


def make_layers(root: Path) -> list[oci.Layer]:
    """Write the two fixture layers (base: /etc, /tmp, /var/tmp, a link; app: /opt/venv) under ``root``."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "app.conf").write_bytes(b"key = value\n")
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir()
    (venv / "bin" / "tool").write_bytes(SCRIPT)
    (venv / "lib" / "mod.py").write_bytes(b"X = 1\n")
    links = root / "links.json"
    links.write_text(json.dumps({"bin/tool3": "tool"}))
    dirs = root / "dirs.json"
    dirs.write_text(json.dumps(DIRS_SPEC))
    plans = {
        "base": layer.plan_layer(
            files=[(root / "etc" / "app.conf", "/etc/app.conf")],
            symlinks=[("/usr/bin/tool", "/opt/venv/bin/tool")],
            directories=["/tmp"],
            modes=[("/tmp", "1777")],
            dirs=[(dirs, "/")],
        ),
        "app": layer.plan_layer(trees=[(venv, "/opt/venv")], links=[(links, "/opt/venv")]),
    }
    result = []
    for name, entries in plans.items():
        descriptor = root / f"{name}.json"
        descriptor.write_text(
            json.dumps(layer.write_layer(entries, root / f"{name}.tar", root / f"{name}.tar.gz"))
        )
        result.append(oci.load_layer(f"//image:{name}", descriptor, root / f"{name}.tar.gz"))
    return result


def assemble(root: Path, platform: str = "linux_aarch64", tag: str = TAG) -> Image:
    """The fixture image's layout and digest file, and its docker-archive as ``oci_load`` writes it."""
    layers = make_layers(root / "in")
    layout, archive = root / "layout", root / "image.tar"
    digest = oci.assemble(layers, platform, CONFIG, tag, layout, root / "image.digest")
    with archive.open("wb") as stream:
        write_docker_archive(layout, stream, tag)
    return Image(layers, layout, archive, digest)


def blob(image: Image, digest: str) -> bytes:
    return oci_core.blob_path(image.layout, digest).read_bytes()


def test_layout_has_canonical_documents_and_consistent_digests(tmp_path: Path) -> None:
    image = assemble(tmp_path)
    assert (image.layout / "oci-layout").read_bytes() == b'{"imageLayoutVersion":"1.0.0"}'
    assert (tmp_path / "image.digest").read_text() == image.digest
    for path in (image.layout / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    # The layout holds the documents; the layer blobs stay where the layer writer put them.
    assert len(list((image.layout / "blobs" / "sha256").iterdir())) == 2
    external = (image.layout / oci_core.EXTERNAL_BLOBS).read_bytes()
    assert json.loads(external) == {lay.digest: f"../in/{lay.blob.name}" for lay in image.layers}
    assert external == oci.canonical_json(json.loads(external))
    index_bytes = (image.layout / "index.json").read_bytes()
    index = json.loads(index_bytes)
    assert index_bytes == oci.canonical_json(index)  # sorted keys, no spaces, no trailing newline
    assert index["mediaType"] == oci.INDEX_MEDIA_TYPE
    [entry] = index["manifests"]
    assert entry["digest"] == image.digest
    assert entry["annotations"] == {oci.REF_NAME: "test"}
    assert entry["platform"] == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    manifest_bytes = blob(image, image.digest)
    manifest = json.loads(manifest_bytes)
    assert manifest_bytes == oci.canonical_json(manifest) and entry["size"] == len(manifest_bytes)
    assert manifest["layers"] == [
        {"digest": lay.digest, "mediaType": LAYER_MEDIA_TYPE, "size": lay.size} for lay in image.layers
    ]
    config_bytes = blob(image, manifest["config"]["digest"])
    config = json.loads(config_bytes)
    assert config_bytes == oci.canonical_json(config)
    assert (config["architecture"], config["os"], config["variant"]) == ("arm64", "linux", "v8")
    assert config["created"] == "1980-01-01T00:00:00Z"
    assert config["history"] == [
        {"created": "1980-01-01T00:00:00Z", "created_by": "//image:base"},
        {"created": "1980-01-01T00:00:00Z", "created_by": "//image:app"},
    ]
    assert config["rootfs"] == {"diff_ids": [lay.diff_id for lay in image.layers], "type": "layers"}
    assert config["config"] == {
        "Cmd": ["--port", "8000"],
        "Entrypoint": ["/opt/venv/bin/tool"],
        "Env": ["PATH=/opt/venv/bin:/usr/bin"],
        "Labels": {"org.opencontainers.image.title": "fixture"},
        "User": "0:0",
        "WorkingDir": "/opt/venv",
    }


def test_docker_archive_holds_the_blobs_and_a_manifest(tmp_path: Path) -> None:
    image = assemble(tmp_path)
    with tarfile.open(image.archive) as archive:
        names = archive.getnames()
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        for name in names:
            if name.startswith("blobs/sha256/") and name != "blobs/sha256":
                data = archive.extractfile(name).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    config_digest = json.loads(blob(image, image.digest))["config"]["digest"]
    assert manifest == [
        {
            "Config": "blobs/sha256/" + config_digest.removeprefix("sha256:"),
            "Layers": ["blobs/sha256/" + lay.digest.removeprefix("sha256:") for lay in image.layers],
            "RepoTags": [TAG],
        }
    ]
    assert names == sorted(names)


def test_two_assemblies_in_different_dirs_umask_and_tz_are_identical(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]); "
        "from tests.image.test_oci import assemble; assemble(Path(sys.argv[1]))"
    )
    for run, (umask, tz) in {"a": (0o022, "UTC"), "b/c": (0o077, "America/Lima")}.items():
        (tmp_path / run).mkdir(parents=True)
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / run), str(REPO)],
            env={**os.environ, "TZ": tz},
            check=True,
            preexec_fn=lambda umask=umask: os.umask(umask),
        )

    def snapshot(root: Path) -> dict[str, bytes]:
        paths = [root / "image.tar", root / "image.digest", *sorted((root / "layout").rglob("*"))]
        return {str(p.relative_to(root)): p.read_bytes() for p in paths if p.is_file()}

    first, second = snapshot(tmp_path / "a"), snapshot(tmp_path / "b/c")
    assert first == second
    # config and manifest; the layers are named by the external-blobs file
    assert len([name for name in first if name.startswith("layout/blobs/")]) == 2
    assert f"layout/{oci_core.EXTERNAL_BLOBS}" in first


def test_x86_64_maps_to_amd64_without_variant(tmp_path: Path) -> None:
    image = assemble(tmp_path, "linux_x86_64")
    [entry] = json.loads((image.layout / "index.json").read_bytes())["manifests"]
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    config = json.loads(blob(image, json.loads(blob(image, image.digest))["config"]["digest"]))
    assert (config["architecture"], "variant" in config) == ("amd64", False)
    assert {name: str(p) for name, p in PLATFORMS.items()} == {
        "linux_aarch64": "linux/arm64/v8",
        "linux_x86_64": "linux/amd64",
    }


def test_unknown_platform_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown platform 'linux_arm64': expected one of linux_aarch64, "):
        oci_platform("linux_arm64")
    layers = make_layers(tmp_path / "in")
    with pytest.raises(oci.OciError, match="unknown platform 'arm64'"):
        oci.assemble(layers, "arm64", CONFIG, TAG, tmp_path / "l", tmp_path / "d")


def test_a_layer_blob_that_is_not_the_one_described_is_refused_by_its_readers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = assemble(tmp_path)
    app = image.layers[1]
    app.blob.chmod(0o644)
    app.blob.write_bytes(image.layers[0].blob.read_bytes())  # another file at the layer's path
    out = tmp_path / "out"
    out.mkdir()
    args = ["--layout", str(image.layout), "--tag", TAG]
    assert oci_load.main([*args, "--output", str(out / "image.tar")]) == 1
    err = capsys.readouterr().err
    size = image.layers[0].size
    assert (
        f"sparkseal: load: {image.layout / '..' / 'in' / app.blob.name}: blob {app.digest} has {size} bytes"
        in err
    )
    assert f"expected {app.size}" in err
    assert oci_load.main([*args, "--oci-layout", str(out / "layout")]) == 1
    err = capsys.readouterr().err
    assert (
        f"expected the blob {app.digest}, found sha256:{image.layers[0].digest.removeprefix('sha256:')}"
        in err
    )
    assert list(out.iterdir()) == []  # nothing half-written


def test_the_complete_layout_holds_every_blob_linked_and_reads_the_same(tmp_path: Path) -> None:
    image = assemble(tmp_path)
    dest = tmp_path / "complete"
    args = ["--layout", str(image.layout), "--tag", TAG, "--oci-layout", str(dest)]
    assert oci_load.main(args) == 0
    names = sorted(p.name for p in (dest / "blobs" / "sha256").iterdir())
    config = json.loads(blob(image, image.digest))["config"]["digest"]
    digests = [*(lay.digest for lay in image.layers), image.digest, config]
    assert names == sorted(d.removeprefix("sha256:") for d in digests)
    assert not (dest / oci_core.EXTERNAL_BLOBS).exists()
    for one in image.layers:
        linked = dest / "blobs" / "sha256" / one.digest.removeprefix("sha256:")
        assert linked.stat().st_ino == one.blob.stat().st_ino  # a hard link, not a copy
    assert (dest / "index.json").read_bytes() == (image.layout / "index.json").read_bytes()
    with (tmp_path / "again.tar").open("wb") as stream:
        write_docker_archive(dest, stream, TAG)
    assert (tmp_path / "again.tar").read_bytes() == image.archive.read_bytes()
    assert oci_load.main(args) == 1  # the directory is no longer new


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"mediaType": "application/vnd.oci.image.layer.v1.tar"}, "mediaType is 'application/vnd.oci"),
        ({"diff_id": "md5:00"}, "diff_id is 'md5:00', expected 'sha256:' and 64 hex digits"),
        ({"size": -1}, "size is -1, expected a byte count"),
    ],
)
def test_a_malformed_descriptor_is_refused(tmp_path: Path, change: dict[str, object], expected: str) -> None:
    [base, _] = make_layers(tmp_path)
    descriptor = tmp_path / "base.json"
    descriptor.write_text(json.dumps({**json.loads(descriptor.read_text()), **change}))
    with pytest.raises(oci.OciError, match=re.escape(f"layer descriptor {descriptor}: {expected}")):
        oci.load_layer("//image:base", descriptor, base.blob)


@pytest.mark.parametrize(
    ("tag", "config", "expected"),
    [
        ("Sparkseal/vllm:1", CONFIG, "repository 'Sparkseal/vllm' is not a valid name"),
        ("sparkseal/vllm", CONFIG, "tag 'sparkseal/vllm': expected REPOSITORY:TAG"),
        ("sparkseal/vllm:-x", CONFIG, "tag '-x' is not valid"),
        (TAG, oci.ImageConfig(env=["NOVALUE"]), "env entry 'NOVALUE': expected NAME=VALUE"),
        (TAG, oci.ImageConfig(workdir="opt"), "workdir 'opt': expected an absolute path"),
    ],
)
def test_bad_tag_or_config_is_refused(
    tmp_path: Path, tag: str, config: oci.ImageConfig, expected: str
) -> None:
    layers = make_layers(tmp_path / "in")
    with pytest.raises(oci.OciError, match=re.escape(expected)):
        oci.assemble(layers, "linux_aarch64", config, tag, tmp_path / "l", tmp_path / "d")


def test_no_layers_or_a_used_layout_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = [
        "--layout",
        str(tmp_path / "l"),
        "--digest",
        str(tmp_path / "d"),
    ]
    assert oci.main(["--platform", "linux_aarch64", "--tag", TAG, *outputs]) == 1
    assert "an image needs at least one layer; got none" in capsys.readouterr().err
    [base, _] = make_layers(tmp_path / "in")
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "stale").write_text("")
    args = ["--layer", base.name, str(tmp_path / "in" / "base.json"), str(base.blob)]
    assert oci.main([*args, "--platform", "linux_aarch64", "--tag", TAG, *outputs]) == 1
    assert f"layout directory {tmp_path / 'l'}: expected it empty, found stale" in capsys.readouterr().err


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install -y {name}; CI installs it)")
    return path


def _run(*command: str, cwd: Path | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, f"{command}: {result.stdout}{result.stderr}"
    return result.stdout


def test_skopeo_reads_the_layout_and_the_docker_archive(tmp_path: Path) -> None:
    skopeo = _tool("skopeo")
    image = assemble(tmp_path)
    inspected = json.loads(_run(skopeo, "inspect", f"oci:{image.layout}:test"))
    assert inspected["Digest"] == image.digest
    assert (inspected["Architecture"], inspected["Os"]) == ("arm64", "linux")
    assert inspected["Layers"] == [lay.digest for lay in image.layers]
    assert inspected["Created"] == "1980-01-01T00:00:00Z"
    config = json.loads(_run(skopeo, "inspect", "--config", f"oci:{image.layout}:test"))
    assert [h["created"] for h in config["history"]] == ["1980-01-01T00:00:00Z"] * 2
    archived = json.loads(_run(skopeo, "inspect", f"docker-archive:{image.archive}"))
    assert archived["Layers"] == [lay.diff_id for lay in image.layers]  # skopeo lists them uncompressed
    assert archived["Env"] == CONFIG.env


def _rootfs(root: Path) -> dict[str, tuple[str, int | None, bytes | str | None]]:
    found: dict[str, tuple[str, int | None, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        mode = path.lstat().st_mode & 0o7777
        if path.is_symlink():
            found[rel] = ("link", None, os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir", mode, None)
        else:
            found[rel] = ("file", mode, path.read_bytes())
    return found


def test_umoci_stats_and_unpacks_files_with_their_modes(tmp_path: Path) -> None:
    umoci = _tool("umoci")
    image = assemble(tmp_path)
    layout = tmp_path / "complete"  # umoci reads ordinary layouts only
    oci_core.write_complete_layout(image.layout, layout)
    history = _run(umoci, "stat", "--image", f"{layout}:test")
    assert "//image:base" in history and "1980-01-01T00:00:00Z" in history
    _run(umoci, "raw", "unpack", "--rootless", "--image", f"{layout}:test", str(tmp_path / "rootfs"))
    assert _rootfs(tmp_path / "rootfs") == EXPECTED_ROOTFS


def test_podman_loads_the_docker_archive(tmp_path: Path) -> None:
    podman = working_podman()
    tag = f"sparkseal/fixture-load:{os.getpid()}"
    image = assemble(tmp_path, tag=tag)
    archive = image.archive
    config_digest = json.loads(blob(image, image.digest))["config"]["digest"]
    try:
        output = _run(podman, "--runtime", "runc", "load", "-i", str(archive))
        assert f"Loaded image: localhost/{tag}" in output
        inspected = json.loads(_run(podman, "image", "inspect", f"localhost/{tag}"))[0]
        assert "sha256:" + inspected["Id"] == config_digest
        assert inspected["Architecture"] == "arm64"
        assert inspected["RootFS"]["Layers"] == [lay.diff_id for lay in image.layers]
    finally:
        subprocess.run([podman, "rmi", "--force", f"localhost/{tag}"], capture_output=True, check=False)


def test_copy_into_podman_stores_the_image_podman_load_stores(tmp_path: Path) -> None:
    """The image tests' quick way into podman (skopeo from the complete layout, no temporary archive)
    stores the image ``podman load`` of our docker-archive stores: the same ID, layers and entrypoint."""
    podman = working_podman()
    _tool("skopeo")
    tag = f"localhost/sparkseal/fixture-copy:{os.getpid()}"
    image = assemble(tmp_path / "in", platform="linux_x86_64", tag=tag)
    config_digest = json.loads(blob(image, image.digest))["config"]["digest"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    try:
        copy_into_podman(image.layout, tag, scratch)
        inspected = json.loads(_run(podman, "image", "inspect", tag))[0]
        assert "sha256:" + inspected["Id"] == config_digest
        assert inspected["RootFS"]["Layers"] == [lay.diff_id for lay in image.layers]
        assert inspected["Config"]["Entrypoint"] == CONFIG.entrypoint
        assert list(scratch.iterdir()) == []  # the complete layout is removed
    finally:
        subprocess.run([podman, "rmi", "--force", tag], capture_output=True, check=False)
    with pytest.raises(AssertionError) as refused:
        copy_into_podman(image.layout, "Not/A:valid:tag", scratch)
    assert str(refused.value).startswith(
        f"skopeo copy oci:{scratch / 'complete-layout'} containers-storage:Not/A:valid:tag: exit 1: "
    )
    assert list(scratch.iterdir()) == []


# --- Bazel: the rules on a fixture workspace -----------------------------------------------------------

BAZEL_WORKSPACE = MINIMAL_WORKSPACE
# The layer blobs of the fixture image, beside its layout in bazel-bin/image.
LAYER_BLOBS = ("base.tar.gz", "app.tar.gz")

TREE_BZL = """\
def _fixture_tree_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    ctx.actions.run_shell(
        outputs = [out],
        arguments = [out.path, ctx.attr.content],
        command = "/bin/mkdir -p $1/bin $1/lib/empty && printf '#!/bin/sh\\\\necho tool\\\\n' > $1/bin/tool" +
                  " && printf '%s\\\\n' \\"$2\\" > $1/lib/mod.py",
    )
    return [DefaultInfo(files = depset([out]))]

fixture_tree = rule(implementation = _fixture_tree_impl, attrs = {"content": attr.string()})
"""

IMAGE_BUILD = """\
load("//rules/private:oci_image.bzl", "oci_image")
load("//rules/private:oci_layer.bzl", "oci_layer")
load(":tree.bzl", "fixture_tree")

fixture_tree(name = "venv", content = "{content}")

filegroup(name = "etc", srcs = ["etc/app.conf"])

oci_layer(
    name = "base",
    directories = ["/tmp"],
    dirs = {{"dirs.json": "/"}},
    modes = {{"/tmp": "1777"}},
    symlinks = {{"/usr/bin/tool": "/opt/venv/bin/tool"}},
    trees = {{":etc": "/"}},
)

oci_layer(name = "app", links = {{"links.json": "/opt/venv"}}, trees = {{":venv": "/opt/venv"}})

oci_image(
    name = "image",
    cmd = ["--port", "8000"],
    entrypoint = ["/opt/venv/bin/tool"],
    env = {{"PATH": "/opt/venv/bin:/usr/bin"}},
    labels = {{"org.opencontainers.image.title": "fixture"}},
    layers = [":base", ":app"],
    platform = "linux_aarch64",
    tag = "{tag}",
    user = "0:0",
    workdir = "/opt/venv",
)
"""


def _bazel_workspace(root: Path, content: str = "X = 1", tag: str = TAG) -> Workspace:
    make_fixture_workspace(root)
    (root / "WORKSPACE").write_text(BAZEL_WORKSPACE)
    package = root / "image"
    (package / "etc").mkdir(parents=True, exist_ok=True)
    (package / "etc" / "app.conf").write_bytes(b"key = value\n")
    (package / "links.json").write_text(json.dumps({"bin/tool3": "tool"}))
    (package / "dirs.json").write_text(json.dumps(DIRS_SPEC))
    (package / "tree.bzl").write_text(TREE_BZL)
    (package / "BUILD").write_text(IMAGE_BUILD.format(content=content, tag=tag))
    return Workspace(
        root, root.parent / (root.name + "-output-base"), root.parent / "repository-cache", base_env()
    )


@pytest.fixture(scope="module")
def bazel_ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    if BAZEL is None:
        pytest.skip("bazel is not installed (make setup installs it)")
    ws = _bazel_workspace(tmp_path_factory.mktemp("oci-bazel") / "ws")
    yield ws
    ws.shutdown()


REFUSED_BUILD = """\
load("//image:tree.bzl", "fixture_tree")
load("//rules/private:module_manifest.bzl", "module_manifest")
load("//rules/private:oci_layer.bzl", "oci_layer")
load("//rules/private:python_venv.bzl", "python_venv")

fixture_tree(name = "venv", content = "X = 1")

WHEEL = "w-1.0-py3-none-any.whl"

python_venv(name = "no_platform", installer = "installer.whl", wheels = [WHEEL])

python_venv(name = "no_installer", platform = "linux_x86_64", wheels = [WHEEL])

python_venv(name = "bytecode_alone", bytecode = True)

python_venv(
    name = "split_alone",
    installer = "installer.whl",
    platform = "linux_x86_64",
    split = "s.json",
    wheels = [WHEEL],
)

python_venv(name = "split_no_wheels", split = "s.json", split_part = "lower")

python_venv(
    name = "split_venv",
    installer = "installer.whl",
    platform = "linux_x86_64",
    split = "s.json",
    split_part = "upper",
    wheels = [WHEEL],
)

oci_layer(name = "split_and_trees", trees = {":venv": "/opt/venv"}, venv = ":split_venv")

oci_layer(name = "plain", directories = ["/tmp"])

module_manifest(name = "both", layers = [":plain"], trees = [":venv"])

module_manifest(name = "neither")

module_manifest(name = "wheelless", layers = [":plain"])
"""


@pytest.mark.bazel
def test_rules_refuse_layers_and_manifests_they_cannot_build(bazel_ws: Workspace) -> None:
    package = bazel_ws.root / "refused"
    package.mkdir(exist_ok=True)
    for name in ("installer.whl", "w-1.0-py3-none-any.whl", "s.json"):
        (package / name).write_bytes(b"not read: analysis stops first")
    (package / "BUILD").write_text(REFUSED_BUILD)
    venvs = ["no_platform", "no_installer", "bytecode_alone", "split_alone", "split_no_wheels"]
    targets = [*venvs, "split_and_trees", "both", "neither", "wheelless"]
    result = bazel_ws.bazel("build", "--nobuild", "--keep_going", *[f"//refused:{t}" for t in targets])
    assert result.returncode != 0
    for message in (
        "sparkseal: //refused:no_platform: wheels need platform (one of linux_",
        "sparkseal: //refused:no_installer: wheels need installer (the locked installer wheel, "
        "@python_tools_any_installer//file)",
        "sparkseal: //refused:bytecode_alone: bytecode needs wheels: only installed wheels are byte-compiled",
        "sparkseal: //refused:split_alone: split and split_part go together",
        "sparkseal: //refused:split_no_wheels: split needs wheels: it splits the installed wheels only",
        "sparkseal: //refused:split_and_trees: split needs wheels and no trees: it splits the installed "
        "wheels only (venv //refused:split_venv has a split, and the layer has trees)",
        "sparkseal: //refused:both: give trees or layers, not both",
        "sparkseal: //refused:neither: expected trees or layers, got neither",
        "sparkseal: //refused:wheelless: layer //refused:plain installs no wheels, so it has no module "
        "manifest",
    ):
        assert message in result.output, result.output[-4000:]


def _sandboxed(output: str) -> int:
    match = re.search(r"(\d+) linux-sandbox", output)
    return int(match.group(1)) if match else 0


@pytest.mark.bazel
def test_bazel_rules_build_the_same_image_as_the_programs(bazel_ws: Workspace, tmp_path: Path) -> None:
    result = bazel_ws.bazel("build", "//image:image", "//image:image.load")
    assert result.returncode == 0, result.output
    out = bazel_ws.bin_path("image")
    # The app layer from the tree artifact, written outside the sandbox from the same inputs, is identical:
    # neither sandbox links nor Bazel's r-xr-xr-x output modes leak into the layer.
    links = bazel_ws.root / "image" / "links.json"
    args = ["--tree", str(out / "venv"), "/opt/venv", "--links", str(links), "/opt/venv"]
    args += ["--tar", str(tmp_path / "app.tar"), "--blob", str(tmp_path / "app.tar.gz")]
    assert layer.main([*args, "--descriptor", str(tmp_path / "app.json")]) == 0
    assert (tmp_path / "app.tar.gz").read_bytes() == (out / "app.tar.gz").read_bytes()
    assert (tmp_path / "app.json").read_bytes() == (out / "app.json").read_bytes()
    # And the whole image equals the one assembled by the programs from the same inputs.
    image = assemble(tmp_path / "direct")
    assert (out / "image.digest").read_text() == image.digest
    assert not (out / "image.tar").exists()  # no docker-archive is a build output
    loaded = tmp_path / "loaded.tar"
    result = bazel_ws.bazel("run", "//image:image.load", "--", "--output", str(loaded))
    assert result.returncode == 0, result.output
    assert loaded.read_bytes() == image.archive.read_bytes()
    # The layout in bazel-bin holds config and manifest only; .load writes a complete one on request.
    assert len(list((out / "image" / "blobs" / "sha256").iterdir())) == 2
    complete = tmp_path / "complete"
    result = bazel_ws.bazel("run", "//image:image.load", "--", "--oci-layout", str(complete))
    assert result.returncode == 0, result.output
    for path in (complete / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    assert len(list((complete / "blobs" / "sha256").iterdir())) == 4
    if shutil.which("skopeo"):
        inspected = json.loads(_run("skopeo", "inspect", f"oci:{out / 'image'}:test"))
        assert inspected["Digest"] == image.digest
    script = (out / "image.load.sh").read_text()
    assert "podman" in script and "sparkseal/actions/oci_load" in script and "image/image" in script


@pytest.mark.bazel
def test_bazel_editing_one_layer_reruns_only_that_layer_and_the_image(bazel_ws: Workspace) -> None:
    result = bazel_ws.bazel("build", "//image:image")
    assert result.returncode == 0, result.output
    before = bazel_ws.bin_path("image/image.digest").read_text()
    (bazel_ws.root / "image" / "etc" / "app.conf").write_bytes(b"key = other\n")
    try:
        result = bazel_ws.bazel("build", "//image:image")
        assert result.returncode == 0, result.output
        # the base layer (written and scanned in one action) and the image; the other layer stays cached
        assert _sandboxed(result.output) == 2, result.output
        assert bazel_ws.bin_path("image/image.digest").read_text() != before
    finally:
        (bazel_ws.root / "image" / "etc" / "app.conf").write_bytes(b"key = value\n")


@pytest.mark.bazel
def test_bazel_run_load_loads_into_podman(bazel_ws: Workspace) -> None:
    podman = working_podman()
    tag = f"sparkseal/fixture-bazel:{os.getpid()}"
    (bazel_ws.root / "image" / "BUILD").write_text(IMAGE_BUILD.format(content="X = 1", tag=tag))
    try:
        result = bazel_ws.bazel("run", "//image:image.load")
        assert result.returncode == 0, result.output
        digest = bazel_ws.bin_path("image/image.digest").read_text()
        assert f"Loaded image: localhost/{tag}" in result.output
        assert f"{tag}: manifest {digest}" in result.output
        inspected = json.loads(_run(podman, "image", "inspect", f"localhost/{tag}"))[0]
        assert inspected["Architecture"] == "arm64"
    finally:
        subprocess.run([podman, "rmi", "--force", f"localhost/{tag}"], capture_output=True, check=False)
        (bazel_ws.root / "image" / "BUILD").write_text(IMAGE_BUILD.format(content="X = 1", tag=TAG))


@pytest.mark.bazel
def test_bazel_zstd_layers_hold_the_same_tars_and_load_as_tars(bazel_ws: Workspace, tmp_path: Path) -> None:
    zstd_wheel_into(bazel_ws.repository_cache)
    result = bazel_ws.bazel("build", "//image:image")
    assert result.returncode == 0, result.output
    out = bazel_ws.bin_path("image")
    gzip_diff_ids = [json.loads((out / f"{name}.json").read_text())["diff_id"] for name in ("base", "app")]
    result = bazel_ws.bazel("build", "--config=zstd", "//image:image")
    assert result.returncode == 0, result.output
    for name, diff_id in zip(("base", "app"), gzip_diff_ids, strict=True):
        described = json.loads((out / f"{name}.json").read_text())
        assert (described["mediaType"], described["diff_id"]) == (ZSTD_LAYER_MEDIA_TYPE, diff_id)
        assert described["compression"]["library"].startswith("python-zstandard 0.25.0 (zstd ")
        assert (out / f"{name}.tar.zst").read_bytes().startswith(ZSTD_MAGIC)
    layers = oci_core.read_image(out / "image").layers
    assert [lay["mediaType"] for lay in layers] == [ZSTD_LAYER_MEDIA_TYPE] * 2
    # The docker-archive of .load carries the tars, decompressed with the locked wheel in its runfiles.
    loaded = tmp_path / "loaded.tar"
    result = bazel_ws.bazel("run", "--config=zstd", "//image:image.load", "--", "--output", str(loaded))
    assert result.returncode == 0, result.output
    with tarfile.open(loaded) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest[0]["Layers"] == [f"blobs/sha256/{d.removeprefix('sha256:')}" for d in gzip_diff_ids]
    result = bazel_ws.bazel("build", "--//rules:layer_compression=lz4", "//image:image")
    assert result.returncode != 0
    assert "sparkseal: --//rules:layer_compression=lz4: expected one of gzip, zstd" in result.output


def test_load_program_streams_the_archive_to_a_pipe_or_a_file(tmp_path: Path) -> None:
    image = assemble(tmp_path)
    args = ["-m", "sparkseal.actions.oci_load", "--layout", str(image.layout), "--tag", TAG]
    piped = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, check=True).stdout
    assert piped == image.archive.read_bytes()
    assert oci_load.main([*args[2:], "--output", str(tmp_path / "out.tar")]) == 0
    assert (tmp_path / "out.tar").read_bytes() == piped
    names = ["image.digest", "image.tar", "in", "layout", "out.tar"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no partial file left beside it


def test_load_program_leaves_nothing_half_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = assemble(tmp_path)
    layer = image.layers[0].digest.removeprefix("sha256:")
    image.layers[0].blob.unlink()  # a layer blob the layout names is gone
    out = tmp_path / "out"
    out.mkdir()
    args = ["--layout", str(image.layout), "--tag", TAG, "--output", str(out / "image.tar")]
    assert oci_load.main(args) == 1
    assert layer in capsys.readouterr().err
    assert list(out.iterdir()) == []
    (image.layout / "index.json").unlink()
    assert oci_load.main(args) == 1
    assert f"{image.layout / 'index.json'}: not a readable OCI index" in capsys.readouterr().err


@pytest.mark.bazel
@pytest.mark.skipif(not Path(NGINX).exists(), reason=f"{NGINX} is missing (.ci/setup installs nginx)")
@pytest.mark.skipif(not Path(REGISTRY).exists(), reason=f"{REGISTRY} is missing (.ci/setup installs it)")
def test_a_cache_hit_image_downloads_no_layer_until_it_is_loaded(tmp_path: Path) -> None:
    """Builds without the bytes: the image target is kilobytes; .push streams the layers from the cache;
    they come down only for .load."""
    first, second = _bazel_workspace(tmp_path / "a" / "ws"), _bazel_workspace(tmp_path / "b" / "ws")
    with NginxCache() as cache:
        flags = ["--config=remote-cache", f"--remote_cache={cache.url}"]
        try:
            built = first.bazel("build", *flags, "//image:image")
            assert built.returncode == 0, built.output
            out = first.bin_path("image")
            layers = {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in LAYER_BLOBS}
            assert set(layers.values()) <= {p.name for p in (cache.root / "cas").iterdir()}
            fetched_before = len(cache.access_log())

            hit = second.bazel("build", *flags, "--remote_download_toplevel", "//image:image")
            assert hit.returncode == 0, hit.output
            assert "remote cache hit" in process_summary(hit.output), hit.output
            gets = [
                line.split()[1] for line in cache.access_log()[fetched_before:] if line.startswith("GET ")
            ]
            assert not [g for g in gets if g.removeprefix("/cas/") in layers.values()], gets
            out_b = second.bin_path("image")
            assert (out_b / "image.digest").read_text() == (out / "image.digest").read_text()
            assert not [name for name in LAYER_BLOBS if (out_b / name).exists()]

            # .push streams the layers the second clone never downloaded from the cache to the registry.
            with Registry(tmp_path / "registry") as registry:
                reference = f"{registry.host}/sparkseal/fixture:from-cache"
                pushed = second.bazel("run", *flags, "--remote_download_toplevel", "//image:image.push", "--",
                                      "--blob-cache", cache.url, reference)  # fmt: skip
                assert pushed.returncode == 0, pushed.output
                assert pushed.output.count("bytes, from the remote cache)") == len(LAYER_BLOBS), pushed.output
                digest = (out / "image.digest").read_text()
                assert f"pushed {reference}@{digest}: {len(LAYER_BLOBS) + 1} blobs uploaded" in pushed.output
                # Pushing again uploads nothing and reads nothing from the cache.
                fetched_before = len(cache.access_log())
                again = second.bazel("run", *flags, "--remote_download_toplevel", "//image:image.push", "--",
                                     "--blob-cache", cache.url, reference)  # fmt: skip
                assert again.returncode == 0, again.output
                pushed_again = f"pushed {reference}@{digest}: 0 blobs uploaded (0 bytes), 3 already there"
                assert pushed_again in again.output
                assert not [line for line in cache.access_log()[fetched_before:] if line.startswith("GET ")]
            assert not [name for name in LAYER_BLOBS if (out_b / name).exists()]

            # .load reads the layers: Bazel 4.2.3 does not download a run target's runfiles under
            # --remote_download_toplevel, so the run asks for every output; the archive is the first clone's.
            archives = []
            for ws in (first, second):
                target = tmp_path / f"{ws.root.parent.name}.tar"
                loaded = ws.bazel("run", *flags, "--remote_download_outputs=all", "//image:image.load", "--",
                                  "--output", str(target))  # fmt: skip
                assert loaded.returncode == 0, loaded.output
                archives.append(target.read_bytes())
            assert archives[0] == archives[1]
        finally:
            first.shutdown()
            second.shutdown()


def test_a_malformed_external_blobs_file_or_a_used_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = assemble(tmp_path)
    dest = tmp_path / "used"
    dest.mkdir()
    (dest / "x").write_text("")
    args = ["--layout", str(image.layout), "--tag", TAG]
    assert oci_load.main([*args, "--oci-layout", str(dest)]) == 1
    assert f"--oci-layout {dest}: expected a new or empty directory" in capsys.readouterr().err
    (image.layout / oci_core.EXTERNAL_BLOBS).write_text('{"sha256:00": "/abs/path"}')
    with pytest.raises(oci_core.LayoutError) as raised:
        oci_core.blob_path(image.layout, image.layers[0].digest)
    message = str(raised.value)
    assert (
        f"{image.layout / oci_core.EXTERNAL_BLOBS}: expected {{'sha256:<64 hex>': 'relative/path'}}"
        in message
    )
