"""Where the fetch downloads each locked .deb from: the archives' base URLs (the variable, the apt sources,
their siblings) joined to the locked paths, then the snapshot archive at the locked time stamps; no apt is
run. Locks come from a loopback apt repository and a loopback snapshot archive.

The lock writer: test_lock_debian.py.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.fetch.debian_archive import (
    ARCHIVES_ENV,
    ArchiveError,
    archive_bases,
    host_archives,
    host_snapshot,
    locked_urls,
    parse_archives,
    snapshot_base,
)
from sparkseal.fetch.debian_archive import main as archive_main
from sparkseal.fetch.debian_snapshot import SNAPSHOT_ENV
from sparkseal.fetch.lock_debian import lock_debian
from tests.fixtures_debian import TIMESTAMP, AptRepo, SnapshotArchive, write_lock
from tests.unit.test_lock_debian import ROOT_SET, _format_1, make_debs

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt-get is not installed")


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_debs(tmp_path_factory.mktemp("debs"))


@pytest.fixture(scope="module")
def repo(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AptRepo]:
    with AptRepo(tmp_path_factory.mktemp("apt") / "repo", list(debs.values())) as served:
        yield served


@pytest.fixture(scope="module")
def snapshot(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with SnapshotArchive(tmp_path_factory.mktemp("snapshot"), {"debian": list(debs.values())}) as served:
        yield served.url


def test_locked_urls_join_the_configured_base_to_the_locked_path(
    repo: AptRepo, snapshot: str, debs: dict[str, Path], tmp_path: Path
) -> None:
    lock = tmp_path / "lock.json"
    assert lock_debian("arm64", lock, ROOT_SET, repo.sources, snapshot=snapshot) == 0
    # apt is never run: the machine's apt sources say nothing here, the variable names the archive.
    no_sources = [tmp_path / "no-sources"]
    urls = locked_urls(lock, ["liba", "prov"], {ARCHIVES_ENV: repo.archives}, no_sources)
    assert urls == {
        "liba": [f"{repo.url}pool/main/liba/liba/liba_1.0-1_arm64.deb"],
        "prov": [f"{repo.url}pool/main/p/prov/prov_1.0_all.deb"],
    }
    # With a snapshot base, each file's second URL is the snapshot archive's at its locked time stamp.
    env = {ARCHIVES_ENV: repo.archives, SNAPSHOT_ENV: snapshot + "/"}
    urls = locked_urls(lock, ["liba", "prov"], env, no_sources)
    assert (
        urls["liba"][1] == f"{snapshot}/archive/debian/{TIMESTAMP}/pool/main/liba/liba/liba_1.0-1_arm64.deb"
    )
    for package, found in urls.items():
        assert len(found) == 2
        for url in found:
            with urllib.request.urlopen(url) as response:
                assert response.read() == debs[package].read_bytes()
    assert sorted(locked_urls(lock, [], {ARCHIVES_ENV: repo.archives}, no_sources)) == [
        "app",
        "liba",
        "pre",
        "prov",
    ]
    with pytest.raises(ArchiveError, match="no locked package named nope"):
        locked_urls(lock, ["nope"], {ARCHIVES_ENV: repo.archives}, no_sources)
    with pytest.raises(ArchiveError) as info:
        locked_urls(lock, [], {}, no_sources)
    message = str(info.value)
    assert "no base URL for the Debian archive 'debian'" in message
    assert f"set {ARCHIVES_ENV}" in message


def test_archive_bases_from_the_variable_the_apt_sources_and_siblings(tmp_path: Path) -> None:
    assert parse_archives(" debian=http://m.example/debian/,debian-security=file:///srv/ds ") == {
        "debian": "http://m.example/debian",
        "debian-security": "file:///srv/ds",
    }
    with pytest.raises(ArchiveError) as info:
        parse_archives("debian=https://user:s3cret@m.example/debian mirror")
    assert "expected NAME=URL" in str(info.value) and "'mirror'" in str(info.value)
    with pytest.raises(ArchiveError) as info:
        parse_archives("debian=https://user:s3cret@m.example/debian debian=ftp://x")
    assert "s3cret" not in str(info.value)

    # The apt sources as text: a one-line file (options, comments, deb-src ignored) and a deb822 file
    # (a disabled stanza ignored); the first source of a name wins.
    sources = tmp_path / "sources.list"
    sources.write_text(
        "# comment\ndeb-src http://src.example/debian sid main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian/ sid main\n"
    )
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "a.sources").write_text(
        "Types: deb\nURIs: http://off.example/debian-security\nSuites: x\nEnabled: no\n\n"
        "Types: deb deb-src\nURIs: http://two.example/debian\n http://three.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    (parts / "ignored.txt").write_text("deb http://never.example/debian sid main\n")
    paths = [sources, parts]
    assert host_archives(paths) == {
        "debian": "http://one.example/debian",
        "debian-security": "http://three.example/debian-security",
    }
    # The variable wins over the sources for the archives it names.
    env = {ARCHIVES_ENV: "debian=http://snap.example/archive/debian/20250520T000000Z"}
    assert archive_bases(["debian", "debian-security"], env, paths) == {
        "debian": "http://snap.example/archive/debian/20250520T000000Z",
        "debian-security": "http://three.example/debian-security",
    }
    # A sid machine's sources name only .../debian: the security archive is its sibling.
    sources.write_text("deb http://mirror.example/debian sid main\n")
    assert archive_bases(["debian", "debian-security"], {}, [sources]) == {
        "debian": "http://mirror.example/debian",
        "debian-security": "http://mirror.example/debian-security",
    }
    # An Ubuntu machine's sources name no Debian archive: no guess from them, the variable is asked for.
    sources.write_text("deb http://ports.example/ubuntu-ports noble main\n")
    with pytest.raises(ArchiveError, match="no base URL for the Debian archive 'debian'"):
        archive_bases(["debian", "debian-security"], {}, [sources])


def test_the_snapshot_base_from_the_variable_or_the_apt_sources(tmp_path: Path) -> None:
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    # Debian's container images name each source's snapshot in a comment line above its URI.
    (parts / "debian.sources").write_text(
        "Types: deb\n# http://snap.example/archive/debian/20250520T000000Z\nURIs: http://m.example/debian\n"
        "Suites: bookworm\nComponents: main\n"
    )
    assert host_snapshot([parts]) == "http://snap.example"
    # A source whose URI is the snapshot archive at a time stamp; a comment with more words is no URL.
    sources = tmp_path / "sources.list"
    sources.write_text(
        "# see http://words.example/archive/debian/20250520T000000Z too\n"
        "deb https://snap2.example/base/archive/debian-security/20240101T000000Z/ bookworm-security main\n"
    )
    assert host_snapshot([sources, parts]) == "https://snap2.example/base"
    assert snapshot_base({}, [sources, parts]) == "https://snap2.example/base"
    # The variable wins; without either there is none.
    assert snapshot_base({SNAPSHOT_ENV: "file:///srv/snapshot/"}, [sources]) == "file:///srv/snapshot"
    assert snapshot_base({}, [tmp_path / "none"]) is None
    # The variable names the base, not one archive at one time stamp.
    with pytest.raises(ArchiveError, match=rf"\${SNAPSHOT_ENV}: expected the snapshot archive's base URL"):
        snapshot_base({SNAPSHOT_ENV: "http://snap.example/archive/debian/20250520T000000Z"}, [])


def test_urls_command_prints_tab_separated_urls_or_one_error(
    repo: AptRepo,
    snapshot: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock = tmp_path / "lock.json"
    assert lock_debian("arm64", lock, ROOT_SET, repo.sources, snapshot=snapshot) == 0
    capsys.readouterr()
    monkeypatch.setenv(ARCHIVES_ENV, repo.archives)
    monkeypatch.setenv(SNAPSHOT_ENV, snapshot)
    assert archive_main(["urls", "--lock", str(lock), "pre"]) == 0
    path = "pool/main/p/pre/pre_3.0_arm64.deb"
    assert capsys.readouterr().out == f"pre\t{repo.url}{path}\t{snapshot}/archive/debian/{TIMESTAMP}/{path}\n"
    assert archive_main(["snapshot-base"]) == 0
    assert capsys.readouterr().out == f"{snapshot}\n"
    write_lock(lock, _format_1(json.loads(lock.read_text())))
    assert archive_main(["urls", "--lock", str(lock)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sparkseal: {lock}: field `format`: expected 3") and err.count("\n") == 1
