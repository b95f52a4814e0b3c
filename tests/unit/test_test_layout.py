"""Every unit test module is named after what it tests, so "where is X tested" is one hop.

``tests/unit/test_X.py`` tests the module (or package) ``X`` of ``sparkseal/``, ``bench/`` or a helper of
``tests/``; where two modules share a name, ``X`` is ``<package>_<module>`` (``test_core_pgzip.py`` for
``sparkseal/core/pgzip.py``, not ``bench/pgzip.py``). The few modules that test the repository as a whole,
or await a rename, are listed here with the reason, and the list is checked not to go stale.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "tests" / "unit"
SOURCE_ROOTS = ("sparkseal", "bench", "tests")

# Test modules whose name is no source module's, and why.
WHOLE_REPOSITORY = {
    "test_hygiene": "the repository's lint, layers, imports and Bazel dependency lists",
    "test_docs": "every page of docs/ and README.md: links, commands, tables",
    "test_bench_scripts": "every benchmark program's command line",
    "test_test_layout": "this naming rule over tests/unit/",
    "test_host_reads": "what rules/ and the actions read from the build host, against docs/building.md",
}


def source_names() -> set[str]:
    """The names a test module may carry: each module's and package's, alone and after its package's."""
    names: set[str] = set()
    for root in SOURCE_ROOTS:
        for path in (REPO / root).rglob("*.py"):
            if path.stem.startswith("test_") or path.stem in {"conftest", "__main__"}:
                continue
            if path.stem == "__init__":
                path = path.parent
            names.add(path.stem)
            names.add(f"{path.parent.name}_{path.stem}")
    return names


def test_every_unit_test_module_names_a_source_module() -> None:
    names = source_names()
    unnamed = sorted(
        path.name
        for path in UNIT.glob("test_*.py")
        if path.stem.removeprefix("test_") not in names and path.stem not in WHOLE_REPOSITORY
    )
    assert unnamed == [], (
        f"{UNIT}: these test modules name no module of {', '.join(SOURCE_ROOTS)}: {unnamed}; name each "
        "test_<module>.py (test_<package>_<module>.py where two modules share the name), or list it in "
        "WHOLE_REPOSITORY of tests/unit/test_test_layout.py with the reason"
    )


def test_the_list_of_whole_repository_tests_is_not_stale() -> None:
    names = source_names()
    present = {path.stem for path in UNIT.glob("test_*.py")}
    missing = sorted(set(WHOLE_REPOSITORY) - present)
    named = sorted(stem for stem in WHOLE_REPOSITORY if stem.removeprefix("test_") in names)
    assert (missing, named) == ([], []), (
        f"WHOLE_REPOSITORY of tests/unit/test_test_layout.py: {missing} are no file of {UNIT}, and {named} "
        "name a source module; take them off the list"
    )
