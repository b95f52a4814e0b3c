"""Bazel tests of `debian_packages` and `debian_rootfs`: a fixture workspace, a loopback Debian archive
(fetched by base URL + locked path, with no apt) and a loopback snapshot archive (the locked time stamp),
and a repository cache Bazel cannot use itself, read with downloads off."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bazel_remote import read_execution_log
from tests.bazel_util import (
    BASE_WORKSPACE,
    BAZEL,
    REPO,
    SCANNER_WORKSPACE,
    ZSTD_WORKSPACE,
    Workspace,
    base_env,
)
from tests.fixtures_debian import (
    TIMESTAMP,
    AptRepo,
    Exec,
    Link,
    SnapshotArchive,
    lock_for,
    make_deb,
    pool_path,
    sha256,
    write_lock,
)

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

ARCH = "amd64"
COPIES = (
    "rules",
    "sparkseal",
    "third_party/bazel",
    "third_party/scan",
    "third_party/toolchains",
    "third_party/zstd",
)
WORKSPACE = (
    BASE_WORKSPACE
    + """
load("//rules/private:debian.bzl", "debian_packages")

debian_packages(name = "debian_fixture", lock = "//:fixture.lock.json")
"""
    + SCANNER_WORKSPACE
    + ZSTD_WORKSPACE
)
BUILD = """\
load("//rules/private:debian.bzl", "debian_rootfs")
load("//rules/private:oci_layer.bzl", "oci_layer")

exports_files(["fixture.lock.json"])

debian_rootfs(name = "rootfs", debs = ["@debian_fixture//:debs"], lock = "@debian_fixture//:lock")

