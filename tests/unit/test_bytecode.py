"""Bytecode of installed wheels: unchecked-hash pycs with image paths, recorded, reproducible, or refused."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import marshal
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sparkseal.actions import oci_layer
from sparkseal.core import manifest
from sparkseal.core.determinism import SOURCE_DATE_EPOCH
from sparkseal.install import bytecode
from sparkseal.install.venv import compile_bytecode, install_wheels
from tests.fixture_wheels import locked_installer_wheel, make_wheel

SITE = "opt/venv/lib/python3.11/site-packages"
IMAGE_SITE = "/" + SITE
# Sources whose code objects share strings and hold frozenset constants: what makes marshal's output
# depend on the process and the hash seed when compiled carelessly.
SHARED = b'NAMES = ("alpha", "beta")\n\ndef pick(x):\n    return x in {"alpha", "beta", "gamma"}\n'
SOURCES = {
    "alpha/__init__.py": b'"""Alpha."""\nVALUE = 1\n',
    "alpha/shared.py": SHARED,
    "alpha/more/__init__.py": SHARED + b"MORE = pick('beta')\n",
    "alpha/broken.py": b"def broken(:\n",
    "alpha/py2.py": b"print 'python 2'\n",
}
# The pyc header flags of PEP 552: bit 0 hash-based, bit 1 check the source.
HASH_BASED_UNCHECKED = 0b01


@pytest.fixture(scope="module")
def installer_wheel() -> Path:
    """The locked installer wheel (downloaded once when no cache holds it)."""
    return locked_installer_wheel()


def _wheels(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    alpha = make_wheel(directory, "alpha", "1.0", files=SOURCES, console_scripts={"alpha": "alpha:main"})
    beta = make_wheel(directory, "beta", "2.0", files={"beta/__init__.py": b"B = 2\n"})
    return [alpha, beta]


def _record(site: Path, dist_info: str) -> dict[str, tuple[str, str]]:
    text = (site / dist_info / "RECORD").read_text()
    return {row[0]: (row[1], row[2]) for row in csv.reader(text.splitlines()) if row}


def _pycs(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.pyc"))}


@pytest.mark.network
def test_installed_sources_get_unchecked_hash_pycs_named_by_image_path_and_recorded(
    tmp_path: Path, installer_wheel: Path
) -> None:
    out = tmp_path / "tree"
    install_wheels(_wheels(tmp_path / "wheels"), out, "linux_aarch64", installer_wheel, bytecode=True)
    site = out / SITE

    pycs = _pycs(site)
    assert sorted(pycs) == [
        "alpha/__pycache__/__init__.cpython-311.pyc",
        "alpha/__pycache__/shared.cpython-311.pyc",
        "alpha/more/__pycache__/__init__.cpython-311.pyc",
        "beta/__pycache__/__init__.cpython-311.pyc",
    ]  # nothing for the two sources that are not Python 3

    data = pycs["alpha/__pycache__/shared.cpython-311.pyc"]
    assert data[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(data[4:8], "little") == HASH_BASED_UNCHECKED
    assert data[8:16] == importlib.util.source_hash(SHARED)
    assert marshal.loads(data[16:]).co_filename == f"{IMAGE_SITE}/alpha/shared.py"

    record = _record(site, "alpha-1.0.dist-info")
    for name in ("__init__", "shared"):
        key = f"alpha/__pycache__/{name}.cpython-311.pyc"
        digest = base64.urlsafe_b64encode(hashlib.sha256(pycs[key]).digest()).rstrip(b"=").decode()
        assert record[key] == (f"sha256={digest}", str(len(pycs[key])))
    keys = [row[0] for row in csv.reader((site / "alpha-1.0.dist-info/RECORD").read_text().splitlines())]
    assert keys == sorted(keys)
    assert "beta/__pycache__/__init__.cpython-311.pyc" in _record(site, "beta-2.0.dist-info")

    # Every .pyc written, by name: a loop over the glob would pass over none.
    stamps = {
        path.relative_to(site).as_posix(): (stat.S_IMODE(path.stat().st_mode), int(path.stat().st_mtime))
        for path in site.rglob("__pycache__/*.pyc")
    }
    assert stamps == dict.fromkeys(pycs, (0o644, SOURCE_DATE_EPOCH))

    # The module manifest files them under their distribution.
    files = manifest.tree_manifest(out, "/opt/venv")["distributions"]["alpha"]["files"]
    assert files["alpha/__pycache__/shared.cpython-311.pyc"] == hashlib.sha256(data).hexdigest()


@pytest.mark.network
def test_the_interpreter_runs_the_pyc_without_reading_the_source(
    tmp_path: Path, installer_wheel: Path
) -> None:
    out = tmp_path / "tree"
    install_wheels(_wheels(tmp_path / "wheels"), out, "linux_aarch64", installer_wheel, bytecode=True)
    site = out / SITE
    # An unchecked pyc is loaded as it is: a changed source is not even hashed (the module check is what
    # notices a changed file in an image).
    (site / "alpha/__init__.py").write_bytes(b"VALUE = 2\n")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    code = "import alpha, alpha.more; print(alpha.VALUE, alpha.more.MORE, alpha.__cached__.endswith('.pyc'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "True", "True"]


@pytest.mark.network
def test_pyc_bytes_depend_on_neither_the_directory_nor_the_workers_nor_the_order(
    tmp_path: Path, installer_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = _wheels(tmp_path / "wheels")
    first, second = tmp_path / "first", tmp_path / "second" / "deeper"
    install_wheels(wheels, first, "linux_aarch64", installer_wheel, bytecode=True)
    install_wheels(wheels[::-1], second, "linux_aarch64", installer_wheel, bytecode=False)
    # Recompile the second tree in one-file chunks, three workers at a time, another hash seed around it.
    monkeypatch.setattr(bytecode, "CHUNK_FILES", 1)
    monkeypatch.setenv("PYTHONHASHSEED", "12345")
    assert compile_bytecode(second, "/opt/venv", workers=3) == 4
    assert _pycs(first) == _pycs(second)
    assert (first / SITE / "alpha-1.0.dist-info/RECORD").read_bytes() == (
        second / SITE / "alpha-1.0.dist-info/RECORD"
    ).read_bytes()


def test_chunks_are_fixed_runs_of_the_sorted_sources() -> None:
    sources = [f"m{i:02}.py" for i in range(7)]
    assert bytecode.chunks(sources[::-1], 3) == [sources[:3], sources[3:6], sources[6:]]


def test_an_interpreter_of_another_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bytecode, "PYTHON_VERSION", (3, 12))
    monkeypatch.setattr(bytecode, "CACHE_TAG", "cpython-312")
    with pytest.raises(bytecode.BytecodeError) as error:
        bytecode.compile_tree(tmp_path, IMAGE_SITE, ["a.py"], workers=1)
    assert str(error.value) == (
        f"{sys.executable}: bytecode for the image needs the image's interpreter version, expected "
        f"cpython 3.12 (cache tag cpython-312), found cpython 3.11 (cache tag cpython-311)"
    )


def test_a_failing_compiler_process_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    for name in ("a", "b"):
        (site / "pkg" / f"{name}.py").write_text("X = 1\n")
    # Stands in for an interpreter that dies: the same binary, told to run a module that is not there.
    monkeypatch.setattr(bytecode, "__name__", "sparkseal.core.no_such_module")
    with pytest.raises(bytecode.BytecodeError) as error:
        bytecode.compile_tree(site, IMAGE_SITE, ["pkg/b.py", "pkg/a.py"], workers=1)
    message = str(error.value)
    assert message.startswith(f"{site}: the compiler process for pkg/a.py .. pkg/b.py exited with 1: ")
    assert "No module named sparkseal.core.no_such_module" in message
    assert not list(site.rglob("*.pyc"))


@pytest.mark.network
def test_a_layer_with_bytecode_holds_the_pycs_and_their_manifest(
    tmp_path: Path, installer_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "layer"
    out.mkdir()
    modules = out / "l.modules.json"
    args = [arg for wheel in _wheels(tmp_path / "wheels") for arg in ("--wheel", str(wheel))]
    args += ["--platform", "linux_aarch64", "--installer", str(installer_wheel), "--modules", str(modules)]
    blob = out / "l.tar.gz"
    args += ["--bytecode", "--blob", str(blob), "--descriptor", str(out / "l.json")]
    assert oci_layer.main(args) == 0
    with tarfile.open(blob, "r:gz") as archive:
        names = set(archive.getnames())
    assert f"{SITE}/alpha/more/__pycache__/__init__.cpython-311.pyc" in names
    files = manifest.load_manifest(modules)["distributions"]["alpha"]["files"]
    assert "alpha/more/__pycache__/__init__.cpython-311.pyc" in files
    assert sorted(p.name for p in out.iterdir()) == ["l.json", "l.modules.json", "l.tar.gz"]


@pytest.mark.network
def test_a_compile_failure_in_a_layer_leaves_nothing(
    tmp_path: Path, installer_wheel: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "layer"
    out.mkdir()
    monkeypatch.setattr(bytecode, "PYTHON_VERSION", (3, 12))
    args = [arg for wheel in _wheels(tmp_path / "wheels") for arg in ("--wheel", str(wheel))]
    args += ["--platform", "linux_aarch64", "--installer", str(installer_wheel)]
    args += ["--modules", str(out / "m.json"), "--bytecode"]
    assert oci_layer.main([*args, "--blob", str(out / "l.tar.gz"), "--descriptor", str(out / "l.json")]) == 1
    assert "sparkseal: bytecode: " in capsys.readouterr().err
    assert list(out.iterdir()) == []
