"""Repacking our vLLM wheel: upstream binaries + patched Python, a correct RECORD, deterministic bytes."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from sparkseal.actions import vllm_wheel as repack_action
from sparkseal.actions.vllm_wheel import RepackError, repack
from sparkseal.core.wheel_split import load_split
from tests.fixtures_vllm import (
    FAKE_SO,
    FAKE_SO_NAME,
    git_diff,
    make_patch,
    make_wheel,
    version_file,
    wheel_filename,
    write_tree,
)

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.25.1"
COMMIT = "752a3a504485790a2e8491cacbb35c137339ad34"
SHORT = COMMIT[:9]
DIST_INFO = f"vllm-{VERSION}.dist-info"
COMMA_NAME = "vllm/configs/E=1,N=14336,device_name=NVIDIA_GB10.json"

PRISTINE = {
    "vllm/_version.py": version_file(VERSION, SHORT),
    "vllm/__init__.py": b"",
    "vllm/a.py": b"A = 1\n",
    "vllm/b.py": b"B = 1\n",
    "vllm/gone.py": b"GONE = 1\n",
    "vllm/only_sdist.py": b"S = 1\n",
}
UPSTREAM = {
    "vllm/__init__.py": b"",
    "vllm/a.py": b"A = 1\n",
    "vllm/b.py": b"B = 1\n",
    "vllm/gone.py": b"GONE = 1\n",
    "vllm/only_wheel.py": b"W = 1\n",
    COMMA_NAME: b'{"x": 1}\n',
}
PATCHED_CHANGES = {"vllm/b.py": b"B = 2\n", "vllm/added.py": b"ADDED = 1\n", "vllm/tool.sh": b"#!/bin/sh\n"}


class Inputs:
    """The files one repack reads: upstream wheel, pristine and patched trees, and one patch."""

    def __init__(self, root: Path, commit_in_wheel: str = SHORT, delete: tuple[str, ...] = ()) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.wheel = make_wheel(root / wheel_filename(VERSION, "any"), VERSION, commit_in_wheel, UPSTREAM)
        self.pristine = write_tree(root / "pristine", PRISTINE)
        patched = {k: v for k, v in PRISTINE.items() if k not in delete} | PATCHED_CHANGES
        self.patched = write_tree(root / "patched", patched, modes={"vllm/tool.sh": 0o775})
        self.patch = make_patch(root / "0001-b.patch", git_diff("vllm/b.py", "B = 1\n", "B = 2\n"))
        self.out = root / "out" / wheel_filename(VERSION, "any")
        self.out.parent.mkdir()

    def run(self) -> dict[str, object]:
        return repack(self.wheel, self.pristine, self.patched, COMMIT, [self.patch], self.out)


@pytest.fixture
def inputs(tmp_path: Path) -> Inputs:
    return Inputs(tmp_path / "in")


def _entries(wheel: Path) -> list[zipfile.ZipInfo]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.infolist()


def _contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {i.filename: archive.read(i) for i in archive.infolist()}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_wheel_holds_upstream_binaries_and_patched_python(inputs: Inputs) -> None:
    inputs.run()
    contents = _contents(inputs.out)
    assert contents[FAKE_SO_NAME] == FAKE_SO
    assert contents["vllm/b.py"] == PATCHED_CHANGES["vllm/b.py"]
    assert contents["vllm/added.py"] == PATCHED_CHANGES["vllm/added.py"]
    assert contents["vllm/only_wheel.py"] == UPSTREAM["vllm/only_wheel.py"]
    assert contents[COMMA_NAME] == UPSTREAM[COMMA_NAME]
    assert contents["vllm/_version.py"] == PRISTINE["vllm/_version.py"]
    assert "vllm/only_sdist.py" not in contents
    expected = (
        set(UPSTREAM)
        | {"vllm/_version.py", FAKE_SO_NAME}
        | set(PATCHED_CHANGES)
        | {f"{DIST_INFO}/{n}" for n in ("METADATA", "WHEEL", "RECORD", "sparkseal.json")}
    )
    assert set(contents) == expected


def test_file_deleted_by_a_patch_is_not_in_the_wheel(tmp_path: Path) -> None:
    # The patched tree lacks vllm/gone.py (a patch of the series deleted it); the upstream copy must not
    # come back through the wheel.
    inputs = Inputs(tmp_path / "in", delete=("vllm/gone.py",))
    inputs.run()
    contents = _contents(inputs.out)
    assert "vllm/gone.py" not in contents
    assert contents["vllm/b.py"] == PATCHED_CHANGES["vllm/b.py"]


def test_record_lists_every_entry_with_hash_and_size(inputs: Inputs) -> None:
    inputs.run()
    contents = _contents(inputs.out)
    record_text = contents[f"{DIST_INFO}/RECORD"].decode("utf-8")
    rows = list(csv.reader(io.StringIO(record_text)))
    assert [r[0] for r in rows].count(f"{DIST_INFO}/RECORD") == 1
    assert {r[0] for r in rows} == set(contents)
    for name, digest, size in rows:
        if name == f"{DIST_INFO}/RECORD":
            assert (digest, size) == ("", "")
            continue
        data = contents[name]
        expected = "sha256=" + urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
        assert (digest, size) == (expected, str(len(data))), name
    assert f'"{COMMA_NAME}",sha256=' in record_text


def test_entry_order_dates_and_modes(inputs: Inputs) -> None:
    inputs.run()
    infos = _entries(inputs.out)
    names = [i.filename for i in infos]
    dist = [n for n in names if n.startswith(DIST_INFO + "/")]
    assert names == sorted(set(names) - set(dist)) + sorted(set(dist) - {f"{DIST_INFO}/RECORD"}) + [
        f"{DIST_INFO}/RECORD"
    ]
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    modes = {i.filename: i.external_attr >> 16 for i in infos}
    executables = {FAKE_SO_NAME, "vllm/tool.sh"}
    assert {n for n, m in modes.items() if m == 0o100755} == executables
    assert all(m == 0o100644 for n, m in modes.items() if n not in executables)
    assert {i.create_system for i in infos} == {3}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_DEFLATED}


def test_modes_do_not_follow_the_bits_bazel_gives_inputs(inputs: Inputs) -> None:
    # Inside a Bazel action every input file is 0555: the tree's bits must not reach the wheel.
    for tree in (inputs.pristine, inputs.patched):
        for path in tree.rglob("*"):
            if path.is_file():
                path.chmod(0o555)
    inputs.run()
    modes = {i.filename: i.external_attr >> 16 for i in _entries(inputs.out)}
    assert modes["vllm/a.py"] == modes["vllm/added.py"] == 0o100644
    assert modes["vllm/tool.sh"] == modes[FAKE_SO_NAME] == 0o100755


def test_report_and_build_record(inputs: Inputs) -> None:
    report = inputs.run()
    upstream_sha = _sha(inputs.wheel.read_bytes())
    patches = [{"file": "0001-b.patch", "sha256": _sha(inputs.patch.read_bytes())}]
    assert report["commit"] == COMMIT
    assert report["dist_info"] == DIST_INFO
    assert report["patches"] == patches
    assert report["py_in_sdist_not_in_wheel"] == ["vllm/only_sdist.py"]
    assert report["py_in_wheel_not_in_sdist"] == ["vllm/only_wheel.py"]
    assert report["added_by_patches_or_overlay"] == ["vllm/added.py", "vllm/tool.sh"]
    assert report["upstream_wheel"] == {"file": inputs.wheel.name, "sha256": upstream_sha}

    raw = _contents(inputs.out)[f"{DIST_INFO}/sparkseal.json"]
    assert raw.endswith(b"}\n")
    assert json.loads(raw) == {
        "commit": COMMIT,
        "patches": patches,
        "added_by_patches_or_overlay": ["vllm/added.py", "vllm/tool.sh"],
        "upstream_wheel": {"file": inputs.wheel.name, "sha256": upstream_sha},
    }


def test_repack_is_deterministic_across_runs_umask_and_timezone(tmp_path: Path) -> None:
    first = Inputs(tmp_path / "one")
    first.run()
    again = first.out.read_bytes()
    first.out.unlink()
    first.run()
    assert first.out.read_bytes() == again

    # Other directory, other input modes (only the exec bit may matter), other umask and time zone.
    second = Inputs(tmp_path / "two")
    for path in second.patched.rglob("*.py"):
        path.chmod(0o600)
    env = {**os.environ, "TZ": "Asia/Kathmandu", "PYTHONPATH": str(REPO)}
    script = (
        f"umask 077; exec {sys.executable} -m sparkseal.actions.vllm_wheel --upstream {second.wheel} "
        f"--pristine {second.pristine} --patched {second.patched} --commit {COMMIT} "
        f"--patch {second.patch} --out {second.out} --report {tmp_path / 'report.json'}"
    )
    result = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert second.out.read_bytes() == again


def test_pip_installs_the_result(inputs: Inputs, tmp_path: Path) -> None:
    inputs.run()
    target = tmp_path / "site"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--target",
            str(target),
            str(inputs.out),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (target / "vllm/b.py").read_bytes() == PATCHED_CHANGES["vllm/b.py"]
    assert (target / FAKE_SO_NAME).read_bytes() == FAKE_SO
    assert (target / FAKE_SO_NAME).stat().st_mode & 0o111
    assert json.loads((target / DIST_INFO / "sparkseal.json").read_bytes())["commit"] == COMMIT


def test_wheel_commit_mismatch(tmp_path: Path) -> None:
    inputs = Inputs(tmp_path / "in", commit_in_wheel="abcdef012")
    with pytest.raises(RepackError) as info:
        inputs.run()
    assert str(info.value) == (
        f"{inputs.wheel}: vllm/_version.py: commit id is 'abcdef012', but the lock expects commit '{COMMIT}'"
    )
    assert not inputs.out.exists()


def test_wheel_without_version_file(tmp_path: Path, inputs: Inputs) -> None:
    wheel = make_wheel(tmp_path / "bare.whl", VERSION, None, UPSTREAM)
    with pytest.raises(RepackError) as info:
        repack(wheel, inputs.pristine, inputs.patched, COMMIT, [], inputs.out)
    assert str(info.value) == f"{wheel}: vllm/_version.py is missing; cannot check the locked commit"


def _rewrite(source: Path, target: Path, extra: list[tuple[str, bytes, int]]) -> Path:
    """Copy ``source`` to ``target`` adding raw entries (name, data, unix st_mode)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            new.writestr(info, old.read(info))
        for name, data, mode in extra:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.create_system = 3
            info.external_attr = mode << 16
            new.writestr(info, data)
    return target


