"""sparkseal/devtools/deps.py: the Bazel dependency lists written from the imports, on checkout copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkseal.devtools import deps
from tests.bazel_util import REPO

TABLE_FILES = [
    "sparkseal/actions/BUILD",
    "sparkseal/core/BUILD",
    "sparkseal/install/BUILD",
    "sparkseal/scan/BUILD",
    "rules/private/helpers.bzl",
]
# The tables that name core's paths module: all but the scan's.
PATHS_TABLES = {
    "sparkseal/actions/BUILD": "ACTION_DEPS",
    "sparkseal/core/BUILD": "CORE_DEPS",
    "sparkseal/install/BUILD": "INSTALL_DEPS",
    "rules/private/helpers.bzl": "HELPER_SOURCES",
}


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The checkout's sparkseal/ and rules/: all the generator reads."""
    for folder in ("sparkseal", "rules"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _snapshot(root: Path) -> dict[str, str]:
    return {path: (root / path).read_text() for path in TABLE_FILES}


def test_the_checkout_is_up_to_date_and_a_rewrite_changes_nothing(checkout: Path) -> None:
    before = _snapshot(checkout)
    assert deps.stale(checkout) == []
    assert deps.rewrite(checkout) == []
    assert _snapshot(checkout) == before


def test_a_planted_stale_entry_is_named_and_make_deps_restores_the_imports(checkout: Path) -> None:
    build = checkout / "sparkseal/actions/BUILD"
    original = build.read_text()
    planted = original.replace(
        '    "oci_image_index": ["oci"],\n', '    "oci_image_index": ["oci", "tar"],\n'
    )
    assert planted != original
    build.write_text(planted)
    assert deps.stale(checkout) == [
        "sparkseal/actions/BUILD: ACTION_DEPS differs from the imports: run `make deps` and commit the result"
    ]
    assert deps.main(["--check", "--root", str(checkout)]) == 1
    assert build.read_text() == planted  # --check writes nothing
    assert deps.main(["--root", str(checkout)]) == 0
    assert build.read_text() == original
    assert deps.stale(checkout) == []


def test_the_lists_follow_a_module_that_moves(checkout: Path) -> None:
    """Moving a core module (and editing its importers) needs `make deps` only, never a hand edit."""
    core = checkout / "sparkseal/core"
    (core / "paths.py").rename(core / "layout.py")
    for path in [*core.glob("*.py"), *(checkout / "sparkseal").glob("*/*.py")]:
        text = path.read_text()
        moved = text.replace("sparkseal.core.paths", "sparkseal.core.layout").replace(
            "from sparkseal.core import paths", "from sparkseal.core import layout as paths"
        )
        if moved != text:
            path.write_text(moved)
    assert deps.stale(checkout) == [
        f"{path}: {name} differs from the imports: run `make deps` and commit the result"
        for path, name in PATHS_TABLES.items()
    ]
    assert deps.rewrite(checkout) == list(PATHS_TABLES)
    assert deps.stale(checkout) == []
    actions, core_table, helpers = (
        deps.action_deps(checkout),
        deps.core_deps(checkout),
        deps.helper_sources(checkout),
    )
    assert "paths" not in core_table and core_table["layout"] == []
    assert core_table["patchset"] == ["layout"]
    assert actions["vllm_patched_tree_overlay"] == ["layout", "patchset", "tree"]
    assert "sparkseal/core/layout.py" in helpers["sparkseal.fetch.series"]
    assert "sparkseal/core/paths.py" not in helpers["sparkseal.fetch.series"]
    text = (checkout / "sparkseal/core/BUILD").read_text()
    assert '    "layout": [],\n' in text and '"paths"' not in text


def test_an_import_the_table_cannot_name_stops_the_generator_and_writes_nothing(checkout: Path) -> None:
    action = checkout / "sparkseal/actions/sbom.py"
    action.write_text(action.read_text() + "\n\ndef extra():\n    from sparkseal.audit import compare\n")
    table = checkout / "sparkseal/actions/BUILD"
    table.write_text(table.read_text().replace('"sbom": ["locks", "oci", "sbom"]', '"sbom": []'))
    before = _snapshot(checkout)
    line = len(action.read_text().splitlines())
    with pytest.raises(deps.DepsError) as caught:
        deps.rewrite(checkout)
    assert str(caught.value) == (
        f"sparkseal/actions/sbom.py:{line}: imports sparkseal.audit.compare; expected a module of "
        "sparkseal/core, sparkseal/install, sparkseal/scan, the only ones its Bazel deps can name"
    )
    assert _snapshot(checkout) == before


def test_a_file_without_its_markers_is_named(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    helpers = checkout / "rules/private/helpers.bzl"
    helpers.write_text(helpers.read_text().replace(deps.END + "\n", ""))
    (checkout / "sparkseal/core/BUILD").write_text(
        (checkout / "sparkseal/core/BUILD").read_text().replace('"nccl": [],', '"nccl": ["tar"],')
    )
    before = _snapshot(checkout)
    assert deps.main(["--root", str(checkout)]) == 1
    assert capsys.readouterr().err == (
        f"make deps: rules/private/helpers.bzl: expected one block between the lines {deps.BEGIN!r} and "
        f"{deps.END!r}, found 1 start and 0 end lines\n"
    )
    assert _snapshot(checkout) == before  # the stale core table is not written either: all or nothing


def test_a_helper_that_names_no_module_is_an_error(checkout: Path) -> None:
    series = checkout / "rules/private/patch_series.bzl"
    series.write_text(series.read_text().replace('"sparkseal.fetch.series"', '"sparkseal.fetch.serie"'))
    with pytest.raises(deps.DepsError) as caught:
        deps.stale(checkout)
    assert str(caught.value) == (
        f"rules/private/patch_series.bzl: runs the helper sparkseal.fetch.serie, which is no module under "
        f"{checkout}"
    )


def test_render_keeps_short_lists_on_one_line() -> None:
    long = [f"module_{i:02d}" for i in range(12)]
    assert deps.render("T", {"a": [], "b": ["x", "y"], "c": long}) == "\n".join(
        [
            "T = {",
            '    "a": [],',
            '    "b": ["x", "y"],',
            '    "c": [',
            *(f'        "{m}",' for m in long),
            "    ],",
            "}",
        ]
    )
