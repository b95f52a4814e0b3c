"""Install wheels into a ``/opt/venv`` tree with the locked ``installer`` library.

The target directory receives ``opt/venv/lib/python3.11/site-packages/...``, ``opt/venv/bin/...`` and
(unless ``write_pyvenv_cfg`` is false) ``opt/venv/pyvenv.cfg``: the files of a virtual environment at
``/opt/venv``, ready for a tar layer, except the interpreter links (``PYTHON_LINKS``), which the layer adds.

Nothing of the target is executed: the wheels are unpacked, console scripts are generated with the
shebang ``#!/opt/venv/bin/python3``. Bytecode is compiled only when asked (``bytecode=True``), after
every wheel is in place, by ``sparkseal.install.bytecode``: reproducible unchecked-hash pycs that each
distribution's RECORD lists. Every wheel's tags are checked against the
target platform first (CPython 3.11, manylinux glibc <= 2.36), two wheels writing the same file is an
error naming both, and every file and directory gets a fixed mode and mtime. ``INSTALLER`` says
``sparkseal``; no ``direct_url.json`` or ``REQUESTED`` is written; RECORD lists the files sorted.

The ``installer`` wheel is put on ``sys.path``: a pure-Python wheel imports from its zip. The ``oci_layer``
action uses this module: its wheels are installed into a scratch directory that only the layer's tar keeps.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from sparkseal.core.manifest import DEFAULT_PREFIX, ManifestError, read_dist_infos
from sparkseal.core.tree import normalize_tree
from sparkseal.core.wheels import (
    PYTHON_VERSION,
    WheelError,
    check_wheels,
    normalize_name,
    parse_wheel_filename,
)
from sparkseal.install.bytecode import BytecodeError, add_to_record, compile_tree

# The interpreter links of the venv, relative to the prefix. They are not in the tree: an absolute link
# would point into the build host (Bazel follows it and hashes the host's file), so the layer writer adds
# them. Console scripts name `<prefix>/bin/python3`.
PYTHON_LINKS = {
    "bin/python": "/usr/bin/python3.11",
    "bin/python3": "/usr/bin/python3.11",
    "bin/python3.11": "/usr/bin/python3.11",
}
INSTALLER_NAME = b"sparkseal\n"


class InstallError(Exception):
    """A wheel is malformed, is for another platform, or collides with another wheel."""


def python_dirs(prefix: str) -> dict[str, str]:
    """The install scheme of a POSIX virtual environment at ``prefix`` (headers get the project appended)."""
    site = f"{prefix}/lib/python{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}/site-packages"
    return {
        "purelib": site,
        "platlib": site,
        "headers": f"{prefix}/include/site/python{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}",
        "scripts": f"{prefix}/bin",
        "data": prefix,
    }


def pyvenv_cfg() -> str:
    """The fixed ``pyvenv.cfg``: the image's interpreter is Debian's ``/usr/bin/python3``."""
    return (
        "home = /usr/bin\n"
        "include-system-site-packages = false\n"
        f"version = {PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}\n"
    )


def _load_installer(installer_wheel: Path) -> Any:
    """Import ``installer`` from its locked wheel; return the module namespace we use."""
    if not installer_wheel.is_file():
        raise InstallError(f"--installer {installer_wheel}: expected the installer wheel, found no file")
    entry = str(installer_wheel.absolute())
    if entry not in sys.path:
        sys.path.insert(0, entry)
    import installer
    import installer.destinations
    import installer.exceptions
    import installer.sources

    return installer


def _make_destination(installer: Any, out: Path, prefix: str) -> Any:
    base = installer.destinations.SchemeDictionaryDestination

    class Destination(base):  # type: ignore[misc, valid-type]
        """Writes under ``out`` as if ``out`` were ``/``; refuses a file that another wheel wrote."""

        owners: dict[str, str]
        current: str
        # project of the current wheel -> the project whose files it may replace
        replaces: dict[str, str]
        # replaced project -> paths (relative to out) that a later wheel replaced
        shadowed: dict[str, list[str]]

        def write_to_fs(self, scheme: str, path: str, stream: BinaryIO, is_executable: bool) -> Any:
            rel = str(PurePosixPath(self.scheme_dict[scheme]) / path).lstrip("/")
            key = os.path.normpath(rel)
            owner = self.owners.get(key)
            if owner is not None:
                loser = self.replaces.get(parse_wheel_filename(self.current).project)
                if owner == self.current or loser != parse_wheel_filename(owner).project:
                    where = "this wheel" if owner == self.current else owner
                    raise InstallError(f"/{rel}: written by both {where} and {self.current}")
                self.shadowed.setdefault(loser, []).append(key)
                (Path(self.destdir) / key).unlink()
            self.owners[key] = self.current
            return super().write_to_fs(scheme, path, stream, is_executable)

    destination = Destination(
        scheme_dict=python_dirs(prefix),
        interpreter=f"{prefix}/bin/python3",
        script_kind="posix",
        bytecode_optimization_levels=(),
        destdir=str(out),
    )
    destination.owners = {}
    destination.replaces = {}
    destination.shadowed = {}
    return destination


def _install_one(installer: Any, destination: Any, wheel: Path, prefix: str) -> None:
    name = parse_wheel_filename(wheel.name)
    destination.current = wheel.name
    destination.scheme_dict["headers"] = f"{python_dirs(prefix)['headers']}/{name.project}"
    try:
        with installer.sources.WheelFile.open(wheel) as source:
            # Names and RECORD syntax only: the whole file's sha256 is locked, and zipfile checks each
            # member's CRC while it is unpacked.
            source.validate_record(validate_contents=False)
            with warnings.catch_warnings():
                # installer leaves out the bytecode a wheel ships in __pycache__ (numpy's does), as pip
                # does, and warns for each file: in a build log that reads like a failure. The image's
                # pycs are compiled from the installed sources (sparkseal.install.bytecode).
                warnings.filterwarnings(
                    "ignore", message=r"Skip installing .*__pycache__", category=RuntimeWarning
                )
                installer.install(source, destination, {"INSTALLER": INSTALLER_NAME})
    except InstallError:
        raise
    # installer asserts on malformed entry points; ValueError covers bad RECORD rows and unsafe paths.
    except (
        installer.exceptions.InstallerError,
        zipfile.BadZipFile,
        ValueError,
        KeyError,
        OSError,
        AssertionError,
    ) as exc:
        raise InstallError(f"{wheel}: not a valid wheel: {type(exc).__name__}: {exc}") from exc


def read_replaces(path: Path) -> dict[str, str]:
    """Read the replacement policy: ``{"replaces": {"winner": {"replaces": "loser", "reason": "..."}}}``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["replaces"]
        result = {normalize_name(k): normalize_name(v["replaces"]) for k, v in entries.items() if v["reason"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InstallError(
            f"{path}: expected {{'replaces': {{project: {{'replaces', 'reason'}}}}}}: {exc}"
        ) from exc
    if len(result) != len(entries):
        raise InstallError(f"{path}: every replacement needs a non-empty reason")
    return result


def drop_from_record(out: Path, prefix: str, project: str, paths: Sequence[str]) -> None:
    """Remove ``paths`` (relative to ``out``) from the RECORD of the installed ``project``."""
    site = out / python_dirs(prefix)["purelib"].lstrip("/")
    records = [
        r for r in site.glob("*.dist-info/RECORD") if normalize_name(r.parent.name.split("-")[0]) == project
    ]
    if len(records) != 1:
        raise InstallError(f"{site}: expected one installed RECORD of {project}, found {len(records)}")
    gone = {os.path.relpath(out / p, site) for p in paths}
    rows = list(csv.reader(io.StringIO(records[0].read_text(encoding="utf-8"))))
    kept = [row for row in rows if row and row[0] not in gone]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(kept)
    records[0].write_text(text.getvalue(), encoding="utf-8")


def compile_bytecode(out: Path, prefix: str, workers: int) -> int:
    """Byte-compile the sources every installed RECORD lists and add the pycs to it; return their count.

    ``installer`` installs no ``__pycache__`` a wheel ships, so every pyc here is one of ours.
    """
    image_site = python_dirs(prefix)["purelib"]
    site = out / image_site.lstrip("/")
    try:
        dists = read_dist_infos(site)
        owner: dict[str, str] = {}
        for dist in dists:
            for key in dist.record:
                if key.endswith(".py") and not key.startswith("../") and (site / key).is_file():
                    owner[key] = dist.directory
        written = compile_tree(site, image_site, sorted(owner), workers)
    except (ManifestError, BytecodeError) as error:
        raise InstallError(f"bytecode: {error}") from error
    by_dist: dict[str, list[str]] = {}
    for source, pyc in written:
        by_dist.setdefault(owner[source], []).append(pyc)
    for directory, pycs in sorted(by_dist.items()):
        add_to_record(site / directory / "RECORD", site, pycs)
    return len(written)


def install_wheels(
    wheels: Sequence[Path],
    out: Path,
    platform: str,
    installer_wheel: Path,
    prefix: str = DEFAULT_PREFIX,
    write_pyvenv_cfg: bool = True,
    replaces: Mapping[str, str] | None = None,
    bytecode: bool = False,
) -> list[str]:
    """Install ``wheels`` for ``platform`` into ``out`` (as ``<out>/<prefix>/...``); return their names.

    ``out`` must be empty or absent. ``replaces`` maps a project to the one project whose files it may
    overwrite (as pip would, silently, in whatever order it installs); the replaced project's RECORD then
    no longer names those files, so every file has exactly one owner. ``bytecode`` adds the pycs of the
    installed sources (``compile_bytecode``), compiled on every CPU the process may use.
    """
    if not prefix.startswith("/") or prefix != os.path.normpath(prefix):
        raise InstallError(f"--prefix {prefix!r}: expected a normalised absolute path such as /opt/venv")
    try:
        ordered = check_wheels(wheels, platform)
    except WheelError as error:
        raise InstallError(str(error)) from error
    if out.exists() and any(out.iterdir()):
        raise InstallError(f"--out {out}: expected an empty directory, found {sorted(os.listdir(out))[:5]}")
    replaces = dict(replaces or {})
    # A wheel that replaces another's files installs after it, whatever order the wheels came in.
    ordered = sorted(ordered, key=lambda w: parse_wheel_filename(w.name).project in replaces)
    installer = _load_installer(installer_wheel)
    destination = _make_destination(installer, out, prefix)
    destination.replaces = replaces
    venv = out / prefix.lstrip("/")
    for sub in ("bin", python_dirs(prefix)["purelib"].removeprefix(prefix + "/")):
        (venv / sub).mkdir(parents=True, exist_ok=True)
    for wheel in ordered:
        _install_one(installer, destination, wheel, prefix)
    for project, paths in sorted(destination.shadowed.items()):
        drop_from_record(out, prefix, project, paths)
    if bytecode:
        compile_bytecode(out, prefix, len(os.sched_getaffinity(0)))
    if write_pyvenv_cfg:
        (venv / "pyvenv.cfg").write_text(pyvenv_cfg(), encoding="utf-8")
    normalize_tree(out)
    return [w.name for w in ordered]
