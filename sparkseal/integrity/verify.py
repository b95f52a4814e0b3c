"""Hash the installed files of a site-packages directory and compare them with the image's module manifest.

What is checked by default (``verify_site``): every distribution of the site-packages directory, as the
manifest describes it (``sparkseal.core.manifest``). For each ``*.dist-info`` there and each distribution the
manifest lists:

* every file its RECORD names, in site-packages or outside it (console scripts in ``bin/``): missing,
  changed and extra files are findings;
* a distribution the manifest lists but no ``*.dist-info`` installs is a finding, and so is a
  ``*.dist-info`` the manifest does not list, whatever its files: a distribution the image does not have
  can shadow the image's modules, and its own ``.pth`` files and entry points (vLLM loads every
  ``vllm.general_plugins`` entry point) run in every process, without a file of the image changing;
* every file under site-packages that no RECORD names (a ``.pth`` file, a module dropped beside the
  others, a bytecode cache) is compared with the manifest's ``(unowned)`` bucket, and so are the unowned
  files outside site-packages that the manifest lists (``pyvenv.cfg``).

Bytecode caches (``__pycache__``) count as files: Python loads them instead of the source, so an image
that is verified runs with ``PYTHONDONTWRITEBYTECODE=1`` (or a read-only venv) and ships only those the
manifest lists.

``--modules a,b`` narrows the check to named top-level modules (``verify_module``), located without
importing them: ``importlib`` finds the package (``find_spec`` of a top-level name runs none of its code),
the directory holding it is its site-packages directory, and the ``*.dist-info/RECORD`` files there say
which distribution owns it and which files that distribution has. Every file its RECORD names is hashed,
and so is every file under the distribution's top-level directories that no RECORD names. Because the
import system locates the module, this also finds a module imported from outside site-packages. The
default check of the running interpreter's site-packages asks the same of the served modules
(``shadowed``): each one installed there must be the one ``sys.path`` finds first.

Files are hashed by several threads (``sha256_files``); results are in a fixed order whatever the number.
Keys are the manifest's: paths relative to site-packages.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from sparkseal.core.digests import sha256_files
from sparkseal.core.manifest import (
    UNOWNED,
    DistInfo,
    ManifestError,
    owner_map,
    read_dist_infos,
)
from sparkseal.core.tree import list_files

# The name of a result that concerns the whole site-packages directory (it cannot be read).
SITE_PACKAGES = "site-packages"


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


def installed_module(
    module: str, search_path: Sequence[str] | None = None, jobs: int | None = None
) -> InstalledModule:
    """Locate ``module``, find its distribution and hash its files (RECORD-named and stray ones).

    ``jobs``: the threads that hash (``None``: every CPU this process may use; 1: one after another).
    """
    root = module_root(module, search_path)
    site = root.parent
    try:
        dists = read_dist_infos(site)
        owners = owner_map(dists, str(site))
    except ManifestError as error:
        raise VerifyError(f"module {module}: {error}") from error
    dist = _owner(module, root, dists)
    keys = {key for key in dist.record if (site / key).is_file()}
    top_dirs = frozenset(key.split("/")[0] for key in dist.record if not key.startswith("../"))
    for top in sorted(top_dirs):
        if not (site / top).is_dir():
            continue
        try:
            found = list_files(site / top)
        except ValueError as error:
            raise VerifyError(f"module {module}: {error}") from error
        keys.update(key for rel in found if owners.get(key := f"{top}/{rel}", dist) is dist)
    ordered = sorted(keys)
    files = dict(zip(ordered, sha256_files([site / key for key in ordered], jobs), strict=True))
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
    manifest: Mapping[str, Any],
    manifest_path: Path,
    module: str,
    search_path: Sequence[str] | None = None,
    jobs: int | None = None,
) -> ModuleResult:
    """Compare one module's installed files with the manifest."""
    result = ModuleResult(module)
    try:
        installed = installed_module(module, search_path, jobs)
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


