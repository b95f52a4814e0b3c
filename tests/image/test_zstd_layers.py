"""zstd layers: frames whose bytes do not depend on the thread count, readers, the docker-archive, podman."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from sparkseal.actions import oci_image as oci
from sparkseal.actions import oci_layer as layer
from sparkseal.actions import oci_load
from sparkseal.core import oci as oci_core
from sparkseal.core import pzstd
from sparkseal.core.docker_archive import write_docker_archive
from sparkseal.core.oci import LAYER_MEDIA_TYPE, ZSTD_LAYER_MEDIA_TYPE, LayoutError, layer_tar
from tests.podman import run_image, working_podman

zstandard = pytest.importorskip("zstandard")

HOST_PLATFORM = {"x86_64": "linux_x86_64", "aarch64": "linux_aarch64"}.get(platform.machine())
HELLO_C = b"""#include <stdio.h>
int main(int argc, char **argv) {
    char text[256] = {0};
    FILE *file = fopen(argv[1], "r");
    if (!file) return 3;
    fread(text, 1, sizeof text - 1, file);
    printf("read from the other layer: %s", text);
    return 0;
}
"""


def _data(size: int) -> bytes:
    """Compressible but not trivial bytes: repeated records with a counter."""
    return b"".join(b"record %08d of a layer\n" % i for i in range(size // 24 + 1))[:size]


def _compress(data: bytes, workers: int, chunks: list[int], block_size: int) -> bytes:
    out = _Sink()
    with pzstd.ParallelZstdWriter(out, pzstd.LEVEL, workers, zstandard, block_size=block_size) as writer:
        start = 0
        for size in chunks:
            writer.write(data[start : start + size])
            start += size
        writer.write(data[start:])
    return bytes(out.data)


class _Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)


def test_frames_do_not_depend_on_the_thread_count_or_the_writes() -> None:
    data = _data(700_000)
    block = 64 << 10
    one = _compress(data, 1, [], block)
    assert _compress(data, 4, [], block) == one
    assert _compress(data, 3, [1, 65536, 12345, 200_000], block) == one
    # One frame per block: the frames are independent, each with its content size.
    assert one.count(pzstd.MAGIC) >= len(data) // block
    assert zstandard.ZstdDecompressor().stream_reader(one, read_across_frames=True).read() == data
    # An exact multiple of the block size gets no trailing empty frame, whatever the thread count.
    exact = data[: 4 * block]
    assert _compress(exact, 1, [], block) == _compress(exact, 8, [block] * 4, block)


def test_the_zstd_program_reads_the_frames_and_an_empty_stream() -> None:
    zstd = shutil.which("zstd")
    if zstd is None:
        pytest.skip("the zstd program is not installed")
    data = _data(300_000)
    for content in (data, b""):
        blob = _compress(content, 2, [], 32 << 10)
        done = subprocess.run([zstd, "-dc"], input=blob, capture_output=True, check=True)
        assert done.stdout == content


def test_load_zstandard_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(pzstd.ZstdUnavailable) as error:
        pzstd.load_zstandard(tmp_path)
    assert str(error.value) == f"{tmp_path}: expected the unpacked zstandard wheel (zstandard/__init__.py)"


def _layers(root: Path, zstd: bool, files: dict[str, tuple[bytes, int]]) -> list[oci.Layer]:
    """One layer per image path, written by the layer writer, gzip or zstd."""
    result = []
    for n, (dest, (content, mode)) in enumerate(sorted(files.items())):
        source = root / f"src{n}"
        source.write_bytes(content)
        source.chmod(mode)
        entries = layer.plan_layer(files=[(source, dest)])
        suffix = ".tar.zst" if zstd else ".tar.gz"
        blob, descriptor = root / f"layer{n}{suffix}", root / f"layer{n}.json"
        written = layer.write_layer(entries, None, blob, zstandard=zstandard if zstd else None)
        descriptor.write_text(json.dumps(written))
        result.append(oci.load_layer(f"//fixture:layer{n}", descriptor, blob))
    return result


def test_a_zstd_layer_holds_the_tar_of_the_gzip_one_and_records_its_settings(tmp_path: Path) -> None:
    files = {"/etc/message": (b"zstd layers\n", 0o644), "/usr/share/data.bin": (_data(3 << 20), 0o644)}
    (tmp_path / "gz").mkdir()
    (tmp_path / "zst").mkdir()
    gz, zst = _layers(tmp_path / "gz", False, files), _layers(tmp_path / "zst", True, files)
    assert [lay.diff_id for lay in gz] == [lay.diff_id for lay in zst]
    assert [lay.media_type for lay in zst] == [ZSTD_LAYER_MEDIA_TYPE] * 2
    assert zst[1].blob.read_bytes().startswith(pzstd.MAGIC)
    described = json.loads((tmp_path / "zst" / "layer1.json").read_text())
    assert described["compression"] == {
        "format": "zstd",
        "level": pzstd.LEVEL,
        "block_size": pzstd.BLOCK_SIZE,
        "frames": "per block",
        "library": f"python-zstandard {zstandard.__version__} (zstd {'.'.join(map(str, zstandard.ZSTD_VERSION))})",  # noqa: E501
    }
    # Every reader of layers opens both the same way: the tar comes out.
    for lay in (gz[1], zst[1]):
        with lay.blob.open("rb") as raw, tarfile.open(fileobj=layer_tar(raw), mode="r|*") as tar:
            member = next(iter(tar))
            assert member.name == "usr"


def test_the_layer_program_writes_zstd_with_the_locked_wheel_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_bytes(b"x\n")
    args = ["--file", str(tmp_path / "f"), "/f", "--blob", str(tmp_path / "l.tar.zst")]
    args += ["--descriptor", str(tmp_path / "l.json")]
    site = Path(zstandard.__file__).parent.parent
    assert layer.main([*args, "--compression", "zstd", "--zstd-site", str(site)]) == 0
    assert json.loads((tmp_path / "l.json").read_text())["mediaType"] == ZSTD_LAYER_MEDIA_TYPE
    assert layer.main([*args, "--compression", "zstd", "--zstd-site", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"sparkseal: {tmp_path}: expected the unpacked zstandard wheel (zstandard/__init__.py)" in err
    assert not (tmp_path / "l.tar.zst").exists()
    # Without --compression zstd the blob is gzip, whatever --zstd-site says.
    assert layer.main([*args, "--zstd-site", str(site)]) == 0
    assert json.loads((tmp_path / "l.json").read_text())["mediaType"] == LAYER_MEDIA_TYPE


def _image(root: Path, tag: str, zstd: bool = True) -> tuple[Path, list[oci.Layer]]:
    """A runnable image for this machine: a static program in one layer, the file it reads in another."""
    if HOST_PLATFORM is None or shutil.which("gcc") is None:
        pytest.skip("needs gcc and an x86_64 or aarch64 machine to build the static test program")
    source, program = root / "hello.c", root / "hello"
    source.write_bytes(HELLO_C)
    built = subprocess.run(["gcc", "-static", "-O2", "-o", str(program), str(source)], capture_output=True)
    if built.returncode != 0:
        pytest.skip(f"gcc cannot link a static program here: {built.stderr.decode()[-300:]}")
    layers = _layers(
        root, zstd, {"/hello": (program.read_bytes(), 0o755), "/etc/message": (b"zstd\n", 0o644)}
    )
    config = oci.ImageConfig(entrypoint=["/hello"], cmd=["/etc/message"])
    oci.assemble(layers, HOST_PLATFORM, config, tag, root / "layout", root / "image.digest")
    return root / "layout", layers


def _runs_and_reads_the_other_layer(image: str) -> None:
    ran = run_image(image)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "read from the other layer: zstd\n"


def test_podman_pulls_and_runs_an_image_of_zstd_layers(tmp_path: Path) -> None:
    podman = working_podman()
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        pytest.skip("skopeo is not installed (.ci/setup installs it)")
    tag = f"sparkseal/zstd-fixture:{os.getpid()}"
    layout, layers = _image(tmp_path, tag)
    complete = tmp_path / "complete"
    oci_core.write_complete_layout(layout, complete)
    name = f"localhost/{tag}"
    try:
        # As .load does with podman: the complete layout, copied into podman's store by skopeo.
        subprocess.run(
            [skopeo, "copy", "--quiet", f"oci:{complete}", f"containers-storage:{name}"], check=True
        )
        inspected = json.loads(subprocess.check_output([podman, "image", "inspect", name]))[0]
        assert inspected["RootFS"]["Layers"] == [lay.diff_id for lay in layers]
        _runs_and_reads_the_other_layer(name)
        stored = json.loads(subprocess.check_output([skopeo, "inspect", "--raw", f"oci:{complete}"]))
        assert {lay["mediaType"] for lay in stored["layers"]} == {ZSTD_LAYER_MEDIA_TYPE}
    finally:
        subprocess.run([podman, "rmi", "--force", name], capture_output=True, check=False)


def test_a_docker_archive_carries_the_zstd_layers_as_tars_and_podman_loads_it(tmp_path: Path) -> None:
    podman = working_podman()
    tag = f"sparkseal/zstd-archive:{os.getpid()}"
    layout, layers = _image(tmp_path, tag)
    archive = tmp_path / "image.tar"
    with archive.open("wb") as stream:
        write_docker_archive(layout, stream, tag, zstandard)
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        names = tar.getnames()
    # Under their diff_ids, uncompressed: the engine checks them against the config.
    assert manifest[0]["Layers"] == [f"blobs/sha256/{lay.diff_id.removeprefix('sha256:')}" for lay in layers]
    assert all(name in names for name in manifest[0]["Layers"])
    name = f"localhost/{tag}"
    try:
        loaded = subprocess.run(
            [podman, "load", "-i", str(archive)], capture_output=True, text=True, check=False
        )
        assert loaded.returncode == 0, loaded.stderr
        _runs_and_reads_the_other_layer(name)
    finally:
        subprocess.run([podman, "rmi", "--force", name], capture_output=True, check=False)


def test_a_docker_archive_of_zstd_layers_needs_the_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {"/etc/message": (b"zstd\n", 0o644)}
    layers = _layers(tmp_path, True, files)
    layout = tmp_path / "layout"
    oci.assemble(layers, "linux_x86_64", oci.ImageConfig(), "sparkseal/z:t", layout, tmp_path / "d")
    with pytest.raises(LayoutError) as error:
        write_docker_archive(layout, _Sink(), "sparkseal/z:t")
    assert "1 zstd layers go into a docker-archive uncompressed, which needs the zstandard module" in str(
        error.value
    )
    out = tmp_path / "out.tar"
    args = ["--layout", str(layout), "--tag", "sparkseal/z:t", "--output", str(out)]
    assert oci_load.main(args) == 1
    assert "expected --zstd-site" in capsys.readouterr().err
    assert not out.exists()
    site = Path(zstandard.__file__).parent.parent
    assert oci_load.main([*args, "--zstd-site", str(site)]) == 0
    with tarfile.open(out) as tar:
        (member,) = [m for m in tar.getmembers() if m.name == f"blobs/sha256/{layers[0].diff_id[7:]}"]
        tar_bytes = tar.extractfile(member).read()  # type: ignore[union-attr]
    reader = zstandard.ZstdDecompressor().stream_reader(layers[0].blob.read_bytes(), read_across_frames=True)
    assert tar_bytes == reader.read()
