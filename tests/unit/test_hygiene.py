"""Repository hygiene: lint, shell checks, Starlark that loads, no stray links or host names."""

from __future__ import annotations

import ast
import collections
import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkseal.devtools import deps
from sparkseal.devtools.deps import our_imports
from sparkseal.devtools.rules_doc import bzl_path
from tests.bazel_util import BAZEL, REPO, Workspace, base_env

RUFF = Path(sys.executable).parent / "ruff"
SKIP_DIRS = {".git", ".ruff_cache", ".pytest_cache", "__pycache__", ".gpu_trees"}


def _tracked_files() -> list[Path]:
    """The files of the checkout, without Bazel's convenience links and ignored caches."""
    found: list[Path] = []
    for path in sorted(REPO.rglob("*")):
        rel = path.relative_to(REPO)
        if rel.parts[0].startswith("bazel-") or SKIP_DIRS & set(rel.parts):
            continue
        if path.is_file() or path.is_symlink():
            found.append(path)
    return found


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)


def test_ruff_check_and_format() -> None:
    assert RUFF.exists(), f"ruff not found at {RUFF}: run make setup"
    check = _run([str(RUFF), "check", "."])
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run([str(RUFF), "format", "--check", "."])
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def _shell_scripts() -> list[Path]:
    scripts = []
    for path in _tracked_files():
        if path.is_symlink():
            continue
        if path.suffix == ".sh" or path.read_bytes()[:32].startswith((b"#!/bin/sh", b"#!/usr/bin/env bash")):
            scripts.append(path)
    return scripts


def test_shell_scripts_parse_and_pass_shellcheck() -> None:
    scripts = _shell_scripts()
    assert REPO / ".ci" / "run" in scripts
    for script in scripts:
        parsed = _run(["bash", "-n", str(script)])
        assert parsed.returncode == 0, f"{script}: {parsed.stderr}"
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: run make setup"
    result = _run([shellcheck, *map(str, scripts)])
    assert result.returncode == 0, result.stdout


def test_no_symlinks_in_sources() -> None:
    links = [str(p.relative_to(REPO)) for p in _tracked_files() if p.is_symlink()]
    assert links == [], f"symlinks are not allowed in the repository: {links}"


def test_no_registry_host_names_in_files() -> None:
    # The index is whatever pip is configured with; no file may name a registry host.
    pattern = re.compile(rb"pypi\.org|files\.pythonhosted|deb\.debian\.org|download\.pytorch\.org")
    offenders = [
        str(p.relative_to(REPO))
        for p in _tracked_files()
        if not p.is_symlink() and pattern.search(p.read_bytes())
    ]
    assert offenders == []


def _first_symbol(bzl: Path) -> str | None:
    match = re.search(r"^(?:def\s+([A-Za-z]\w*)|([A-Za-z]\w*)\s*=)", bzl.read_text(), re.MULTILINE)
    return next((g for g in match.groups() if g), None) if match else None


# .bzl files that only MODULE.bazel loads (they define module extensions, which Bazel 4.2.3 lacks).
BZLMOD_ONLY = {"rules/extensions.bzl"}


def test_bzlmod_only_files_are_the_module_extensions_of_module_bazel() -> None:
    module = (REPO / "MODULE.bazel").read_text()
    used = set(re.findall(r'use_extension\(\s*"//([^":]*):([^"]+)"', module))
    assert {f"{package}/{name}" for package, name in used} == BZLMOD_ONLY
    for rel in BZLMOD_ONLY:
        assert "module_extension(" in (REPO / rel).read_text(), f"{rel}: expected a module extension"


_LOAD = re.compile(r'^load\(\s*"([^"]+)"', re.MULTILINE)


def _bzl_loads(path: str, text: str) -> list[str]:
    """The repository paths of the .bzl files of this repository that ``text`` loads (load statements)."""
    here = path.rpartition("/")[0]
    return [found for label in _LOAD.findall(text) if (found := bzl_path(label, here)) is not None]