@pytest.mark.parametrize(
    ("name", "mode", "problem"),
    [
        ("vllm/link.py", 0o120777, "entry vllm/link.py is a symlink; symlinks are not allowed"),
        ("../evil.py", 0o100644, "entry: path '../evil.py' escapes its root through '..'"),
        ("/abs/evil.py", 0o100644, "entry: absolute path '/abs/evil.py' is not allowed"),
        (
            "other-1.0.dist-info/METADATA",
            0o100644,
            f"expected exactly one .dist-info directory, found ['other-1.0.dist-info', '{DIST_INFO}']",
        ),
    ],
)
def test_unsafe_upstream_wheel(tmp_path: Path, inputs: Inputs, name: str, mode: int, problem: str) -> None:
    wheel = _rewrite(inputs.wheel, tmp_path / "bad.whl", [(name, b"a.py", mode)])
    with pytest.raises(RepackError) as info:
        repack(wheel, inputs.pristine, inputs.patched, COMMIT, [], inputs.out)
    assert str(info.value) == f"{wheel}: {problem}"
    assert not inputs.out.exists()


def test_not_a_wheel(tmp_path: Path, inputs: Inputs) -> None:
    wheel = tmp_path / "junk.whl"
    wheel.write_bytes(b"not a zip\n")
    with pytest.raises(RepackError) as info:
        repack(wheel, inputs.pristine, inputs.patched, COMMIT, [], inputs.out)
    assert str(info.value).startswith(f"{wheel}: not a readable wheel: ")


