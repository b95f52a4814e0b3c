"""Wheels installed into a venv and into a layer: layout, determinism, tag checks and the errors reported."""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from sparkseal.actions import module_manifest, oci_layer
from sparkseal.core import manifest
from sparkseal.core.determinism import SOURCE_DATE_EPOCH
from sparkseal.install.venv import (
    InstallError,
    install_wheels,
    pyvenv_cfg,
    read_replaces,
)
from tests.fixture_wheels import locked_installer_wheel, make_wheel

SITE = "opt/venv/lib/python3.11/site-packages"
SO = b"\x7fELF\x02\x01\x01\x00fake extension"
AARCH64 = "cp311-cp311-manylinux_2_28_aarch64"


@pytest.fixture(scope="module")
def installer_wheel() -> Path:
    """The locked installer wheel (downloaded once when no cache holds it)."""
    return locked_installer_wheel()


def _fixture_wheels(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    alpha = make_wheel(
        directory,
        "alpha",
        "1.0",
        files={"alpha/__init__.py": b"def main():\n    return 0\n"},
        console_scripts={"alpha": "alpha:main"},
        data={
            "scripts/alpha-tool": b"#!python\nprint('tool')\n",
            "data/share/alpha/notes.txt": b"notes\n",
            "headers/alpha.h": b"int alpha;\n",
        },
        modes={"alpha-1.0.data/scripts/alpha-tool": 0o755},
    )
    beta = make_wheel(
        directory,
        "beta",
        "2.0",
        tag=AARCH64,
        files={"beta/__init__.py": b"", "beta/_ext.so": SO},
        modes={"beta/_ext.so": 0o755},
    )
    return [beta, alpha]


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (mode, mtime, sha256 of content) for every entry under ``root``."""
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[path.relative_to(root).as_posix()] = (stat.S_IMODE(info.st_mode), int(info.st_mtime), digest)
    return out


@pytest.mark.network
def test_layout_scripts_and_metadata(tmp_path: Path, installer_wheel: Path) -> None:
    wheels = _fixture_wheels(tmp_path / "wheels")
    out = tmp_path / "tree"
    names = install_wheels(wheels, out, "linux_aarch64", installer_wheel)
    assert names == sorted(w.name for w in wheels)
    venv = out / "opt/venv"
    script = (venv / "bin/alpha").read_text()
    assert script.startswith("#!/opt/venv/bin/python3\n")
    assert "from alpha import main" in script
    assert (venv / "bin/alpha-tool").read_bytes() == b"#!/opt/venv/bin/python3\nprint('tool')\n"
    assert (venv / "share/alpha/notes.txt").read_bytes() == b"notes\n"
    assert (venv / "include/site/python3.11/alpha/alpha.h").read_bytes() == b"int alpha;\n"
    assert (out / SITE / "beta/_ext.so").read_bytes() == SO
    assert (venv / "pyvenv.cfg").read_text() == pyvenv_cfg()
    assert "home = /usr/bin\n" in pyvenv_cfg()
    assert (out / SITE / "alpha-1.0.dist-info/INSTALLER").read_bytes() == b"sparkseal\n"
    assert not (out / SITE / "alpha-1.0.dist-info/direct_url.json").exists()

    modes = {rel: mode for rel, (mode, _, _) in _snapshot(out).items()}
    assert modes[f"{SITE}/beta/_ext.so"] == 0o755
    assert modes["opt/venv/bin/alpha"] == 0o755
    assert modes["opt/venv/bin/alpha-tool"] == 0o755
    assert modes[f"{SITE}/alpha/__init__.py"] == 0o644
    assert modes[SITE] == 0o755
    assert not [rel for rel in modes if rel.endswith(".pyc") or "__pycache__" in rel]
    assert {mtime for _, mtime, _ in _snapshot(out).values()} == {SOURCE_DATE_EPOCH}


@pytest.mark.network
def test_record_lists_every_installed_file_with_its_hash(tmp_path: Path, installer_wheel: Path) -> None:
    out = tmp_path / "tree"
    install_wheels(_fixture_wheels(tmp_path / "wheels"), out, "linux_aarch64", installer_wheel)
    dist_info = out / SITE / "alpha-1.0.dist-info"
    rows = list(csv.reader((dist_info / "RECORD").read_text().splitlines()))
    assert len({r[0] for r in rows}) == len(rows)
    listed = set()
    for path, digest, size in rows:
        target = (out / SITE / path).resolve()
        listed.add(target)
        if path.endswith("/RECORD"):
            assert (digest, size) == ("", "")
            continue
        data = target.read_bytes()
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={expected}", len(data)), path
    assert (out / "opt/venv/bin/alpha").resolve() in listed
    assert (out / "opt/venv/share/alpha/notes.txt").resolve() in listed


@pytest.mark.network
def test_two_installs_are_identical(tmp_path: Path, installer_wheel: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    install_wheels(_fixture_wheels(tmp_path / "w1"), first, "linux_aarch64", installer_wheel)
    os.umask(0o077)
    try:
        # Another umask and the wheels in the other order must not change a byte, mode or date.
        install_wheels(_fixture_wheels(tmp_path / "w2")[::-1], second, "linux_aarch64", installer_wheel)
    finally:
        os.umask(0o022)
    assert _snapshot(first) == _snapshot(second)


@pytest.mark.network
def test_bytecode_shipped_in_a_wheel_is_left_out_without_a_warning(
    tmp_path: Path, installer_wheel: Path, recwarn: pytest.WarningsRecorder
) -> None:
    """As pip does, a wheel's own pycs are not installed; the build log gets no warning per file."""
    files = {"gen/tool.py": b"X = 1\n", "gen/__pycache__/tool.cpython-311.pyc": b"\x00" * 16}
    (tmp_path / "w").mkdir()
    wheel = make_wheel(tmp_path / "w", "gen", "1.0", files=files)
    out = tmp_path / "out"
    install_wheels([wheel], out, "linux_aarch64", installer_wheel)
    site = out / "opt/venv/lib/python3.11/site-packages"
    assert (site / "gen/tool.py").is_file()
    assert not (site / "gen/__pycache__").exists()
    assert "gen/__pycache__/tool.cpython-311.pyc" not in (site / "gen-1.0.dist-info/RECORD").read_text()
    assert [str(w.message) for w in recwarn] == []


@pytest.mark.network
def test_two_wheels_writing_one_file_are_named(tmp_path: Path, installer_wheel: Path) -> None:
    one = make_wheel(tmp_path, "one", "1.0", files={"shared/mod.py": b"A = 1\n"})
    two = make_wheel(tmp_path, "two", "1.0", files={"shared/mod.py": b"A = 2\n"})
    with pytest.raises(InstallError) as error:
        install_wheels([one, two], tmp_path / "tree", "linux_x86_64", installer_wheel)
    assert str(error.value) == (
        f"/{SITE}/shared/mod.py: written by both one-1.0-py3-none-any.whl and two-1.0-py3-none-any.whl"
    )


def test_a_declared_replacement_wins_and_owns_the_file(tmp_path: Path, installer_wheel: Path) -> None:
    base = make_wheel(tmp_path, "libs-base", "1.0", files={"shared/mod.py": b"A = 1\n", "shared/b.py": b""})
    cu13 = make_wheel(tmp_path, "libs-cu13", "1.0", files={"shared/mod.py": b"A = 2\n"})
    out = tmp_path / "tree"
    # Given in the "wrong" order: the replacing wheel still installs last.
    install_wheels([cu13, base], out, "linux_x86_64", installer_wheel, replaces={"libs-cu13": "libs-base"})
    site = out / SITE
    assert (site / "shared/mod.py").read_bytes() == b"A = 2\n"
    base_record = (site / "libs_base-1.0.dist-info/RECORD").read_text()
    cu13_record = (site / "libs_cu13-1.0.dist-info/RECORD").read_text()
    assert "shared/mod.py," not in base_record
    assert "shared/b.py," in base_record
    assert "shared/mod.py," in cu13_record


def test_replacement_of_an_undeclared_project_still_fails(tmp_path: Path, installer_wheel: Path) -> None:
    one = make_wheel(tmp_path, "one", "1.0", files={"shared/mod.py": b"A = 1\n"})
    two = make_wheel(tmp_path, "two", "1.0", files={"shared/mod.py": b"A = 2\n"})
    with pytest.raises(InstallError) as error:
        install_wheels(
            [one, two], tmp_path / "tree", "linux_x86_64", installer_wheel, replaces={"two": "three"}
        )
    assert "shared/mod.py: written by both one-1.0-py3-none-any.whl and two-1.0-py3-none-any.whl" in str(
        error.value
    )


def test_replacement_policy_needs_a_reason(tmp_path: Path) -> None:
    policy = tmp_path / "replaces.json"
    policy.write_text('{"replaces": {"a": {"replaces": "b", "reason": ""}}}')
    with pytest.raises(InstallError) as error:
        read_replaces(policy)
    assert str(error.value) == f"{policy}: every replacement needs a non-empty reason"
    policy.write_text('{"replaces": {"a": {"replaces": "b", "reason": "why"}}}')
    assert read_replaces(policy) == {"a": "b"}


def test_the_checked_in_policy_reads() -> None:
    policy = Path(__file__).resolve().parents[2] / "third_party/python/replaces.json"
    assert read_replaces(policy) == {
        "flashinfer-python": "torch-c-dlpack-ext",
        "nvidia-cutlass-dsl-libs-cu13": "nvidia-cutlass-dsl-libs-base",
    }


@pytest.mark.network
def test_script_colliding_with_another_wheels_script(tmp_path: Path, installer_wheel: Path) -> None:
    one = make_wheel(tmp_path, "one", "1.0", files={"one.py": b""}, console_scripts={"tool": "one:main"})
    two = make_wheel(tmp_path, "two", "1.0", files={"two.py": b""}, data={"scripts/tool": b"#!python\n"})
    with pytest.raises(
        InstallError, match=r"^/opt/venv/bin/tool: written by both one-1\.0-py3-none-any\.whl "
    ):
        install_wheels([one, two], tmp_path / "tree", "linux_x86_64", installer_wheel)


@pytest.mark.parametrize(
    ("tag", "platform"),
    [
        ("cp311-cp311-manylinux_2_28_x86_64", "linux_aarch64"),  # another architecture
        ("cp311-cp311-manylinux_2_39_aarch64", "linux_aarch64"),  # needs a newer glibc than 2.36
        ("cp312-cp312-manylinux_2_28_aarch64", "linux_aarch64"),  # another Python
        ("cp312-abi3-manylinux_2_28_aarch64", "linux_aarch64"),  # stable ABI of a newer Python
        ("cp311-cp311-musllinux_1_2_aarch64", "linux_aarch64"),  # musl, not glibc
        ("cp311-cp311-manylinux_2_28_aarch64", "any"),  # the tools are pure Python only
    ],
)
def test_wheel_for_another_target_is_refused_before_installing(
    tmp_path: Path, tag: str, platform: str
) -> None:
    wheel = make_wheel(tmp_path, "gamma", "1.0", tag=tag, files={"gamma.py": b""})
    # The tags are checked before the installer is even loaded: no installer wheel is needed here.
    with pytest.raises(InstallError) as error:
        install_wheels([wheel], tmp_path / "tree", platform, tmp_path / "no-installer.whl")
    target = {"any": "CPython 3.11, pure Python (py3-none-any)"}.get(
        platform, f"CPython 3.11 on {platform}, manylinux glibc <= 2.36"
    )
    assert str(error.value) == f"{wheel}: tags {tag} do not install on {target}"
    assert not (tmp_path / "tree").exists()


def test_same_project_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = make_wheel(tmp_path, "delta", "1.0", files={"delta.py": b""})
    second = make_wheel(tmp_path / "a", "Delta", "2.0", files={"delta.py": b""})
    with pytest.raises(InstallError) as error:
        install_wheels([first, second], tmp_path / "tree", "linux_x86_64", tmp_path / "none.whl")
    assert str(error.value) == f"project delta comes twice: {first} and {second}"


@pytest.mark.network
@pytest.mark.parametrize("defect", ["not a zip", "file missing from RECORD", "two dist-info directories"])
def test_bad_wheel_is_named(tmp_path: Path, installer_wheel: Path, defect: str) -> None:
    wheel = make_wheel(tmp_path, "bad", "1.0", files={"bad.py": b"X = 1\n"})
    if defect == "not a zip":
        wheel.write_bytes(b"this is not a zip archive\n")
    else:
        extra = (
            "bad-1.0.dist-info/extra.txt"
            if defect == "file missing from RECORD"
            else "x-1.dist-info/METADATA"
        )
        with zipfile.ZipFile(wheel, "a") as archive:
            archive.writestr(extra, b"unlisted\n")
    with pytest.raises(InstallError) as error:
        install_wheels([wheel], tmp_path / "tree", "linux_x86_64", installer_wheel)
    message = str(error.value)
    assert message.startswith(f"{wheel}: not a valid wheel: ")
    expected = {
        "not a zip": "BadZipFile",
        "file missing from RECORD": "bad-1.0.dist-info/extra.txt is not mentioned in RECORD",
        "two dist-info directories": "exactly one .dist-info directory",
    }[defect]
    assert expected in message


def test_output_must_be_empty_and_prefix_absolute(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "eps", "1.0", files={"eps.py": b""})
    out = tmp_path / "tree"
    out.mkdir()
    (out / "stale").write_text("x")
    with pytest.raises(InstallError, match=r"--out .*/tree: expected an empty directory, found \['stale'\]"):
        install_wheels([wheel], out, "linux_x86_64", tmp_path / "none.whl")
    with pytest.raises(InstallError, match=r"--prefix 'opt/venv': expected a normalised absolute path"):
        install_wheels([wheel], tmp_path / "t2", "linux_x86_64", tmp_path / "none.whl", prefix="opt/venv")


@pytest.mark.network
def test_command_line_with_a_params_file(tmp_path: Path, installer_wheel: Path) -> None:
    """The layer program installs wheels as the rule calls it: every argument in one params file."""
    wheels = _fixture_wheels(tmp_path / "wheels")
    params = tmp_path / "args.params"
    out = tmp_path / "layer"
    out.mkdir()
    lines = [arg for wheel in wheels for arg in ("--wheel", str(wheel))]
    lines += ["--platform", "linux_aarch64", "--installer", str(installer_wheel), "--venv", "/opt/venv"]
    lines += ["--modules", str(out / "l.modules.json"), "--no-pyvenv-cfg", *_layer_args(out)]
    params.write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "sparkseal.actions.oci_layer", f"@{params}"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    members = _layer_members(out / "l.tar.gz")
    assert "opt/venv/bin/alpha" in members
    assert "opt/venv/pyvenv.cfg" not in members

    params.write_text(params.read_text().replace("linux_aarch64", "linux_x86_64"))
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"sparkseal: {wheels[0]}: tags {AARCH64} do not install on CPython 3.11 on linux_x86_64"
    )


