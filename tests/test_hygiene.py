"""Repository hygiene: lint, shell checks, Starlark that loads, no stray links or host names."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
        result = workspace.bazel("query", " + ".join(["//:all", *[f"//{p}/..." for p in packages]]))
    finally:
        workspace.shutdown()
    assert result.returncode == 0, result.output
    assert "//third_party/vllm:wheel_linux_aarch64" in result.output


def _module_deps_table() -> dict[str, list[str]]:
    text = (REPO / "sparkseal/build/BUILD").read_text()
    table = re.search(r"^MODULE_DEPS = (\{.*?^\})", text, re.MULTILINE | re.DOTALL)
    assert table, "sparkseal/build/BUILD: expected a MODULE_DEPS = {...} table, found none"
    return ast.literal_eval(table.group(1))


def _build_imports(module: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "sparkseal.build":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkseal.build."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("sparkseal.build."))
    return found


def test_build_action_deps_match_their_imports() -> None:
    """Each action program's Bazel inputs are the modules it imports: no more (cache misses), no fewer."""
    table = _module_deps_table()
    modules = sorted(p for p in (REPO / "sparkseal/build").glob("*.py") if p.stem != "__init__")
    assert sorted(table) == [p.stem for p in modules], (
        "sparkseal/build/BUILD: MODULE_DEPS lists other modules"
    )
    for module in modules:
        assert sorted(_build_imports(module)) == table[module.stem], (
            f"sparkseal/build/BUILD: MODULE_DEPS[{module.stem!r}]: expected {sorted(_build_imports(module))} "
            f"(the imports of {module.name}), found {table[module.stem]}"
        )
