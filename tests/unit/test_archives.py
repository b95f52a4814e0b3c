"""`sparkseal scan PATH` opens the archives it finds: wheels, sdists, tars (gz, zst, xz, ...), .debs.

A finding inside one is named ``ARCHIVE!member`` (nested: ``outer!inner!member``); a corrupt archive or a
bomb fails the scan (exit 2) naming the archive; no member path leaves the scan's scratch directory.
Secrets are built at run time (tests/secret_samples.py) so that this file itself stays clean.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import struct
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest
import zstandard

from sparkseal.core import archives
from sparkseal.scan import scanner as scan
from sparkseal.scan.catalogue import Catalogue
from tests.fixtures_debian import ar_archive
from tests.secret_samples import families
from tests.unit.test_scan import HOME, RULES_NOTE, _cli, _oci_layout

CATALOGUE = Catalogue.find()
# The PyPI prefix only shapes the PyPI sample, which these tests do not use.
SLACK = families("pypi-unused")["slack"].positive.encode()
TOKEN = SLACK.split(b'"')[1].decode()  # what the rule matches: the token without its assignment
RULE = "betterleaks.slack-bot-token"
WHEEL = "pkg-1.0-py3-none-any.whl"


def _tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """An uncompressed tar of ``files`` (regular members) and ``links`` (symlinks: name -> target)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def _zip(files: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", method) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return raw.getvalue()


def _deb(files: dict[str, bytes]) -> bytes:
    """A .deb as dpkg-deb writes one: debian-binary, control.tar.gz, data.tar.xz."""
    control = gzip.compress(_tar({"./control": b"Package: tool\nVersion: 1.0\nArchitecture: arm64\n"}))
    data = lzma.compress(_tar(files))
    return ar_archive([("debian-binary", b"2.0\n"), ("control.tar.gz", control), ("data.tar.xz", data)])


def _scan(*paths: Path) -> scan.Report:
    return scan.run_scan(list(paths), None, None, root=paths[0].parent, catalogue=CATALOGUE)


def _locations(report: scan.Report) -> list[str]:
    return [f.location() for f in report.findings]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, scan.Report]:
    """One directory holding each kind of archive with a token inside, scanned once."""
    root = tmp_path_factory.mktemp("archives")
    wheel = _zip({"pkg/__init__.py": b"", "pkg/config.txt": SLACK})
    (root / WHEEL).write_bytes(wheel)
    (root / "pkg-1.0.tar.gz").write_bytes(gzip.compress(_tar({"pkg-1.0/pkg/config.txt": SLACK})))
    (root / "rootfs.tar.zst").write_bytes(
        zstandard.ZstdCompressor().compress(_tar({"./etc/app/config.txt": SLACK}))
    )
    (root / "tool_1.0_arm64.deb").write_bytes(_deb({"./etc/tool/config.txt": SLACK, "./usr/bin/tool": b"x"}))
    (root / "bundle.tar.gz").write_bytes(gzip.compress(_tar({f"dist/{WHEEL}": wheel, "README": b"hi\n"})))
    (root / "notes.txt").write_text("nothing here\n")
    return root, _scan(root)


def test_every_archive_is_opened_and_counted(tree: tuple[Path, scan.Report]) -> None:
    root, report = tree
    # the .deb gives 4 files: debian-binary, control.tar.gz's control, data.tar's two
    assert (report.files, report.archives, report.notes) == (12, 7, [])
    assert _locations(report) == [
        f"{root}/bundle.tar.gz!dist/{WHEEL}!pkg/config.txt:1:{RULE}",
        f"{root}/pkg-1.0-py3-none-any.whl!pkg/config.txt:1:{RULE}",
        f"{root}/pkg-1.0.tar.gz!pkg-1.0/pkg/config.txt:1:{RULE}",
        f"{root}/rootfs.tar.zst!etc/app/config.txt:1:{RULE}",
        f"{root}/tool_1.0_arm64.deb!etc/tool/config.txt:1:{RULE}",
    ]


def test_token_in_a_wheel(tree: tuple[Path, scan.Report]) -> None:
    root, report = tree
    assert f"{root}/{WHEEL}!pkg/config.txt:1:{RULE}" in _locations(report)


def test_token_in_a_tar_gz(tree: tuple[Path, scan.Report]) -> None:
    root, report = tree
    assert f"{root}/pkg-1.0.tar.gz!pkg-1.0/pkg/config.txt:1:{RULE}" in _locations(report)


def test_token_in_a_tar_zst(tree: tuple[Path, scan.Report]) -> None:
    root, report = tree
    assert f"{root}/rootfs.tar.zst!etc/app/config.txt:1:{RULE}" in _locations(report)


def test_token_in_a_deb(tree: tuple[Path, scan.Report]) -> None:
    """A .deb's data.tar members are named as dpkg would install them (no ``./``)."""
    root, report = tree
    assert f"{root}/tool_1.0_arm64.deb!etc/tool/config.txt:1:{RULE}" in _locations(report)


def test_token_in_a_wheel_inside_a_tar_gz(tree: tuple[Path, scan.Report]) -> None:
    root, report = tree
    assert f"{root}/bundle.tar.gz!dist/{WHEEL}!pkg/config.txt:1:{RULE}" in _locations(report)


def test_text_and_json_name_the_member_and_never_the_token(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    wheel.write_bytes(_zip({"pkg/config.txt": SLACK}))
    done = _cli(str(wheel))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"{wheel}!pkg/config.txt:1:{RULE}: xoxb***({len(TOKEN)} chars)",
        f"1 files scanned (1 archives opened), 1 finding(s), 0 allowed {RULES_NOTE}",
    ]
    done = _cli(str(wheel), "--json")
    report = json.loads(done.stdout)
    assert [(f["path"], f["rule"]) for f in report["findings"]] == [(f"{wheel}!pkg/config.txt", RULE)]
    assert (report["files"], report["archives"], report["notes"]) == (1, 1, [])
    assert TOKEN not in done.stdout
    allow = tmp_path / "allow.json"
    allow.write_text(json.dumps({"allow": [{"path": "*.whl!pkg/*", "rule": RULE, "reason": "fixture"}]}))
    assert _cli(str(wheel), "--allow", str(allow)).returncode == 0


def test_an_archive_nested_too_deep_is_read_as_bytes_not_opened(tmp_path: Path) -> None:
    """Our rules still read its bytes (stored, so the path is plain there); the catalogue skips archives."""
    stored = zipfile.ZIP_STORED
    level4 = _zip({"config.txt": SLACK, "cache.py": f"CACHE = '{HOME}/.cache'\n".encode()}, stored)
    level3 = _zip({"d.zip": level4}, stored)
    level2 = _zip({"c.zip": level3}, stored)
    (tmp_path / "a.zip").write_bytes(_zip({"b.zip": level2}, stored))
    report = _scan(tmp_path / "a.zip")
    deepest = f"{tmp_path}/a.zip!b.zip!c.zip!d.zip"
    assert report.archives == archives.MAX_ARCHIVE_DEPTH == 3
    assert report.notes == [
        f"{deepest}: a zip archive nested deeper than 3 archives (MAX_ARCHIVE_DEPTH): not opened, its "
        "bytes read by sparkseal's own rules only"
    ]
    assert [(f.path, f.rule) for f in report.findings] == [(deepest, "home-path")]


def test_a_zstd_tar_without_the_zstandard_module_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "rootfs.tar.zst"
    archive.write_bytes(zstandard.ZstdCompressor().compress(_tar({"a.txt": b"a\n"})))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(archive)
    assert str(caught.value).startswith(
        f"{archive}: expected a zstd-compressed tar archive, cannot open it: the zstandard module cannot "
        "be imported (import of zstandard halted; None in sys.modules); install it"
    )


