"""`sparkseal verify-modules`: installed module files against the image manifest, every finding and error."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sparkseal.core import manifest as mm
from sparkseal.integrity import verify
from tests.installed_tree import install, make_venv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, Path]:
    """An image tree and its manifest file; returns (site-packages, manifest path)."""
    site = make_venv(tmp_path / "tree")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(mm.dumps(mm.tree_manifest(tmp_path / "tree", "/opt/venv")))
    return site, manifest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command with ``site`` first on the import path (ahead of the dev environment's torch)."""
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "verify-modules", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_identical_tree_passes(image: tuple[Path, Path]) -> None:
    site, manifest_path = image
    manifest = mm.load_manifest(manifest_path)
    results = [verify.verify_module(manifest, manifest_path, m, [str(site)]) for m in ("vllm", "torch")]
    assert [r.ok for r in results] == [True, True]
    assert results[0].checked == 8  # 4 module files, METADATA, WHEEL, INSTALLER, RECORD
    assert results[0].version == "0.25.1"

    done = _cli(site, "--manifest", str(manifest_path), "--modules", "vllm,torch")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"vllm: vllm 0.25.1 in {site}: 8 files, OK",
        f"torch: torch 2.11.0 in {site}: 6 files, OK",
    ]


def test_changed_missing_and_extra_files_are_findings(image: tuple[Path, Path]) -> None:
    site, manifest_path = image
    old_config = (site / "vllm/config.py").read_bytes()
    (site / "vllm/config.py").write_bytes(b"MAX_MODEL_LEN = 1 << 30\n")
    old_init = (site / "vllm/__init__.py").read_bytes()
    (site / "vllm/__init__.py").unlink()
    (site / "vllm/evil.py").write_bytes(b"import os\n")
    (site / "vllm/__pycache__").mkdir()
    (site / "vllm/__pycache__/config.cpython-311.pyc").write_bytes(b"\x00bytecode")

    pyc, config, evil = (_sha(b"\x00bytecode"), _sha(b"MAX_MODEL_LEN = 1 << 30\n"), _sha(b"import os\n"))
    done = _cli(site, "--manifest", str(manifest_path), "--modules", "vllm")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"vllm: vllm 0.25.1 in {site}: 9 files, 4 finding(s)",
        f"  missing vllm/__init__.py: expected sha256 {_sha(old_init)}, actual no file",
        f"  extra vllm/__pycache__/config.cpython-311.pyc: expected not in the manifest, actual sha256 {pyc}",
        f"  changed vllm/config.py: expected sha256 {_sha(old_config)}, actual sha256 {config}",
        f"  extra vllm/evil.py: expected not in the manifest, actual sha256 {evil}",
    ]


