"""The locked toolchains: the unpacked root of their .debs, and the interpreter every action runs on."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import pytest

from sparkseal.fetch.toolchain_root import main as toolchain_root
from tests.bazel_remote import minimal_workspace, shut_down_after
from tests.bazel_util import BAZEL
from tests.fixtures_debian import Exec, Link, lock_for, make_deb, write_lock

ARCH = "amd64"
TRIPLET = "x86_64-linux-gnu"


def _debs(tmp_path: Path) -> list[Path]:
    out = tmp_path / "debs"
    out.mkdir()
    return [
        make_deb(
            out,
            "libc6",
            "2.36-9",
            ARCH,
            {
                f"lib/{TRIPLET}/libc.so.6": b"host libc",
                "lib64/ld-linux-x86-64.so.2": Link(f"/lib/{TRIPLET}/libc.so.6"),
            },
        ),
        make_deb(
            out,
            "zlib1g",
            "1:1.2.13",
            ARCH,
            {
                f"lib/{TRIPLET}/libz.so.1.2.13": b"zlib",
                f"lib/{TRIPLET}/libz.so.1": Link("libz.so.1.2.13"),
                "usr/share/doc/zlib1g/copyright": b"license",
            },
        ),
        make_deb(
            out,
            "tool",
            "1.0",
            ARCH,
            {
                "usr/bin/tool-1": Exec(b"#!/bin/sh\n"),
                "usr/bin/tool": Link("/usr/bin/tool-1"),
                "usr/bin/dangling": Link("/usr/lib/nothing-ships-this"),
                "usr/bin/chained": Link("dangling"),
                # One file below each folder the toolchain's drop policy names, and look-alikes it keeps.
                "usr/share/man/man1/tool.1.gz": b"man",
                "usr/share/info/tool.info.gz": b"info",
                "usr/share/locale/de/LC_MESSAGES/tool.mo": b"mo",
                "usr/share/lintian/overrides/tool": b"tool: lintian\n",
                "usr/share/bug/tool/control": b"bug",
                "usr/share/gdb/auto-load/tool-gdb.py": b"gdb",
                "usr/share/bash-completion/completions/tool": b"complete",
                "usr/share/doc-base/tool": b"Document: tool\n",
                "usr/share/groff/site-tmac/tool.tmac": b"groff",
            },
        ),
    ]


def _unpack(tmp_path: Path, debs: list[Path], *extra: str) -> tuple[int, Path]:
    lock = write_lock(tmp_path / "lock.json", lock_for(debs, ARCH))
    out = tmp_path / "out"
    args = ["--lock", str(lock), "--out", str(out), "--triplet", TRIPLET, *extra, *map(str, debs)]
    return toolchain_root(args), out


def _outputs_digest(out: Path) -> str:
    """One sha256 over what the unpacker wrote: every file with its mode, every link with its target, and
    ``packages.json`` without the sha256s (dpkg-deb's compressed bytes, not the unpacker's doing)."""
    digest = hashlib.sha256()
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if rel == "packages.json":
            packages = [{k: v for k, v in p.items() if k != "sha256"} for p in json.loads(path.read_text())]
            digest.update(f"{rel} {json.dumps(packages, sort_keys=True)}\n".encode())
        elif path.is_symlink():
            digest.update(f"{rel} -> {path.readlink()}\n".encode())
        elif path.is_file():
            content = hashlib.sha256(path.read_bytes()).hexdigest()
            digest.update(f"{rel} {path.stat().st_mode:o} {content}\n".encode())
    return digest.hexdigest()


# The fixture's root, recorded before the .deb reading and the drop policies moved to sparkseal.core.deb:
# an unpacker that changes a byte, a mode or a link fails.
ROOT_DIGEST = "67be3117307e2118f5d2e0eb3f8296463ce2672a2011eaadeef3eb23c264a85b"


def test_root_is_the_debs_with_relative_links_and_no_host_libc_on_the_library_path(tmp_path: Path) -> None:
    code, out = _unpack(tmp_path, _debs(tmp_path), "--host-libc", "libc6")
    assert code == 0
    root = out / "root"
    # Absolute links are relative: nothing points into the host's /.
    assert (root / "usr/bin/tool").readlink() == Path("tool-1")
    assert (root / "lib64/ld-linux-x86-64.so.2").readlink() == Path(f"../lib/{TRIPLET}/libc.so.6")
    # A link to a file no locked package ships is dropped, and so is a link to it.
    assert not (root / "usr/bin/dangling").is_symlink()
    assert not (root / "usr/bin/chained").is_symlink()
    assert not (root / "usr/share/doc").exists()
    for kept in ("doc-base/tool", "groff/site-tmac/tool.tmac"):
        assert (root / "usr/share" / kept).exists(), kept
    for dropped in ("man", "info", "locale", "lintian", "bug", "gdb", "bash-completion"):
        assert not (root / "usr/share" / dropped).exists(), dropped
    # lib/ holds the locked libraries but never the C library, which comes with the host's loader.
    assert sorted(p.name for p in (out / "lib").iterdir()) == ["libz.so.1", "libz.so.1.2.13"]
    assert (out / "lib/libz.so.1").read_bytes() == b"zlib"
    packages = json.loads((out / "packages.json").read_text())
    assert [(p["package"], p["version"]) for p in packages] == [
        ("libc6", "2.36-9"),
        ("tool", "1.0"),
        ("zlib1g", "1:1.2.13"),
    ]
    assert _outputs_digest(out) == ROOT_DIGEST


def test_skipped_package_is_listed_but_not_unpacked(tmp_path: Path) -> None:
    code, out = _unpack(tmp_path, _debs(tmp_path), "--skip", "libc6")
    assert code == 0
    assert not (out / "root/lib" / TRIPLET / "libc.so.6").exists()
    assert "libc6" in [p["package"] for p in json.loads((out / "packages.json").read_text())]


def test_two_packages_disagreeing_about_a_path_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    debs = _debs(tmp_path)
    debs.append(
        make_deb(tmp_path / "debs", "other", "2.0", ARCH, {"usr/bin/tool-1": Exec(b"#!/bin/sh\nexit 1\n")})
    )
    code, out = _unpack(tmp_path, debs)
    assert code == 1
    assert "/usr/bin/tool-1 of tool differs from the one other ships" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("out.partial").exists()


def test_debs_other_than_the_locked_ones_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    debs = _debs(tmp_path)
    lock = write_lock(tmp_path / "lock.json", lock_for(debs[:2], ARCH))
    code = toolchain_root(
        ["--lock", str(lock), "--out", str(tmp_path / "out"), "--triplet", TRIPLET, *map(str, debs)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert f"{lock}: expected exactly the locked .debs; missing none, unlocked ['{debs[2].name}']" in err


def test_a_deb_whose_sha256_is_not_the_locked_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    debs = _debs(tmp_path)
    lock_doc = lock_for(debs, ARCH)
    lock = write_lock(tmp_path / "lock.json", lock_doc)
    locked = lock_doc["packages"][0]["sha256"]  # type: ignore[index]
    debs[0].write_bytes(debs[0].read_bytes() + b"\0")
    code = toolchain_root(
        ["--lock", str(lock), "--out", str(tmp_path / "out"), "--triplet", TRIPLET, *map(str, debs)]
    )
    assert code == 1
    assert f"{debs[0]}: sha256 mismatch: expected {locked} ({lock}), actual " in capsys.readouterr().err


PROBE = """\
import sys, zlib, ssl
print(sys.version.split()[0], zlib.ZLIB_RUNTIME_VERSION, ssl.OPENSSL_VERSION.split()[1], sys.executable)
"""

PROBE_BUILD = """\
load("//rules:py.bzl", "py_tool")