def test_repack_action_writes_report_and_names_differences(
    inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    args = [
        "--upstream",
        str(inputs.wheel),
        "--pristine",
        str(inputs.pristine),
        "--patched",
        str(inputs.patched),
        "--commit",
        COMMIT,
        "--patch",
        str(inputs.patch),
        "--out",
        str(inputs.out),
        "--report",
        str(report),
    ]
    assert repack_action.main(args) == 0
    assert json.loads(report.read_text())["py_in_wheel_not_in_sdist"] == ["vllm/only_wheel.py"]
    out = capsys.readouterr().out
    assert (
        f"sparkseal: {inputs.out.name}: 1 modules of the upstream wheel have no source in the sdist "
        "(vendored or generated by upstream's build), kept as upstream ships them: in vllm/only_wheel.py "
        "(report.json lists them)\n"
    ) in out
    assert (
        "1 modules of the sdist are not in the upstream wheel, left out as upstream leaves them out: "
        "in vllm/only_sdist.py (report.json lists them)\n"
    ) in out

    # A failed repack leaves neither the wheel nor the split file.
    split = tmp_path / "split.json"
    assert repack_action.main([*args, "--split", str(split)]) == 0 and split.is_file()
    failing = [*args[:-4], "--out", str(inputs.out), "--report", str(report), "--split", str(split)]
    assert repack_action.main([*failing, "--commit", "f" * 40]) == 1
    assert f"but the lock expects commit '{'f' * 40}'" in capsys.readouterr().err
    assert not inputs.out.exists() and not split.exists()


def test_the_split_file_lists_what_differs_from_the_upstream_wheel_and_not_the_patch(tmp_path: Path) -> None:
    inputs = Inputs(tmp_path / "in", delete=("vllm/gone.py",))
    split = tmp_path / "split.json"
    report = repack(inputs.wheel, inputs.pristine, inputs.patched, COMMIT, [inputs.patch], inputs.out, split)
    loaded = load_split(split)
    # b.py changed, gone.py deleted, two files added; the unchanged files and the .dist-info are not listed.
    expected = ["vllm/added.py", "vllm/b.py", "vllm/gone.py", "vllm/tool.sh"]
    assert sorted(loaded.paths) == report["differ_from_upstream"] == expected
    assert (loaded.project, loaded.dist_info) == ("vllm", DIST_INFO)
    assert (loaded.upstream_file, loaded.upstream_sha256) == (
        inputs.wheel.name,
        _sha(inputs.wheel.read_bytes()),
    )

    # Another edit of the same file changes the wheel, not the split file: the image's layer of the
    # upstream wheel's other files keeps its inputs.
    before, wheel_before = split.read_bytes(), inputs.out.read_bytes()
    (inputs.patched / "vllm/b.py").write_bytes(b"B = 3\n")
    repack(inputs.wheel, inputs.pristine, inputs.patched, COMMIT, [inputs.patch], inputs.out, split)
    assert split.read_bytes() == before
    assert inputs.out.read_bytes() != wheel_before
