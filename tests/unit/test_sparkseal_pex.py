"""The PEX action: complete platforms, reproducibility, cross-platform selection, errors, running it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from sparkseal.actions import sparkseal_pex as pex_build
from sparkseal.actions.sparkseal_pex import PexBuildError, build_pex, render_complete_platform
from sparkseal.core.manifest import pex_manifest, tree_manifest
from sparkseal.core.wheels import supported_tags
from sparkseal.install.venv import install_wheels
from tests.fixture_wheels import REPO, locked_installer_wheel, locked_tool_wheel, make_wheel

COMPLETE_PLATFORMS = REPO / "third_party/python/complete_platforms"
HOST_PYTHON = Path("/usr/bin/python3.11")
X86_64 = "cp311-cp311-manylinux_2_17_x86_64"
AARCH64 = "cp311-cp311-manylinux_2_28_aarch64"


@pytest.fixture(scope="module")
def pex_wheel() -> Path:
    return locked_tool_wheel("pex")


def _wheels(directory: Path, beta_tag: str = X86_64, with_beta: bool = True) -> list[Path]:
    """alpha (pure, console script `alpha`) needs beta==2.0 (compiled-looking, per platform) and gamma."""
    directory.mkdir(parents=True, exist_ok=True)
    alpha = make_wheel(
        directory,
        "alpha",
        "1.0",
        files={
            "alpha/__init__.py": b"import beta\nimport gamma\nVALUE = beta.VALUE + gamma.VALUE\n",
            "alpha/cli.py": b"import alpha\n\ndef main():\n    print('alpha', alpha.VALUE)\n",
        },
        requires=["beta==2.0", "gamma>=3", "delta; sys_platform == 'win32'"],
        console_scripts={"alpha": "alpha.cli:main"},
    )
    gamma = make_wheel(directory, "gamma", "3.1", files={"gamma/__init__.py": b"VALUE = 1\n"})
    wheels = [alpha, gamma]
    if with_beta:
        arch = "aarch64" if beta_tag.endswith("_aarch64") else "x86_64"
        wheels.append(
            make_wheel(
                directory,
                "beta",
                "2.0",
                tag=beta_tag,
                files={"beta/__init__.py": f"VALUE = 41\nARCH = {arch!r}\n".encode()},
                purelib=False,
            )
        )
    return wheels


def _build(tmp: Path, pex_wheel: Path, platform: str = "linux_x86_64", **kwargs) -> tuple[Path, str]:
    wheels = kwargs.pop("wheels", None) or _wheels(tmp / "wheels")
    out = tmp / "app.pex"
    digest = build_pex(
        wheels, platform, pex_wheel, COMPLETE_PLATFORMS / f"{platform}.json", out, script="alpha", **kwargs
    )
    return out, digest


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else ""
        out[path.relative_to(root).as_posix()] = (info.st_mode, int(info.st_mtime), digest)
    return out


# --- complete platforms ------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["linux_aarch64", "linux_x86_64"])
def test_checked_in_complete_platform_is_the_generators_output(platform: str) -> None:
    path = COMPLETE_PLATFORMS / f"{platform}.json"
    assert path.read_text() == render_complete_platform(platform), f"regenerate {path}"
    document = json.loads(path.read_text())
    assert document["compatible_tags"] == list(supported_tags(platform))
    assert document["marker_environment"]["platform_machine"] == platform.removeprefix("linux_")
    # The generator command named in the file prints the same bytes.
    result = subprocess.run(
        ["python3", "-m", "sparkseal.actions.sparkseal_pex", "--print-complete-platform", platform],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == path.read_text()


@pytest.mark.parametrize("arch", ["arm64", "amd64"])
def test_marker_python_version_is_the_locked_debian_interpreter(arch: str) -> None:
    lock = json.loads((REPO / f"third_party/debian/bookworm_{arch}.lock.json").read_text())
    versions = {p["version"] for p in lock["packages"] if p["package"] == "python3.11"}
    assert len(versions) == 1, f"bookworm_{arch}.lock.json: python3.11 versions {versions}"
    upstream = versions.pop().split("-")[0]
    assert upstream == pex_build.PYTHON_FULL_VERSION


def test_stale_complete_platform_is_refused(tmp_path: Path) -> None:
    stale = tmp_path / "linux_aarch64.json"
    stale.write_text(render_complete_platform("linux_aarch64").replace("manylinux_2_36", "manylinux_2_39", 1))
    with pytest.raises(PexBuildError) as error:
        pex_build.check_complete_platform(stale, "linux_aarch64")
    message = str(error.value)
    assert str(stale) in message and "--print-complete-platform linux_aarch64" in message
    assert "manylinux_2_36_aarch64" in message and "manylinux_2_39_aarch64" in message


def test_pex_info_naming_a_build_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "PEX-INFO").write_text(
        json.dumps({"build_properties": {"pex_version": "2"}, "x": "/sb/tmp/1"})
    )
    with pytest.raises(PexBuildError, match=r"PEX-INFO: names the build path /sb/tmp"):
        pex_build.check_pex_info(tmp_path, ["/sb/tmp"])
    (tmp_path / "PEX-INFO").write_text(
        json.dumps({"build_properties": {"pex_version": "2", "platform": "x"}})
    )
    with pytest.raises(PexBuildError, match=r"build_properties has platform; expected only pex_version"):
        pex_build.check_pex_info(tmp_path, [])


def test_pex_runs_with_no_host_folder_on_path(tmp_path: Path) -> None:
    """pex's PATH is an empty folder of its scratch directory: no host program can be found by name
    (the builds below prove pex needs none; docs/building.md, "What the build reads from the host")."""
    env = pex_build.pex_environment(tmp_path / "pex_dist", tmp_path)
    assert env["PATH"] == str(tmp_path / "bin")


# --- building ----------------------------------------------------------------------------------------


@pytest.mark.network
def test_two_builds_in_different_directories_are_identical(tmp_path: Path, pex_wheel: Path) -> None:
    first, digest = _build(tmp_path / "one", pex_wheel)
    second, again = _build(tmp_path / "two" / "deeper", pex_wheel)
    assert _snapshot(first) == _snapshot(second)
    assert digest == again
    # Regular files and directories only, 1980 mtimes, the fixed shebang, no bytecode.
    assert not [p for p in first.rglob("*") if p.is_symlink() or p.suffix == ".pyc"]
    assert {int(p.lstat().st_mtime) for p in first.rglob("*")} == {pex_build.SOURCE_DATE_EPOCH}
    assert (first / "__main__.py").read_text().splitlines()[0] == "#!/usr/bin/python3.11"
    info = json.loads((first / "PEX-INFO").read_text())
    assert info["build_properties"] == {"pex_version": "2.105.2"}
    assert info["venv"] is True
    assert sorted(info["requirements"]) == ["alpha==1.0", "beta==2.0", "gamma==3.1"]
    # The digest is what the coreutils pipeline of the module docstring prints.
    pipeline = "find . -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum"
    coreutils = subprocess.run(["sh", "-c", pipeline], cwd=first, capture_output=True, text=True, check=True)
    assert digest == "sha256:" + coreutils.stdout.split()[0]


@pytest.mark.network
def test_cross_build_for_aarch64_takes_the_aarch64_wheel(tmp_path: Path, pex_wheel: Path) -> None:
    wheels = _wheels(tmp_path / "wheels", beta_tag=AARCH64)
    out, _ = _build(tmp_path, pex_wheel, "linux_aarch64", wheels=wheels)
    deps = sorted(p.name for p in (out / ".deps").iterdir())
    assert f"beta-2.0-{AARCH64}.whl" in deps, deps
    with zipfile.ZipFile(out / ".deps" / f"beta-2.0-{AARCH64}.whl") as chroot:
        assert b"ARCH = 'aarch64'" in chroot.read("beta/__init__.py")
    assert f"beta-2.0-{AARCH64}.whl" in json.loads((out / "PEX-INFO").read_text())["distributions"]


@pytest.mark.network
def test_wheel_of_another_platform_is_refused_naming_it(tmp_path: Path, pex_wheel: Path) -> None:
    wheels = _wheels(tmp_path / "wheels", beta_tag=AARCH64)
    with pytest.raises(PexBuildError) as error:
        _build(tmp_path, pex_wheel, "linux_x86_64", wheels=wheels)
    message = str(error.value)
    assert f"beta-2.0-{AARCH64}.whl" in message and "linux_x86_64" in message
    assert not (tmp_path / "app.pex").exists()


@pytest.mark.network
def test_missing_dependency_fails_naming_it(tmp_path: Path, pex_wheel: Path) -> None:
    wheels = _wheels(tmp_path / "wheels", with_beta=False)
    with pytest.raises(PexBuildError) as error:
        _build(tmp_path, pex_wheel, "linux_aarch64", wheels=wheels)
    message = str(error.value)
    assert "for linux_aarch64 from 2 wheels" in message
    assert "alpha 1.0 requires beta==2.0 but no version was resolved" in message


@pytest.mark.network
@pytest.mark.skipif(not HOST_PYTHON.is_file(), reason="needs Debian's /usr/bin/python3.11")
def test_pex_runs_with_the_target_interpreter(tmp_path: Path, pex_wheel: Path) -> None:
    out, _ = _build(tmp_path / "build", pex_wheel)
    env = {"PATH": "/usr/bin:/bin", "PEX_ROOT": str(tmp_path / "pex_root"), "HOME": str(tmp_path)}
    for command in ([str(out / "__main__.py")], [str(HOST_PYTHON), str(out)]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert (result.returncode, result.stdout) == (0, "alpha 42\n"), result.stderr
    # venv mode: a child started with sys.executable imports the same modules.
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import beta; print(beta.ARCH)'])"
    result = subprocess.run(
        [str(out / "__main__.py"), "-c", child],
        env={**env, "PEX_INTERPRETER": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "x86_64\n"), result.stderr


@pytest.mark.network
def test_module_digests_of_the_pex_match_the_installed_tree(tmp_path: Path, pex_wheel: Path) -> None:
    wheels = _wheels(tmp_path / "wheels")
    out, _ = _build(tmp_path, pex_wheel, wheels=wheels)
    install_wheels(wheels, tmp_path / "tree", "linux_x86_64", locked_installer_wheel())
    in_pex = pex_manifest(out)["distributions"]
    in_tree = tree_manifest(tmp_path / "tree")["distributions"]
    for name in ("alpha", "beta", "gamma"):
        assert in_pex[name]["files"] == in_tree[name]["files"], name
        assert in_pex[name]["digest"] == in_tree[name]["digest"], name


@pytest.mark.network
def test_main_writes_the_digest_and_reports_errors(tmp_path: Path, pex_wheel: Path, capsys) -> None:
    wheels = _wheels(tmp_path / "wheels")
    args = ["--platform", "linux_x86_64", "--pex", str(pex_wheel), "--script", "alpha", "--venv"]
    args += ["--complete-platform", str(COMPLETE_PLATFORMS / "linux_x86_64.json")]
    args += [arg for wheel in wheels for arg in ("--wheel", str(wheel))]
    out, digest = tmp_path / "app.pex", tmp_path / "app.pex.digest"
    assert pex_build.main([*args, "--out", str(out), "--digest", str(digest)]) == 0
    assert digest.read_text() == pex_build.tree_digest(out) + "\n"
    assert pex_build.main([*args, "--out", str(out)]) == 1
    assert f"--out {out}: expected an empty or absent directory" in capsys.readouterr().err
    assert pex_build.main([*args[:-2], "--out", str(tmp_path / "x.pex"), "--wheel", "nope.whl"]) == 1
    assert "--wheel nope.whl: expected a wheel file, found none" in capsys.readouterr().err


def test_pex_wheel_is_required_to_be_pex(tmp_path: Path) -> None:
    other = make_wheel(tmp_path, "notpex", "1.0", files={"notpex/__init__.py": b""})
    with pytest.raises(PexBuildError, match=r"--pex .*notpex-1.0-py3-none-any.whl: expected the locked pex"):
        pex_build.unpack_pex_wheel(other, tmp_path / "unpacked")


def test_stage_wheels_gives_links_their_wheel_names(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    wheel = make_wheel(tmp_path / "src", "alpha", "1.0", files={"alpha/__init__.py": b""})
    cache_file = tmp_path / "cache" / "file"
    cache_file.parent.mkdir()
    shutil.copyfile(wheel, cache_file)
    link = tmp_path / "sandbox" / wheel.name
    link.parent.mkdir()
    link.symlink_to(cache_file)
    (staged,) = pex_build.stage_wheels([link], tmp_path / "staged")
    assert staged.name == wheel.name and not staged.is_symlink()
    assert os.path.realpath(staged) == str(staged)
    assert staged.read_bytes() == wheel.read_bytes()


# --- Bazel: the rule on a fixture workspace ----------------------------------------------------------

PEX_BUILD = """\
load("//rules/private:pex.bzl", "sparkseal_pex")