py_tool(name = "probe", main = "probe.py")

genrule(
    name = "probed",
    outs = ["probed.txt"],
    cmd = "$(location :probe) > $@",
    tools = [":probe"],
)
"""


@pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (run make setup)")
def test_actions_run_the_locked_interpreter_not_the_hosts(tmp_path: Path) -> None:
    """An action's program runs CPython 3.11.2 of the locked .debs with their zlib and OpenSSL, whatever
    python3 the host has."""
    workspace = minimal_workspace(tmp_path / "ws", PROBE_BUILD, files={"probe.py": PROBE})
    with shut_down_after(workspace):
        result = workspace.bazel("build", "//:probed")
        assert result.returncode == 0, result.output
        version, zlib, openssl, executable = workspace.bin_path("probed.txt").read_text().split()
    assert (version, zlib, openssl) == ("3.11.2", "1.2.13", "3.0.22")
    machine = platform.machine()
    assert executable.endswith(f"/sparkseal_python_linux_{machine}/root/usr/bin/python3.11"), executable


CC_PROBE_BZL = """\
def _uses_cc_impl(ctx):
    cc = ctx.toolchains["//third_party/toolchains:cc_toolchain_type"].cc
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    compiler = [f for f in cc.files.to_list() if f.basename == "x86_64-linux-gnu-g++-12"][0]
    ctx.actions.run_shell(
        inputs = cc.files,
        outputs = [out],
        command = "cat %s > %s" % (compiler.path, out.path),
        mnemonic = "UsesCompiler",
    )
    return [DefaultInfo(files = depset([out]))]

