"""sparkseal/devtools/rules_doc.py: docs/rules.md from the .bzl doc strings (the checkout, fixtures)."""

from __future__ import annotations

import ast
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from sparkseal.devtools import rules_doc
from tests.bazel_util import REPO


def test_the_rule_reference_is_up_to_date() -> None:
    """docs/rules.md is what `make rules-doc` writes from today's doc strings."""
    assert rules_doc.stale(REPO) == []


def test_every_public_rule_attribute_and_provider_field_has_a_doc() -> None:
    assert rules_doc.undocumented(rules_doc.read(REPO)) == []


def test_every_name_rules_defs_exports_has_a_section() -> None:
    tree = ast.parse((REPO / "rules/defs.bzl").read_text())
    exported = {n.targets[0].id for n in tree.body if isinstance(n, ast.Assign)}  # type: ignore[attr-defined]
    page = (REPO / "docs/rules.md").read_text()
    assert set(re.findall(r"^### (\S+)$", page, re.MULTILINE)) >= exported
    assert "### OciLayerInfo" in page  # returned by oci_layer, not exported: documented all the same


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "rules", tmp_path / "rules")
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "docs/rules.md", tmp_path / "docs/rules.md")
    return tmp_path


def test_a_changed_doc_string_makes_the_page_stale_until_make_rules_doc(checkout: Path) -> None:
    layer = checkout / "rules/private/python_venv.bzl"
    before = (
        '"path": attr.string(default = "/opt/venv", doc = "Path of the virtual environment in the image."),'
    )
    after = '"path": attr.string(default = "/opt/venv", doc = "Where the virtual environment goes."),'
    assert before in layer.read_text()
    layer.write_text(layer.read_text().replace(before, after))
    page = (checkout / "docs/rules.md").read_text()
    assert rules_doc.stale(checkout) == [
        "docs/rules.md differs from the doc strings of the .bzl files: run `make rules-doc` and commit the "
        "result"
    ]
    assert rules_doc.main(["--check", "--root", str(checkout)]) == 1
    assert (checkout / "docs/rules.md").read_text() == page  # --check writes nothing
    assert rules_doc.main(["--root", str(checkout)]) == 0
    written = (checkout / "docs/rules.md").read_text()
    assert '| `path` | String | `"/opt/venv"` | no | Where the virtual environment goes. |' in written
    assert (
        written.count("Path of the virtual environment in the image.")
        == page.count("Path of the virtual environment in the image.") - 1
    )
    assert rules_doc.stale(checkout) == []


def _fixture(root: Path, private: str) -> Path:
    (root / "rules/private").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "rules/defs.bzl").write_text(
        textwrap.dedent(
            """\
            \"\"\"Public API.\"\"\"

            load("//rules/private:thing.bzl", _THINGS = "THINGS", _TInfo = "TInfo", _thing = "thing")
            load("//rules/private:thing.bzl", _fetch_thing = "fetch_thing", _thing_set = "thing_set")

            THINGS = _THINGS
            TInfo = _TInfo
            fetch_thing = _fetch_thing
            thing = _thing
            thing_set = _thing_set
            """
        )
    )
    (root / "rules/private/thing.bzl").write_text(textwrap.dedent(private))
    return root


THING = """\
    \"\"\"A thing.\"\"\"

    load(":other.bzl", "ENVIRON")

    # The kinds of thing.
    THINGS = ["small", "large"]

    TInfo = provider(
        doc = "What a thing " +
              "writes.",
        fields = {"out": "File: the thing", "kind": "string: one of THINGS"},
    )

    _SHARED = attr.label(allow_single_file = [".json"], doc = "A shared lock.")

    def _impl(ctx):
        return [DefaultInfo(), TInfo(out = None, kind = ""), OutputGroupInfo(report = depset())]

    _thing = rule(
        implementation = _impl,
        doc = \"\"\"Writes `name.out`.

    Second paragraph.\"\"\",
        attrs = {
            "kind": attr.string(mandatory = True, values = [""] + THINGS, doc = "Which kind"),
            "deps": attr.label_list(providers = [[TInfo], [DefaultInfo]], doc = "Mo."),
            "lock": _SHARED,
            "env": attr.string_dict(doc = "Variables."),
            "keep": attr.bool(default = True, doc = "Keep it."),
            "_tool": attr.label(default = Label("//x:y")),
        },
    )

    def thing(name, visibility = None, **kwargs):
        \"\"\"A thing `name` and `name.check`.\"\"\"
        _thing(name = name, visibility = visibility, **kwargs)

    thing_set = rule(implementation = _impl, build_setting = config.string(flag = True), doc = "A flag.")

    fetch_thing = repository_rule(
        implementation = _fetch,
        doc = "Fetches a thing.",
        attrs = {"url": attr.string()},
        environ = ENVIRON + ["NETRC"],
    )
    """