def backwards_loads(files: dict[str, str], image: str = "rules/private/image.bzl") -> list[str]:
    """Each repository-rule file that loads, directly or through others, an image-rule file; one line each.

    The image-rule files are ``image`` and the files it loads that declare a rule. A repository rule runs
    before any build rule exists: loading one makes every repository re-evaluate when the image changes.
    """
    image_rules = {image} | {
        f for f in _bzl_loads(image, files[image]) if re.search(r"(?<![\w.])rule\(", files.get(f, ""))
    }
    found = []
    for path, text in sorted(files.items()):
        if not re.search(r"\brepository_rule\(", text):
            continue
        seen: dict[str, str] = {}  # file -> the file that loads it
        stack = [path]
        while stack:
            current = stack.pop()
            for loaded in _bzl_loads(current, files.get(current, "")):
                if loaded not in seen and loaded != path:
                    seen[loaded] = current
                    stack.append(loaded)
        for hit in sorted(set(seen) & image_rules):
            chain = [hit]
            while chain[-1] != path:
                chain.append(seen[chain[-1]])
            found.append(f"{path}: a repository rule loads the image rules: {' -> '.join(reversed(chain))}")
    return found


def test_no_repository_rule_loads_the_image_rules() -> None:
    """Repository-rule files load leaves (e.g. rules/private/wheel_layers.bzl), never the image's rules."""
    files = {p.relative_to(REPO).as_posix(): p.read_text() for p in sorted((REPO / "rules").rglob("*.bzl"))}
    assert backwards_loads(files) == []


def test_the_backwards_load_check_names_the_chain() -> None:
    files = {
        "rules/private/image.bzl": 'load(":oci_layer.bzl", "oci_layer")\nload(":leaf.bzl", "X")\n',
        "rules/private/oci_layer.bzl": "oci_layer = rule(implementation = _impl)\n",
        "rules/private/leaf.bzl": "X = 1\n",
        "rules/private/lock.bzl": 'load(":middle.bzl", "Y")\nlock = repository_rule(implementation = _i)\n',
        "rules/private/middle.bzl": 'load("//rules/private:image.bzl", "Z")\nY = 1\n',
        "rules/private/clean.bzl": 'load(":leaf.bzl", "X")\nclean = repository_rule(implementation = _i)\n',
    }
    assert backwards_loads(files) == [
        "rules/private/lock.bzl: a repository rule loads the image rules: rules/private/lock.bzl -> "
        "rules/private/middle.bzl -> rules/private/image.bzl",
        "rules/private/lock.bzl: a repository rule loads the image rules: rules/private/lock.bzl -> "
        "rules/private/middle.bzl -> rules/private/image.bzl -> rules/private/oci_layer.bzl",
    ]


@pytest.mark.bazel
def test_every_starlark_file_loads(tmp_path: Path) -> None:
    """Every BUILD file of the main repository and every .bzl file parses and evaluates in Bazel."""
    assert BAZEL, "bazel is not installed: run make setup"
    copy = tmp_path / "ws"
    shutil.copytree(
        REPO,
        copy,
        ignore=lambda d, names: [n for n in names if n.startswith("bazel-") or n in SKIP_DIRS],
    )
    loads = []
    for bzl in sorted(copy.rglob("*.bzl")):
        rel = bzl.relative_to(copy)
        external = next((p for p in bzl.parents if (p / "WORKSPACE").exists() and p != copy), None)
        if external is not None:
            continue  # offline stand-ins are loaded by Bazel itself when a rule needs them
        if rel.as_posix() in BZLMOD_ONLY:
            # Bazel 4.2.3 has no module extensions; tests/bazel/test_bzlmod.py loads these in Bazel 7.7.1
            continue
        symbol = _first_symbol(bzl)
        assert symbol, f"{rel}: defines nothing"
        loads.append(f'load("//{rel.parent.as_posix()}:{rel.name}", {symbol!r})')
    (copy / "sparkseal_lint").mkdir()
    (copy / "sparkseal_lint" / "BUILD").write_text("\n".join(loads) + "\n")
    packages = sorted(
        {
            b.parent.relative_to(copy).parts[0]
            for b in copy.rglob("BUILD")
            if b.parent != copy and not any((p / "WORKSPACE").exists() for p in b.parents if p != copy)
        }
    )
    workspace = Workspace(
        root=copy,
        output_base=tmp_path / "output-base",
        repository_cache=Path.home() / ".cache" / "sparkseal" / "repository",
        env=base_env(),
    )
    try:
        # An empty glob is an error from Bazel 8 on: fail on one here already.
        result = workspace.bazel(
            "query",
            "--incompatible_disallow_empty_glob",
            " + ".join(["//:all", *[f"//{p}/..." for p in packages]]),
        )
    finally:
        workspace.shutdown()
    assert result.returncode == 0, result.output
    assert "//third_party/vllm:wheel_linux_aarch64" in result.output


