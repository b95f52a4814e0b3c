"""Hash the installed files of named modules and compare them with the image's module manifest.

A module's files are found without importing it: ``importlib`` locates the top-level package (``find_spec``
of a top-level name runs none of its code), the directory holding it is its site-packages directory, and
the ``*.dist-info/RECORD`` files there say which distribution owns it and which files that distribution
has. Every file its RECORD names is hashed, and so is every file under the distribution's top-level
directories that no RECORD names: a file dropped beside the module would be imported too. Bytecode caches
(``__pycache__``) count as such files: Python loads them instead of the source, so an image that is
verified runs with ``PYTHONDONTWRITEBYTECODE=1`` (or a read-only venv) and ships none.

Keys are the manifest's: paths relative to site-packages (see ``sparkseal.core.manifest``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from sparkseal.core.manifest import (
    UNOWNED,
    DistInfo,
    ManifestError,
    owner_map,
    read_dist_infos,
    sha256_file,
)
from sparkseal.core.tree import list_files

DEFAULT_MODULES = ("vllm", "torch", "sparkseal")


class VerifyError(Exception):
    """A module cannot be located or has no distribution; the message names it and where it looked."""


@dataclass(frozen=True)
class FileFinding:
    """One file that differs from the manifest."""

    kind: str  # "missing", "extra" or "changed"
    path: str
    expected: str | None
    actual: str | None

    def message(self) -> str:
        """One line naming the file, the expected and the actual sha256."""
        expected = f"sha256 {self.expected}" if self.expected else "not in the manifest"
        actual = f"sha256 {self.actual}" if self.actual else "no file"
        return f"{self.kind} {self.path}: expected {expected}, actual {actual}"


@dataclass(frozen=True)
class InstalledModule:
    """The distribution of an importable module and the sha256 of every file found for it."""

    module: str
    distribution: str  # normalised project name, the manifest's key
    version: str
    site: Path
    top_dirs: frozenset[str]
    files: dict[str, str]


@dataclass
class ModuleResult:
    """What ``verify-modules`` found for one module."""

    module: str
    distribution: str | None = None
    version: str | None = None
    site: str | None = None
    checked: int = 0
    problem: str | None = None
    findings: list[FileFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the module was found, is in the manifest and every file matches."""
        return self.problem is None and not self.findings


def module_root(module: str, search_path: Sequence[str] | None = None) -> Path:
    """The package directory (or single file) of a top-level module, found without running its code.

    ``search_path`` replaces ``sys.path`` for the search (``None``: the interpreter's own import system).
    """
    if not module.isidentifier():
        raise VerifyError(f"module {module!r}: not a top-level module name")
    if search_path is None:
        spec = importlib.util.find_spec(module)
    else:
        spec = PathFinder.find_spec(module, list(search_path))
    where = "sys.path" if search_path is None else ", ".join(search_path)
    if spec is None:
        raise VerifyError(f"module {module}: not installed (searched {where})")
    locations = list(spec.submodule_search_locations or [])
    if len(locations) > 1:
        raise VerifyError(f"module {module}: a namespace package spread over {', '.join(locations)}")
    if locations:
        return Path(locations[0])
    if spec.origin is None or not Path(spec.origin).is_file():
        raise VerifyError(f"module {module}: has no file ({spec.origin}); nothing to verify")
    return Path(spec.origin)


def _owner(module: str, root: Path, dists: Iterable[DistInfo]) -> DistInfo:
    top = root.name
    owners = sorted({d.directory for d in dists for key in d.record if key.split("/")[0] == top})
    if len(owners) != 1:
        found = ", ".join(owners) or "none does"
        raise VerifyError(
            f"module {module} at {root}: expected one *.dist-info in {root.parent} whose RECORD names "
            f"{top}, found {found}"
        )
    return next(d for d in dists if d.directory == owners[0])


def installed_module(module: str, search_path: Sequence[str] | None = None) -> InstalledModule:
    """Locate ``module``, find its distribution and hash its files (RECORD-named and stray ones)."""
    root = module_root(module, search_path)
    site = root.parent
    try:
        dists = read_dist_infos(site)
        owners = owner_map(dists, str(site))
    except ManifestError as error:
        raise VerifyError(f"module {module}: {error}") from error
    dist = _owner(module, root, dists)
    files = {key: sha256_file(site / key) for key in dist.record if (site / key).is_file()}
    top_dirs = frozenset(key.split("/")[0] for key in dist.record if not key.startswith("../"))
    for top in sorted(top_dirs):
        if not (site / top).is_dir():
            continue
        try:
            found = list_files(site / top)
        except ValueError as error:
            raise VerifyError(f"module {module}: {error}") from error
        for rel in found:
            key = f"{top}/{rel}"
            if key not in files and owners.get(key, dist) is dist:
                files[key] = sha256_file(site / key)
    return InstalledModule(module, dist.key, dist.version, site, top_dirs, files)


def expected_files(manifest: Mapping[str, Any], installed: InstalledModule) -> dict[str, str] | None:
    """What the manifest lists for the module's distribution, with unowned files under its directories.

    ``None`` when the manifest has no entry for the distribution.
    """
    dists = manifest["distributions"]
    entry = dists.get(installed.distribution)
    if entry is None:
        return None
    expected = {**entry["files"], **entry["install_files"]}
    unowned = dists.get(UNOWNED, {"files": {}})
    expected.update({k: v for k, v in unowned["files"].items() if k.split("/")[0] in installed.top_dirs})
    return expected


def compare_files(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[FileFinding]:
    """The files missing, extra or changed in ``actual`` against ``expected``, sorted by path."""
    findings = []
    for path in sorted(expected.keys() | actual.keys()):
        want, have = expected.get(path), actual.get(path)
        if want != have:
            kind = "missing" if have is None else "extra" if want is None else "changed"
            findings.append(FileFinding(kind, path, want, have))
    return findings


def verify_module(
    manifest: Mapping[str, Any], manifest_path: Path, module: str, search_path: Sequence[str] | None = None
) -> ModuleResult:
    """Compare one module's installed files with the manifest."""
    result = ModuleResult(module)
    try:
        installed = installed_module(module, search_path)
    except VerifyError as error:
        result.problem = str(error)
        return result
    result.distribution, result.version = installed.distribution, installed.version
    result.site, result.checked = str(installed.site), len(installed.files)
    expected = expected_files(manifest, installed)
    if expected is None:
        result.problem = (
            f"distribution {installed.distribution} {installed.version} (module {module} in "
            f"{installed.site}) is not in the manifest {manifest_path}"
        )
    else:
        result.findings = compare_files(expected, installed.files)
    return result


def render(results: Sequence[ModuleResult], manifest_path: Path, as_json: bool) -> str:
    """The report of ``verify-modules``: text, or JSON with every field."""
    if as_json:
        document = {
            "manifest": str(manifest_path),
            "ok": all(r.ok for r in results),
            "modules": [{**asdict(r), "ok": r.ok} for r in results],
        }
        return json.dumps(document, indent=2, sort_keys=True)
    lines = []
    for r in results:
        if r.problem:
            lines.append(f"{r.module}: {r.problem}")
            continue
        status = "OK" if r.ok else f"{len(r.findings)} finding(s)"
        lines.append(f"{r.module}: {r.distribution} {r.version} in {r.site}: {r.checked} files, {status}")
        lines.extend(f"  {f.message()}" for f in r.findings)
    return "\n".join(lines)
