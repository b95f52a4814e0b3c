"""``sparkseal lock vllm`` against a loopback index holding a tiny fixture release."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from sparkseal import cli
from tests.servers.fixture_index import FixtureIndex

VERSION = "9.9.9"
SHORT_COMMIT = "1234abcde"
FULL_COMMIT = SHORT_COMMIT + "f" * 31
SDIST = f"vllm-{VERSION}.tar.gz"
WHEEL_ARM = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_aarch64.whl"
WHEEL_X86 = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
ENGINE = b"def answer():\n    return 41\n"
NO_SERIES = "note: no patch series at patches/vllm/series; the patch check is skipped\n"


def make_sdist(version: str, commit_id: str = "g" + SHORT_COMMIT) -> bytes:
    """A gzip tarball laid out like a vLLM sdist, with ``vllm/_version.py`` recording ``commit_id``."""
    members = {
        "PKG-INFO": b"Metadata-Version: 2.1\nName: vllm\n",
        "vllm/__init__.py": b"",
        "vllm/_version.py": f"__commit_id__ = commit_id = {commit_id!r}\n".encode(),
        "vllm/engine.py": ENGINE,
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def release_files(**changes: bytes | None) -> dict[str, bytes]:
    """The fixture index's files: release 9.9.9, an older release, and a wheel the lock must ignore."""
    files: dict[str, bytes | None] = {
        SDIST: make_sdist(VERSION),
        WHEEL_ARM: b"arm wheel",
        WHEEL_X86: b"x86 wheel",
        f"vllm-{VERSION}-cp38-abi3-musllinux_1_2_x86_64.whl": b"musl wheel",
        "vllm-9.9.8.tar.gz": make_sdist("9.9.8"),
        "vllm-9.9.8-cp38-abi3-manylinux_2_28_aarch64.whl": b"old arm wheel",
    }
    files.update(changes)
    return {name: data for name, data in files.items() if data is not None}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_lock(files: dict[str, bytes], commit: str) -> str:
    lock = {
        "commit": commit,
        "format": 1,
        "name": "vllm",
        "sdist": {"filename": SDIST, "sha256": sha(files[SDIST])},
        "version": VERSION,
        "wheels": {
            "linux_aarch64": {"filename": WHEEL_ARM, "sha256": sha(files[WHEEL_ARM])},
            "linux_x86_64": {"filename": WHEEL_X86, "sha256": sha(files[WHEEL_X86])},
        },
    }
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"


def run_lock(
    capsys: pytest.CaptureFixture[str], index: str, tmp_path: Path, *extra: str
) -> tuple[int, str, str]:
    """Run ``sparkseal lock vllm`` for the fixture release; return (status, stdout, stderr)."""
    argv = ["lock", "vllm", "--version", VERSION, "--lock", str(tmp_path / "vllm.lock.json")]
    argv += ["--download-dir", str(tmp_path / "downloads"), "--index", index, *extra]
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def write_patch(directory: Path, name: str, old: str, new: str) -> Path:
    """Write a patch of ``vllm/engine.py`` changing its return value from ``old`` to ``new``."""
    path = directory / name
    path.write_text(
        f"Subject: answer {new}\nUpstream: none\nReason: fixture\n\n"
        "diff --git a/vllm/engine.py b/vllm/engine.py\n"
        "--- a/vllm/engine.py\n+++ b/vllm/engine.py\n"
        "@@ -1,2 +1,2 @@\n def answer():\n"
        f"-    return {old}\n+    return {new}\n"
    )
    return path


@pytest.fixture(autouse=True)
def in_tmp_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run each test in its own directory, so that default paths name nothing of the project."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def series(tmp_path: Path) -> Path:
    """A series whose first patch applies to the fixture tree and whose second does not."""
    directory = tmp_path / "series-dir"
    directory.mkdir()
    write_patch(directory, "0001-answer-42.patch", "41", "42")
    write_patch(directory, "0002-answer-43.patch", "40", "43")
    path = directory / "series"
    path.write_text("# fixture series\n0001-answer-42.patch\n0002-answer-43.patch\n")
    return path