# Which packages of ours each part of sparkseal may import: the core at the bottom imports nothing else of
# ours; the secret scan (which runs git and the catalogue's binary) and the installed trees (byte-compiled
# in fresh interpreters) sit on it; action programs, fetch helpers, auditors, the kernel bindings, module
# verification and the live checker sit on the core and never on each other (an action program imports no
# other action program either), on the scan and the installed trees where they need them; the vLLM
# integration sits on the kernel bindings and module verification (the plugin checks the ranks' modules,
# the backend calls the kernels); the command line sits on everything. The package root
# (``sparkseal/__init__.py``) holds only the version and may be imported by all.
ALLOWED_IMPORTS = {
    "core": {"core"},
    "scan": {"core", "scan"},
    "install": {"core", "install"},
    "actions": {"core", "scan", "install"},
    "fetch": {"core", "fetch", "install"},
    "audit": {"core", "audit", "scan"},
    "kernels": {"core", "kernels"},
    "integrity": {"core", "integrity"},
    "live_check": {"core", "live_check"},
    "vllm_integration": {"core", "kernels", "integrity", "vllm_integration"},
    "cli": {
        *("core", "scan", "install", "actions", "fetch", "audit"),
        *("kernels", "integrity", "live_check", "vllm_integration", "cli"),
    },
    # tools for working on the repository (generated tables and pages): they read files, import nothing
    "devtools": {"devtools"},
}


def _part(rel: Path) -> str:
    """The part of the package a module belongs to (``sparkseal/<part>/x.py``; ``cli.py`` is the cli)."""
    return rel.parts[1] if len(rel.parts) > 2 else "cli"


def import_violations(modules: dict[Path, str]) -> list[str]:
    """Every import against the direction in ``modules`` (repository path -> source), one line each."""
    violations = []
    for rel, source in sorted(modules.items()):
        part = _part(rel)
        for line, name in our_imports(source):
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else "__init__"
            if target in {"__init__", "__version__"}:
                continue
            target = "cli" if target in {"cli", "__main__"} else target
            if target not in ALLOWED_IMPORTS[part]:
                violations.append(
                    f"{rel}:{line}: imports {name}; sparkseal.{part} may import only "
                    f"{', '.join(sorted('sparkseal.' + p for p in ALLOWED_IMPORTS[part]))}"
                )
            elif part == "actions" and target == "actions":
                violations.append(f"{rel}:{line}: imports {name}; an action program imports no other")
    return violations


def _package_modules() -> dict[Path, str]:
    return {p.relative_to(REPO): p.read_text() for p in sorted((REPO / "sparkseal").rglob("*.py"))}


def test_imports_flow_one_way() -> None:
    """core <- actions, fetch, audit, kernels, integrity, live_check <- vllm_integration <- cli: one way."""
    modules = _package_modules()
    assert {_part(rel) for rel in modules} == set(ALLOWED_IMPORTS), sorted({_part(r) for r in modules})
    assert import_violations(modules) == []