def _corrupt(tmp_path: Path) -> dict[str, tuple[bytes, str]]:
    """Corrupt archives by name: their bytes and the start of the message each must fail with."""
    wheel = _zip({"pkg/config.txt": b"a line of text, compressed\n" * 50})
    at = wheel.index(b"pkg/config.txt") + len("pkg/config.txt") + 10  # inside the deflated data
    flipped = wheel[:at] + bytes(b ^ 0xFF for b in wheel[at : at + 8]) + wheel[at + 8 :]
    sdist = gzip.compress(_tar({"pkg-1.0/setup.py": b"print(1)\n" * 400}))
    return {
        "not-a-zip.whl": (
            b"this is no zip",
            "expected a wheel (a zip archive), cannot read it: File is not a zip file",
        ),
        "flipped.whl": (
            flipped,
            "expected a wheel (a zip archive), cannot read it (member pkg/config.txt): ",
        ),
        "truncated.tar.gz": (
            sdist[: len(sdist) // 2],
            "expected a gzip-compressed tar archive, cannot read it",
        ),
        "not-gzip.tgz": (b"plain text", "expected a gzip-compressed tar archive, cannot read it: "),
        "no-data.deb": (
            ar_archive([("debian-binary", b"2.0\n")]),
            "expected a Debian package (an ar archive with a data.tar member), cannot read it: expected "
            "one member of data.tar, data.tar.gz, data.tar.bz2, data.tar.xz, data.tar.zst, found none "
            "among ['debian-binary']",
        ),
        "not-ar.deb": (
            b"PK\x03\x04",
            "expected a Debian package (an ar archive with a data.tar member), cannot read it: ",
        ),
        # A size is decimal digits, space-padded, as dpkg-deb reads it: no sign, no leading space.
        "signed-size.deb": (
            ar_archive([("debian-binary", b"2.0\n")]).replace(b"4         `", b"+4        `"),
            "expected a Debian package (an ar archive with a data.tar member), cannot read it: member "
            "'debian-binary': bad size field b'+4        '",
        ),
        "compressed-oddly.deb": (
            ar_archive([("debian-binary", b"2.0\n"), ("data.tar.lz4", b"")]),
            "expected a Debian package (an ar archive with a data.tar member), cannot read it: "
            "data.tar.lz4 is not supported (expected one of data.tar, data.tar.gz, data.tar.bz2, "
            "data.tar.xz, data.tar.zst)",
        ),
        "bad-data.deb": (
            ar_archive([("debian-binary", b"2.0\n"), ("data.tar.xz", b"not xz at all")]),
            "expected a Debian package whose data.tar.xz is an xz-compressed tar archive, cannot read it: ",
        ),
    }


def test_a_corrupt_archive_fails_the_scan_naming_it_and_its_format(tmp_path: Path) -> None:
    for name, (data, message) in _corrupt(tmp_path).items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(scan.ScanInputError) as caught:
            _scan(path)
        assert str(caught.value).startswith(f"{path}: {message}"), str(caught.value)
    done = _cli(str(tmp_path / "not-a-zip.whl"))
    assert done.returncode == 2
    assert (
        f"{tmp_path}/not-a-zip.whl: expected a wheel (a zip archive), cannot read it: File is not a zip file"
        in done.stderr
    )


def _copied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the members the scan copies out of archives, as they are copied."""
    names: list[str] = []
    add_copy = scan._CatalogueBatches.add_copy

    def spy(self: scan._CatalogueBatches, content: io.RawIOBase, name: str, size: int) -> Path:
        names.append(name)
        return add_copy(self, content, name, size)  # type: ignore[arg-type]

    monkeypatch.setattr(scan._CatalogueBatches, "add_copy", spy)
    return names


def test_a_zip_bomb_is_refused_not_unpacked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = tmp_path / "bomb.zip"
    unpacked = archives.RATIO_FROM_BYTES * 2
    bomb.write_bytes(_zip({"a.txt": b"fine\n", "zeros.bin": bytes(unpacked)}))
    copied = _copied(monkeypatch)
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(bomb)
    packed = bomb.stat().st_size
    assert str(caught.value) == (
        f"{bomb}: refused as an archive bomb, not unpacked: its 2 members would unpack to {unpacked + 5} "
        f"bytes from {packed}, {(unpacked + 5) // packed} times its size, over the limit of 100 times "
        "(MAX_COMPRESSION_RATIO)"
    )
    assert copied == []  # refused from the zip's directory, before its first member

    sdist = tmp_path / "bomb.tar.gz"
    sdist.write_bytes(gzip.compress(_tar({"a.txt": b"fine\n", "zeros.bin": bytes(unpacked)})))
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(sdist)
    assert str(caught.value).startswith(
        f"{sdist}: refused as an archive bomb, not unpacked: its members up to zeros.bin would unpack to "
        f"{unpacked + 5} bytes from {sdist.stat().st_size}"
    )
    assert copied == [f"{sdist}!a.txt"]  # the bomb member itself was never read


def test_an_archive_over_the_size_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit counts the members of nested archives too: here the wheel inside the tar."""
    wheel = _zip({"pkg/a.py": b"#" * 1000, "pkg/b.py": b"#" * 1000})
    limit = len(wheel) + 1500  # the wheel itself fits; with its members it does not
    monkeypatch.setattr(archives, "MAX_UNPACKED_BYTES", limit)
    bundle = tmp_path / "bundle.tar"
    bundle.write_bytes(_tar({f"dist/{WHEEL}": wheel}))
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(bundle)
    assert str(caught.value) == (
        f"{bundle}!dist/{WHEEL}: refused as an archive bomb, not unpacked: its 2 members would bring what "
        f"it unpacks to {len(wheel) + 2000} bytes, over the limit of {limit} bytes (MAX_UNPACKED_BYTES)"
    )


def test_member_paths_never_leave_the_scratch_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Absolute paths, ``..`` and links in an archive are names only: nothing is written where they point."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SLACK)  # what a followed link would read
    scanned = tmp_path / "in"
    scanned.mkdir()
    absolute = f"{outside}/planted.txt"
    evil = scanned / "evil.tar.gz"
    evil.write_bytes(
        gzip.compress(
            _tar(
                {
                    "../../../../escape.txt": SLACK,
                    absolute: SLACK,
                    "linked/pwned.txt": SLACK,  # through the link below, were links made
                    "..": b"no name\n",
                },
                links={"linked": str(outside), "secret-link.txt": str(outside / "secret.txt")},
            )
        )
    )
    (scanned / "evil.zip").write_bytes(_zip({"../../zip-escape.txt": SLACK, "/etc/abs.txt": SLACK}))
    before = sorted(p for p in tmp_path.rglob("*"))
    report = _scan(scanned)
    assert _locations(report) == sorted(
        [
            f"{evil}!../../../../escape.txt:1:{RULE}",
            f"{evil}!linked/pwned.txt:1:{RULE}",
            f"{evil}!{absolute.lstrip('/')}:1:{RULE}",
            f"{scanned}/evil.zip!../../zip-escape.txt:1:{RULE}",
            f"{scanned}/evil.zip!etc/abs.txt:1:{RULE}",
        ]
    )
    assert report.files == 6  # the two links are not members with content: skipped, not followed
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing new anywhere, scratch empty again
    assert list(scratch.iterdir()) == []


# Issue 39: an archive scan that cannot be starved (headers, member counts, .debs read whole) or blinded
# (zip "links", bytes outside the members, a tar's bytes past where its reader stops).


def _header_size(raw: bytes, at: int) -> int:
    """The size the tar header block at byte ``at`` states (of an extension header: its content)."""
    return tarfile.TarInfo.frombuf(raw[at : at + 512], "utf-8", "surrogateescape").size


def test_a_tar_header_over_the_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pax path or a GNU long name is judged from its header block, naming the member's position."""
    monkeypatch.setattr(archives, "MAX_HEADER_BYTES", 4096)
    long = "d/" * 2100 + "config.txt"  # 4210 bytes of path
    for form, what in (
        (tarfile.PAX_FORMAT, "pax extended header"),
        (tarfile.GNU_FORMAT, "GNU long name header"),
    ):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=form) as tar:
            for name in ("a.txt", long):
                info = tarfile.TarInfo(name)
                info.size = len(SLACK)
                tar.addfile(info, io.BytesIO(SLACK))
        archive = tmp_path / f"long-{form}.tar.gz"
        archive.write_bytes(gzip.compress(raw.getvalue()))
        stated = _header_size(raw.getvalue(), 1024)  # after a.txt's header and its one data block
        assert stated > 4096
        with pytest.raises(scan.ScanInputError) as caught:
            _scan(archive)
        assert str(caught.value) == (
            f"{archive}: refused, not read further: member 2 (its header at byte 1024 of the tar): its "
            f"{what} states {stated} bytes, over the limit of 4096 bytes (MAX_HEADER_BYTES)"
        )


