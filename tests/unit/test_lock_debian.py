"""The Debian lock writer (against a loopback apt repository), and, marked, the checked-in locks on the real
archive.

Where the fetch downloads the locked files from: test_debian_archive.py.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.cli import main as cli_main
from sparkseal.core.locks import LockError, read_debian_lock
from sparkseal.fetch.debian_archive import locked_urls
from sparkseal.fetch.lock_debian import ARCHITECTURES, ROOTS, lock_debian
from tests.bazel_util import REPO
from tests.fixtures_debian import TIMESTAMP, AptRepo, SnapshotArchive, make_deb, pool_path, sha256, write_lock

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt-get is not installed")

ROOT_SET = ["app"]


def make_debs(out: Path) -> dict[str, Path]:
    """The fixture packages the lock tests resolve, written under ``out``."""
    return {
        # app needs (liba or libb), the virtual package "virt", and pre (as a Pre-Depends).
        "app": make_deb(
            out,
            "app",
            "1.0",
            "arm64",
            {"usr/bin/app": b"app"},
            depends="liba | libb, virt",
            pre_depends="pre",
        ),
        "app_amd64": make_deb(out, "app", "1.0", "amd64", {"usr/bin/app": b"app"}, depends="prov"),
        "liba": make_deb(out, "liba", "2:1.0-1", "arm64", {"usr/lib/liba": b"a"}),
        "libb": make_deb(out, "libb", "1.0", "arm64", {"usr/lib/libb": b"b"}),
        "prov": make_deb(out, "prov", "1.0", "all", {"usr/share/prov": b"p"}, provides="virt"),
        "pre": make_deb(out, "pre", "3.0", "arm64", {"usr/lib/pre": b"p"}),
        "unrelated": make_deb(out, "unrelated", "1.0", "arm64", {"usr/lib/u": b"u"}),
    }


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_debs(tmp_path_factory.mktemp("debs"))


@pytest.fixture(scope="module")
def repo(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AptRepo]:
    with AptRepo(tmp_path_factory.mktemp("apt") / "repo", list(debs.values())) as served:
        yield served


@pytest.fixture(scope="module")
def snapshot(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a snapshot archive that holds every fixture .deb at TIMESTAMP."""
    with SnapshotArchive(tmp_path_factory.mktemp("snapshot"), {"debian": list(debs.values())}) as served:
        yield served.url