def test_json_report(image: tuple[Path, Path]) -> None:
    site, manifest_path = image
    (site / "torch/nn/functional.py").write_bytes(b"changed\n")
    done = _cli(site, "--manifest", str(manifest_path), "--modules", "torch,vllm", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["manifest"] == str(manifest_path)
    torch, vllm = report["modules"]
    assert (torch["module"], torch["ok"], vllm["ok"]) == ("torch", False, True)
    assert torch["findings"] == [
        {
            "kind": "changed",
            "path": "torch/nn/functional.py",
            "expected": _sha(b"def relu(x):\n    return x\n"),
            "actual": _sha(b"changed\n"),
        }
    ]


def test_script_outside_site_packages_is_checked(image: tuple[Path, Path]) -> None:
    site, manifest_path = image
    script = site.parents[2] / "bin/vllm"
    script.write_bytes(b"#!/bin/sh\nexec curl evil\n")
    result = verify.verify_module(mm.load_manifest(manifest_path), manifest_path, "vllm", [str(site)])
    original = _sha(b"#!/opt/venv/bin/python3\nfrom vllm.cli import main\nmain()\n")
    tampered = _sha(b"#!/bin/sh\nexec curl evil\n")
    assert [f.message() for f in result.findings] == [
        f"changed ../../../bin/vllm: expected sha256 {original}, actual sha256 {tampered}"
    ]


def test_unowned_file_listed_in_the_manifest_is_not_a_finding(tmp_path: Path) -> None:
    site = make_venv(tmp_path / "tree")
    (site / "vllm/generated.py").write_bytes(b"BUILD = 1\n")
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_text(mm.dumps(mm.tree_manifest(tmp_path / "tree", "/opt/venv")))
    result = verify.verify_module(mm.load_manifest(manifest_path), manifest_path, "vllm", [str(site)])
    assert result.ok, [f.message() for f in result.findings]
    (site / "vllm/generated.py").write_bytes(b"BUILD = 2\n")
    result = verify.verify_module(mm.load_manifest(manifest_path), manifest_path, "vllm", [str(site)])
    assert [f.kind for f in result.findings] == ["changed"]


def test_module_problems(image: tuple[Path, Path], tmp_path: Path) -> None:
    site, manifest_path = image
    manifest = mm.load_manifest(manifest_path)
    absent = verify.verify_module(manifest, manifest_path, "nosuchmodule", [str(site)])
    assert absent.problem == f"module nosuchmodule: not installed (searched {site})"
    assert not absent.ok

    install(site, "extra-pkg", "3.0", {"extra_pkg/__init__.py": b""})
    unlisted = verify.verify_module(manifest, manifest_path, "extra_pkg", [str(site)])
    assert unlisted.problem == (
        f"distribution extra-pkg 3.0 (module extra_pkg in {site}) is not in the manifest {manifest_path}"
    )

    (site / "bare").mkdir()
    (site / "bare/__init__.py").write_bytes(b"")
    bare = verify.verify_module(manifest, manifest_path, "bare", [str(site)])
    assert bare.problem == (
        f"module bare at {site / 'bare'}: expected one *.dist-info in {site} whose RECORD names bare, "
        "found none does"
    )

    install(site, "vllm-addon", "1.0", {"vllm/addon.py": b""})
    shared = verify.verify_module(manifest, manifest_path, "vllm", [str(site)])
    assert shared.problem == (
        f"module vllm at {site / 'vllm'}: expected one *.dist-info in {site} whose RECORD names vllm, "
        "found vllm-0.25.1.dist-info, vllm_addon-1.0.dist-info"
    )


def test_cli_reports_a_missing_module(image: tuple[Path, Path]) -> None:
    site, manifest_path = image
    done = _cli(site, "--manifest", str(manifest_path), "--modules", "vllm,nosuchmodule")
    assert done.returncode == 1
    assert (
        done.stdout.splitlines()[1] == "nosuchmodule: module nosuchmodule: not installed (searched sys.path)"
    )


def test_cli_usage_errors(image: tuple[Path, Path], tmp_path: Path) -> None:
    site, _ = image
    missing = tmp_path / "absent.json"
    done = _cli(site, "--manifest", str(missing))
    assert done.returncode == 2
    assert f"{missing}: no manifest there" in done.stderr
    done = _cli(site, "--modules", "vllm,torch.nn")
    assert done.returncode == 2
    assert "expected comma-separated top-level module names such as vllm,torch, got 'vllm,torch.nn'" in (
        done.stderr
    )
    helped = _cli(site, "--help")
    assert helped.returncode == 0
    assert str(mm.IMAGE_MANIFEST_PATH) in helped.stdout and "--modules" in helped.stdout


def test_modules_that_cannot_be_verified(tmp_path: Path) -> None:
    with pytest.raises(
        verify.VerifyError, match=r"^module sys: has no file \(built-in\); nothing to verify$"
    ):
        verify.module_root("sys")
    for part in ("a", "b"):
        (tmp_path / part / "nsp").mkdir(parents=True)
    with pytest.raises(verify.VerifyError) as error:
        verify.module_root("nsp", [str(tmp_path / "a"), str(tmp_path / "b")])
    assert (
        str(error.value)
        == f"module nsp: a namespace package spread over {tmp_path / 'a/nsp'}, {tmp_path / 'b/nsp'}"
    )
    with pytest.raises(verify.VerifyError, match=r"^module 'torch.nn': not a top-level module name$"):
        verify.module_root("torch.nn")


def test_a_special_file_under_a_module_is_an_error(image: tuple[Path, Path]) -> None:
    site, _ = image
    os.mkfifo(site / "vllm/pipe")
    with pytest.raises(verify.VerifyError) as error:
        verify.installed_module("vllm", [str(site)])
    assert str(error.value) == f"module vllm: {site / 'vllm/pipe'}: not a regular file"


# The default check: every distribution of the site-packages directory.

NUMPY = {
    "numpy/__init__.py": b"from numpy.core import *\n",
    "numpy/core.py": b"def dot(a, b):\n    return a * b\n",
    "numpy.libs/libopenblas.so": b"\x7fELF openblas\n",
    "../../../bin/f2py": b"#!/opt/venv/bin/python3\nfrom numpy.f2py import main\nmain()\n",
}


@pytest.fixture
def full_image(tmp_path: Path) -> tuple[Path, Path]:
    """An image tree with a distribution beyond vllm, torch and sparkseal (a numpy look-alike), a single-file
    module and a ``.pth`` file no RECORD names; returns (site-packages, manifest path)."""
    site = make_venv(tmp_path / "tree")
    install(site, "numpy", "2.4.6", NUMPY)
    install(site, "six", "1.17.0", {"six.py": b"PY3 = True\n"})
    (site / "distutils-precedence.pth").write_bytes(b"import os\n")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(mm.dumps(mm.tree_manifest(tmp_path / "tree", "/opt/venv")))
    return site, manifest


def test_default_covers_every_distribution_of_the_manifest(full_image: tuple[Path, Path]) -> None:
    site, manifest_path = full_image
    manifest = mm.load_manifest(manifest_path)
    results = verify.verify_site(manifest, manifest_path, site)
    assert [r.module for r in results] == [*sorted(set(manifest["distributions"]) - {mm.UNOWNED}), mm.UNOWNED]
    assert [r.module for r in results] == ["numpy", "six", "sparkseal", "torch", "vllm", mm.UNOWNED]
    assert all(r.ok for r in results), verify.render(results, manifest_path, False)
    # Every file the manifest lists is hashed once: the pyvenv.cfg outside site-packages included.
    listed = sum(len(e["files"]) + len(e["install_files"]) for e in manifest["distributions"].values())
    assert sum(r.checked for r in results) == listed
    assert results[-1].checked == 2  # distutils-precedence.pth and ../../../pyvenv.cfg

    done = _cli(site, "--manifest", str(manifest_path), "--site-packages", str(site))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"numpy: numpy 2.4.6 in {site}: 8 files, OK",
        f"six: six 1.17.0 in {site}: 5 files, OK",
        f"sparkseal: sparkseal 0.1.0 in {site}: 5 files, OK",
        f"torch: torch 2.11.0 in {site}: 6 files, OK",
        f"vllm: vllm 0.25.1 in {site}: 8 files, OK",
        f"(unowned): files no RECORD names in {site}: 2 files, OK",
    ]