oci_layer(name = "base", rootfs = ":rootfs", scan = False)
"""
TARGETS = ("@debian_fixture//:debs", "@debian_fixture//:libfoo++1", "//:rootfs")


# Bazel 4.2.3's name of --repository_disable_download (Bazel 7.7.1 takes both).
DISABLE_DOWNLOAD = "--experimental_repository_disable_download"


@dataclass
class Fixture:
    """The fixture .debs, the apt repository serving them, snapshot archives with all and none of them,
    and a workspace factory."""

    debs: list[Path]
    repo: AptRepo
    snapshot: SnapshotArchive
    no_snapshot: SnapshotArchive
    tmp: Path

    def workspace(
        self,
        name: str,
        cache: Path,
        lock: dict[str, object] | None = None,
        archives: str | None = None,
        snapshot: str | None = None,
    ) -> Workspace:
        root = self.tmp / name
        for rel in COPIES:
            shutil.copytree(REPO / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (root / "WORKSPACE").write_text(WORKSPACE)
        (root / "BUILD").write_text(BUILD)
        rc = (REPO / ".bazelrc").read_text().splitlines()
        (root / ".bazelrc").write_text(
            "\n".join(line for line in rc if "repository_cache" not in line) + "\n"
        )
        write_lock(root / "fixture.lock.json", lock or lock_for(self.debs, ARCH))
        return Workspace(
            root=root,
            output_base=self.tmp / f"{name}-output-base",
            repository_cache=cache,
            # No apt: the variables alone say where the archive and its snapshots are (by default a
            # snapshot archive that holds nothing, never the one the machine's apt sources may name).
            env=base_env(
                SPARKSEAL_DEBIAN_ARCHIVES=archives or self.repo.archives,
                SPARKSEAL_DEBIAN_SNAPSHOT=snapshot or self.no_snapshot.url,
            ),
        )


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    tmp = tmp_path_factory.mktemp("debian-bazel")
    out = tmp / "debs"
    out.mkdir()
    debs = [
        make_deb(
            out,
            "base-files",
            "12.4",
            ARCH,
            {"usr/lib/os-release": b"ID=debian\n", "etc/os-release": Link("../usr/lib/os-release")},
            dirs={"tmp": 0o1777},
        ),
        make_deb(out, "tool", "1.0", ARCH, {"bin/tool": Exec(b"#!/bin/sh\n"), "usr/bin/alias": Link("tool")}),
        make_deb(out, "libfoo++1", "1:2.0-1", ARCH, {"usr/lib/libfoo.so.1": b"\x7fELF"}),
    ]
    with (
        AptRepo(tmp / "repo", debs) as repo,
        SnapshotArchive(tmp / "snapshot", {"debian": debs}) as snapshot,
        SnapshotArchive(tmp / "no-snapshot", {}) as no_snapshot,
    ):
        yield Fixture(debs, repo, snapshot, no_snapshot, tmp)


def _bin(ws: Workspace, rel: str) -> Path:
    return ws.bin_path(rel)


def _digests(ws: Workspace) -> dict[str, str]:
    tree = _bin(ws, "rootfs")
    found = {
        p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in tree.rglob("*")
        if p.is_file()
    }
    for name in ("rootfs.links.json", "rootfs.dirs.json"):
        found[name] = sha256(_bin(ws, name))
    return found


def test_fetch_rootfs_then_offline_clone_is_identical(fixture: Fixture) -> None:
    cache = fixture.tmp / "cache-good"
    ws = fixture.workspace("ws-good", cache)
    try:
        result = ws.bazel("build", *TARGETS)
        assert result.returncode == 0, result.output
        assert fixture.repo.deb_requests() == len(fixture.debs)
        external = ws.output_base / "external/debian_fixture/debs"
        assert sorted(p.name for p in external.iterdir()) == sorted(d.name for d in fixture.debs)
        assert all(sha256(external / d.name) == sha256(d) for d in fixture.debs)
        assert (_bin(ws, "rootfs/usr/bin/tool")).read_bytes() == b"#!/bin/sh\n"
        links = json.loads(_bin(ws, "rootfs.links.json").read_text())
        assert (links["bin"], links["usr/bin/alias"], links["etc/os-release"]) == (
            "usr/bin",
            "tool",
            "../usr/lib/os-release",
        )
        dirs = json.loads(_bin(ws, "rootfs.dirs.json").read_text())
        assert dirs["tmp"]["mode"] == "1777"
        status = _bin(ws, "rootfs/var/lib/dpkg/status").read_text()
        assert "Package: libfoo++1\nStatus: install ok installed\nVersion: 1:2.0-1" in status
        digests = _digests(ws)
    finally:
        ws.shutdown()

    # A second clone with the same repository cache asks the apt repository nothing at all.
    before = sum(fixture.repo.requests.values())
    clone = fixture.workspace("ws-clone", cache)
    try:
        result = clone.bazel("build", *TARGETS)
        assert result.returncode == 0, result.output
        assert sum(fixture.repo.requests.values()) == before
        assert _digests(clone) == digests
    finally:
        clone.shutdown()


def test_a_mirror_that_dropped_a_locked_version_is_bridged_by_the_snapshot(
    fixture: Fixture, tmp_path: Path
) -> None:
    """The mirror has moved on from base-files 12.4 (a point release superseded it); the snapshot archive
    still has it at the locked time stamp, and the build gets the locked bytes from there."""
    first, *rest = fixture.debs  # base-files, the first locked package
    with AptRepo(tmp_path / "moved-on", rest) as mirror:
        ws = fixture.workspace(
            "ws-dropped", tmp_path / "cache", archives=mirror.archives, snapshot=fixture.snapshot.url
        )
        before = fixture.snapshot.deb_requests()
        try:
            result = ws.bazel("build", "@debian_fixture//:debs")
        finally:
            ws.shutdown()
        assert result.returncode == 0, result.output
        assert mirror.deb_requests() >= len(rest)
    path = f"/archive/debian/{TIMESTAMP}/{pool_path('base-files', first.name)}"
    assert fixture.snapshot.requests[path] >= 1
    assert fixture.snapshot.deb_requests() - before == fixture.snapshot.requests[path]
    external = ws.output_base / "external/debian_fixture/debs"
    assert all(sha256(external / d.name) == sha256(d) for d in fixture.debs)


def test_neither_mirror_nor_snapshot_fails_naming_package_both_urls_and_sha256(fixture: Fixture) -> None:
    first = fixture.debs[0]  # base-files, the first locked package
    base = fixture.repo.url + "elsewhere"
    ws = fixture.workspace("ws-mirror", fixture.tmp / "cache-mirror", archives=f"debian={base}")
    try:
        result = ws.bazel("build", "@debian_fixture//:debs")
    finally:
        ws.shutdown()
    assert result.returncode != 0
    path = pool_path("base-files", first.name)
    url = f"{base}/{path}"
    snapshot = f"{fixture.no_snapshot.url}/archive/debian/{TIMESTAMP}/{path}"
    expected = (
        f"sparkseal: base-files=12.4 ({first.name}): download from {url} and from {snapshot} failed "
        f"(expected sha256 {sha256(first)}, locked in //:fixture.lock.json):"
    )
    assert expected in result.output, result.output
    assert f"{url}: sparkseal: {first.name}: cannot download {url}: HTTP Error 404" in result.output
    assert f"{snapshot}: sparkseal: {first.name}: cannot download {snapshot}: HTTP Error 404" in result.output
    assert not (ws.output_base / "external/debian_fixture/BUILD").exists()


def test_offline_a_cache_bazel_cannot_use_is_copied_and_a_miss_names_the_cause(
    fixture: Fixture, tmp_path: Path
) -> None:
    """With downloads off, the repository cache Bazel is given is empty (as one on another mount is to it:
    no hard link can be made there) and SPARKSEAL_REPOSITORY_CACHE names the one that holds the files:
    they are copied from it, no download involved. Naming an empty one fails with the real cause."""
    full = tmp_path / "full-cache"
    seed = fixture.workspace("ws-seed", full)
    try:
        assert seed.bazel("build", "@debian_fixture//:debs").returncode == 0
    finally:
        seed.shutdown()
    before = sum(fixture.repo.requests.values())
    ws = fixture.workspace("ws-offline", tmp_path / "empty-cache")
    try:
        result = ws.bazel(
            "build",
            DISABLE_DOWNLOAD,
            f"--repo_env=SPARKSEAL_REPOSITORY_CACHE={full}",
            "@debian_fixture//:debs",
        )
        assert result.returncode == 0, result.output
        external = ws.output_base / "external/debian_fixture/debs"
        assert all(sha256(external / d.name) == sha256(d) for d in fixture.debs)
        assert {(external / d.name).stat().st_nlink for d in fixture.debs} == {1}

        elsewhere = tmp_path / "elsewhere"
        result = ws.bazel(
            "build",
            DISABLE_DOWNLOAD,
            f"--repo_env=SPARKSEAL_REPOSITORY_CACHE={elsewhere}",
            "@debian_fixture//:debs",
        )
    finally:
        ws.shutdown()
    assert result.returncode != 0
    assert (
        f"Bazel may not download (--repository_disable_download) and the repository cache at {elsewhere}"
        in (result.output)
    )
    for deb in fixture.debs:
        assert (
            f"({deb.name}): expected sha256 {sha256(deb)} (locked in //:fixture.lock.json)" in result.output
        )
    assert "proxy" not in result.output
    assert sum(fixture.repo.requests.values()) == before


def test_the_downloader_config_rewrites_the_archive_urls(fixture: Fixture, tmp_path: Path) -> None:
    """The archive base names a host that does not exist; Bazel's downloader config (as a CI operator
    would point it at a mirror) rewrites it to the fixture archive, and every .deb arrives verified."""
    host_port = fixture.repo.url.split("//", 1)[1].rstrip("/")
    config = tmp_path / "downloader.cfg"
    config.write_text(f"rewrite mirror\\.invalid/debian/(.*) {host_port}/$1\n")
    ws = fixture.workspace(
        "ws-rewrite", fixture.tmp / "cache-rewrite", archives="debian=http://mirror.invalid/debian"
    )
    before = fixture.repo.deb_requests()
    try:
        result = ws.bazel("build", f"--experimental_downloader_config={config}", "@debian_fixture//:debs")
    finally:
        ws.shutdown()
    assert result.returncode == 0, result.output
    assert fixture.repo.deb_requests() - before == len(fixture.debs)
    external = ws.output_base / "external/debian_fixture/debs"
    assert all(sha256(external / d.name) == sha256(d) for d in fixture.debs)


def test_corrupt_download_is_rejected_with_actual_hash(fixture: Fixture) -> None:
    tool = fixture.debs[1]
    corrupt = b"not the locked deb"
    fixture.repo.served_bytes_override[tool.name] = corrupt
    ws = fixture.workspace("ws-corrupt", fixture.tmp / "cache-corrupt")
    try:
        result = ws.bazel("build", "@debian_fixture//:debs")
    finally:
        fixture.repo.served_bytes_override.clear()
        ws.shutdown()
    assert result.returncode != 0
    expected = f"tool=1.0 ({tool.name}): sha256 mismatch: expected {sha256(tool)}"
    assert expected in result.output
    assert f"actual {hashlib.sha256(corrupt).hexdigest()}" in result.output
    cached = ws.repository_cache / "content_addressable/sha256"
    assert not (cached / hashlib.sha256(corrupt).hexdigest()).exists()


def test_bazel_download_failing_on_the_locked_deb_blames_the_download(fixture: Fixture) -> None:
    """apt's mirror serves the locked .deb, but Bazel's transfers of it are cut short: the message says
    Bazel's download failed (the second client got the locked sha256), not that the .deb is wrong, and
    Bazel's own error follows."""
    tool = fixture.debs[1]
    fixture.repo.bazel_cuts[tool.name] = 2
    ws = fixture.workspace("ws-cut", fixture.tmp / "cache-cut")
    try:
        result = ws.bazel("build", "@debian_fixture//:debs")
        cuts_left = fixture.repo.bazel_cuts[tool.name]
    finally:
        fixture.repo.bazel_cuts.clear()
        ws.shutdown()
    assert result.returncode != 0
    assert cuts_left == 0
    match = re.search(
        rf"sparkseal: tool=1\.0 \({re.escape(tool.name)}\): Bazel's downloader failed to fetch "
        rf"(http://\S+/{re.escape(tool.name)}), but a second client \(Python's urllib\) fetched it with the "
        rf"locked sha256 {sha256(tool)}, so the file is fine and the failure is Bazel's download",
        result.output,
    )
    assert match, result.output
    assert "sha256 mismatch" not in result.output
    after = result.output[match.end() :]
    assert re.search(rf"Error downloading \[{re.escape(match[1])}\] to ", after), result.output
    assert not (ws.output_base / "external/debian_fixture/BUILD").exists()


def test_the_base_layer_unpacks_its_debs_itself_and_builds_no_rootfs_tree(
    fixture: Fixture, tmp_path: Path
) -> None:
    ws = fixture.workspace("ws-layer", fixture.tmp / "cache-layer")
    try:
        log = tmp_path / "exec.json"
        result = ws.bazel("build", f"--execution_log_json_file={log}", "//:base")
        assert result.returncode == 0, result.output
        ran = sorted(str(spawn.get("mnemonic")) for spawn in read_execution_log(log))
        assert ran == ["OciLayer"], ran
        assert not _bin(ws, "rootfs").exists()
        with tarfile.open(_bin(ws, "base.tar.gz")) as layer:
            members = {m.name: m for m in layer.getmembers()}
        assert members["usr/bin/tool"].mode == 0o755 and members["bin"].linkname == "usr/bin"
        assert members["tmp"].mode == 0o1777
        assert "var/lib/dpkg/status" in members
    finally:
        ws.shutdown()