def test_the_import_check_names_an_upward_import() -> None:
    modules = {
        Path("sparkseal/actions/oci_layer.py"): "from sparkseal.audit.rebuild import check\n",
        Path("sparkseal/core/tar.py"): (
            "import os\n\n\ndef f():\n    from sparkseal.integrity import verify\n"
        ),
        Path(
            "sparkseal/actions/sbom.py"
        ): "from sparkseal import __version__\nfrom sparkseal.actions import oci_image\n",
        Path("sparkseal/fetch/series.py"): "from sparkseal.core.patchset import read_series\n",
        Path("sparkseal/core/oci.py"): "from sparkseal.scan.catalogue import Catalogue\n",
        Path("sparkseal/scan/scanner.py"): "from sparkseal.fetch.index import index_url\n",
    }
    assert import_violations(modules) == [
        "sparkseal/actions/oci_layer.py:1: imports sparkseal.audit.rebuild; sparkseal.actions may import "
        "only sparkseal.core, sparkseal.install, sparkseal.scan",
        "sparkseal/actions/sbom.py:2: imports sparkseal.actions.oci_image; sparkseal.actions may import only "
        "sparkseal.core, sparkseal.install, sparkseal.scan",
        "sparkseal/core/oci.py:1: imports sparkseal.scan.catalogue; sparkseal.core may import only "
        "sparkseal.core",
        "sparkseal/core/tar.py:5: imports sparkseal.integrity.verify; sparkseal.core may import only "
        "sparkseal.core",
        "sparkseal/scan/scanner.py:1: imports sparkseal.fetch.index; sparkseal.scan may import only "
        "sparkseal.core, sparkseal.scan",
    ]


# What makes a module impure: a module that opens connections or starts processes, or a call that starts
# or finds a program. ``urllib.parse`` is string handling and stays allowed.
IMPURE_MODULES = (
    "subprocess",
    "socket",
    "ssl",
    "http",
    "urllib.request",
    "ftplib",
    "smtplib",
    "multiprocessing",
)
_EXEC_SUFFIXES = ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")
IMPURE_CALLS = {
    "shutil": ("which",),
    "os": (
        "system",
        "popen",
        "fork",
        "forkpty",
        "posix_spawn",
        "posix_spawnp",
        *(f"exec{s}" for s in _EXEC_SUFFIXES),
        *(f"spawn{s}" for s in _EXEC_SUFFIXES),
    ),
}


def impurities(rel: Path, source: str) -> list[str]:
    """Each import or call of ``source`` that reaches a process, a program or the network, one line each."""
    found = []

    def impure(name: str) -> bool:
        return any(name == m or name.startswith(f"{m}.") for m in IMPURE_MODULES)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{rel}:{node.lineno}: imports {a.name}" for a in node.names if impure(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            hits = [n for n in names if impure(node.module) or impure(n)]
            hits += [
                n
                for n in names
                if n.rpartition(".")[2] in IMPURE_CALLS.get(node.module, ()) and n not in hits
            ]
            found += [f"{rel}:{node.lineno}: imports {n}" for n in hits]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in IMPURE_CALLS.get(node.value.id, ())
        ):
            found.append(f"{rel}:{node.lineno}: uses {node.value.id}.{node.attr}")
    return found


def test_core_runs_no_program_and_opens_no_connection() -> None:
    """``sparkseal/core`` stays pure: no subprocess, no external binary, no network."""
    found = [
        line
        for rel, source in _package_modules().items()
        if _part(rel) == "core"
        for line in impurities(rel, source)
    ]
    assert found == [], "core is the pure library: move these to the trade that runs them"