def test_a_changed_file_beyond_vllm_torch_and_sparkseal_is_found_by_the_default_only(
    full_image: tuple[Path, Path],
) -> None:
    site, manifest_path = full_image
    (site / "numpy/core.py").write_bytes(b"def dot(a, b):\n    return 0\n")
    done = _cli(site, "--manifest", str(manifest_path), "--site-packages", str(site))
    assert done.returncode == 1
    expected, actual = _sha(NUMPY["numpy/core.py"]), _sha(b"def dot(a, b):\n    return 0\n")
    assert done.stdout.splitlines()[:2] == [
        f"numpy: numpy 2.4.6 in {site}: 8 files, 1 finding(s)",
        f"  changed numpy/core.py: expected sha256 {expected}, actual sha256 {actual}",
    ]
    report = json.loads(
        _cli(site, "--manifest", str(manifest_path), "--site-packages", str(site), "--json").stdout
    )
    assert [(m["module"], m["ok"]) for m in report["modules"]][:2] == [("numpy", False), ("six", True)]
    assert report["modules"][0]["findings"] == [
        {"kind": "changed", "path": "numpy/core.py", "expected": expected, "actual": actual}
    ]
    narrow = _cli(site, "--manifest", str(manifest_path), "--modules", "vllm")
    assert (narrow.returncode, narrow.stdout) == (0, f"vllm: vllm 0.25.1 in {site}: 8 files, OK\n")


def test_an_extra_dist_info_is_a_finding(full_image: tuple[Path, Path]) -> None:
    site, manifest_path = full_image
    install(site, "numpy-shadow", "9.9", {"numpy_shadow/__init__.py": b""})
    results = verify.verify_site(mm.load_manifest(manifest_path), manifest_path, site)
    shadow = next(r for r in results if r.module == "numpy-shadow")
    assert shadow.problem == (
        f"distribution numpy-shadow 9.9 ({site / 'numpy_shadow-9.9.dist-info'}) is not in the manifest "
        f"{manifest_path}; a distribution the image does not have can shadow the image's modules"
    )
    assert (shadow.checked, shadow.version, shadow.ok) == (5, "9.9", False)
    assert [r.module for r in results if not r.ok] == ["numpy-shadow"]


def test_missing_distribution_unowned_files_and_the_venv_config(full_image: tuple[Path, Path]) -> None:
    site, manifest_path = full_image
    manifest = mm.load_manifest(manifest_path)
    pth = manifest["distributions"][mm.UNOWNED]["files"]["distutils-precedence.pth"]
    shutil.rmtree(site / "six-1.17.0.dist-info")  # six.py stays, owned by no RECORD now
    (site / "distutils-precedence.pth").unlink()
    (site / "sitecustomize.py").write_bytes(b"import evil\n")
    cfg = site.parents[2] / "pyvenv.cfg"
    old_cfg = cfg.read_bytes()
    cfg.write_bytes(old_cfg.replace(b"false", b"true"))
    done = _cli(site, "--manifest", str(manifest_path), "--site-packages", str(site))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    evil, six = _sha(b"import evil\n"), _sha(b"PY3 = True\n")
    assert lines[1] == (
        f"six: distribution six 1.17.0 is in the manifest {manifest_path}, expected a *.dist-info of it in "
        f"{site}, found none"
    )
    assert lines[-5:] == [
        f"(unowned): files no RECORD names in {site}: 3 files, 4 finding(s)",
        f"  changed ../../../pyvenv.cfg: expected sha256 {_sha(old_cfg)}, actual sha256 "
        f"{_sha(old_cfg.replace(b'false', b'true'))}",
        f"  missing distutils-precedence.pth: expected sha256 {pth}, actual no file",
        f"  extra sitecustomize.py: expected not in the manifest, actual sha256 {evil}",
        f"  extra six.py: expected not in the manifest, actual sha256 {six}",
    ]


