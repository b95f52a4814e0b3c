"""Unpacking the locked sdist: only vllm/, normalised modes, the commit checked, unsafe members refused."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from sparkseal.actions import vllm_source_tree as unpack_action
from sparkseal.actions.vllm_source_tree import SdistError, unpack
from tests.fixtures_vllm import make_sdist, version_file

VERSION = "0.25.1"
COMMIT = "752a3a504485790a2e8491cacbb35c137339ad34"
SHORT = COMMIT[:9]
TOP = f"vllm-{VERSION}"


def _tar(path: Path, members: list[tuple[str, bytes | None, dict[str, object]]]) -> Path:
    """Write a tar.gz of raw members: (name, data or None, TarInfo attributes)."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data, attrs in members:
            info = tarfile.TarInfo(name)
            for key, value in attrs.items():
                setattr(info, key, value)
            if data is not None:
                info.size = len(data)
            archive.addfile(info, None if data is None else io.BytesIO(data))
    return path


def _valid_members() -> list[tuple[str, bytes | None, dict[str, object]]]:
    return [
        (f"{TOP}/vllm/_version.py", version_file(VERSION, SHORT), {}),
        (f"{TOP}/vllm/a.py", b"A = 1\n", {}),
    ]


def _out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o7777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_unpack_extracts_only_the_package_with_normalised_modes(tmp_path: Path) -> None:
    files = {
        "vllm/a.py": b"A = 1\n",
        "vllm/sub/tool.sh": b"#!/bin/sh\n",
        "vllm/sub/ro.py": b"R = 1\n",
        "setup.py": b"setup()\n",
        "csrc/x.cu": b"int x;\n",
        "vllm_extra/y.py": b"Y\n",
        "README.md": b"readme\n",
    }
    sdist = make_sdist(
        tmp_path / "vllm.tar.gz",
        VERSION,
        SHORT,
        files,
        modes={"vllm/sub/tool.sh": 0o775, "vllm/sub/ro.py": 0o400},
    )
    out = _out(tmp_path)

    assert unpack(sdist, out, VERSION, COMMIT) == 4

    assert _files(out) == {
        "vllm/_version.py": (version_file(VERSION, SHORT), 0o644),
        "vllm/a.py": (b"A = 1\n", 0o644),
        "vllm/sub/ro.py": (b"R = 1\n", 0o644),
        "vllm/sub/tool.sh": (b"#!/bin/sh\n", 0o755),
    }


@pytest.mark.parametrize("locked", [COMMIT, COMMIT[:7], SHORT])
def test_abbreviated_and_full_lock_both_match(tmp_path: Path, locked: str) -> None:
    sdist = make_sdist(tmp_path / "vllm.tar.gz", VERSION, SHORT, {"vllm/a.py": b"A\n"})
    assert unpack(sdist, _out(tmp_path), VERSION, locked) == 2


def test_commit_mismatch_names_both_ids_and_the_file(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path / "vllm.tar.gz", VERSION, "1111111aa", {"vllm/a.py": b"A\n"})
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value) == (
        f"{sdist}: {TOP}/vllm/_version.py: commit id is '1111111aa', but the lock expects commit '{COMMIT}'"
    )


def test_version_file_without_commit_id(tmp_path: Path) -> None:
    sdist = make_sdist(
        tmp_path / "vllm.tar.gz",
        VERSION,
        None,
        {"vllm/a.py": b"A\n", "vllm/_version.py": version_file(VERSION, None)},
    )
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value) == f"{sdist}: {TOP}/vllm/_version.py: no commit_id assignment found"


def test_missing_version_file(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path / "vllm.tar.gz", VERSION, None, {"vllm/a.py": b"A\n"})
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value) == f"{sdist}: {TOP}/vllm/_version.py is missing; cannot check the locked commit"


def test_sdist_without_the_package(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path / "vllm.tar.gz", VERSION, None, {"setup.py": b"setup()\n"})
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value) == f"{sdist}: no files under {TOP}/vllm/"


def test_other_version_is_refused(tmp_path: Path) -> None:
    sdist = make_sdist(tmp_path / "vllm.tar.gz", "0.25.0", SHORT, {"vllm/a.py": b"A\n"})
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value) == (
        f"{sdist}: member 'vllm-0.25.0': expected every member under {TOP}/ (the locked version)"
    )