def test_extension_headers_are_bounded_in_all_before_one_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long name and a long link, each under the limit, are over it together."""
    monkeypatch.setattr(archives, "MAX_HEADER_BYTES", 4096)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("n/" * 1200)
        info.type, info.linkname = tarfile.SYMTYPE, "t/" * 1200
        tar.addfile(info)
    archive = tmp_path / "links.tar"
    archive.write_bytes(raw.getvalue())
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(archive)
    assert str(caught.value) == (
        f"{archive}: refused, not read further: member 1 (its header at byte 0 of the tar): its "
        "extension headers state 4802 bytes in all, over the limit of 4096 bytes (MAX_HEADER_BYTES)"
    )


def _long_path_tar(path_bytes: int) -> tuple[bytes, int]:
    """A tar of a.txt, then a member whose pax header states a path of ``path_bytes``; and that header's size.

    Made at the real limit (:data:`archives.MAX_HEADER_BYTES`): gzip packs the 4 MiB path into a few KB,
    as a hostile layer would pack hundreds of MB.
    """
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("a.txt", "d/" * (path_bytes // 2) + "config.txt"):
            info = tarfile.TarInfo(name)
            info.size = len(SLACK)
            tar.addfile(info, io.BytesIO(SLACK))
    return raw.getvalue(), _header_size(raw.getvalue(), 1024)


def _refused(shown: str, stated: int) -> str:
    return (
        f"{shown}: refused, not read further: member 2 (its header at byte 1024 of the tar): its pax "
        f"extended header states {stated} bytes, over the limit of 1048576 bytes (MAX_HEADER_BYTES)"
    )


def test_an_image_layers_tar_headers_are_bounded(tmp_path: Path) -> None:
    """`scan --image` reads each layer through the same bounded reader as an archive under PATH."""
    hostile, stated = _long_path_tar(4 << 20)
    assert stated > archives.MAX_HEADER_BYTES
    layer = gzip.compress(hostile, mtime=0)
    assert len(layer) < 64 << 10
    layout = tmp_path / "layout"
    _oci_layout(layout, [layer])
    digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    with pytest.raises(scan.ScanInputError) as caught:
        scan.run_scan([], layout, None, root=tmp_path)
    assert str(caught.value) == _refused(f"{layout}: layer {digest}", stated)


def test_an_image_archives_own_tar_headers_are_bounded(tmp_path: Path) -> None:
    """An image given as a tar (OCI or docker archive): its own headers are judged before they are read."""
    hostile, stated = _long_path_tar(4 << 20)
    image = tmp_path / "image.tar"
    image.write_bytes(hostile)
    with pytest.raises(scan.ScanInputError) as caught:
        scan.run_scan([], image, None, root=tmp_path)
    assert str(caught.value) == _refused(str(image), stated)


def _empty_tar(count: int, prefix: str = "f") -> bytes:
    return _tar({f"{prefix}{n}": b"" for n in range(count)})


def test_members_per_archive_are_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archives, "MAX_MEMBERS", 3)
    sdist = tmp_path / "many.tar.gz"
    sdist.write_bytes(gzip.compress(_empty_tar(5)))
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(sdist)
    assert str(caught.value) == (
        f"{sdist}: refused, not read further: member 4 (its header at byte 1536 of the tar) would bring "
        "the entries of the archive to 4, over the limit of 3 (MAX_MEMBERS)"
    )
    wheel = tmp_path / WHEEL
    wheel.write_bytes(_zip({f"pkg/f{n}.py": b"" for n in range(5)}))
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(wheel)
    assert str(caught.value) == (
        f"{wheel}: refused, not read further: its end record lists 5 entries, which would bring the "
        "entries of the archive to 5, over the limit of 3 (MAX_MEMBERS)"
    )
    deb = tmp_path / "tool_1.0_arm64.deb"
    deb.write_bytes(_deb({f"./usr/share/f{n}": b"" for n in range(5)}))
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(deb)
    # The ar members count too: debian-binary, control.tar.gz, data.tar.xz, then the control tar's first
    # one (the control tar is opened first, in archive order, and counts against the .deb's limit).
    assert str(caught.value) == (
        f"{deb}!control.tar.gz: refused, not read further: member 1 (its header at byte 0 of the tar) would "
        "bring the entries of the archive to 4, over the limit of 3 (MAX_MEMBERS)"
    )


def test_members_per_scan_are_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archives, "MAX_SCAN_MEMBERS", 5)
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    first.write_bytes(_empty_tar(3))
    second.write_bytes(_empty_tar(3))
    assert _scan(first).files == 3  # one archive is within the limit
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(first, second)
    assert str(caught.value) == (
        f"{second}: refused, not read further: member 3 (its header at byte 1024 of the tar) would bring "
        "the archive entries of this scan to 6, over the limit of 5 (MAX_SCAN_MEMBERS)"
    )


def test_a_zip_symbolic_link_is_scanned_as_the_data_it_is(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        info = zipfile.ZipInfo("pkg/config.txt")
        info.external_attr = (0o120777 << 16) | 0x10  # S_IFLNK: an unzip that ignores it writes a file
        archive.writestr(info, SLACK)
    wheel = tmp_path / WHEEL
    wheel.write_bytes(raw.getvalue())
    report = _scan(wheel)
    assert (report.files, _locations(report)) == (1, [f"{wheel}!pkg/config.txt:1:{RULE}"])


def test_bytes_outside_a_zips_members_are_scanned(tmp_path: Path) -> None:
    """Its comment and data appended after its end: our rules read the archive's own bytes too."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("cache.py", f"CACHE = '{HOME}/.cache'\n".encode())
        archive.comment = f"built in {HOME}/src\n".encode()
    commented = tmp_path / "commented.zip"
    commented.write_bytes(raw.getvalue())
    appended = tmp_path / "appended.zip"
    appended.write_bytes(_zip({"a.txt": b"a\n"}) + f"\nfrom {HOME}/src\n".encode())
    report = _scan(commented, appended)
    assert [(f.path, f.rule, f.match) for f in report.findings] == [
        (str(appended), "home-path", "/home/a***"),
        (f"{commented}!cache.py", "home-path", "/home/a***"),
        # the comment's match is the member's, so it is reported once, as the member's
    ]
    comment_only = tmp_path / "comment-only.zip"
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        archive.writestr("a.txt", b"a\n")
        archive.comment = f"built in {HOME}/src\n".encode()
    comment_only.write_bytes(raw.getvalue())
    assert [(f.path, f.rule) for f in _scan(comment_only).findings] == [(str(comment_only), "home-path")]