def test_a_distribution_installed_twice_is_a_finding(full_image: tuple[Path, Path]) -> None:
    site, manifest_path = full_image
    install(site, "six", "1.16.0", {"six_compat.py": b""})
    results = verify.verify_site(mm.load_manifest(manifest_path), manifest_path, site)
    six = next(r for r in results if r.module == "six")
    assert six.problem == (
        f"distribution six is installed 2 times in {site}: six-1.16.0.dist-info, six-1.17.0.dist-info; "
        "expected one *.dist-info"
    )


def test_parallel_and_serial_hashing_give_identical_reports(full_image: tuple[Path, Path]) -> None:
    site, manifest_path = full_image
    for index in range(300):
        (site / f"numpy/gen_{index:03}.py").write_bytes(b"#" * (index * 997))
    (site / "numpy/big.bin").write_bytes(bytes(range(256)) * 20_000)
    (site / "torch/__init__.py").write_bytes(b"import os\n")
    manifest = mm.load_manifest(manifest_path)
    serial = verify.verify_site(manifest, manifest_path, site, jobs=1)
    parallel = verify.verify_site(manifest, manifest_path, site, jobs=8)
    assert serial == parallel
    assert sum(len(r.findings) for r in serial) == 302
    assert verify.render(serial, manifest_path, True) == verify.render(parallel, manifest_path, True)
    module_serial = verify.verify_module(manifest, manifest_path, "numpy", [str(site)], jobs=1)
    assert module_serial == verify.verify_module(manifest, manifest_path, "numpy", [str(site)], jobs=8)
    done = [
        _cli(site, "--manifest", str(manifest_path), "--site-packages", str(site), "--jobs", n) for n in "14"
    ]
    assert done[0].stdout == done[1].stdout and done[0].returncode == done[1].returncode == 1


def test_site_packages_problems(full_image: tuple[Path, Path], tmp_path: Path) -> None:
    site, manifest_path = full_image
    manifest = mm.load_manifest(manifest_path)
    absent = tmp_path / "absent"
    [result] = verify.verify_site(manifest, manifest_path, absent)
    assert (result.module, result.problem) == (
        "site-packages",
        f"site-packages {absent}: expected a directory, found none",
    )
    os.mkfifo(site / "numpy/pipe")
    [result] = verify.verify_site(manifest, manifest_path, site)
    assert result.problem == f"site-packages {site}: {site / 'numpy/pipe'}: not a regular file"
    done = _cli(site, "--manifest", str(manifest_path), "--jobs", "0")
    assert done.returncode == 2
    assert "expected a number of threads of at least 1, got '0'" in done.stderr


def test_the_default_site_packages_is_the_interpreters() -> None:
    assert verify.default_site_packages() == Path(sysconfig.get_path("purelib"))


def test_the_default_finds_a_served_module_shadowed_by_a_path_ahead_of_site_packages(
    full_image: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashing site-packages alone would pass: the copy that ``import vllm`` loads is elsewhere."""
    site, manifest_path = full_image
    manifest = mm.load_manifest(manifest_path)
    monkeypatch.setattr(verify, "default_site_packages", lambda: site)
    monkeypatch.syspath_prepend(str(site))
    assert [r.problem for r in verify.verify_site(manifest, manifest_path) if not r.ok] == []
    ahead = tmp_path / "pythonpath"
    (ahead / "vllm").mkdir(parents=True)
    (ahead / "vllm/__init__.py").write_text("print('not the image')\n")
    monkeypatch.syspath_prepend(str(ahead))
    bad = [r for r in verify.verify_site(manifest, manifest_path) if not r.ok]
    assert [(r.module, r.problem) for r in bad] == [
        (
            "vllm",
            f"module vllm: imported from {ahead / 'vllm'}, expected the checked {site / 'vllm'}: a directory "
            "ahead of site-packages on sys.path (PYTHONPATH, a mount) shadows the image's",
        )
    ]
    # A site-packages named explicitly (an unpacked tree) is not the one this process imports from.
    assert all(r.ok for r in verify.verify_site(manifest, manifest_path, site))