def test_the_sections_say_what_the_bzl_files_say(tmp_path: Path) -> None:
    root = _fixture(tmp_path, THING)
    (root / "rules/private/other.bzl").write_text('ENVIRON = ["PIP_INDEX_URL"]\n')
    reference = rules_doc.read(root)
    page = rules_doc.render(reference)
    macro = page[page.index("### thing\n") : page.index("## Repository rules")]
    assert macro == textwrap.dedent(
        """\
        ### thing

        ```starlark
        thing(name, visibility = None, **kwargs)
        ```

        Macro in `rules/private/thing.bzl`.

        A thing `name` and `name.check`.

        The attributes of the rule it declares:

        | Attribute | Type | Default | Mandatory | Description |
        |---|---|---|---|---|
        | `name` | Name |  | yes | A unique name for this target. |
        | `kind` | String |  | yes | Which kind. One of `""`, `small`, `large`. |
        | `deps` | List of labels | `[]` | no | Mo. Targets must provide [`TInfo`](#tinfo) or `DefaultInfo`. |
        | `lock` | Label | `None` | no | A shared lock. Files (one file): `.json`. |
        | `env` | Dictionary: String -> String | `{}` | no | Variables. |
        | `keep` | Boolean | `True` | no | Keep it. |

        Returns: `DefaultInfo`, [`TInfo`](#tinfo), `OutputGroupInfo`.

        Output groups: `report`.

        """
    )
    assert "### TInfo\n\nProvider in `rules/private/thing.bzl`.\n\nWhat a thing writes.\n\n" in page
    assert "| `out` | File: the thing |\n| `kind` | string: one of THINGS |\n" in page
    assert "Re-runs when these environment variables change: `PIP_INDEX_URL`, `NETRC`." in page
    assert "A build setting: `config.string(flag = True)`." in page
    constant = "### THINGS\n\nConstant in `rules/private/thing.bzl`.\n\nThe kinds of thing.\n\n"
    assert constant + '```starlark\nTHINGS = ["small", "large"]\n```' in page
    assert rules_doc.undocumented(reference) == [
        "rules/private/thing.bzl: fetch_thing: attribute url has no doc"
    ]


def test_a_construct_the_reader_cannot_follow_is_named(tmp_path: Path) -> None:
    root = _fixture(
        tmp_path, THING.replace('"env": attr.string_dict(doc = "Variables."),', '"env": _attrs(),')
    )
    (root / "rules/private/other.bzl").write_text('ENVIRON = ["PIP_INDEX_URL"]\n')
    with pytest.raises(rules_doc.RulesDocError) as caught:
        rules_doc.read(root)
    assert str(caught.value) == (
        "rules/private/thing.bzl:28: thing: attribute env: expected attr.<type>(...), found _attrs()"
    )


def test_a_missing_loaded_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _fixture(tmp_path, THING)
    assert rules_doc.main(["--root", str(root)]) == 1
    assert (
        capsys.readouterr().err
        == f"make rules-doc: rules/private/other.bzl: loaded but not found under {root}\n"
    )
    assert not (root / "docs/rules.md").exists()


def test_a_macro_argument_its_doc_string_does_not_explain_is_named(tmp_path: Path) -> None:
    macro = THING.replace(
        "def thing(name, visibility = None, **kwargs):", "def thing(name, size, visibility = None, **kwargs):"
    ).replace('"url": attr.string()', '"url": attr.string(doc = "Where.")')
    root = _fixture(tmp_path, macro)
    (root / "rules/private/other.bzl").write_text('ENVIRON = ["PIP_INDEX_URL"]\n')
    assert rules_doc.undocumented(rules_doc.read(root)) == [
        "rules/private/thing.bzl: macro thing: argument size is not in its doc string's Args: section"
    ]
    args = "\n\n        Args:\n          size: how big,\n            in bytes.\n        "
    documented = macro.replace(
        '"""A thing `name` and `name.check`."""', f'"""A thing `name` and `name.check`.{args}"""'
    )
    (root / "rules/private/thing.bzl").write_text(textwrap.dedent(documented))
    reference = rules_doc.read(root)
    assert reference.macros[0].doc == "A thing `name` and `name.check`."
    assert reference.macros[0].arguments == [("size", "how big, in bytes.")]
    assert rules_doc.undocumented(reference) == []
    assert "| Argument | Description |\n|---|---|\n| `size` | how big, in bytes. |\n" in rules_doc.render(
        reference
    )
