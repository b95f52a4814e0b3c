"""The rootfs action on fixture .debs built with dpkg-deb (and, marked, on the real locked packages)."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from sparkseal.actions import oci_layer
from sparkseal.actions.debian_rootfs import main
from sparkseal.core.deb import DebError
from sparkseal.core.locks import read_debian_lock
from sparkseal.fetch.debian_archive import locked_urls
from sparkseal.fetch.download import download
from sparkseal.fetch.index import IndexFile
from sparkseal.install.debian_rootfs import RUNTIME_UID, RUNTIME_USER, build_rootfs
from tests.bazel_util import REPO
from tests.bytecode_probe import PROBE
from tests.fixtures_debian import (
    Exec,
    Hardlink,
    Link,
    lock_for,
    make_deb,
    make_raw_deb,
    materialize,
    tar_entry,
    write_lock,
)

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")

ARCH = "amd64"
CERT_A = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"
CERT_B = b"-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n"


def _base_files(out: Path) -> Path:
    return make_deb(
        out,
        "base-files",
        "12.4",
        ARCH,
        {
            "usr/lib/os-release": b"ID=debian\nVERSION_CODENAME=bookworm\n",
            "etc/os-release": Link("../usr/lib/os-release"),
        },
        dirs={"bin": 0o755, "tmp": 0o1777, "root": 0o700},
    )


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("debs")
    marker = out / "maintainer-script-ran"
    script = f'#!/bin/sh\ntouch {marker}\ntouch "$DPKG_ROOT/etc/script-ran"\n'
    return [
        _base_files(out),
        make_deb(
            out,
            "tool",
            "1.0-1",
            ARCH,
            {
                "bin/tool": Exec(b"#!/bin/sh\necho tool\n"),
                "usr/bin/tool-alias": Link("tool"),
                "usr/bin/tool-hard": Hardlink("bin/tool"),
                "usr/share/doc/tool/README": b"read me\n",
                "usr/share/doc/tool/copyright": b"MIT\n",
                "usr/share/man/man1/tool.1.gz": b"man",
                # One file below each folder a drop policy names, and look-alikes it keeps.
                "usr/share/doc/tool/examples/copyright": b"MIT too\n",
                "usr/share/doc-base/tool": b"Document: tool\n",
                "usr/share/groff/site-tmac/tool.tmac": b"groff",
                "usr/share/info/tool.info.gz": b"info",
                "usr/share/linda/overrides/tool": b"linda",
                "usr/share/lintian/overrides/tool": b"tool: lintian\n",
                "usr/share/locale/de/LC_MESSAGES/tool.mo": b"mo",
                "usr/share/bug/tool/control": b"bug",
                "usr/share/gdb/auto-load/tool-gdb.py": b"gdb",
                "usr/share/bash-completion/completions/tool": b"complete",
            },
            scripts={"preinst": script, "postinst": script},
        ),
        make_deb(
            out,
            "libfoo1",
            "2:1.2-3",
            ARCH,
            {"usr/lib/x86_64-linux-gnu/libfoo.so.1": b"\x7fELF"},
            multi_arch="same",
        ),
        make_deb(
            out,
            "ca-certificates",
            "20250419",
            "all",
            {
                "usr/share/ca-certificates/mozilla/B.crt": CERT_B,
                "usr/share/ca-certificates/mozilla/A.crt": CERT_A,
            },
            dirs={"etc/ssl/certs": 0o755},
        ),
        make_deb(out, "tzdata", "2025b", "all", {"usr/share/zoneinfo/Etc/UTC": b"TZif2"}),
    ]


def _build(debs: list[Path], tmp: Path, exclude: str = "slim", lock: dict[str, object] | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    lock_path = write_lock(tmp / "lock.json", lock or lock_for(debs, ARCH))
    out = tmp / "rootfs"
    build_rootfs(debs, lock_path, out, tmp / "links.json", tmp / "dirs.json", exclude)
    return out


def _outputs_digest(tmp: Path) -> str:
    """One sha256 over the three outputs of a build in ``tmp``: every file of the tree with its mode, and
    the links and dirs specs byte for byte (not the lock, whose sha256s are dpkg-deb's compressed bytes)."""
    digest = hashlib.sha256()
    root = tmp / "rootfs"
    for path in sorted(root.rglob("*")):
        if path.is_file():
            content = hashlib.sha256(path.read_bytes()).hexdigest()
            digest.update(f"{path.relative_to(root).as_posix()} {path.stat().st_mode:o} {content}\n".encode())
    for spec in ("links.json", "dirs.json"):
        digest.update((tmp / spec).read_bytes())
    return digest.hexdigest()


# The outputs of the fixture packages, recorded before the .deb reading and the drop policies moved to
# sparkseal.core.deb: an unpacker that changes a byte of the tree, a mode, a link or a directory fails.
SLIM_DIGEST = "d661d5cce3ad607828bd21edb3f64cb406030ffcf401d7a4f270d09a69ffd908"
NONE_DIGEST = "ed60e1964d293554d9322d8434ba6403b0954d6eb2d42c3721c15b60ddfb781a"


def _digest_tree(tmp: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(tmp.rglob("*")):
        if path.is_file():
            digests[path.relative_to(tmp).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def test_unpacks_merged_usr_with_links_dirs_and_no_scripts(debs: list[Path], tmp_path: Path) -> None:
    root = _build(debs, tmp_path)
    tool = root / "usr/bin/tool"
    assert tool.read_bytes() == b"#!/bin/sh\necho tool\n"
    assert tool.stat().st_mode & 0o777 == 0o755
    assert (root / "usr/bin/tool-hard").read_bytes() == tool.read_bytes()
    assert (root / "usr/lib/os-release").stat().st_mode & 0o777 == 0o644
    assert not (root / "bin").exists()
    assert not [p for p in root.rglob("*") if p.is_symlink()]

    links = json.loads((tmp_path / "links.json").read_text())
    assert links["bin"] == "usr/bin"
    assert links["lib"] == "usr/lib"
    assert "lib64" not in links
    assert links["usr/bin/tool-alias"] == "tool"
    assert links["etc/os-release"] == "../usr/lib/os-release"
    assert links["etc/localtime"] == "/usr/share/zoneinfo/Etc/UTC"
    assert (root / "etc/timezone").read_text() == "Etc/UTC\n"

    dirs = json.loads((tmp_path / "dirs.json").read_text())
    assert dirs["tmp"] == {"mode": "1777", "uid": 0, "gid": 0}
    # Modes are the two the layer writer allows: 0700 (/root in base-files) becomes 0755.
    assert dirs["root"]["mode"] == "0755"
    assert dirs["usr/bin"]["mode"] == "0755"
    assert (dirs[f"home/{RUNTIME_USER}"]["uid"], dirs[f"home/{RUNTIME_USER}"]["gid"]) == (
        RUNTIME_UID,
        RUNTIME_UID,
    )
    assert "bin" not in dirs

    # Maintainer scripts never run: neither on the machine nor in the tree.
    assert not (debs[0].parent / "maintainer-script-ran").exists()
    assert not (root / "etc/script-ran").exists()


def test_slim_profile_keeps_copyright_only_and_none_keeps_all(debs: list[Path], tmp_path: Path) -> None:
    slim = _build(debs, tmp_path / "slim")
    assert (slim / "usr/share/doc/tool/copyright").read_bytes() == b"MIT\n"
    assert not (slim / "usr/share/doc/tool/README").exists()
    assert not (slim / "usr/share/man/man1").exists()
    listing = (slim / "var/lib/dpkg/info/tool.list").read_text().splitlines()
    assert listing[0] == "/."
    assert "/bin/tool" in listing
    assert "/usr/share/doc/tool/copyright" in listing
    assert "/usr/share/doc/tool/README" not in listing

    assert (slim / "usr/share/doc/tool/examples/copyright").read_bytes() == b"MIT too\n"
    for kept in ("doc-base/tool", "bug/tool/control", "gdb/auto-load/tool-gdb.py"):
        assert (slim / "usr/share" / kept).exists(), kept
    for dropped in ("groff", "info", "linda", "lintian", "locale"):
        assert not (slim / "usr/share" / dropped).exists(), dropped
    assert _outputs_digest(tmp_path / "slim") == SLIM_DIGEST

    full = _build(debs, tmp_path / "none", exclude="none")
    assert (full / "usr/share/doc/tool/README").read_bytes() == b"read me\n"
    assert (full / "usr/share/man/man1/tool.1.gz").read_bytes() == b"man"
    assert _outputs_digest(tmp_path / "none") == NONE_DIGEST


def test_accounts_dpkg_database_and_ca_bundle(debs: list[Path], tmp_path: Path) -> None:
    root = _build(debs, tmp_path)
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert passwd[0].startswith("root:x:0:0:")
    assert (
        f"{RUNTIME_USER}:x:{RUNTIME_UID}:{RUNTIME_UID}:{RUNTIME_USER}:/home/{RUNTIME_USER}:/bin/sh" in passwd
    )
    assert (root / "etc/group").read_text().splitlines()[:2] == [
        "root:x:0:",
        f"{RUNTIME_USER}:x:{RUNTIME_UID}:",
    ]

    paragraphs = (root / "var/lib/dpkg/status").read_text().split("\n\n")
    names = [p.splitlines()[0] for p in paragraphs]
    assert names == [f"Package: {p}" for p in ("base-files", "ca-certificates", "libfoo1", "tool", "tzdata")]
    assert all(p.splitlines()[1] == "Status: install ok installed" for p in paragraphs)
    assert "Version: 2:1.2-3" in paragraphs[2]
    info = root / "var/lib/dpkg/info"
    assert (info / "format").read_text() == "1\n"
    # Multi-Arch: same packages are named pkg:arch in dpkg's database.
    assert (info / f"libfoo1:{ARCH}.list").is_file()
    md5 = hashlib.md5(b"#!/bin/sh\necho tool\n").hexdigest()
    assert f"{md5}  bin/tool" in (info / "tool.md5sums").read_text()

    # update-ca-certificates' result: sorted by path, each certificate newline-terminated.
    assert (root / "etc/ssl/certs/ca-certificates.crt").read_bytes() == CERT_A + b"\n" + CERT_B
    assert (root / "etc/ca-certificates.conf").read_text().splitlines()[1:] == [
        "mozilla/A.crt",
        "mozilla/B.crt",
    ]


def test_output_is_identical_whatever_the_input_order(debs: list[Path], tmp_path: Path) -> None:
    _build(debs, tmp_path / "a")
    _build(list(reversed(debs)), tmp_path / "b")
    first, second = _digest_tree(tmp_path / "a"), _digest_tree(tmp_path / "b")
    assert len(first) > 10
    assert first == second


def test_the_standard_library_gets_reproducible_unchecked_bytecode(debs: list[Path], tmp_path: Path) -> None:
    stdlib = make_deb(
        tmp_path / "debs",
        "libpython3.11-stdlib",
        "3.11.2-6",
        ARCH,
        {
            "usr/lib/python3.11/json/__init__.py": b'"""JSON."""\nNAMES = {"a", "b"}\n',
            "usr/lib/python3.11/json/decoder.py": b"def decode(s):\n    return s\n",
            "usr/lib/python3.11/lib2to3/tests/data/py2_test_grammar.py": b"print 'python 2'\n",
            "usr/lib/python3.11/json/tool.py": Link("decoder.py"),
            "usr/share/doc/python3.11/example.py": b"X = 1\n",
        },
    )
    first = _build([*debs, stdlib], tmp_path / "a")
    pycs = sorted(p.relative_to(first).as_posix() for p in first.rglob("*.pyc"))
    assert pycs == [
        "usr/lib/python3.11/json/__pycache__/__init__.cpython-311.pyc",
        "usr/lib/python3.11/json/__pycache__/decoder.cpython-311.pyc",
    ]  # not the Python 2 file, nor a link, nor a .py outside the standard library
    data = (first / pycs[1]).read_bytes()
    assert int.from_bytes(data[4:8], "little") == 0b01  # PEP 552: hash-based, unchecked
    assert marshal.loads(data[16:]).co_filename == "/usr/lib/python3.11/json/decoder.py"
    assert (first / pycs[0]).stat().st_mode & 0o777 == 0o644
    dirs = json.loads((tmp_path / "a" / "dirs.json").read_text())
    assert "usr/lib/python3.11/json/__pycache__" in dirs
    # Another directory, the packages in the other order: the same bytes.
    second = _build([stdlib, *debs[::-1]], tmp_path / "b" / "deeper")
    assert _digest_tree(first) == _digest_tree(second)


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        (tar_entry("./../evil", b"x"), "escapes its root through '..'"),
        (tar_entry("/etc/evil", b"x"), "absolute path '/etc/evil' is not allowed"),
        (
            tar_entry("./usr/bad", kind=tarfile.SYMTYPE, link="../../../etc/shadow"),
            "usr/bad -> ../../../etc/shadow escapes the root",
        ),
        (
            tar_entry("./dev/null", kind=tarfile.CHRTYPE),
            "only directories, regular files and symlinks are allowed",
        ),
        (tar_entry("./bin", b"x"), "/bin must be a directory (it is a link into /usr here)"),
    ],
)
def test_unsafe_members_are_refused(
    debs: list[Path], tmp_path: Path, member: tuple[tarfile.TarInfo, bytes], expected: str
) -> None:
    bad = make_raw_deb(tmp_path, "bad", "1.0", ARCH, [tar_entry("./", kind=tarfile.DIRTYPE), member])
    with pytest.raises(DebError) as info:
        _build([*debs, bad], tmp_path)
    assert expected in str(info.value)
    assert bad.name in str(info.value)


def test_a_path_through_another_packages_symlink_is_refused(debs: list[Path], tmp_path: Path) -> None:
    link = make_deb(tmp_path, "linker", "1.0", ARCH, {"usr/share/data": Link("/etc")})
    # dpkg would follow the link and write /etc/passwd; here the directory entry already clashes.
    with_dir = make_deb(tmp_path, "writer", "1.0", ARCH, {"usr/share/data/passwd": b"x"})
    with pytest.raises(DebError) as info:
        _build([*debs, link, with_dir], tmp_path / "dir")
    assert "usr/share/data clashes: package linker has a link -> /etc, package writer a different dir" in str(
        info.value
    )
    # Without a directory entry, the file itself is refused.
    file_only = make_raw_deb(tmp_path, "writer", "1.0", ARCH, [tar_entry("./usr/share/data/passwd", b"x")])
    with pytest.raises(DebError) as info:
        _build([*debs, link, file_only], tmp_path / "file")
    message = str(info.value)
    assert "usr/share/data/passwd (package writer) passes through the link usr/share/data -> /etc" in message
    assert "of package linker" in message


def test_clashing_files_are_refused_identical_ones_allowed(debs: list[Path], tmp_path: Path) -> None:
    one = make_deb(tmp_path, "one", "1.0", ARCH, {"usr/bin/same": b"same", "usr/bin/x": b"1"})
    two = make_deb(tmp_path, "two", "1.0", ARCH, {"bin/same": b"same", "usr/bin/x": b"2"})
    with pytest.raises(DebError) as info:
        _build([*debs, one, two], tmp_path / "clash")
    assert "usr/bin/x clashes: package one has a file, package two a different file" in str(info.value)
    three = make_deb(tmp_path, "three", "1.0", ARCH, {"bin/same": b"same"})
    root = _build([*debs, one, three], tmp_path / "ok")
    assert (root / "usr/bin/same").read_bytes() == b"same"


def test_zstd_data_member_is_refused(debs: list[Path], tmp_path: Path) -> None:
    zst = make_raw_deb(
        tmp_path, "zst", "1.0", ARCH, [tar_entry("./", kind=tarfile.DIRTYPE)], data_member="data.tar.zst"
    )
    with pytest.raises(DebError) as info:
        _build([*debs, zst], tmp_path)
    supported = "data.tar, data.tar.gz, data.tar.bz2, data.tar.xz"
    assert f"{zst}: data.tar.zst is not supported (expected one of {supported})" in str(info.value)


def test_debs_must_be_exactly_the_locked_ones(debs: list[Path], tmp_path: Path) -> None:
    lock = lock_for(debs, ARCH)
    packages = lock["packages"]
    assert isinstance(packages, list)
    wrong = "f" * 64
    actual = packages[0]["sha256"]
    packages[0]["sha256"] = wrong
    with pytest.raises(DebError) as info:
        _build(debs, tmp_path / "sha", lock=lock)
    assert f"{debs[0]}: sha256 mismatch: expected {wrong}" in str(info.value)
    assert f"actual {actual}" in str(info.value)

    with pytest.raises(DebError) as info:
        _build(debs[1:], tmp_path / "missing", lock=lock_for(debs, ARCH))
    assert f"missing ['{debs[0].name}'], unlocked none" in str(info.value)

    lock = lock_for(debs, ARCH)
    tool = next(p for p in lock["packages"] if p["package"] == "tool")  # type: ignore[union-attr]
    tool["version"] = "9.9"
    with pytest.raises(DebError) as info:
        _build(debs, tmp_path / "version", lock=lock)
    assert "control Version: expected '9.9'" in str(info.value)
    assert "actual '1.0-1'" in str(info.value)


def test_base_files_is_required(debs: list[Path], tmp_path: Path) -> None:
    with pytest.raises(DebError, match="base-files must be among the locked packages"):
        _build(debs[1:], tmp_path)


def test_main_reports_errors_with_exit_status_1(
    debs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = write_lock(tmp_path / "lock.json", lock_for(debs[1:], ARCH))
    args = [
        "--lock",
        str(lock),
        "--out",
        str(tmp_path / "o"),
        "--links",
        str(tmp_path / "l"),
        "--dirs",
        str(tmp_path / "d"),
    ]
    assert main([*args, *map(str, debs[1:])]) == 1
    assert "deb_rootfs: no package provides etc/os-release" in capsys.readouterr().err
    lock = write_lock(tmp_path / "lock.json", lock_for(debs, ARCH))
    assert main([*args, *map(str, debs)]) == 0
    assert f"deb_rootfs: {len(debs)} packages unpacked" in capsys.readouterr().out


def test_a_layer_of_debs_equals_the_layer_of_their_unpacked_tree(
    debs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The base layer unpacks its .debs in its own action: the same bytes as writing the rootfs tree."""
    tree = _build(debs, tmp_path / "tree")
    lock = tmp_path / "tree" / "lock.json"
    from_tree, from_debs = tmp_path / "from-tree", tmp_path / "from-debs"
    for out in (from_tree, from_debs):
        out.mkdir()
    common = ["--blob", "l.tar.gz", "--descriptor", "l.json"]
    tree_args = ["--tree", str(tree), "/", "--links", str(tmp_path / "tree/links.json"), "/"]
    tree_args += ["--dirs", str(tmp_path / "tree/dirs.json"), "/"]
    assert oci_layer.main([*tree_args, *_at(from_tree, common)]) == 0
    deb_args = [arg for deb in reversed(debs) for arg in ("--deb", str(deb))] + ["--deb-lock", str(lock)]
    assert oci_layer.main([*deb_args, *_at(from_debs, common)]) == 0
    for name in ("l.tar.gz", "l.json"):
        assert (from_debs / name).read_bytes() == (from_tree / name).read_bytes()
    # Nothing of the unpacked tree is left beside the layer.
    assert sorted(p.name for p in from_debs.iterdir()) == ["l.json", "l.tar.gz"]

    # A .deb the lock does not name fails the layer, which writes nothing.
    failed = tmp_path / "failed"
    failed.mkdir()
    bad = write_lock(tmp_path / "short.lock.json", lock_for(debs[1:], ARCH))
    args = [arg for deb in debs for arg in ("--deb", str(deb))] + ["--deb-lock", str(bad)]
    assert oci_layer.main([*args, *_at(failed, common)]) == 1
    assert (
        f"sparkseal: {bad}: expected exactly the locked .debs; missing none, unlocked"
        in capsys.readouterr().err
    )
    assert list(failed.iterdir()) == []


def _at(out: Path, args: list[str]) -> list[str]:
    """Layer arguments with the output file names placed in ``out``."""
    return [str(out / arg) if arg.startswith("l.") else arg for arg in args]


def _locked_debs(arch: str, tmp: Path) -> tuple[Path, list[Path]]:
    """The real locked .debs of ``arch``, downloaded once into the user's cache and verified."""
    lock = REPO / f"third_party/debian/bookworm_{arch}.lock.json"
    locked = read_debian_lock(lock).packages
    cache = Path.home() / ".cache/sparkseal/downloads/debian"
    urls: dict[str, str] = {}
    debs = []
    for deb in locked:
        target = cache / deb.filename
        if not (target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == deb.sha256):
            urls = urls or locked_urls(lock)
            target, _, _ = download(IndexFile(deb.filename, urls[deb.package], deb.sha256, str(lock)), cache)
        debs.append(target)
    return lock, debs


def _run_in(root: Path, *command: str, user: str | None = None) -> str:
    chroot = shutil.which("chroot")
    assert chroot is not None
    prefix = [chroot, *([f"--userspec={user}"] if user else []), str(root)]
    proc = subprocess.run(
        [*prefix, *command],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        check=False,
    )
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


# The CA certificates OpenSSL loads from its default locations (the bundle written for ca-certificates).
CA_COUNT = "ssl.create_default_context().cert_store_stats()['x509_ca']"


def _certificates(tree: Path) -> int:
    count = (tree / "etc/ssl/certs/ca-certificates.crt").read_text().count("-----BEGIN CERTIFICATE-----")
    assert count > 100
    return count


TRITON_LIKE_BUILD = """
import shutil, subprocess, sys, sysconfig
src = "/tmp/stub.c"
open(src, "w").write('#include <Python.h>\\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "stub"};\\n'
                     'PyMODINIT_FUNC PyInit_stub(void) { return PyModule_Create(&m); }\\n')
subprocess.check_call([shutil.which("gcc"), src, "-O3", "-shared", "-fPIC", "-o", "/tmp/stub.so",
                       "-I" + sysconfig.get_paths()["include"]])
sys.path.insert(0, "/tmp")
import stub
print(stub.__name__)
"""


# Imports a good part of the standard library and prints how many modules were compiled from source.
COUNT_COMPILED = (
    PROBE
    + """
import asyncio, email.parser, json, logging.handlers, ssl, sqlite3, subprocess, urllib.request
print(len(compiled), compiled[:3])
"""
)


@pytest.mark.network
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chroot") is None, reason="chroot needs root")
def test_real_amd64_rootfs_runs_python_and_builds_a_triton_style_stub(tmp_path: Path) -> None:
    lock, debs = _locked_debs("amd64", tmp_path)
    tree = tmp_path / "tree"
    assert build_rootfs(debs, lock, tree, tmp_path / "links.json", tmp_path / "dirs.json") == len(debs)
    root = tmp_path / "root"
    materialize(tree, tmp_path / "links.json", tmp_path / "dirs.json", root)
    check = f"import ssl, sqlite3, zoneinfo; print(1, {CA_COUNT})"
    assert _run_in(root, "/usr/bin/python3.11", "-c", check).split() == ["1", str(_certificates(tree))]
    assert (
        _run_in(
            root, "/usr/bin/python3", "-c", "import getpass; print(getpass.getuser())", user="1000:1000"
        ).strip()
        == RUNTIME_USER
    )
    assert _run_in(root, "/usr/bin/python3", "-c", TRITON_LIKE_BUILD, user="1000:1000").strip() == "stub"
    assert _run_in(root, "/bin/sh", "-c", "echo sh").strip() == "sh"
    # The standard library loads from the shipped bytecode: nothing is compiled from source.
    assert _run_in(root, "/usr/bin/python3", "-c", COUNT_COMPILED).split() == ["0", "[]"]
    assert "ID=debian" in _run_in(root, "/usr/bin/python3", "-c", "print(open('/etc/os-release').read())")
    assert "ii  libc6:amd64" in _run_in(root, "/usr/bin/dpkg", "-l", "libc6")


QEMU_AARCH64 = shutil.which("qemu-aarch64-static")


@pytest.mark.network
@pytest.mark.skipif(os.geteuid() != 0 or QEMU_AARCH64 is None, reason="needs root and qemu-user-static")
def test_real_arm64_rootfs_runs_python_under_qemu(tmp_path: Path) -> None:
    lock, debs = _locked_debs("arm64", tmp_path)
    tree = tmp_path / "tree"
    build_rootfs(debs, lock, tree, tmp_path / "links.json", tmp_path / "dirs.json")
    root = tmp_path / "root"
    materialize(tree, tmp_path / "links.json", tmp_path / "dirs.json", root)
    assert QEMU_AARCH64 is not None
    shutil.copy(QEMU_AARCH64, root / "qemu-aarch64-static")  # run explicitly: no binfmt registration needed
    check = f"import platform, sqlite3, ssl; print(platform.machine(), {CA_COUNT})"
    out = _run_in(root, "/qemu-aarch64-static", "/usr/bin/python3.11", "-c", check)
    assert out.split() == ["aarch64", str(_certificates(tree))]