def _layer_args(out: Path, *extra: str) -> list[str]:
    return [*extra, "--blob", str(out / "l.tar.gz"), "--descriptor", str(out / "l.json")]


def _layer_members(blob: Path) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, content) of every member of a gzip layer (content empty for non-files)."""
    with tarfile.open(blob, "r:gz") as archive:
        return {
            m.name: (m.mode, archive.extractfile(m).read() if m.isfile() else m.linkname.encode())  # type: ignore[union-attr]
            for m in archive.getmembers()
        }


@pytest.mark.network
def test_a_wheel_layer_equals_the_layer_of_the_installed_tree_and_keeps_no_tree(
    tmp_path: Path, installer_wheel: Path
) -> None:
    wheels = _fixture_wheels(tmp_path / "wheels")
    tree = tmp_path / "tree"
    install_wheels(wheels, tree, "linux_aarch64", installer_wheel, write_pyvenv_cfg=False)
    from_tree, from_wheels = tmp_path / "from-tree", tmp_path / "from-wheels"
    from_tree.mkdir()
    from_wheels.mkdir()
    link = ["--symlink", "/opt/venv/bin/python3", "/usr/bin/python3.11"]
    assert oci_layer.main(_layer_args(from_tree, "--tree", str(tree), "/", *link)) == 0
    wheel_args = [arg for wheel in wheels for arg in ("--wheel", str(wheel))]
    modules = from_wheels / "l.modules.json"
    common = ["--platform", "linux_aarch64", "--installer", str(installer_wheel), "--modules", str(modules)]
    assert oci_layer.main(_layer_args(from_wheels, *wheel_args, *common, *link, "--no-pyvenv-cfg")) == 0

    # Same bytes as installing first and writing the tree, and nothing left of the scratch install.
    for name in ("l.tar.gz", "l.json"):
        assert (from_wheels / name).read_bytes() == (from_tree / name).read_bytes()
    assert sorted(p.name for p in from_wheels.iterdir()) == ["l.json", "l.modules.json", "l.tar.gz"]
    members = _layer_members(from_wheels / "l.tar.gz")
    assert members["opt/venv/bin/python3"] == (0o777, b"/usr/bin/python3.11")
    assert members[f"{SITE}/beta/_ext.so"] == (0o755, SO)
    assert "opt/venv/pyvenv.cfg" not in members
    # The layer's module manifest is that of the installed files.
    assert manifest.load_manifest(modules) == manifest.tree_manifest(tree, "/opt/venv")


@pytest.mark.network
def test_the_image_manifest_from_layer_manifests_equals_the_stacked_trees(
    tmp_path: Path, installer_wheel: Path
) -> None:
    alpha_beta = _fixture_wheels(tmp_path / "wheels")
    gamma = make_wheel(tmp_path / "wheels", "gamma", "3.0", files={"gamma/__init__.py": b"G = 3\n"})
    parts, trees = [], []
    for n, (wheels, pyvenv) in enumerate([(alpha_beta, True), ([gamma], False)]):
        out = tmp_path / f"layer{n}"
        out.mkdir()
        tree = tmp_path / f"tree{n}"
        install_wheels(wheels, tree, "linux_aarch64", installer_wheel, write_pyvenv_cfg=pyvenv)
        trees.append(tree)
        part = out / "l.modules.json"
        flags = [] if pyvenv else ["--no-pyvenv-cfg"]
        args = [arg for wheel in wheels for arg in ("--wheel", str(wheel))]
        args += ["--platform", "linux_aarch64", "--installer", str(installer_wheel), "--modules", str(part)]
        assert oci_layer.main(_layer_args(out, *args, *flags)) == 0
        parts.append(part)
    merged, stacked = tmp_path / "merged.json", tmp_path / "stacked.json"
    assert module_manifest.main(["--part", str(parts[0]), "--part", str(parts[1]), "--out", str(merged)]) == 0
    tree_args = [arg for tree in trees for arg in ("--tree", str(tree))]
    assert module_manifest.main([*tree_args, "--out", str(stacked)]) == 0
    assert merged.read_bytes() == stacked.read_bytes()
    assert "gamma" in manifest.load_manifest(merged)["distributions"]


@pytest.mark.network
def test_layer_manifests_that_overlap_are_refused(
    tmp_path: Path, installer_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = _fixture_wheels(tmp_path / "wheels")
    out = tmp_path / "layer"
    out.mkdir()
    part = out / "l.modules.json"
    args = [arg for wheel in wheels for arg in ("--wheel", str(wheel))]
    args += ["--platform", "linux_aarch64", "--installer", str(installer_wheel), "--modules", str(part)]
    assert oci_layer.main(_layer_args(out, *args, "--no-pyvenv-cfg")) == 0
    again = tmp_path / "again.modules.json"
    data = manifest.load_manifest(part)
    again.write_text(manifest.dumps(data))
    merged = tmp_path / "merged.json"
    assert module_manifest.main(["--part", str(part), "--part", str(again), "--out", str(merged)]) == 1
    err = capsys.readouterr().err
    assert (
        f"module_manifest: lib/python3.11/site-packages/alpha-1.0.dist-info/METADATA is in two layers: "
        f"{part} and {again}" in err
    )
    assert not merged.exists()

    # One distribution in two layers must be one release (a split distribution), whatever its files.
    release = {**data["distributions"]["alpha"], "version": "9.9", "files": {}, "install_files": {}}
    again.write_text(manifest.dumps({**data, "distributions": {"alpha": release}}))
    assert module_manifest.main(["--part", str(part), "--part", str(again), "--out", str(merged)]) == 1
    assert (
        f"module_manifest: distribution alpha is in two layers as different releases: alpha 1.0 in {part} "
        f"and alpha 9.9 in {again}; expected one release split between layers"
    ) in capsys.readouterr().err
    assert not merged.exists()

    # A distribution of another name that claims one of the same files.
    data["distributions"] = {"other": {**data["distributions"]["beta"], "name": "other"}}
    again.write_text(manifest.dumps(data))
    assert module_manifest.main(["--part", str(part), "--part", str(again), "--out", str(merged)]) == 1
    err = capsys.readouterr().err
    assert f"is in two layers: {part} and {again}" in err
    assert "module_manifest: lib/python3.11/site-packages/beta-2.0.dist-info/METADATA is in two layers" in err


@pytest.mark.network
def test_a_bad_wheel_in_a_layer_is_named_and_leaves_no_scratch(
    tmp_path: Path, installer_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "wheels" / "alpha-1.0-py3-none-any.whl"
    bad.parent.mkdir()
    bad.write_bytes(b"not a zip")
    out = tmp_path / "out"
    out.mkdir()
    args = ["--wheel", str(bad), "--platform", "linux_aarch64", "--installer", str(installer_wheel)]
    assert oci_layer.main(_layer_args(out, *args, "--modules", str(out / "m.json"))) == 1
    assert capsys.readouterr().err.startswith(f"sparkseal: {bad}: not a valid wheel")
    assert list(out.iterdir()) == []