sparkseal_pex(
    name = "app",
    pex = "{pex}",
    platform = "linux_aarch64",
    script = "alpha",
    wheels = glob(["wheels/*.whl"]),
)
"""


@pytest.mark.bazel
@pytest.mark.network
def test_bazel_rule_builds_the_same_pex_as_the_program(tmp_path: Path, pex_wheel: Path) -> None:
    from tests.bazel_util import BASE_WORKSPACE, BAZEL, Workspace, base_env, make_fixture_workspace

    if BAZEL is None:
        pytest.skip("bazel is not installed (make setup installs it)")
    root = tmp_path / "ws"
    make_fixture_workspace(root)
    (root / "WORKSPACE").write_text(BASE_WORKSPACE)
    shutil.copytree(COMPLETE_PLATFORMS, root / "third_party/python/complete_platforms")
    wheels = _wheels(root / "app" / "wheels", beta_tag=AARCH64)
    pex_name = "pex-2.105.2-py3-none-any.whl"
    shutil.copyfile(pex_wheel, root / "app" / pex_name)
    (root / "app" / "BUILD").write_text(PEX_BUILD.format(pex=pex_name))
    ws = Workspace(root, tmp_path / "output-base", tmp_path / "repository-cache", base_env())
    try:
        result = ws.bazel("build", "//app:app")
        assert result.returncode == 0, result.output
        out = ws.bin_path("app/app.pex")
        digest = ws.bin_path("app/app.pex.digest").read_text()
    finally:
        ws.shutdown()
    direct, expected = _build(tmp_path / "direct", pex_wheel, "linux_aarch64", wheels=wheels, venv=True)
    assert digest == expected + "\n"
    assert {k: v[2] for k, v in _snapshot(out).items()} == {k: v[2] for k, v in _snapshot(direct).items()}