def test_the_purity_check_names_each_impure_import_and_call() -> None:
    source = (
        "import os\nimport subprocess\nimport urllib.parse\nimport urllib.request\n"
        "from http import client\nfrom shutil import which, copyfile\nimport shutil\n"
        "from socket import socket\n\n\ndef f():\n    os.execvp('git', ['git'])\n"
        "    shutil.which('git')\n    os.path.join('a', 'b')\n    shutil.copyfile('a', 'b')\n"
    )
    assert impurities(Path("sparkseal/core/x.py"), source) == [
        "sparkseal/core/x.py:2: imports subprocess",
        "sparkseal/core/x.py:4: imports urllib.request",
        "sparkseal/core/x.py:5: imports http.client",
        "sparkseal/core/x.py:6: imports shutil.which",
        "sparkseal/core/x.py:8: imports socket.socket",
        "sparkseal/core/x.py:12: uses os.execvp",
        "sparkseal/core/x.py:13: uses shutil.which",
    ]


def _module_name(rel: Path) -> str:
    """``sparkseal/fetch/index.py`` -> ``sparkseal.fetch.index`` (a package's ``__init__`` is the package)."""
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(modules: dict[Path, str]) -> list[str]:
    """Every import cycle among the modules of one folder of ``modules`` (repository path -> source).

    The direction check keeps the folders apart; inside one, two modules that import each other (at module
    level or in a function) would be one unit in disguise: neither can be read, tested, or given its own
    Bazel inputs alone, and a module-level pair breaks as soon as either is imported first. One line per
    cycle (a strongly connected part of the folder's import graph): each module of it and the line where
    it imports the next, around the cycle back to the first.
    """
    names = {_module_name(rel): rel for rel in modules}
    edges: dict[str, dict[str, int]] = {name: {} for name in names}
    for name, rel in names.items():
        for line, imported in our_imports(modules[rel]):
            if imported in names and names[imported].parent == rel.parent and imported != name:
                edges[name].setdefault(imported, line)
            elif imported == name:
                edges[name].setdefault(name, line)
    # Tarjan's strongly connected components, iterative so no recursion limit applies.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    components.append(sorted(component))
    found = []
    for component in sorted(components):
        path = _shortest_cycle(component[0], edges, set(component))
        hops = ", ".join(
            f"{names[a].as_posix()}:{edges[a][b]} imports {b}" for a, b in itertools.pairwise(path)
        )
        folder = names[component[0]].parent.as_posix()
        found.append(f"{folder}: import cycle among {', '.join(component)}: {hops}")
    return found


def _shortest_cycle(start: str, edges: dict[str, dict[str, int]], members: set[str]) -> list[str]:
    """The shortest import path from ``start`` back to itself through ``members`` (breadth first)."""
    came_from: dict[str, str] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node]):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child in members and child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start}: no cycle back to it among {sorted(members)}")


def test_no_import_cycles_inside_a_folder() -> None:
    """No module imports, directly or through others of its folder, a module that imports it back."""
    assert import_cycles(_package_modules()) == []


def test_the_cycle_check_names_a_planted_cycle() -> None:
    modules = {
        Path("sparkseal/audit/provenance_check.py"): (
            "def verify():\n    from sparkseal.audit import provenance_sign\n"
        ),
        Path("sparkseal/audit/provenance_sign.py"): (
            "import json\n\nfrom sparkseal.audit.provenance_check import load_statement\n"
        ),
        Path("sparkseal/audit/compare.py"): "from sparkseal.audit.provenance_check import check\n",
        # a three-module cycle, through a package-level `from sparkseal.fetch import x`
        Path("sparkseal/fetch/a.py"): "from sparkseal.fetch import b\n",
        Path("sparkseal/fetch/b.py"): "import sparkseal.fetch.c\n",
        Path("sparkseal/fetch/c.py"): "\n\nfrom sparkseal.fetch.a import x\n",
        # the same names in two folders are no cycle; one-way imports are none either
        Path("sparkseal/kernels/a.py"): "from sparkseal.core.b import y\n",
        Path("sparkseal/core/b.py"): "from sparkseal.core import c\n",
        Path("sparkseal/core/c.py"): "",
    }
    assert import_cycles(modules) == [
        "sparkseal/audit: import cycle among sparkseal.audit.provenance_check, "
        "sparkseal.audit.provenance_sign: sparkseal/audit/provenance_check.py:2 imports "
        "sparkseal.audit.provenance_sign, sparkseal/audit/provenance_sign.py:3 imports "
        "sparkseal.audit.provenance_check",
        "sparkseal/fetch: import cycle among sparkseal.fetch.a, sparkseal.fetch.b, sparkseal.fetch.c: "
        "sparkseal/fetch/a.py:1 imports sparkseal.fetch.b, sparkseal/fetch/b.py:1 imports "
        "sparkseal.fetch.c, sparkseal/fetch/c.py:3 imports sparkseal.fetch.a",
    ]