def default_site_packages() -> Path:
    """The site-packages directory the check covers by default: the running interpreter's (``purelib``).

    Why this one: the image's entrypoint and the ``vllm serve`` it becomes run one interpreter,
    ``/opt/venv/bin/python3``, and the vLLM plugin runs inside vLLM's own processes, so this is the
    directory their imports come from: ``/opt/venv/lib/python3.11/site-packages`` in the image, the one its
    manifest describes. The directory of the ``sparkseal`` package would name it in the image too, but not
    where the package runs from a checkout; the manifest's prefix says where the tree was installed, not
    where it is being looked at (``--site-packages`` checks an unpacked tree). A virtual environment keeps
    pure and platform modules in one directory; were they two, which one the manifest describes is unknown,
    so that is an error.
    """
    purelib, platlib = (Path(sysconfig.get_path(name)) for name in ("purelib", "platlib"))
    if purelib != platlib:
        raise VerifyError(
            f"expected one site-packages directory for pure and platform modules, found purelib {purelib} "
            f"and platlib {platlib}; name one with --site-packages"
        )
    return purelib


@dataclass(frozen=True)
class InstalledDistribution:
    """One installed distribution: its ``*.dist-info`` directories (one, unless installed twice), files."""

    key: str  # normalised project name, the manifest's key
    version: str
    directories: tuple[str, ...]
    files: dict[str, str]


@dataclass(frozen=True)
class InstalledSite:
    """Every distribution of a site-packages directory, and the files no RECORD names, with their sha256."""

    site: Path
    distributions: dict[str, InstalledDistribution]  # by key, sorted
    unowned: dict[str, str]

    def file_count(self) -> int:
        """How many files were hashed."""
        return len(self.unowned) + sum(len(d.files) for d in self.distributions.values())