@pytest.mark.parametrize(
    ("name", "attrs", "problem"),
    [
        (
            "other/x.py",
            {},
            "member 'other/x.py': expected every member under vllm-0.25.1/ (the locked version)",
        ),
        (f"{TOP}/../x.py", {}, f"member '{TOP}/../x.py': path '{TOP}/../x.py' escapes its root through '..'"),
        ("../x.py", {}, "member '../x.py': path '../x.py' escapes its root through '..'"),
        ("/etc/x.py", {}, "member '/etc/x.py': absolute path '/etc/x.py' is not allowed"),
        (
            f"{TOP}/vllm/link.py",
            {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"},
            f"member '{TOP}/vllm/link.py': links are not allowed (points to '/etc/passwd')",
        ),
        (
            f"{TOP}/vllm/hard.py",
            {"type": tarfile.LNKTYPE, "linkname": f"{TOP}/vllm/a.py"},
            f"member '{TOP}/vllm/hard.py': links are not allowed (points to '{TOP}/vllm/a.py')",
        ),
        (
            f"{TOP}/vllm/fifo",
            {"type": tarfile.FIFOTYPE},
            f"member '{TOP}/vllm/fifo': only regular files and directories are allowed",
        ),
        (
            f"{TOP}/vllm/dev",
            {"type": tarfile.CHRTYPE},
            f"member '{TOP}/vllm/dev': only regular files and directories are allowed",
        ),
    ],
)
def test_unsafe_members_are_refused(
    tmp_path: Path, name: str, attrs: dict[str, object], problem: str
) -> None:
    data = None if "type" in attrs else b"evil\n"
    sdist = _tar(tmp_path / "vllm.tar.gz", [*_valid_members(), (name, data, attrs)])
    out = _out(tmp_path)
    with pytest.raises(SdistError) as info:
        unpack(sdist, out, VERSION, COMMIT)
    assert str(info.value) == f"{sdist}: {problem}"
    assert not (tmp_path / "x.py").exists()
    assert not (out / "vllm/link.py").exists() and not (out / "vllm/hard.py").exists()


def test_not_a_tar(tmp_path: Path) -> None:
    sdist = tmp_path / "vllm.tar.gz"
    sdist.write_bytes(b"this is not an archive\n" * 40)
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value).startswith(f"{sdist}: not a readable tar archive: ")


def test_truncated_sdist(tmp_path: Path) -> None:
    whole = make_sdist(tmp_path / "whole.tar.gz", VERSION, SHORT, {"vllm/a.py": bytes(range(256)) * 400})
    raw = gzip.decompress(whole.read_bytes())
    sdist = tmp_path / "vllm.tar.gz"
    sdist.write_bytes(gzip.compress(raw[: len(raw) // 2], mtime=0))
    with pytest.raises(SdistError) as info:
        unpack(sdist, _out(tmp_path), VERSION, COMMIT)
    assert str(info.value).startswith(f"{sdist}: ")


def test_unpack_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sdist = make_sdist(tmp_path / "vllm.tar.gz", VERSION, SHORT, {"vllm/a.py": b"A\n"})
    out = _out(tmp_path)
    args = ["--sdist", str(sdist), "--version", VERSION, "--out", str(out)]
    assert unpack_action.main([*args, "--commit", COMMIT]) == 0
    assert (out / "vllm/a.py").read_bytes() == b"A\n"

    other = tmp_path / "other"
    other.mkdir()
    args = ["--sdist", str(sdist), "--version", VERSION, "--out", str(other)]
    assert unpack_action.main([*args, "--commit", "0" * 40]) == 1
    assert capsys.readouterr().err == (
        f"sparkseal: {sdist}: {TOP}/vllm/_version.py: commit id is '{SHORT}', but the lock expects commit "
        f"'{'0' * 40}'\n"
    )


@pytest.mark.parametrize("repository", ["_main~sparkseal~vllm_sdist", "+sparkseal+vllm_sdist"])
def test_the_action_names_the_sdist_as_the_user_wrote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, repository: str
) -> None:
    """Under bzlmod the sdist is at external/<canonical name>/...; the error says external/vllm_sdist/..."""
    monkeypatch.chdir(tmp_path)
    sdist = Path("external") / repository / "file" / "vllm.tar.gz"
    sdist.parent.mkdir(parents=True)
    make_sdist(sdist, VERSION, SHORT, {"vllm/a.py": b"A\n"})
    args = ["--sdist", str(sdist), "--version", VERSION, "--out", str(_out(tmp_path))]
    assert unpack_action.main([*args, "--commit", "0" * 40]) == 1
    assert capsys.readouterr().err == (
        f"sparkseal: external/vllm_sdist/file/vllm.tar.gz: {TOP}/vllm/_version.py: commit id is '{SHORT}', "
        f"but the lock expects commit '{'0' * 40}'\n"
    )