def test_bazel_dependency_lists_are_generated_from_the_imports() -> None:
    """ACTION_DEPS, CORE_DEPS, INSTALL_DEPS, SCAN_DEPS and HELPER_SOURCES say what the imports say: `make
    deps` wrote them last."""
    assert deps.stale(REPO) == []


def test_starlark_platforms_are_the_python_ones() -> None:
    """rules/private/platforms.bzl repeats sparkseal/core/platforms.py for Starlark; they must agree."""
    from sparkseal.core import platforms

    text = (REPO / "rules/private/platforms.bzl").read_text()
    names = re.search(r"^PLATFORMS = (\[.*?\])", text, re.MULTILINE | re.DOTALL)
    debian = re.search(r"^DEBIAN_ARCHITECTURES = (\{.*?^\})", text, re.MULTILINE | re.DOTALL)
    assert names and debian, "rules/private/platforms.bzl: expected PLATFORMS and DEBIAN_ARCHITECTURES"
    assert ast.literal_eval(names.group(1)) == list(platforms.PLATFORMS)
    assert ast.literal_eval(debian.group(1)) == platforms.DEBIAN_ARCHITECTURES
    assert set(platforms.MACHINES) == set(platforms.PLATFORMS) == set(platforms.DEBIAN_ARCHITECTURES)


def test_platform_names_are_written_in_one_place() -> None:
    """No Python module or .bzl file spells out the platform list itself: they read the one table."""
    pattern = re.compile(r"""["']linux_aarch64["'],\s*["']linux_x86_64["']""")
    homes = {Path("sparkseal/core/platforms.py"), Path("rules/private/platforms.bzl")}
    offenders = [
        str(p.relative_to(REPO))
        for p in [
            *(REPO / "sparkseal").rglob("*.py"),
            *(REPO / "rules").rglob("*.bzl"),
            *REPO.glob("**/BUILD"),
        ]
        if p.relative_to(REPO) not in homes
        and not p.relative_to(REPO).parts[0].startswith(("bazel-", "tests", "third_party"))
        and pattern.search(p.read_text())
    ]
    assert offenders == []


def test_no_label_is_printed_into_action_arguments() -> None:
    """str(label) changed form in Bazel 7 (`@@//pkg:name`); what reaches outputs uses label_string()."""
    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "rules").rglob("*.bzl"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"args\.add", line) and re.search(r"\bstr\(", line)
    ]
    assert offenders == []


def test_every_build_file_loads_python_rules_from_one_place() -> None:
    """Bazel 8 drops the native py_* rules: every BUILD file takes them from rules/py.bzl."""
    offenders = []
    for build in sorted(REPO.rglob("BUILD")):
        rel = build.relative_to(REPO)
        if rel.parts[0].startswith("bazel-") or rel.parts[:2] == ("third_party", "bazel"):
            continue
        text = build.read_text()
        used = set(re.findall(r"^\s*(py_library|py_binary|py_test)\(", text, re.MULTILINE))
        loaded = set(re.findall(r'load\("//rules:py\.bzl",([^)]*)\)', text))
        names = set(re.findall(r'"(py_\w+)"', " ".join(loaded)))
        if used - names:
            offenders.append(f"{rel}: uses {sorted(used - names)} without loading them from //rules:py.bzl")
    assert offenders == []