def _past_end(tmp_path: Path) -> dict[str, tuple[bytes, int]]:
    """Tars whose bytes go on past where the reader stops: their bytes and where it stops."""
    hidden = _tar({"config.txt": SLACK})
    plain = _tar({"a.txt": b"a\n"})
    return {
        "appended.tar": (plain + hidden, len(plain) - 1024 * 8),
        "zero-first.tar": (bytes(512) + hidden, 0),
        "two-members.tar.gz": (gzip.compress(plain) + gzip.compress(hidden), len(plain) - 1024 * 8),
        "two-frames.tar.zst": (
            zstandard.ZstdCompressor().compress(plain) + zstandard.ZstdCompressor().compress(hidden),
            len(plain) - 1024 * 8,
        ),
    }


def test_a_tar_is_read_whole_or_refused(tmp_path: Path) -> None:
    """After its end blocks, after a zero block, in a second gzip member: what tar -i or gzip -d unpacks."""
    for name, (data, end) in _past_end(tmp_path).items():
        if name != "zero-first.tar":
            end = _tar({"a.txt": b"a\n"}).index(bytes(1024), 1024)  # the end blocks after a.txt
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(scan.ScanInputError) as caught:
            _scan(path)
        description = archives.archive_kind(name).description  # type: ignore[union-attr]
        assert str(caught.value) == (
            f"{path}: expected {description}, cannot read it whole: the tar reader stops at byte {end} "
            "(an end or zero block, or a header it cannot read), and bytes that are not zero follow it; "
            "refused, since an unpacker that reads on (tar -i, gzip -d over a second member) would "
            "unpack what the scan did not see"
        ), name
    padded = tmp_path / "padded.tar.gz"  # zeros past the end, as tar's record padding: read as before
    padded.write_bytes(gzip.compress(_tar({"a.txt": b"a\n"}) + bytes(20480)))
    assert _scan(padded).files == 1


def test_a_deb_is_streamed_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deb = tmp_path / "tool_1.0_arm64.deb"
    deb.write_bytes(_deb({"./etc/tool/config.txt": SLACK}))
    truncated = tmp_path / "truncated_1.0_arm64.deb"
    truncated.write_bytes(deb.read_bytes()[:-10])
    read_bytes = Path.read_bytes

    def whole(self: Path) -> bytes:
        assert self != deb, "the .deb was read whole"
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", whole)
    assert _locations(_scan(deb)) == [f"{deb}!etc/tool/config.txt:1:{RULE}"]
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(truncated)
    assert str(caught.value).startswith(
        f"{truncated}: expected a Debian package (an ar archive with a data.tar member), cannot read it: "
        "member 'data.tar.xz' claims "
    )


def test_a_debs_control_member_is_scanned_too(tmp_path: Path) -> None:
    """Its maintainer scripts run as root at install: a .deb's members besides data.tar are scanned, the
    control tar opened like a nested archive (and any other ar member read as the bytes it is)."""
    control = gzip.compress(_tar({"./control": b"Package: tool\n", "./postinst": b"#!/bin/sh\n" + SLACK}))
    data = lzma.compress(_tar({"./usr/bin/tool": b"x"}))
    deb = tmp_path / "tool_1.0_arm64.deb"
    deb.write_bytes(
        ar_archive(
            [
                ("debian-binary", b"2.0\n"),
                ("control.tar.gz", control),
                ("data.tar.xz", data),
                ("_extra", SLACK),
            ]
        )
    )
    report = _scan(deb)
    assert _locations(report) == [
        f"{deb}!_extra:1:{RULE}",
        f"{deb}!control.tar.gz!postinst:2:{RULE}",
    ]
    assert (report.files, report.archives) == (5, 2)  # debian-binary, control, postinst, tool, _extra


def test_the_help_says_what_is_read_whole_and_the_limits() -> None:
    text = " ".join(_cli("--help").stdout.split())
    assert (
        "Every member's bytes are scanned, a zip's 'symbolic links' too, and each archive's own bytes as "
        "well: the bytes of a zip outside its members (its comment, data prepended, appended or between "
        "members) by both rule sets, as ARCHIVE!(bytes outside the members) for the catalogue, the whole "
        "archive by our rules; the bytes of a tar (a .deb's data.tar too) that are no member's data (its "
        "headers: every pax record, GNU long names, owner, group and link fields; the padding after each "
        "member; entries of a type no reader knows) by both rule sets, as ARCHIVE!(tar headers and "
        "padding), a finding at the line of the tar decompressed (not in --image layers); a tar must be "
        "read whole: data past its end (after its end "
        "blocks or a zero block, in a second gzip member) is refused, as is a tar header over 1048576 "
        "bytes, an archive of more than 250000 entries or a scan of more than 1000000 archive entries "
        "(exit 2)."
    ) in text


def _outside(tmp_path: Path, name: str, data: bytes) -> list[tuple[int, int]]:
    path = tmp_path / name
    path.write_bytes(data)
    return archives.outside_members(path, name, archives.archive_kind(name))  # type: ignore[arg-type]


def test_the_bytes_outside_a_zips_members_are_computed_from_its_records(tmp_path: Path) -> None:
    """Prefix, gap, comment and suffix: each bound read from the zip's own records, nothing else."""
    plain = _zip({"pkg/__init__.py": b"", "pkg/a.py": b"print(1)\n" * 40})
    assert _outside(tmp_path, WHEEL, plain) == []
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/", b"")  # a directory entry with no data: all structure, covered
        archive.writestr("pkg/a.py", b"print(1)\n" * 40)
        raw.write(b"<gap>")  # between two records: zipfile writes the next one where it left off
        archive.start_dir = raw.tell()  # type: ignore[attr-defined]
        archive.writestr("pkg/b.py", b"print(2)\n" * 40)
        archive.comment = b"<comment>"
    prefix, suffix = b"#!/bin/sh\nexit 0\n", b"<suffix>"
    data = prefix + raw.getvalue() + suffix
    ranges = _outside(tmp_path, "commented.zip", data)
    assert [data[start:end] for start, end in ranges] == [prefix, b"<gap>", b"<comment><suffix>"]
    assert ranges[0] == (0, len(prefix)) and ranges[-1][1] == len(data)
    # A zip written to a stream puts a data descriptor after each member's data: a record's bytes too.
    streamed = io.BytesIO()
    with zipfile.ZipFile(_Unseekable(streamed), "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/a.py", b"print(1)\n" * 40)
    assert zipfile.ZipFile(streamed).infolist()[0].flag_bits & 0x08
    assert _outside(tmp_path, "streamed.zip", streamed.getvalue()) == []
    # A stored member's data past the size it states: zipfile hands out that size and no more.
    slack = _stored_slack(b"a\n", b"<slack>")
    assert zipfile.ZipFile(io.BytesIO(slack)).read("a.txt") == b"a\n"
    assert [slack[start:end] for start, end in _outside(tmp_path, "slack.zip", slack)] == [b"<slack>"]
    # Tars are read whole (bytes past the reader's end refused) and an ar's headers follow each other
    # to its last byte: neither has bytes outside its members.
    assert _outside(tmp_path, "a.tar", _tar({"a.txt": b"a\n"})) == []
    assert _outside(tmp_path, "tool_1.0_arm64.deb", _deb({"./a.txt": b"a\n"})) == []


