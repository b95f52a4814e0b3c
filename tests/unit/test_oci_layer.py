"""The layer writer: identical bytes from any build directory, normalised members, and clear errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sparkseal.actions import oci_layer as layer
from sparkseal.core.determinism import SOURCE_DATE_EPOCH
from tests.bazel_util import REPO

SCRIPT = b"#!/bin/sh\necho hi\n"
ELF = b"\x7fELF\x02\x01\x01" + bytes(57)
FILES = {
    "bin/run": SCRIPT,
    "lib/libx.so": ELF,
    "lib/python/mod.py": b"X = 1\n",
    "share/doc/README": b"plain text\n",
}


def make_tree(root: Path, order: list[str], mode: int, mtime: int) -> Path:
    """Write FILES under ``root`` in ``order`` with permission bits ``mode`` and mtime ``mtime``."""
    for rel in order:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(FILES[rel])
        path.chmod(mode)
        os.utime(path, (mtime, mtime))
    (root / "lib" / "empty").mkdir(parents=True)
    return root


def run_layer(args: list[str], cwd: Path, umask: int, tz: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TZ": tz, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "sparkseal.actions.oci_layer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lambda: os.umask(umask),
    )


def outputs(out: Path) -> list[str]:
    return ["--tar", str(out / "l.tar"), "--blob", str(out / "l.tar.gz"), "--descriptor", str(out / "l.json")]


def build(tmp: Path, **inputs: Any) -> Path:
    """Plan and write a layer in-process (``inputs`` are ``plan_layer``'s); return the tar path."""
    descriptor = layer.write_layer(layer.plan_layer(**inputs), tmp / "l.tar", tmp / "l.tar.gz")
    (tmp / "l.json").write_text(json.dumps(descriptor))
    return tmp / "l.tar"


def members(tar: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(tar) as archive:
        return archive.getmembers()


def test_two_builds_in_different_dirs_umask_tz_and_order_are_identical(tmp_path: Path) -> None:
    order = sorted(FILES)
    runs = [
        (tmp_path / "one", order, 0o644, 0o022, "UTC", 1_000_000_000),
        (tmp_path / "two" / "deeper", order[::-1], 0o600, 0o077, "Asia/Kolkata", 1_700_000_000),
    ]
    produced = []
    for root, creation_order, mode, umask, tz, mtime in runs:
        tree = make_tree(root / "tree", creation_order, mode, mtime)
        links = root / "links.json"
        links.write_text(json.dumps({"bin/run2": "run"}))
        out = root / "out"
        out.mkdir()
        result = run_layer(
            ["--tree", str(tree), "/opt/venv", "--links", str(links), "/opt/venv", *outputs(out)],
            cwd=root,
            umask=umask,
            tz=tz,
        )
        assert result.returncode == 0, result.stderr
        produced.append([(out / name).read_bytes() for name in ("l.tar", "l.tar.gz", "l.json")])
    assert produced[0] == produced[1]
    names = [m.name for m in members(tmp_path / "one" / "out" / "l.tar")]
    assert "opt/venv/share/doc/README" in names


def test_the_plain_tar_is_optional_and_changes_nothing_else(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", sorted(FILES), 0o644, 1_000_000_000)
    with_tar, without = tmp_path / "with", tmp_path / "without"
    with_tar.mkdir()
    without.mkdir()
    first = run_layer(
        ["--tree", str(tree), "/opt/venv", *outputs(with_tar)], cwd=tmp_path, umask=0o022, tz="UTC"
    )
    assert first.returncode == 0, first.stderr
    only_blob = ["--blob", str(without / "l.tar.gz"), "--descriptor", str(without / "l.json")]
    result = run_layer(["--tree", str(tree), "/opt/venv", *only_blob], cwd=tmp_path, umask=0o022, tz="UTC")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in without.iterdir()) == ["l.json", "l.tar.gz"]
    for name in ("l.tar.gz", "l.json"):
        assert (without / name).read_bytes() == (with_tar / name).read_bytes()


def test_members_are_sorted_with_parents_fixed_owner_time_and_modes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", sorted(FILES), 0o600, 1_234_567_890)
    tar = build(tmp_path, trees=[(tree, "/opt/venv")], directories=["/tmp"], modes=[("/tmp", "1777")])
    found = members(tar)
    assert [m.name for m in found] == [
        "opt",
        "opt/venv",
        "opt/venv/bin",
        "opt/venv/bin/run",
        "opt/venv/lib",
        "opt/venv/lib/libx.so",
        "opt/venv/lib/python",
        "opt/venv/lib/python/mod.py",
        "opt/venv/share",
        "opt/venv/share/doc",
        "opt/venv/share/doc/README",
        "tmp",
    ]  # lib/empty is not written: an empty tree directory is dropped
    modes = {m.name: m.mode for m in found}
    assert modes["opt/venv/bin/run"] == 0o755  # "#!"
    assert modes["opt/venv/lib/libx.so"] == 0o755  # ELF
    assert modes["opt/venv/lib/python/mod.py"] == 0o644
    assert modes["opt/venv"] == 0o755
    assert modes["tmp"] == 0o1777
    for m in found:
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", SOURCE_DATE_EPOCH), m.name
        assert m.pax_headers == {}, m.name
    raw = tar.read_bytes()
    assert raw[257:265] == b"ustar\x0000"
    assert raw[:100].rstrip(b"\0") == b"opt/"  # directories carry the trailing slash


def test_sandbox_style_links_are_read_for_content_and_modes_come_from_content(tmp_path: Path) -> None:
    real = make_tree(tmp_path / "real", sorted(FILES), 0o555, 0)  # Bazel marks outputs r-xr-xr-x
    sandbox = tmp_path / "sandbox"
    for rel in FILES:
        (sandbox / rel).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / rel).symlink_to(real / rel)
    tar = build(tmp_path, trees=[(sandbox, "/")])
    with tarfile.open(tar) as archive:
        files = {m.name: m for m in archive.getmembers() if m.isfile()}
        assert {name: archive.extractfile(m).read() for name, m in files.items()} == FILES  # type: ignore[union-attr]
    assert not any(m.issym() or m.islnk() for m in members(tar))
    assert {n: m.mode for n, m in files.items()} == {
        "bin/run": 0o755,
        "lib/libx.so": 0o755,
        "lib/python/mod.py": 0o644,
        "share/doc/README": 0o644,
    }


def test_links_spec_symlinks_files_and_mode_overrides(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", sorted(FILES), 0o644, 0)
    spec = tmp_path / "links.json"
    spec.write_text(json.dumps({"bin/python3": "python3.11", "lib/libx.so.1": "libx.so"}))
    extra = tmp_path / "app.conf"
    extra.write_bytes(b"#!not really a script\n")
    tar = build(
        tmp_path,
        trees=[(tree, "/opt/venv")],
        links=[(spec, "/opt/venv")],
        files=[(extra, "/etc/app.conf")],
        symlinks=[("/usr/bin/python3", "/opt/venv/bin/python3")],
        modes=[("/etc/app.conf", "0644")],
    )
    found = {m.name: m for m in members(tar)}
    assert found["opt/venv/bin/python3"].issym() and found["opt/venv/bin/python3"].linkname == "python3.11"
    assert found["opt/venv/lib/libx.so.1"].linkname == "libx.so"
    assert found["usr/bin/python3"].linkname == "/opt/venv/bin/python3"
    assert found["usr/bin/python3"].mode == 0o777
    assert found["etc/app.conf"].mode == 0o644  # the override beats the "#!" rule
    assert found["usr"].isdir() and found["usr/bin"].isdir()


def test_dirs_spec_declares_empty_directories_with_mode_and_owner(tmp_path: Path) -> None:
    spec = tmp_path / "dirs.json"
    dirs = {
        "home": {"gid": 0, "mode": "0755", "uid": 0},
        "home/user": {"gid": 1000, "mode": "0755", "uid": 1000},
        "tmp": {"gid": 0, "mode": "1777", "uid": 0},
        "var/tmp": {"gid": 0, "mode": "1777", "uid": 0},
    }
    spec.write_text(json.dumps(dirs))
    tar = build(tmp_path, dirs=[(spec, "/")], directories=["/home"])  # same attributes: one entry
    found = {m.name: (m.type, m.mode, m.uid, m.gid) for m in members(tar)}
    assert found == {
        "home": (tarfile.DIRTYPE, 0o755, 0, 0),
        "home/user": (tarfile.DIRTYPE, 0o755, 1000, 1000),
        "tmp": (tarfile.DIRTYPE, 0o1777, 0, 0),
        "var": (tarfile.DIRTYPE, 0o755, 0, 0),
        "var/tmp": (tarfile.DIRTYPE, 0o1777, 0, 0),
    }


def test_descriptor_names_tar_and_blob_digests_and_gzip_is_fixed(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", sorted(FILES), 0o644, 0)
    tar = build(tmp_path, trees=[(tree, "/opt")])
    blob = (tmp_path / "l.tar.gz").read_bytes()
    descriptor = json.loads((tmp_path / "l.json").read_text())
    assert descriptor == {
        "diff_id": "sha256:" + hashlib.sha256(tar.read_bytes()).hexdigest(),
        "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "size": len(blob),
        "compression": {"format": "gzip", "level": 1, "block_size": 1 << 20, "dictionary": 32 << 10},
    }
    assert gzip.decompress(blob) == tar.read_bytes()
    assert blob[3] == 0  # FLG: no file name, no comment, no extra field
    assert blob[4:8] == bytes(4)  # MTIME 0


def test_long_and_non_ascii_paths_get_a_pax_header_with_only_the_path(tmp_path: Path) -> None:
    long_dir = "d" * 120
    long_file = "f" * 120
    tree = tmp_path / "tree"
    (tree / long_dir).mkdir(parents=True)
    (tree / long_dir / long_file).write_bytes(b"long\n")
    (tree / "ünï.txt").write_bytes(b"utf8\n")
    (tree / ("s" * 90)).write_bytes(b"fits ustar\n")
    tar = build(tmp_path, trees=[(tree, "/")])
    found = {m.name: m.pax_headers for m in members(tar)}
    assert found[f"{long_dir}/{long_file}"] == {"path": f"{long_dir}/{long_file}"}
    assert found[long_dir] == {"path": f"{long_dir}/"}
    assert found["ünï.txt"] == {"path": "ünï.txt"}
    assert found["s" * 90] == {}
    # GNU tar reads the names as written (every supported host has it: a missing one fails, never skips).
    assert shutil.which("tar"), "tar: expected GNU tar on PATH to read the layer back, found none"
    listed = subprocess.run(["tar", "-tf", str(tar)], capture_output=True, text=True, check=True).stdout
    assert f"{long_dir}/{long_file}\n" in listed and "ünï.txt\n" in listed


def test_hardlinked_sources_become_separate_regular_files(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a").write_bytes(b"same\n")
    os.link(tree / "a", tree / "b")
    tar = build(tmp_path, trees=[(tree, "/x")])
    assert [(m.name, m.type) for m in members(tar) if not m.isdir()] == [
        ("x/a", tarfile.REGTYPE),
        ("x/b", tarfile.REGTYPE),
    ]


def _error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert layer.main(args) == 1
    return capsys.readouterr().err


def test_errors_name_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = make_tree(tmp_path / "tree", sorted(FILES), 0o644, 0)
    other = make_tree(tmp_path / "other", ["share/doc/README"], 0o644, 0)
    out = tmp_path / "out"
    out.mkdir()
    o = outputs(out)

    err = _error(capsys, ["--tree", str(tree), "/opt/../../etc", *o])
    assert f"--tree {tree}" in err and "escapes its root through '..'" in err

    err = _error(capsys, ["--tree", str(tree), "opt/venv", *o])
    assert "destination 'opt/venv' must be an absolute image path" in err

    err = _error(capsys, ["--tree", str(tree), "/opt", "--tree", str(other), "/opt", *o])
    assert "/opt/share/doc/README: given twice" in err
    assert f"tree {tree} (share/doc/README)" in err and f"tree {other} (share/doc/README)" in err

    err = _error(capsys, ["--tree", str(tree), "/opt", "--file", str(tree / "bin/run"), "/opt/bin/run", *o])
    assert "/opt/bin/run: given twice" in err and f"--file {tree / 'bin/run'}" in err

    err = _error(capsys, ["--symlink", "/opt/x", "../../../etc/passwd", *o])
    assert "--symlink /opt/x: symlink /opt/x -> ../../../etc/passwd escapes the image root" in err

    spec = tmp_path / "links.json"
    spec.write_text(json.dumps({"../up": "x"}))
    err = _error(capsys, ["--links", str(spec), "/opt", *o])
    assert f"links spec {spec}: ../up" in err and "escapes its root through '..'" in err

    spec.write_text(json.dumps({"/etc/passwd": "x"}))
    err = _error(capsys, ["--links", str(spec), "/opt", *o])
    assert f"links spec {spec}: /etc/passwd: absolute path '/etc/passwd' is not allowed" in err

    dirs = tmp_path / "dirs.json"
    dirs.write_text(json.dumps({"tmp": {"gid": 0, "mode": "1777", "uid": 0}}))
    err = _error(capsys, ["--dirs", str(dirs), "/", "--dir", "/tmp", *o])
    assert "/tmp: directory given twice with different attributes, mode 1777 owner 0:0 by dirs spec" in err
    assert "mode 0755 owner 0:0 by --dir /tmp" in err

    dirs.write_text(json.dumps({"tmp": {"gid": 0, "mode": "0700", "uid": 0}}))
    err = _error(capsys, ["--dirs", str(dirs), "/", *o])
    assert f"dirs spec {dirs}: tmp: mode 0700 is not allowed for a directory; expected 0755 or 1777" in err

    dirs.write_text(json.dumps({"tmp": {"gid": 0, "mode": "0755", "uid": -1}}))
    err = _error(capsys, ["--dirs", str(dirs), "/", *o])
    assert f"dirs spec {dirs}: tmp: uid -1 is not an id from 0 to 2097151" in err

    err = _error(capsys, ["--tree", str(tree), "/opt", "--symlink", "/opt/lib", "/usr/lib", *o])
    assert "/opt/lib/libx.so lies under /opt/lib, which --symlink /opt/lib makes a symlink" in err

    err = _error(capsys, ["--tree", str(tree), "/", "--mode", "/bin/run", "0700", *o])
    assert "--mode /bin/run: mode 0700 is not allowed for a file; expected 0644 or 0755" in err

    err = _error(capsys, ["--tree", str(tree), "/", "--mode", "/nowhere", "0644", *o])
    assert "--mode /nowhere: /nowhere is not in the layer" in err

    err = _error(capsys, ["--symlink", "/a", "b", "--mode", "/a", "0755", *o])
    assert "not allowed for a symlink; expected no mode (symlinks have none)" in err


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda p: os.mkfifo(p),
            "is a FIFO; a layer holds only regular files, directories and declared symlinks",
        ),
        (lambda p: p.symlink_to(p.parent / "sub"), "is a symlink to a directory"),
        (lambda p: p.symlink_to(p.parent / "missing"), "is a broken symlink"),
        (lambda p: p.with_name(".wh.gone").write_bytes(b""), "which OCI runtimes read as a whiteout"),
    ],
    ids=["fifo", "dir-symlink", "broken-symlink", "whiteout"],
)
def test_tree_special_entries_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, expected: str
) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "ok.txt").write_bytes(b"ok\n")
    make(tree / "odd")  # type: ignore[operator]
    out = tmp_path / "out"
    out.mkdir()
    err = _error(capsys, ["--tree", str(tree), "/opt", *outputs(out)])
    assert expected in err
    assert f"tree {tree}" in err and ("odd" in err or ".wh.gone" in err)