def test_lock_written_with_the_listed_hashes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = release_files()
    with FixtureIndex(files) as idx:
        status, out, err = run_lock(capsys, idx.url, tmp_path)
        page = idx.page_url("vllm")
    lock = tmp_path / "vllm.lock.json"
    assert (status, err) == (0, "")
    assert lock.read_text() == expected_lock(files, SHORT_COMMIT)
    assert lock.stat().st_mode & 0o777 == 0o644
    assert out.splitlines() == [
        NO_SERIES.rstrip("\n"),
        f"index page: {page}",
        f"sdist {SDIST} sha256 {sha(files[SDIST])} (downloaded to {tmp_path / 'downloads' / SDIST})",
        f"wheel linux_aarch64 {WHEEL_ARM} sha256 {sha(files[WHEEL_ARM])}",
        f"wheel linux_x86_64 {WHEEL_X86} sha256 {sha(files[WHEEL_X86])}",
        f"commit {SHORT_COMMIT} (vllm-{VERSION}/vllm/_version.py records {SHORT_COMMIT})",
        f"note: commit {SHORT_COMMIT} is abbreviated (as recorded in vllm/_version.py); "
        f"replace it with the full commit of the v{VERSION} tag",
        f"wrote {lock}",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["downloads", "vllm.lock.json"]


def test_relock_keeps_the_full_commit_byte_for_byte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = release_files()
    lock = tmp_path / "vllm.lock.json"
    lock.write_text(expected_lock(files, FULL_COMMIT))
    before = lock.read_bytes()
    with FixtureIndex(files) as idx:
        first = run_lock(capsys, idx.url, tmp_path)
        second = run_lock(capsys, idx.url, tmp_path)
        downloads = idx.requests[f"/packages/{SDIST}"]
    assert lock.read_bytes() == before
    assert (first[0], second[0], downloads) == (0, 0, 1)
    assert "abbreviated" not in first[1] + second[1]
    assert f"commit {FULL_COMMIT} (vllm-{VERSION}/vllm/_version.py records {SHORT_COMMIT})" in first[1]
    assert f"(reused {tmp_path / 'downloads' / SDIST})" in second[1]


def test_relock_with_another_commit_writes_the_sdists(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = release_files()
    lock = tmp_path / "vllm.lock.json"
    lock.write_text(expected_lock(files, "ab" * 20))
    with FixtureIndex(files) as idx:
        status, out, _ = run_lock(capsys, idx.url, tmp_path)
    assert status == 0
    assert lock.read_text() == expected_lock(files, SHORT_COMMIT)
    assert (
        f"note: the existing lock: commit id is {SHORT_COMMIT!r}, but the lock expects commit {'ab' * 20!r}; "
        f"writing the sdist's commit id {SHORT_COMMIT}"
    ) in out


def test_missing_wheel(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with FixtureIndex(release_files(**{WHEEL_ARM: None})) as idx:
        status, out, err = run_lock(capsys, idx.url, tmp_path)
        page = idx.page_url("vllm")
    assert (status, out) == (1, NO_SERIES)
    assert err == (
        f"sparkseal: vllm {VERSION}: expected exactly one manylinux aarch64 wheel on {page}, found 0 (none); "
        f"files of {VERSION}: {WHEEL_X86}, vllm-{VERSION}-cp38-abi3-musllinux_1_2_x86_64.whl, {SDIST}\n"
    )
    assert not (tmp_path / "vllm.lock.json").exists()


def test_ambiguous_wheels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = f"vllm-{VERSION}-cp312-cp312-manylinux2014_aarch64.whl"
    with FixtureIndex(release_files(**{other: b"second arm wheel"})) as idx:
        status, _, err = run_lock(capsys, idx.url, tmp_path)
    assert status == 1
    assert f"expected exactly one manylinux aarch64 wheel on {idx.page_url('vllm')}, found 2 (" in err
    assert f"found 2 ({WHEEL_ARM}, {other})" in err or f"found 2 ({other}, {WHEEL_ARM})" in err


def test_missing_sdist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with FixtureIndex(release_files(**{SDIST: None})) as idx:
        status, _, err = run_lock(capsys, idx.url, tmp_path)
    assert status == 1
    assert err.startswith(
        f"sparkseal: vllm {VERSION}: {SDIST} is not listed on {idx.page_url('vllm')} (files of "
    )


def test_sdist_differs_from_the_index_hash(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = release_files()
    lock = tmp_path / "vllm.lock.json"
    previous = expected_lock(files, FULL_COMMIT)
    lock.write_text(previous)
    tampered = make_sdist(VERSION, "g" + "9" * 9)
    with FixtureIndex(files, served_bytes_override={SDIST: tampered}) as idx:
        status, _, err = run_lock(capsys, idx.url, tmp_path)
        url, page = idx.file_url(SDIST), idx.page_url("vllm")
    assert status == 1
    assert err == (
        f"sparkseal: {SDIST}: downloaded from {url} has sha256 {sha(tampered)}, "
        f"but the index {page} lists {sha(files[SDIST])}\n"
    )
    assert lock.read_text() == previous
    assert list((tmp_path / "downloads").iterdir()) == []


def test_index_replaced_a_locked_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = release_files()
    old = json.loads(expected_lock(files, FULL_COMMIT))
    old["wheels"]["linux_x86_64"]["sha256"] = "0" * 64
    (tmp_path / "vllm.lock.json").write_text(json.dumps(old))
    with FixtureIndex(files) as idx:
        status, _, err = run_lock(capsys, idx.url, tmp_path)
    assert status == 1
    assert err == (
        f"sparkseal: {WHEEL_X86}: the existing lock has sha256 {'0' * 64}, "
        f"the index now lists {sha(files[WHEEL_X86])}\n"
    )
    assert (tmp_path / "vllm.lock.json").read_text() == expected_lock(files, FULL_COMMIT)


def test_unreachable_index(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with FixtureIndex(release_files()) as idx:
        url = idx.url
    status, out, err = run_lock(capsys, url, tmp_path)
    assert (status, out) == (1, NO_SERIES)
    assert err.startswith(f"sparkseal: index unreachable: {url}/vllm/: ")


def test_unreadable_existing_lock(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lock = tmp_path / "vllm.lock.json"
    lock.write_text("{not json")
    with FixtureIndex(release_files()) as idx:
        status, _, err = run_lock(capsys, idx.url, tmp_path)
        assert idx.requests == {}
    assert status == 1
    assert err.startswith(
        f"sparkseal: cannot read the existing lock: {lock}: expected a JSON lock, actual unreadable content: "
    )
    assert err.endswith(" (move it away to lock afresh)\n")
    assert lock.read_text() == "{not json"
    # A lock the reader refuses (here: written before locks had a format) is not overwritten either.
    old = {k: v for k, v in json.loads(expected_lock(release_files(), FULL_COMMIT)).items() if k != "format"}
    lock.write_text(json.dumps(old))
    with FixtureIndex(release_files()) as idx:
        status, _, err = run_lock(capsys, idx.url, tmp_path)
    assert status == 1
    assert err == (
        f"sparkseal: cannot read the existing lock: {lock}: field `format`: expected 1 (a vLLM lock, written "
        "by `sparkseal lock vllm`), actual nothing (move it away to lock afresh)\n"
    )
    assert json.loads(lock.read_text()) == old


def test_patch_that_no_longer_applies_is_reported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, series: Path
) -> None:
    files = release_files()
    patches = {p: p.read_bytes() for p in series.parent.iterdir()}
    with FixtureIndex(files) as idx:
        status, out, err = run_lock(capsys, idx.url, tmp_path, "--series", str(series))
    lines = out.splitlines()
    assert (status, err) == (1, "")
    assert (tmp_path / "vllm.lock.json").read_text() == expected_lock(files, SHORT_COMMIT)
    assert lines[-3:-1] == [f"patch series {series} against {SDIST}:", "0001-answer-42.patch: applies"]
    bad = series.parent / "0002-answer-43.patch"
    assert lines[-1] == (
        f"0002-answer-43.patch: does not apply: {bad}: hunk #1 (@@ -1,2 +1,2 @@) of vllm/engine.py: "
        "does not apply at line 2: expected '    return 40', found '    return 42' "
        "(no fuzz or offset is allowed)"
    )
    assert {p: p.read_bytes() for p in series.parent.iterdir()} == patches


def test_applying_series_exits_zero(capsys: pytest.CaptureFixture[str], tmp_path: Path, series: Path) -> None:
    series.write_text("0001-answer-42.patch\n")
    with FixtureIndex(release_files()) as idx:
        status, out, err = run_lock(capsys, idx.url, tmp_path, "--series", str(series))
    assert (status, err) == (0, "")
    assert out.splitlines()[-1] == "0001-answer-42.patch: applies"


def test_default_series_is_checked(capsys: pytest.CaptureFixture[str], tmp_path: Path, series: Path) -> None:
    default = tmp_path / "patches" / "vllm"
    default.mkdir(parents=True)
    for patch in series.parent.iterdir():
        (default / patch.name).write_bytes(patch.read_bytes())
    with FixtureIndex(release_files()) as idx:
        status, out, _ = run_lock(capsys, idx.url, tmp_path)
    assert status == 1
    assert "patch series patches/vllm/series against" in out
    assert "0002-answer-43.patch: does not apply: " in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--version", "9.9.9", "--lock", "l.json", "--series", "missing/series"],
            "--series missing/series: no such file",
        ),
        (
            ["--version", "9.9.9", "--lock", "no/such/dir/x.json"],
            "--lock no/such/dir/x.json: directory no/such/dir",
        ),
        (["--version", "../9"], "argument --version: expected a release version such as 0.25.1, got '../9'"),
        ([], "the following arguments are required: --version"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["lock", "vllm", *argv])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