class _Unseekable(io.RawIOBase):
    """A stream zipfile cannot seek back in, so it writes a data descriptor after each member."""

    def __init__(self, out: io.BytesIO) -> None:
        super().__init__()
        self.out = out

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        return self.out.write(data)


def test_a_zip64_archives_end_records_are_its_directorys(tmp_path: Path) -> None:
    """Past 65535 entries zipfile writes a zip64 end record and its locator before the classic one.

    Their ranges are read from the bytes (signatures and struct fields), not from zipfile, whose idea of
    where the end lies changed between Python revisions (Debian's 3.11.2-6+deb12u9 and deb12u6).
    """
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as archive:
        for n in range(0x10000):
            archive.writestr(zipfile.ZipInfo(f"{n}"), b"")
        archive.comment = b"<comment>"
    data = raw.getvalue()
    directory, record = data.index(b"PK\x01\x02"), data.rindex(b"PK\x06\x06")
    locator, classic = data.rindex(b"PK\x06\x07"), data.rindex(b"PK\x05\x06")
    assert (record + _END64.size, locator + _LOCATOR.size) == (locator, classic)  # as zipfile writes them
    fields = _END64.unpack_from(data, record)
    assert fields[1:] == (44, 45, 45, 0, 0, 0x10000, 0x10000, record - directory, directory)
    assert _LOCATOR.unpack_from(data, locator)[1:] == (0, record, 1)
    assert _END.unpack_from(data, classic)[3:] == (0xFFFF, 0xFFFF, record - directory, directory, 9)
    assert archives.end_records(io.BytesIO(data)) == archives.EndRecords(
        size=len(data),
        classic=(classic, classic + _END.size),
        comment=(classic + _END.size, len(data)),
        locator=(locator, classic),
        zip64=(record, locator),
        directory=(directory, record),
        entries=0x10000,
        offset=directory,
    )
    ranges = _outside(tmp_path, "many.zip", data)
    assert ranges == [(classic + _END.size, len(data))]
    assert [data[start:end] for start, end in ranges] == [b"<comment>"]


# The records of a zip, as APPNOTE.TXT lays them out (little-endian, each led by its signature).
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a local file header (4.3.7), its name next
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # a central directory header (4.3.12), its name next
_END64 = struct.Struct("<4sQHHIIQQQQ")  # the zip64 end of central directory record (4.3.14)
_LOCATOR = struct.Struct("<4sIQI")  # the zip64 end of central directory locator (4.3.15)
_END = struct.Struct("<4sHHHHIIH")  # the end of central directory record (4.3.16), its comment next


def _built(zip64: bool, gaps: dict[str, bytes] | None = None) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """A zip of two stored members built with struct, and the byte range of each of its parts by name.

    Parts, in order: the local records ``a.txt`` and ``b.txt``, ``directory``, with ``zip64`` the zip64
    end record ``zip64`` and its ``locator`` (the classic record's count, size and offset then defer to
    them: 0xffff and 0xffffffff), and the classic record ``end``. ``gaps`` puts bytes before a part (by
    its name), as the ``comment`` or after everything (``suffix``). Every offset a record states counts
    from the first local header, as a writer that knows nothing of bytes put before it.
    """
    gaps = gaps or {}
    out, parts = bytearray(), {}
    prefix = len(gaps.get("a.txt", b""))

    def put(name: str, data: bytes) -> None:
        out.extend(gaps.get(name, b""))
        parts[name] = (len(out), len(out) + len(data))
        out.extend(data)

    central = b""
    for name, data in {"a.txt": b"a\n", "b.txt": b"b\n"}.items():
        crc, size, encoded = zlib.crc32(data), len(data), name.encode()
        put(
            name,
            _LOCAL.pack(b"PK\x03\x04", 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0) + encoded + data,
        )
        offset = parts[name][0] - prefix
        central += _CENTRAL.pack(
            b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0, 0, 0, 0, 0, offset
        )
        central += encoded
    put("directory", central)
    count, size, offset = 2, len(central), parts["directory"][0] - prefix
    if zip64:
        put("zip64", _END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, offset))
        put("locator", _LOCATOR.pack(b"PK\x06\x07", 0, parts["zip64"][0] - prefix, 1))
        count, size, offset = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF
    comment = gaps.get("comment", b"")
    put("end", _END.pack(b"PK\x05\x06", 0, 0, count, count, size, offset, len(comment)))
    out.extend(comment + gaps.get("suffix", b""))
    return bytes(out), parts


def test_a_zips_end_records_are_read_from_its_bytes(tmp_path: Path) -> None:
    """Each record's range and the directory's, as the struct layout puts them, with or without zip64."""
    stub, comment = b"#!/bin/sh\nexit 0\n", b"<comment>"
    for zip64 in (False, True):
        data, parts = _built(zip64, {"a.txt": stub, "comment": comment})
        assert zipfile.ZipFile(io.BytesIO(data)).read("b.txt") == b"b\n"  # zipfile reads it
        assert archives.end_records(io.BytesIO(data)) == archives.EndRecords(
            size=len(data),
            classic=parts["end"],
            comment=(parts["end"][1], len(data)),
            locator=parts["locator"] if zip64 else None,
            zip64=parts["zip64"] if zip64 else None,
            directory=parts["directory"],
            entries=2,
            offset=parts["directory"][0] - len(stub),
        )
        assert _outside(tmp_path, "stub.zip", data) == [(0, len(stub)), (parts["end"][1], len(data))]
        # A comment length that does not reach the end of the file, or reaches past it, is taken as zipfile
        # takes it: the rest is data appended after the comment, or the comment is cut at the end of the
        # file. Both stay outside the members, as the comment does.
        for stated, cut in ((3, parts["end"][1] + 3), (len(comment) + 5, len(data))):
            changed = bytearray(data)
            struct.pack_into("<H", changed, parts["end"][0] + 20, stated)
            assert zipfile.ZipFile(io.BytesIO(changed)).read("b.txt") == b"b\n"
            records = archives.end_records(io.BytesIO(changed))
            assert (records.classic, records.comment) == (parts["end"], (parts["end"][1], cut))
            assert _outside(tmp_path, "stub.zip", bytes(changed)) == [
                (0, len(stub)),
                (parts["end"][1], len(data)),
            ]