uses_cc = rule(implementation = _uses_cc_impl, toolchains = ["//third_party/toolchains:cc_toolchain_type"])
"""

CC_PROBE_BUILD = (
    PROBE_BUILD
    + """
load(":cc_probe.bzl", "uses_cc")

uses_cc(name = "compiled")
"""
)


def _fake_cc(debs: Path, version: str) -> Path:
    """A stand-in for the locked compilers: one package whose compiler is a script naming its version."""
    debs.mkdir(exist_ok=True)
    compiler = Exec(f"#!/bin/sh\necho fake g++ {version}\n".encode())
    return make_deb(debs, "fake-gxx", version, ARCH, {f"usr/bin/{TRIPLET}-g++-12": compiler})


def _into_cache(cache: Path, deb: Path) -> None:
    target = cache / "content_addressable" / "sha256" / hashlib.sha256(deb.read_bytes()).hexdigest() / "file"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(deb.read_bytes())


@pytest.mark.skipif(BAZEL is None or platform.machine() != "x86_64", reason="bazel on an x86_64 host")
def test_a_changed_compiler_package_reruns_only_the_actions_that_read_it(tmp_path: Path) -> None:
    workspace = minimal_workspace(
        tmp_path / "ws", CC_PROBE_BUILD, files={"probe.py": PROBE, "cc_probe.bzl": CC_PROBE_BZL}
    )
    lock = workspace.root / "third_party/toolchains/cc_bookworm_amd64.lock.json"
    logs = []
    with shut_down_after(workspace):
        for version in ("1.0", "1.1"):
            deb = _fake_cc(tmp_path / f"debs-{version}", version)
            write_lock(lock, lock_for([deb], ARCH))
            _into_cache(workspace.repository_cache, deb)
            log = tmp_path / f"exec-{version}.json"
            result = workspace.bazel("build", f"--execution_log_json_file={log}", "//:probed", "//:compiled")
            assert result.returncode == 0, result.output
            assert workspace.bin_path("compiled.txt").read_text() == f"#!/bin/sh\necho fake g++ {version}\n"
            logs.append(sorted(json.loads(s)["mnemonic"] for s in _json_stream(log.read_text())))
    assert logs[0] == ["Genrule", "UsesCompiler"], logs[0]
    # The interpreter's action did not run again; the compiler's did, with the new package's bytes.
    assert logs[1] == ["UsesCompiler"], logs[1]


def _json_stream(text: str) -> list[str]:
    """The objects of a Bazel JSON execution log (concatenated, not a list), each as its own text."""
    decoder, index, found = json.JSONDecoder(), 0, []
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        _, end = decoder.raw_decode(text, index)
        found.append(text[index:end])
        index = end
    return found