def test_lock_is_the_closure_with_index_hashes_and_is_stable(
    repo: AptRepo, snapshot: str, debs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bookworm_arm64.lock.json"
    assert lock_debian("arm64", out, ROOT_SET, repo.sources, snapshot=snapshot) == 0
    text = out.read_text()
    assert text.endswith("}\n")
    document = json.loads(text)
    assert document["architecture"] == "arm64"
    assert document["suite"] == "bookworm"
    assert document["roots"] == ROOT_SET
    # The first alternative (liba), the provider of "virt" (prov) and the Pre-Depends (pre); never libb,
    # unrelated, or the amd64 build of app.
    expected = ["app", "liba", "pre", "prov"]
    assert [p["package"] for p in document["packages"]] == expected
    for entry in document["packages"]:
        deb = debs[entry["package"]]
        assert entry["filename"] == deb.name
        # Where the file lies in its archive, and the archive (the Release file's Label), never a host.
        assert entry["path"] == pool_path(entry["package"], deb.name)
        assert entry["archive"] == "debian"
        # When the snapshot archive first held the file (its API), checked there by sha256.
        assert entry["snapshot"] == TIMESTAMP
        assert entry["sha256"] == sha256(deb)
        assert entry["size"] == deb.stat().st_size
    liba = next(p for p in document["packages"] if p["package"] == "liba")
    assert (liba["version"], liba["architecture"], liba["filename"]) == (
        "2:1.0-1",
        "arm64",
        "liba_1.0-1_arm64.deb",
    )
    assert next(p for p in document["packages"] if p["package"] == "prov")["architecture"] == "all"
    assert json.dumps(document, indent=2, sort_keys=True) + "\n" == text
    assert "127.0.0.1" not in text
    assert f"{out}: 4 packages for arm64" in capsys.readouterr().out

    # Locking again changes nothing, and says so.
    assert lock_debian("arm64", out, ROOT_SET, repo.sources, snapshot=snapshot) == 0
    assert out.read_text() == text
    assert "(unchanged)" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [out]


def test_lock_for_the_other_architecture(repo: AptRepo, snapshot: str, tmp_path: Path) -> None:
    out = tmp_path / "amd64.json"
    assert lock_debian("amd64", out, ROOT_SET, repo.sources, snapshot=snapshot) == 0
    packages = json.loads(out.read_text())["packages"]
    assert [(p["package"], p["architecture"]) for p in packages] == [("app", "amd64"), ("prov", "all")]


def test_unsatisfiable_dependency_names_it(
    debs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with AptRepo(tmp_path / "partial", [debs["app"], debs["liba"], debs["pre"]]) as partial:
        assert lock_debian("arm64", tmp_path / "lock.json", ROOT_SET, partial.sources) == 1
    assert "app : Depends: virt but it is not installable" in capsys.readouterr().err


def test_unknown_root_fails_with_apt_message_and_writes_nothing(
    repo: AptRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lock.json"
    assert lock_debian("arm64", out, ["app", "no-such-package"], repo.sources) == 1
    err = capsys.readouterr().err
    assert str(out) in err
    assert "Unable to locate package no-such-package" in err
    assert not out.exists()


def test_sources_of_another_release_are_refused(
    debs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lock.json"
    with AptRepo(tmp_path / "trixie", [debs["pre"]], codename="trixie") as other:
        assert lock_debian("arm64", out, ["pre"], other.sources) == 1
    err = capsys.readouterr().err
    assert "must all be bookworm" in err
    assert "['trixie']" in err
    assert not out.exists()


def _format_1(document: dict[str, object]) -> dict[str, object]:
    """The lock as format 1 wrote it: no archive, no path, no snapshot."""
    packages = [
        {k: v for k, v in p.items() if k not in ("archive", "path", "snapshot")}
        for p in document["packages"]  # type: ignore[attr-defined]
    ]
    return {**document, "format": 1, "packages": packages}


def _format_2(document: dict[str, object]) -> dict[str, object]:
    """The lock as format 2 wrote it: no snapshot."""
    packages = [{k: v for k, v in p.items() if k != "snapshot"} for p in document["packages"]]  # type: ignore[attr-defined]
    return {**document, "format": 2, "packages": packages}


def test_keep_versions_adds_paths_and_archives_and_nothing_else(
    repo: AptRepo, snapshot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "lock.json"
    assert lock_debian("arm64", lock, ROOT_SET, repo.sources, snapshot=snapshot) == 0
    current = lock.read_text()
    write_lock(lock, _format_1(json.loads(current)))
    with pytest.raises(
        LockError,
        match=r"lock.json: field `format`: expected 3 \(a Debian lock, .*"
        r"`sparkseal lock debian --keep-versions` rewrites an older one\), actual 1$",
    ):
        read_debian_lock(lock)
    # Other roots given: the lock's own roots and versions are kept.
    assert lock_debian("arm64", lock, ["pre"], repo.sources, keep_versions=True, snapshot=snapshot) == 0
    assert lock.read_text() == current
    # A format 2 lock gains its time stamps the same way.
    write_lock(lock, _format_2(json.loads(current)))
    assert lock_debian("arm64", lock, ROOT_SET, repo.sources, keep_versions=True, snapshot=snapshot) == 0
    assert lock.read_text() == current
    capsys.readouterr()

    # A kept version whose file the archive now lists with another sha256 is refused, naming both.
    document = _format_1(json.loads(current))
    wrong = "0" * 64
    next(p for p in document["packages"] if p["package"] == "pre")["sha256"] = wrong  # type: ignore[attr-defined]
    write_lock(lock, document)
    before = lock.read_text()
    assert lock_debian("arm64", lock, ROOT_SET, repo.sources, keep_versions=True, snapshot=snapshot) == 1
    err = capsys.readouterr().err
    assert f"pre:arm64=3.0: sha256 mismatch: expected {wrong}" in err
    assert f"actual {sha256(repo.root / pool_path('pre', 'pre_3.0_arm64.deb'))}" in err
    assert lock.read_text() == before


def test_the_snapshot_time_stamp_is_checked_by_sha256_or_the_lock_is_not_written(
    repo: AptRepo, debs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lock.json"
    # A snapshot archive without liba: no time stamp, named with the package.
    held = [deb for name, deb in debs.items() if name != "liba"]
    with SnapshotArchive(tmp_path / "partial", {"debian": held}) as partial:
        assert lock_debian("arm64", out, ROOT_SET, repo.sources, snapshot=partial.url) == 1
    err = capsys.readouterr().err
    assert "liba=2:1.0-1: expected the snapshot archive to list liba_1.0-1_arm64.deb in debian" in err
    assert not out.exists()
    # One whose file at that time stamp is not the locked one.
    with SnapshotArchive(tmp_path / "other", {"debian": list(debs.values())}) as other:
        served = other.root / "archive/debian" / TIMESTAMP / pool_path("pre", debs["pre"].name)
        served.write_bytes(b"other bytes")
        assert lock_debian("arm64", out, ROOT_SET, repo.sources, snapshot=other.url) == 1
    err = capsys.readouterr().err
    assert f"pre=3.0: sha256 mismatch at {other.url}/archive/debian/{TIMESTAMP}/pool/" in err
    assert f"expected {sha256(debs['pre'])} (locked)" in err
    assert not out.exists()
    # None at all: the error says how to name one.
    assert lock_debian("arm64", out, ROOT_SET, repo.sources) == 1
    assert "no base URL of the snapshot archive" in capsys.readouterr().err
    assert not out.exists()


def test_a_source_without_label_cannot_name_the_archive(
    debs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with AptRepo(tmp_path / "nolabel", [debs["pre"]], label="") as bare:
        assert lock_debian("arm64", tmp_path / "lock.json", ["pre"], bare.sources) == 1
    err = capsys.readouterr().err
    assert "pre:arm64=3.0: expected the Release files under http://127.0.0.1:" in err
    assert "to carry one Label that names the archive" in err
    assert not (tmp_path / "lock.json").exists()


def test_read_lock_rejects_malformed_entries(tmp_path: Path) -> None:
    """The one reader (sparkseal.core.locks) names the file, the field, the expected and the actual value."""
    lock = tmp_path / "lock.json"
    entry = {
        "architecture": "arm64",
        "archive": "debian",
        "filename": "x_1_arm64.deb",
        "package": "x",
        "path": "pool/x_1_arm64.deb",
        "sha256": "a" * 64,
        "size": 1,
        "snapshot": TIMESTAMP,
        "version": "1",
    }
    document = {"architecture": "arm64", "format": 3, "roots": ["x"], "suite": "bookworm"}
    document["packages"] = [entry]
    write_lock(lock, document)
    assert read_debian_lock(lock).packages[0].path == "pool/x_1_arm64.deb"

    def refused(packages: list[dict[str, object]], message: str, **top: object) -> None:
        write_lock(lock, {**document, "packages": packages, **top})
        with pytest.raises(LockError) as info:
            read_debian_lock(lock)
        assert str(info.value) == f"{lock}: {message}"

    refused(
        [{"package": "x", "sha256": "ab"}],
        "field `packages[0].filename`: expected a .deb file name without '/', actual nothing",
    )
    refused(
        [{**entry, "path": "../x_1_arm64.deb"}],
        "field `packages[0].path`: expected a relative path without '.', '..' or empty parts, ending in "
        'x_1_arm64.deb, actual "../x_1_arm64.deb"',
    )
    refused(
        [{**entry, "archive": "Debian Main"}],
        'field `packages[0].archive`: expected an archive name ([a-z0-9][a-z0-9.+_-]*), actual "Debian Main"',
    )
    refused(
        [{**entry, "snapshot": "2024-06-11"}],
        'field `packages[0].snapshot`: expected a time stamp YYYYMMDDTHHMMSSZ, actual "2024-06-11"',
    )
    refused(
        [{**entry, "size": "1"}], 'field `packages[0].size`: expected a whole number of bytes, actual "1"'
    )
    refused(
        [entry, {**entry, "version": "2"}],
        'field `packages[1].package`: expected a package not listed before, actual "x"',
    )
    refused([], "field `packages`: expected a non-empty list, actual an empty list")
    # A format this reader does not know, newer or older, or none: named with the file, the field and the
    # format it reads.
    for unknown, shown in ((4, "4"), (0, "0"), ("3", '"3"'), (True, "true")):
        refused(
            [entry],
            "field `format`: expected 3 (a Debian lock, each package with its archive, path and snapshot "
            "time stamp; `sparkseal lock debian --keep-versions` rewrites an older one), "
            f"actual {shown}",
            format=unknown,
        )
    write_lock(lock, {k: v for k, v in document.items() if k != "format"})
    with pytest.raises(LockError, match=r"lock.json: field `format`: expected 3 .*, actual nothing$"):
        read_debian_lock(lock)
    refused(
        [entry],
        'field `architecture`: expected one of amd64, arm64, actual "riscv64"',
        architecture="riscv64",
    )


def test_cli_writes_the_named_lock(repo: AptRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.lock.json"
    # The CLI locks the real root set, which the fixture repository cannot satisfy: apt's message says so.
    assert (
        cli_main(["lock", "debian", "--arch", "arm64", "--out", str(out), "--sources", str(repo.sources)])
        == 1
    )
    err = capsys.readouterr().err
    assert "Unable to locate package" in err
    assert not out.exists()
    with pytest.raises(SystemExit) as info:
        cli_main(["lock", "debian", "--arch", "arm64", "--sources", str(tmp_path / "missing.list")])
    assert info.value.code == 2
    assert "missing.list: no such file" in capsys.readouterr().err


@pytest.mark.network
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_checked_in_lock_still_resolves_on_the_archive(arch: str) -> None:
    """Every locked file is still served, at the size locked, from this machine's archive bases."""
    lock = REPO / f"third_party/debian/bookworm_{arch}.lock.json"
    locked = read_debian_lock(lock)
    debs = locked.packages
    assert locked.architecture == arch
    assert set(ROOTS) <= {d.package for d in debs}
    assert json.loads(lock.read_text())["roots"] == sorted(ROOTS)
    urls = locked_urls(lock)
    assert sorted(urls) == sorted(d.package for d in debs)
    for deb in debs:
        with urllib.request.urlopen(
            urllib.request.Request(urls[deb.package][0], method="HEAD"), timeout=60
        ) as reply:
            assert int(reply.headers["Content-Length"]) == deb.size, urls[deb.package]