def test_a_token_in_any_gap_of_a_zip_is_outside_its_members_or_refused(tmp_path: Path) -> None:
    """Bytes put before, between or after any records: reported outside, or the zip is refused. No byte
    between the directory and the end records, or between two end records, is taken as covered."""
    token = b"<token>"
    for zip64 in (False, True):
        for part in ("a.txt", "b.txt", "directory", "comment", "suffix"):
            data, _ = _built(zip64, {part: token})
            at = data.index(token)
            assert _outside(tmp_path, "gap.zip", data) == [(at, at + len(token))], (zip64, part)
    shown = "gap.zip: expected a zip archive, cannot read it: "
    # The locator points at the record, past where the directory ends: the record and the locator disagree.
    data, parts = _built(True, {"zip64": token})
    record, (offset, ends) = parts["zip64"][0], parts["directory"]
    with pytest.raises(archives.ArchiveError) as caught:
        _outside(tmp_path, "gap.zip", data)
    assert str(caught.value) == (
        f"{shown}its zip64 end of central directory record (at byte {record}) states a central directory "
        f"ending at byte {ends} (offset {offset} + size {ends - offset}), expected byte {record}, where its "
        "locator places the record"
    )
    data, parts = _built(True, {"locator": token})
    locator = parts["locator"][0]
    with pytest.raises(archives.ArchiveError) as caught:
        _outside(tmp_path, "gap.zip", data)
    assert str(caught.value) == (
        f"{shown}its zip64 end of central directory locator (at byte {locator}) is not preceded by a zip64 "
        f"end of central directory record: expected its signature b'PK\\x06\\x06' at byte {locator - 56}, "
        f"found {data[locator - 56 : locator - 52]!r}"
    )
    # Between the locator and the classic record there is no locator where a reader looks: a classic zip,
    # whose directory of 0xffffffff bytes cannot lie before its end record.
    data, parts = _built(True, {"end": token})
    end = parts["end"][0]
    with pytest.raises(archives.ArchiveError) as caught:
        _outside(tmp_path, "gap.zip", data)
    assert str(caught.value) == (
        f"{shown}its end of central directory record (at byte {end}) states a central directory of "
        f"4294967295 bytes, expected at most the {end} bytes before the record"
    )
    # A classic zip's directory is read just before its end record, where the token now ends it.
    data, _ = _built(False, {"end": token})
    with pytest.raises(archives.ArchiveError) as caught:
        _outside(tmp_path, "gap.zip", data)
    assert str(caught.value) == f"{shown}Bad magic number for central directory"


def test_a_corrupt_zip64_locator_or_record_is_refused_naming_it(tmp_path: Path) -> None:
    """Each field that would make a Python revision read another directory, or none, is refused: the
    message names the record, what it states and what was expected; never taken as covered."""
    data, parts = _built(True)
    (record, locator), end = parts["zip64"], parts["end"][0]
    offset, ends = parts["directory"]
    size = ends - offset
    named, named64 = (
        f"its zip64 end of central directory locator (at byte {locator})",
        f"its zip64 end of central directory record (at byte {record})",
    )
    multiple = "zipfiles that span multiple disks are not supported"
    cases: dict[str, tuple[int, str, int | bytes, str]] = {
        # name: (where, struct format, value written there, what the refusal says)
        "locator disk": (
            locator + 4,
            "<I",
            1,
            f"{named} places the zip64 end record on disk 1, expected disk 0: {multiple}",
        ),
        "locator disks": (locator + 16, "<I", 2, f"{named} states 2 disks, expected 1: {multiple}"),
        "locator past the record": (
            locator + 8,
            "<Q",
            record + 1,
            f"{named} places the zip64 end record at byte {record + 1}, expected byte {record}, where it "
            "lies (or before it, by the bytes prepended to the archive)",
        ),
        "locator before the record": (
            locator + 8,
            "<Q",
            record - 1,
            f"{named64} states a central directory ending at byte {ends} (offset {offset} + size {size}), "
            f"expected byte {record - 1}, where its locator places the record",
        ),
        "record signature": (
            record,
            "<4s",
            b"PK\x06\x07",
            f"{named} is not preceded by a zip64 end of central directory record: expected its signature "
            f"b'PK\\x06\\x06' at byte {record}, found b'PK\\x06\\x07'",
        ),
        "record size": (
            record + 4,
            "<Q",
            45,
            f"{named64} states a size of 45 bytes after its first 12, expected 44: an extensible data sector "
            "is not supported",
        ),
        "record disk": (
            record + 16,
            "<I",
            1,
            f"{named64} states disk 1, its directory starting on disk 0, expected disk 0 for both: "
            f"{multiple}",
        ),
        "record entries on this disk": (
            record + 24,
            "<Q",
            1,
            f"{named64} states 1 entries on this disk and 2 in all, expected the same count on an archive of "
            "one disk",
        ),
        "record directory size": (
            record + 40,
            "<Q",
            size + 1,
            f"{named64} states a central directory ending at byte {ends + 1} (offset {offset} + size "
            f"{size + 1}), expected byte {record}, where its locator places the record",
        ),
        "classic entries": (
            end + 10,
            "<H",
            1,
            f"its end of central directory record (at byte {end}) states 1 as its entries in all, expected 2 "
            "as its zip64 end record states, or 0xffff to defer to it",
        ),
        "classic offset": (
            end + 16,
            "<I",
            offset + 1,
            f"its end of central directory record (at byte {end}) states {offset + 1} as its directory "
            f"offset, expected {offset} as its zip64 end record states, or 0xffffffff to defer to it",
        ),
    }
    for name, (at, layout, value, message) in cases.items():
        corrupt = bytearray(data)
        struct.pack_into(layout, corrupt, at, value)
        with pytest.raises(archives.ArchiveError) as caught:
            _outside(tmp_path, "corrupt.zip", bytes(corrupt))
        assert str(caught.value) == f"corrupt.zip: expected a zip archive, cannot read it: {message}", name
    # Bytes prepended to the archive: its locator points before the record, by as many bytes. Where it
    # points, another zip64 record's signature: deb12u9's zipfile reads that one, deb12u6's the other.
    prepended, parts = _built(True, {"a.txt": bytes(record) + b"PK\x06\x06"})
    (moved, locator) = parts["zip64"]
    with pytest.raises(archives.ArchiveError) as caught:
        _outside(tmp_path, "corrupt.zip", prepended)
    assert str(caught.value) == (
        f"corrupt.zip: expected a zip archive, cannot read it: its zip64 end of central directory locator "
        f"(at byte {locator}) places the zip64 end record at byte {record}, where another one starts, "
        f"expected byte {moved} (or bytes prepended to the archive before it, but no zip64 record): Python "
        "revisions differ on which of the two they read"
    )
    # The scan refuses it before reading a member, naming the archive.
    wheel = tmp_path / WHEEL
    corrupt = bytearray(data)
    struct.pack_into("<Q", corrupt, record + 4, 45)
    wheel.write_bytes(corrupt)
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(wheel)
    assert str(caught.value) == (
        f"{wheel}: expected a wheel (a zip archive), cannot read it: {named64} states a size of 45 bytes "
        "after its first 12, expected 44: an extensible data sector is not supported"
    )


def test_a_zip_without_a_whole_end_record_is_refused(tmp_path: Path) -> None:
    """No classic end record in the last 22 + 65535 bytes, a truncated one, or a directory larger than
    what precedes its end record: each refused, saying what was found."""
    shown = "end.zip: expected a zip archive, cannot read it: "
    data, parts = _built(False)
    end = parts["end"][0]
    beyond = bytearray(data)
    struct.pack_into("<I", beyond, end + 12, end + 1)
    # 65536 bytes after the record: one more than a comment can be (3.11's zipfile still finds it there).
    far = data + bytes(0x10000)
    cases = {
        "nothing": (
            b"this is no zip",
            "expected an end of central directory record (signature b'PK\\x05\\x06') "
            "in its last 14 bytes, found none",
        ),
        "truncated": (
            data[:-5],
            f"its last end of central directory record signature, at byte {end}, is followed by 13 bytes, "
            "expected the record's 18",
        ),
        "too far": (
            far,
            f"expected an end of central directory record (signature b'PK\\x05\\x06') in its last "
            f"{_END.size + 0xFFFF} bytes, found none",
        ),
    }
    for name, (raw, detail) in cases.items():
        with pytest.raises(archives.ArchiveError) as caught:
            _outside(tmp_path, "end.zip", raw)
        assert str(caught.value) == f"{shown}File is not a zip file: {detail}", name
    with pytest.raises(archives.ArchiveError) as caught:
        _outside(tmp_path, "end.zip", bytes(beyond))
    assert str(caught.value) == (
        f"{shown}its end of central directory record (at byte {end}) states a central directory of "
        f"{end + 1} bytes, expected at most the {end} bytes before the record"
    )