def unowned_outside(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The files outside site-packages that no RECORD names and the manifest lists (``pyvenv.cfg``).

    The check hashes these where they exist instead of walking the whole virtual environment: ``bin/``
    also holds the interpreter links a layer adds after the manifest is written.
    """
    entry = manifest["distributions"].get(UNOWNED, {})
    keys = {**entry.get("files", {}), **entry.get("install_files", {})}
    return tuple(sorted(key for key in keys if key.startswith("../")))


def installed_site(site: Path, outside: Iterable[str] = (), jobs: int | None = None) -> InstalledSite:
    """Hash every file of ``site``, each given to the distribution whose RECORD names it or to none.

    RECORD-named files outside ``site`` (console scripts) are hashed where they exist; so are ``outside``
    (site-relative keys of unowned files, see ``unowned_outside``). ``jobs`` as for ``sha256_files``.
    """
    if not site.is_dir():
        raise VerifyError(f"site-packages {site}: expected a directory, found none")
    try:
        dists = read_dist_infos(site)
        owners = owner_map(dists, str(site))
        present = list_files(site)
    except (ManifestError, ValueError) as error:
        raise VerifyError(f"site-packages {site}: {error}") from error
    on_disk = set(present)
    unowned = [key for key in present if key not in owners]
    unowned += [key for key in sorted(set(outside)) if key not in owners and (site / key).is_file()]
    by_key: dict[str, list[DistInfo]] = {}
    for dist in dists:
        by_key.setdefault(dist.key, []).append(dist)
    owned = {
        key: sorted(
            {
                path
                for dist in group
                for path in dist.record
                if path in on_disk or (path.startswith("../") and (site / path).is_file())
            }
        )
        for key, group in by_key.items()
    }
    keys = [*unowned, *(path for key in sorted(owned) for path in owned[key])]
    hashes = dict(zip(keys, sha256_files([site / key for key in keys], jobs), strict=True))
    distributions = {
        key: InstalledDistribution(
            key,
            by_key[key][0].version,
            tuple(dist.directory for dist in by_key[key]),
            {path: hashes[path] for path in owned[key]},
        )
        for key in sorted(owned)
    }
    return InstalledSite(site, distributions, {key: hashes[key] for key in unowned})


def site_results(
    manifest: Mapping[str, Any], manifest_path: Path, installed: InstalledSite
) -> list[ModuleResult]:
    """One result per distribution installed or listed (sorted by name), then one for the unowned files."""
    listed = {key: entry for key, entry in manifest["distributions"].items() if key != UNOWNED}
    site = installed.site
    results = []
    for key in sorted(listed.keys() | installed.distributions.keys()):
        entry, found = listed.get(key), installed.distributions.get(key)
        result = ModuleResult(key, distribution=key, site=str(site))
        results.append(result)
        if found is None:
            result.version = listed[key]["version"]
            result.problem = (
                f"distribution {key} {result.version} is in the manifest {manifest_path}, expected a "
                f"*.dist-info of it in {site}, found none"
            )
            continue
        result.version, result.checked = found.version, len(found.files)
        if len(found.directories) > 1:
            result.problem = (
                f"distribution {key} is installed {len(found.directories)} times in {site}: "
                f"{', '.join(found.directories)}; expected one *.dist-info"
            )
        elif entry is None:
            result.problem = (
                f"distribution {key} {found.version} ({site / found.directories[0]}) is not in the manifest "
                f"{manifest_path}; a distribution the image does not have can shadow the image's modules"
            )
        else:
            result.findings = compare_files({**entry["files"], **entry["install_files"]}, found.files)
    entry = manifest["distributions"].get(UNOWNED, {})
    expected = {**entry.get("files", {}), **entry.get("install_files", {})}
    unowned = ModuleResult(UNOWNED, UNOWNED, None, str(site), len(installed.unowned))
    unowned.findings = compare_files(expected, installed.unowned)
    results.append(unowned)
    return results


# The modules a served image runs (the entrypoint, vLLM, its kernels): where the check covers the running
# interpreter's site-packages, each of these that is installed there must also be what the import system
# finds first (``shadowed``).
SERVED_MODULES = ("vllm", "torch", "sparkseal")


def shadowed(site: Path, modules: Sequence[str] = SERVED_MODULES) -> list[ModuleResult]:
    """A result for each of ``modules`` installed in ``site`` that ``sys.path`` finds elsewhere first.

    Why: hashing site-packages says nothing of a copy ahead of it on ``sys.path`` (``PYTHONPATH``, a mounted
    directory, a ``.pth`` entry), which is what ``import`` would load. Searched with ``sys.path`` as it is,
    not with the modules already imported (``PathFinder``), so the answer is the path's, for this process.
    """
    results = []
    for module in modules:
        if not (site / module).exists():
            continue  # not installed here: the distributions' results say what is missing
        try:
            root = module_root(module, sys.path)
        except VerifyError as error:
            results.append(ModuleResult(module, site=str(site), problem=str(error)))
            continue
        if root.parent.resolve() != site.resolve():
            results.append(
                ModuleResult(
                    module,
                    site=str(site),
                    problem=f"module {module}: imported from {root}, expected the checked {site / module}: a "
                    "directory ahead of site-packages on sys.path (PYTHONPATH, a mount) shadows the image's",
                )
            )
    return results


def verify_site(
    manifest: Mapping[str, Any], manifest_path: Path, site: Path | None = None, jobs: int | None = None
) -> list[ModuleResult]:
    """The default check: every distribution of ``site`` (``None``: ``default_site_packages``, and then
    also that the served modules are imported from it, ``shadowed``)."""
    given = site is not None
    try:
        site = default_site_packages() if site is None else site
        installed = installed_site(site, unowned_outside(manifest), jobs)
    except VerifyError as error:
        return [ModuleResult(SITE_PACKAGES, site=str(site) if site else None, problem=str(error))]
    results = site_results(manifest, manifest_path, installed)
    return results if given else results + shadowed(site)


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
        what = "files no RECORD names" if r.distribution == UNOWNED else f"{r.distribution} {r.version}"
        lines.append(f"{r.module}: {what} in {r.site}: {r.checked} files, {status}")
        lines.extend(f"  {f.message()}" for f in r.findings)
    return "\n".join(lines)