def _stored_slack(shown: bytes, hidden: bytes) -> bytes:
    """A zip of one stored member whose records state ``shown``'s size and CRC, its data ``shown + hidden``.

    zipfile hands out the stated size, so ``hidden`` is read by no reader, and yet lies in the member's
    compressed size (the two sizes of a stored member need not agree).
    """
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("a.txt", shown + hidden)
    data = bytearray(raw.getvalue())
    central = data.index(b"PK\x01\x02")
    fields = (zlib.crc32(shown).to_bytes(4, "little"), len(shown).to_bytes(4, "little"))
    data[14:18], data[22:26] = fields  # the local header's CRC and uncompressed size
    data[central + 16 : central + 20], data[central + 24 : central + 28] = fields  # the directory's
    return bytes(data)


def _catalogue_only(tmp_path: Path) -> dict[str, bytes]:
    """Zips with the Slack token outside their members: a bare token, which only the catalogue knows."""
    hidden = f"token {TOKEN}\n".encode()
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/__init__.py", b"")
        archive.comment = hidden
    # Stored, so that newlines in its members count towards the line of what follows them.
    wheel = _zip({"pkg/__init__.py": b"# one\n# two\n", "pkg-1.0.dist-info/RECORD": b""}, zipfile.ZIP_STORED)
    stub = b'#!/bin/sh\nexec unzip -o "$0"\n'  # a self-extracting stub: the comment is the second range
    return {
        "commented.zip": stub + raw.getvalue(),
        WHEEL: wheel + hidden,
        "prepended.zip": hidden + wheel,
        "stored-slack.zip": _stored_slack(b"a\n", hidden),
    }


def test_a_token_outside_a_zips_members_is_found_by_the_catalogue(tmp_path: Path) -> None:
    """In its comment, appended after a wheel, prepended before a zip, past a stored member's stated size:
    named as outside the members, at the archive's own line (as our rules report a match in its bytes)."""
    bare = f"token {TOKEN}\n"
    assert scan.scan_stream("notes.txt", io.BytesIO(bare.encode())) == []  # our rules alone miss all three
    expected, paths = [], []
    for name, data in _catalogue_only(tmp_path).items():
        paths.append(tmp_path / name)
        paths[-1].write_bytes(data)
        line = data[: data.index(bare.encode())].count(b"\n") + 1
        expected.append(f"{tmp_path}/{name}!(bytes outside the members):{line}:{RULE}")
    assert [location.split(":")[1] for location in expected] == ["3", "3", "1", "2"]
    report = _scan(*paths)
    assert _locations(report) == expected
    assert report.files == 6  # the members; the bytes outside them are no file
    done = _cli(str(tmp_path / WHEEL))
    assert done.stdout.splitlines()[0] == f"{expected[1]}: xoxb***({len(TOKEN)} chars)"
    assert TOKEN not in done.stdout + done.stderr


def test_a_token_outside_the_members_that_a_member_gave_is_reported_once(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/config.txt", SLACK)
        archive.comment = f"token {TOKEN}\n".encode()
    wheel = tmp_path / WHEEL
    wheel.write_bytes(raw.getvalue())
    assert _locations(_scan(wheel)) == [f"{wheel}!pkg/config.txt:1:{RULE}"]


def test_a_deb_with_two_members_of_one_name_is_refused(tmp_path: Path) -> None:
    """dpkg-deb installs the first data.tar; a reader by name would scan only one of the two."""
    control = gzip.compress(_tar({"./control": b"Package: tool\n"}))
    hidden = lzma.compress(_tar({"./etc/tool/config.txt": SLACK}))
    clean = lzma.compress(_tar({"./usr/bin/tool": b"x"}))
    members = [("debian-binary", b"2.0\n"), ("control.tar.gz", control), ("data.tar.xz", hidden)]
    deb = tmp_path / "tool_1.0_arm64.deb"
    deb.write_bytes(ar_archive([*members, ("data.tar.xz", clean)]))
    second = len(ar_archive(members))
    first = second - _AR_HEADER_BYTES - len(hidden) - len(hidden) % 2
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(deb)
    assert str(caught.value) == (
        f"{deb}: expected a Debian package (an ar archive with a data.tar member), cannot read it: two "
        f"members named 'data.tar.xz' (their ar headers at bytes {first} and {second}); refused, since "
        "which one an unpacker reads is not ours to choose"
    )


_AR_HEADER_BYTES = 60


# A tar's bytes that are no member's data: headers, extension headers, padding.


def _headers_tar(form: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar whose metadata holds text, each member's data a run of its own letter (none in the headers).

    A pax ``comment`` record and a vendor key, a ustar uname, gname and link name, a GNU long name (in
    GNU form), a directory, and an entry of a type no reader knows, whose data the reader skips.
    """
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=form) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size, info.uname, info.gname = 700, "<uname>", "<gname>"
        if form == tarfile.PAX_FORMAT:
            info.pax_headers = {"comment": "<comment>", "VENDOR.key": "<vendor>"}
        tar.addfile(info, io.BytesIO(b"A" * 700))
        info = tarfile.TarInfo("d")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        info = tarfile.TarInfo("link")
        info.type, info.linkname = tarfile.SYMTYPE, "<linkname>"
        tar.addfile(info)
        info = tarfile.TarInfo("unknown")
        info.type, info.size = b"Z", 5  # GNU tar extracts it as a regular file; Python's reader skips it
        tar.addfile(info, io.BytesIO(b"<zzz>"))
        info = tarfile.TarInfo("long/" * 30 + "b.txt")  # 155 bytes: a GNU long name, or a pax path
        info.size = 3
        tar.addfile(info, io.BytesIO(b"B\nB"))
    return raw.getvalue()


def _skipped(path: Path) -> tuple[bytes, archives.Skipped, list[tuple[str, bytes]]]:
    out = io.BytesIO()
    skipped = archives.Skipped(out)
    kind = archives.archive_kind(path.name)
    assert kind is not None
    read = [
        (m.name, m.stream.read()) for m in archives.members(path, path.name, kind, archives.Budget(), skipped)
    ]
    return out.getvalue(), skipped, read


def test_a_tars_bytes_that_are_no_members_data_are_collected(tmp_path: Path) -> None:
    """Everything up to the reader's end but the regular members' data, each run after a newline of its own;
    the end blocks are not collected, nor is anything of a zip."""
    for form in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        data = _headers_tar(form)
        a_data = data.index(b"A" * 700)
        b_data = data.index(b"B\nB")
        end = len(data.rstrip(b"\0"))  # past b.txt's data the rest is padding and end blocks: zeros
        end += -end % 512  # b.txt's padding is collected, the end blocks are not
        expected = (
            b"\n" + data[:a_data] + b"\n" + data[a_data + 700 : b_data] + b"\n" + data[b_data + 3 : end]
        )
        for name, packed in (
            ("h.tar", data),
            ("h.tar.gz", gzip.compress(data)),
            ("h.tar.xz", lzma.compress(data)),
        ):
            path = tmp_path / name
            path.write_bytes(packed)
            collected, skipped, read = _skipped(path)
            assert read == [("a.txt", b"A" * 700), ("long/" * 30 + "b.txt", b"B\nB")], (form, name)
            assert collected == expected, (form, name)
            assert skipped.size == len(expected)
            # each run: its line in the copy, its line in the tar (b.txt's data holds the tar's one newline
            # outside its headers: pax records end in newlines, so they are counted up to there)
            before_b = data[:b_data].count(b"\n")
            assert skipped.lines == [
                (2, 1),
                (3 + data[:a_data].count(b"\n"), 1 + data[: a_data + 700].count(b"\n")),
                (4 + before_b, 1 + before_b + 1),
            ], (form, name)
        for text in (b"<uname>", b"<gname>", b"<linkname>", b"<zzz>", b"long/long/"):
            assert text in expected, (form, text)
        assert (b"<comment>" in expected) == (b"<vendor>" in expected) == (form == tarfile.PAX_FORMAT)
    deb = tmp_path / "tool_1.0_arm64.deb"
    deb.write_bytes(_deb({"./a.txt": b"a\n"}))
    collected, _, _ = _skipped(deb)
    assert b"./a.txt" in collected and b"Package:" not in collected  # the data.tar's; control is a member
    wheel = tmp_path / WHEEL
    wheel.write_bytes(_zip({"a.txt": b"a\n"}))
    assert _skipped(wheel)[0] == b""  # a zip's bytes outside its members: outside_members


def test_a_tars_member_data_is_never_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes are classified as the reader reaches them: what is held is the read-ahead, never a member."""
    path = tmp_path / "big.tar.gz"
    path.write_bytes(gzip.compress(_tar({"a.bin": bytes(range(256)) * 16384, "b.txt": b"b\n"})))  # 4 MiB
    held: list[int] = []
    feed = archives.Skipped.feed

    def spy(self: archives.Skipped, data: bytes) -> None:
        feed(self, data)
        held.append(len(self._held))

    monkeypatch.setattr(archives.Skipped, "feed", spy)
    collected, _, _ = _skipped(path)
    assert len(held) > 400 and max(held) <= 10240  # tarfile's stream reads 10240 bytes at a time
    # three runs, each after its newline: a.bin's header, b.txt's header, b.txt's padding (a.bin needs none)
    assert len(collected) == 3 + 2 * 512 + 510


def test_a_tars_headers_are_judged_against_the_bomb_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They are written to scratch space: their total is judged before the next member is read."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("a.txt", "b.txt"):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = 2, {"comment": "c" * 3000}
            tar.addfile(info, io.BytesIO(b"a\n"))
    data = raw.getvalue()
    second = data.index(b"a\n", data.index(b"a\n") + 2)
    limit = second - 100  # a.txt's headers fit, b.txt's do not
    monkeypatch.setattr(archives, "MAX_UNPACKED_BYTES", limit)
    path = tmp_path / "commented.tar.gz"
    path.write_bytes(gzip.compress(data))
    copied = _copied(monkeypatch)
    # a.txt's 2 bytes, and all the rest up to the end of b.txt's block but b.txt's 2 bytes (its padding is
    # known with its header)
    total = 2 + second + 512 - 4
    with pytest.raises(scan.ScanInputError) as caught:
        _scan(path)
    assert str(caught.value) == (
        f"{path}: refused as an archive bomb, not unpacked: its tar headers and padding up to b.txt would "
        f"bring what it unpacks to {total} bytes, over the limit of {limit} bytes (MAX_UNPACKED_BYTES)"
    )
    assert copied == [f"{path}!a.txt"]


def _pax_comment_tar(comment: str) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pkg-1.0/README")
        info.size, info.pax_headers = 6, {"comment": comment}
        tar.addfile(info, io.BytesIO(b"hello\n"))
    return raw.getvalue()


def _uname_tar(uname: str) -> bytes:
    """A ustar tar whose one member's owner is ``uname`` (at most 32 bytes: the field's width)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("pkg-1.0/README")
        info.size, info.uname = 6, uname
        tar.addfile(info, io.BytesIO(b"one\ntwo\n"[:6]))
    return raw.getvalue()


def test_a_token_in_a_tars_headers_is_found_by_both_rule_sets(tmp_path: Path) -> None:
    """In a pax comment record of a .tar.gz (an sdist), in a ustar uname of a .tar.xz, of a plain .tar and of
    a .deb's data.tar: the catalogue reads the headers as ARCHIVE!(tar headers and padding), a finding at
    the line of the tar (uncompressed) where it lies. It never read a tar's own bytes: it skips a .tar by
    its name, and is never shown one."""
    owner = TOKEN[:32]
    assert len(owner.encode()) == 32
    comment = f"token {TOKEN}"
    for text in (comment, owner):
        assert scan.scan_stream("notes.txt", io.BytesIO(text.encode())) == []  # our rules alone miss both
    tars = {
        "pkg-1.0.tar.gz": (_pax_comment_tar(comment), gzip.compress),
        "rootfs.tar.xz": (_uname_tar(owner), lzma.compress),
        "plain.tar": (_pax_comment_tar(comment), bytes),
        "tool_1.0_arm64.deb": (
            _pax_comment_tar(comment),
            lambda tar: ar_archive([("debian-binary", b"2.0\n"), ("data.tar.xz", lzma.compress(tar))]),
        ),
    }
    expected, paths = [], []
    for name, (tar, pack) in tars.items():
        paths.append(tmp_path / name)
        paths[-1].write_bytes(pack(tar))
        line = tar[: tar.index(owner.encode())].count(b"\n") + 1
        expected.append(f"{paths[-1]}!(tar headers and padding):{line}:{RULE}")
    assert [location.split(":")[1] for location in expected] == ["1", "1", "1", "1"]
    # Shown the plain tar itself, the catalogue skips it by its name (the same bytes under another are read)
    plain, renamed = paths[2], tmp_path / "plain.bin"
    renamed.write_bytes(plain.read_bytes())
    names = {str(plain.resolve()): "plain.tar", str(renamed.resolve()): "plain.bin"}
    assert [f.path for f in CATALOGUE.scan([plain, renamed], names)] == ["plain.bin"]
    renamed.unlink()
    report = _scan(*paths)
    assert sorted(_locations(report)) == sorted(expected)
    assert report.files == 5  # the members (and the .deb's debian-binary); the headers are no file
    done = _cli(str(paths[0]))
    assert done.stdout.splitlines()[0] == f"{expected[0]}: xoxb***({len(TOKEN)} chars)"
    assert TOKEN not in done.stdout + done.stderr


def test_a_match_in_a_tars_headers_is_given_the_tars_line(tmp_path: Path) -> None:
    """Our rules read the headers too (a compressed tar's own bytes hide them): at the tar's line, once."""
    data = b"".join(f"{n}\n".encode() for n in range(5))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("b.txt")
        info.size, info.pax_headers = 2, {"comment": f"built in {HOME}/src"}
        tar.addfile(info, io.BytesIO(b"b\n"))
        info = tarfile.TarInfo("c.txt")  # the same match in a member and in its headers: reported once
        info.size, info.pax_headers = len(SLACK), {"comment": SLACK.decode()}
        tar.addfile(info, io.BytesIO(SLACK))
    tar_bytes = raw.getvalue()
    line = tar_bytes[: tar_bytes.index(HOME.encode())].count(b"\n") + 1
    assert line == 6  # after a.txt's five lines
    # A plain tar's own bytes are our rules' too (the raw pass): its headers' match is reported once,
    # as the headers', at the same line.
    for name, data in (("src.tar.gz", gzip.compress(tar_bytes)), ("src.tar", tar_bytes)):
        path = tmp_path / name
        path.write_bytes(data)
        assert [(f.location(), f.match) for f in _scan(path).findings] == [
            (f"{path}!(tar headers and padding):{line}:home-path", "/home/a***"),
            (f"{path}!c.txt:1:{RULE}", f"xoxb***({len(TOKEN)} chars)"),
        ], name
