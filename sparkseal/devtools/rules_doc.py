"""docs/rules.md, the rule reference, generated from the rules' and providers' own doc strings.

A Bazel user reads what ``//rules:defs.bzl`` exports (rules, repository rules, macros, providers,
constants) the way rules_oci and rules_img publish theirs: each rule's attributes with their type,
default, whether they are mandatory and their doc; what a rule returns (providers, output groups,
executable); each provider field by field. Stardoc would need a Java toolchain a 2-core CI machine does
not have offline, so this reads the ``.bzl`` files with Python's ``ast``: the Starlark these files use
(``load``, assignments, calls with keywords, string concatenation, ``def``) is Python syntax, and the
public API is followed through its ``load`` statements to the ``rule()``, ``repository_rule()``,
``provider()`` and ``def`` that define each name. The doc strings stay the one source: ``make rules-doc``
rewrites the page, ``tests/unit/test_rules_doc.py`` fails when the page is stale or a public attribute,
rule or provider field has no doc.

Only the standard library: it runs before any set-up, on any Python 3.11.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PUBLIC = "rules/defs.bzl"
PAGE = "docs/rules.md"
COMMAND = "make rules-doc"

# attr.<kind> -> (the type a reader sees, the default Bazel gives when the attribute sets none)
ATTR_TYPES = {
    "bool": ("Boolean", "False"),
    "int": ("Integer", "0"),
    "int_list": ("List of integers", "[]"),
    "label": ("Label", "None"),
    "label_list": ("List of labels", "[]"),
    "label_keyed_string_dict": ("Dictionary: Label -> String", "{}"),
    "output": ("Label (an output)", "None"),
    "output_list": ("List of labels (outputs)", "[]"),
    "string": ("String", '""'),
    "string_dict": ("Dictionary: String -> String", "{}"),
    "string_list": ("List of strings", "[]"),
    "string_list_dict": ("Dictionary: String -> List of strings", "{}"),
}
# Arguments every rule takes, whose meaning Bazel defines: a macro's doc need not explain them.
COMMON_ARGUMENTS = {"name", "visibility", "tags", "testonly"}
# Providers every rule may return that Bazel itself defines: named, never documented here.
BUILTIN_PROVIDERS = {"DefaultInfo", "OutputGroupInfo", "RunEnvironmentInfo", "platform_common.ToolchainInfo"}


class RulesDocError(Exception):
    """A .bzl construct the reader cannot follow: the message names the file and line."""


@dataclass
class Attr:
    name: str
    type: str
    default: str
    mandatory: bool
    doc: str
    constraints: str = ""  # what the attribute's declaration allows (values, providers, files)
    providers: list[str] = field(default_factory=list)  # the providers its targets must have


@dataclass
class Rule:
    name: str
    kind: str  # "rule" or "repository rule"
    path: str
    doc: str
    attrs: list[Attr]
    returns: list[str] = field(default_factory=list)
    output_groups: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Macro:
    name: str
    path: str
    signature: str
    doc: str
    wraps: Rule | None
    params: list[str] = field(default_factory=list)  # its arguments, **kwargs left out
    arguments: list[tuple[str, str]] = field(default_factory=list)  # the doc string's `Args:` section


@dataclass
class Provider:
    name: str
    path: str
    doc: str
    fields: list[tuple[str, str]]


@dataclass
class Constant:
    name: str
    path: str
    value: str
    doc: str


@dataclass
class Reference:
    rules: list[Rule] = field(default_factory=list)
    repository_rules: list[Rule] = field(default_factory=list)
    macros: list[Macro] = field(default_factory=list)
    providers: list[Provider] = field(default_factory=list)
    constants: list[Constant] = field(default_factory=list)


class Bzl:
    """One parsed .bzl file: its top-level definitions and what it loads."""

    def __init__(self, root: Path, path: str) -> None:
        self.path = path
        self.source = (root / path).read_text()
        self.lines = self.source.splitlines()
        try:
            tree = ast.parse(self.source, filename=path)
        except SyntaxError as error:
            raise RulesDocError(
                f"{path}:{error.lineno}: not the Starlark this reader follows: {error.msg}"
            ) from None
        self.defs: dict[str, ast.AST] = {}
        self.loads: dict[str, tuple[str, str]] = {}
        for node in tree.body:
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and _called(node.value) == "load"
            ):
                self._load(node.value)
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                self.defs[node.targets[0].id] = node
            elif isinstance(node, ast.FunctionDef):
                self.defs[node.name] = node

    def _load(self, call: ast.Call) -> None:
        path = bzl_path(_literal(call.args[0], self.path), Path(self.path).parent.as_posix())
        if path is None:
            return  # another repository's file: nothing this reference documents
        for arg in call.args[1:]:
            self.loads[_literal(arg, self.path)] = (path, _literal(arg, self.path))
        for keyword in call.keywords:
            self.loads[keyword.arg or ""] = (path, _literal(keyword.value, self.path))

    def comment_above(self, node: ast.AST) -> str:
        """The ``#`` comment lines right above a top-level statement, as its doc."""
        lines: list[str] = []
        number = node.lineno - 2  # type: ignore[attr-defined]
        while number >= 0 and self.lines[number].startswith("#"):
            lines.insert(0, self.lines[number].lstrip("#").strip())
            number -= 1
        return " ".join(lines)


def bzl_path(label: str, here: str) -> str | None:
    """The repository path of the .bzl file a ``load`` label names from a file in the folder ``here``
    (``//pkg:f.bzl``, ``@//pkg:f.bzl``, ``:f.bzl``); None for another repository's file."""
    label = label.removeprefix("@")
    if label.startswith("//"):
        package, _, name = label[2:].partition(":")
        return f"{package}/{name}"
    if label.startswith(":"):
        return f"{here}/{label[1:]}"
    return None


def _called(call: ast.Call) -> str:
    """The dotted name a call calls (``rule``, ``attr.string``), or "" for anything else."""
    try:
        return ast.unparse(call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else ""
    except ValueError:
        return ""


def _literal(node: ast.expr, path: str = "") -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise RulesDocError(f"{path}:{node.lineno}: expected a string literal, found {ast.unparse(node)}")


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _starlark(node: ast.expr) -> str:
    """An expression as Starlark writes it (double-quoted strings, True/False/None)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return json.dumps(node.value)
    if isinstance(node, ast.List):
        return "[" + ", ".join(_starlark(e) for e in node.elts) + "]"
    if isinstance(node, ast.Dict):
        items = (f"{_starlark(k)}: {_starlark(v)}" for k, v in zip(node.keys, node.values, strict=True) if k)
        return "{" + ", ".join(items) + "}"
    if isinstance(node, ast.Call):
        args = [_starlark(a) for a in node.args] + [f"{k.arg} = {_starlark(k.value)}" for k in node.keywords]
        return f"{ast.unparse(node.func)}({', '.join(args)})"
    return ast.unparse(node)


class Reader:
    """Reads the .bzl files of a checkout, each once, and follows names through their loads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, Bzl] = {}

    def bzl(self, path: str) -> Bzl:
        if path not in self.files:
            if not (self.root / path).is_file():
                raise RulesDocError(f"{path}: loaded but not found under {self.root}")
            self.files[path] = Bzl(self.root, path)
        return self.files[path]

    def resolve(self, path: str, name: str) -> tuple[Bzl, ast.AST]:
        """The file and statement that define ``name`` as seen from ``path`` (through loads and aliases)."""
        for _ in range(50):
            module = self.bzl(path)
            if name in module.loads:
                path, name = module.loads[name]
                continue
            if name not in module.defs:
                raise RulesDocError(f"{path}: {name} is neither defined nor loaded there")
            node = module.defs[name]
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
                name = node.value.id
                continue
            return module, node
        raise RulesDocError(f"{path}: {name}: more than 50 loads and aliases to follow")

    def evaluate(self, module: Bzl, node: ast.expr) -> object:
        """A constant expression's value: literals, lists, ``+``, and names of constants (through loads)."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return [self.evaluate(module, e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {
                self.evaluate(module, k): self.evaluate(module, v)  # type: ignore[misc]
                for k, v in zip(node.keys, node.values, strict=True)
                if k is not None
            }
        if isinstance(node, ast.Call) and len(node.args) == 1 and _called(node) in {"sorted", "list"}:
            value = self.evaluate(module, node.args[0])
            return sorted(value) if _called(node) == "sorted" else list(value)  # type: ignore[call-overload]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
            owner = self.evaluate(module, node.func.value)
            if isinstance(owner, dict) and node.func.attr in {"keys", "values"}:
                return list(getattr(owner, node.func.attr)())
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.evaluate(module, node.left) + self.evaluate(module, node.right)  # type: ignore[operator]
        if isinstance(node, ast.Name):
            home, statement = self.resolve(module.path, node.id)
            if isinstance(statement, ast.Assign):
                return self.evaluate(home, statement.value)
        raise RulesDocError(f"{module.path}:{node.lineno}: expected a constant, found {ast.unparse(node)}")

    def text(self, module: Bzl, node: ast.expr) -> str:
        """A doc string's value (a literal, or strings and string constants joined with ``+``)."""
        value = self.evaluate(module, node)
        if not isinstance(value, str):
            raise RulesDocError(
                f"{module.path}:{node.lineno}: expected a doc string, found {ast.unparse(node)}"
            )
        return value

    def doc(self, module: Bzl, call: ast.Call) -> str:
        value = _keywords(call).get("doc")
        return inspect.cleandoc(self.text(module, value)) if value is not None else ""

    def rule(self, name: str, module: Bzl, call: ast.Call) -> Rule:
        kind = "repository rule" if _called(call) == "repository_rule" else "rule"
        keywords = _keywords(call)
        attrs = [
            Attr(
                "name",
                "Name",
                "",
                True,
                "A unique name for this repository."
                if kind == "repository rule"
                else "A unique name for this target.",
            )
        ]
        spec = keywords.get("attrs")
        if spec is not None and not isinstance(spec, ast.Dict):
            raise RulesDocError(
                f"{module.path}:{spec.lineno}: {name}: expected attrs = {{...}}, found {ast.unparse(spec)}"
            )
        for key, value in zip(spec.keys if spec else [], spec.values if spec else [], strict=True):
            attr_name = _literal(key, module.path) if key is not None else ""
            if attr_name.startswith("_") or not attr_name:
                continue
            attrs.append(self.attr(module, name, attr_name, value))
        rule = Rule(name, kind, module.path, self.doc(module, call), attrs)
        if "build_setting" in keywords:
            rule.notes.append(f"A build setting: `{_starlark(keywords['build_setting'])}`.")
        for flag, note in (("executable", "Executable: `bazel run` runs it."), ("test", "A test rule.")):
            value = keywords.get(flag)
            if isinstance(value, ast.Constant) and value.value is True:
                rule.notes.append(note)
        if "environ" in keywords:
            names = self.evaluate(module, keywords["environ"])
            rule.notes.append(
                "Re-runs when these environment variables change: " + ", ".join(f"`{n}`" for n in names) + "."  # type: ignore[union-attr]
            )
        implementation = keywords.get("implementation")
        if isinstance(implementation, ast.Name) and kind == "rule":
            _, function = self.resolve(module.path, implementation.id)
            returned: list[str] = []
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    called = _called(node)
                    if called.endswith("Info") and called not in returned:
                        returned.append(called)
                    if called == "OutputGroupInfo":
                        rule.output_groups += [
                            k.arg for k in node.keywords if k.arg and k.arg not in rule.output_groups
                        ]
            rule.returns = returned
        return rule

    def attr(self, module: Bzl, rule: str, name: str, value: ast.expr) -> Attr:
        if isinstance(value, ast.Name):  # one attr.<type>(...) shared by several attributes
            module, statement = self.resolve(module.path, value.id)
            value = statement.value if isinstance(statement, ast.Assign) else value
        if not isinstance(value, ast.Call) or not _called(value).startswith("attr."):
            raise RulesDocError(
                f"{module.path}:{value.lineno}: {rule}: attribute {name}: expected attr.<type>(...), "
                f"found {ast.unparse(value)}"
            )
        kind = _called(value).removeprefix("attr.")
        if kind not in ATTR_TYPES:
            raise RulesDocError(
                f"{module.path}:{value.lineno}: {rule}: attribute {name}: unknown type attr.{kind}"
            )
        type_name, default = ATTR_TYPES[kind]
        keywords = _keywords(value)
        doc = self.doc(module, value)
        extras = []
        providers: list[str] = []
        if "values" in keywords:
            values = self.evaluate(module, keywords["values"])
            shown = [f"`{json.dumps(v)}`" if v == "" else f"`{v}`" for v in values]  # type: ignore[attr-defined]
            extras.append("One of " + ", ".join(shown) + ".")
        if isinstance(keywords.get("providers"), ast.List):
            # [A, B]: both; [[A], [B]]: either
            elements = keywords["providers"].elts  # type: ignore[union-attr]
            groups = [g.elts if isinstance(g, ast.List) else [g] for g in elements]
            providers = [ast.unparse(p) for g in groups for p in g]
            if all(isinstance(g, ast.List) for g in elements):
                wanted = " or ".join(" and ".join(_provider_link(ast.unparse(p)) for p in g) for g in groups)
            else:
                wanted = " and ".join(_provider_link(ast.unparse(p)) for p in elements)
            extras.append(f"Targets must provide {wanted}.")
        for files in ("allow_single_file", "allow_files"):
            allowed = self.evaluate(module, keywords[files]) if files in keywords else None
            one = " (one file)" if files == "allow_single_file" else ""
            if isinstance(allowed, list):
                extras.append(f"Files{one}: " + ", ".join(f"`{e}`" for e in allowed) + ".")
            elif allowed is True:
                extras.append(f"Files{one}: any.")
        mandatory = keywords.get("mandatory")
        is_mandatory = isinstance(mandatory, ast.Constant) and mandatory.value is True
        return Attr(
            name,
            type_name,
            _starlark(keywords["default"]) if "default" in keywords else "" if is_mandatory else default,
            is_mandatory,
            doc,
            " ".join(extras),
            providers,
        )

    def provider(self, name: str, module: Bzl, call: ast.Call) -> Provider:
        fields: list[tuple[str, str]] = []
        spec = _keywords(call).get("fields")
        if isinstance(spec, ast.Dict):
            fields = [
                (_literal(k, module.path), self.text(module, v))
                for k, v in zip(spec.keys, spec.values, strict=True)
                if k
            ]
        elif isinstance(spec, (ast.List, ast.Tuple)):
            fields = [(_literal(e, module.path), "") for e in spec.elts]
        return Provider(name, module.path, self.doc(module, call), fields)

    def macro(self, name: str, module: Bzl, function: ast.FunctionDef) -> Macro:
        arguments = function.args
        defaults = [None] * (len(arguments.args) - len(arguments.defaults)) + list(arguments.defaults)
        params = [
            a.arg if d is None else f"{a.arg} = {_starlark(d)}"
            for a, d in zip(arguments.args, defaults, strict=True)
        ]
        if arguments.kwarg:
            params.append(f"**{arguments.kwarg.arg}")
        wraps = None
        # A private rule of the macro's own (`_oci_image`): its attributes are the macro's arguments.
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id.startswith("_")
            ):
                home, statement = self.resolve(module.path, node.func.id)
                value = statement.value if isinstance(statement, ast.Assign) else None
                if isinstance(value, ast.Call) and _called(value) == "rule":
                    wraps = self.rule(name, home, value)
                    break
        doc, documented = _split_args(inspect.cleandoc(ast.get_docstring(function) or ""))
        return Macro(
            name,
            module.path,
            f"{name}({', '.join(params)})",
            doc,
            wraps,
            [a.arg for a in arguments.args],
            documented,
        )


def _split_args(doc: str) -> tuple[str, list[tuple[str, str]]]:
    """A macro's doc string without its ``Args:`` section, and that section as (argument, description)."""
    head, found, tail = doc.partition("\nArgs:\n")
    if not found:
        return doc, []
    arguments: list[tuple[str, str]] = []
    for line in tail.splitlines():
        entry = re.match(r"\s{0,4}(\w+): (.*)", line)
        if entry:
            arguments.append((entry.group(1), entry.group(2).strip()))
        elif arguments and line.strip():
            arguments[-1] = (arguments[-1][0], f"{arguments[-1][1]} {line.strip()}")
    return head.rstrip(), arguments


def read(root: Path) -> Reference:
    """Every name ``rules/defs.bzl`` exports, each read from the statement that defines it."""
    reader = Reader(root)
    public = reader.bzl(PUBLIC)
    reference = Reference()
    providers: dict[str, Provider] = {}
    exported = sorted(n for n in public.defs if not n.startswith("_"))
    for name in exported:
        module, node = reader.resolve(PUBLIC, name)
        call = node.value if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) else None
        called = _called(call) if call is not None else ""
        if isinstance(node, ast.FunctionDef):
            reference.macros.append(reader.macro(name, module, node))
        elif called == "rule":
            reference.rules.append(reader.rule(name, module, call))  # type: ignore[arg-type]
        elif called == "repository_rule":
            reference.repository_rules.append(reader.rule(name, module, call))  # type: ignore[arg-type]
        elif called == "provider":
            providers[name] = reader.provider(name, module, call)  # type: ignore[arg-type]
        elif isinstance(node, ast.Assign):
            reference.constants.append(
                Constant(name, module.path, _starlark(node.value), module.comment_above(node))
            )
        else:
            raise RulesDocError(f"{module.path}: {name}: expected a rule, provider, macro or constant")
    # The providers the public rules return, too: a user reads their fields from the targets.
    for rule in [*reference.rules, *(m.wraps for m in reference.macros if m.wraps)]:
        for returned in [*rule.returns, *(p for a in rule.attrs for p in a.providers)]:
            if returned in BUILTIN_PROVIDERS or returned in providers:
                continue
            module, node = reader.resolve(rule.path, returned)
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and _called(node.value) == "provider"
            ):
                providers[returned] = reader.provider(returned, module, node.value)
    reference.providers = [providers[n] for n in sorted(providers)]
    return reference


def undocumented(reference: Reference) -> list[str]:
    """Every public rule, attribute, macro and provider field without a doc: one line each."""
    missing = []
    rules = [*reference.rules, *reference.repository_rules, *(m.wraps for m in reference.macros if m.wraps)]
    for rule in rules:
        if not rule.doc:
            missing.append(f"{rule.path}: {rule.kind} {rule.name} has no doc")
        missing += [
            f"{rule.path}: {rule.name}: attribute {a.name} has no doc" for a in rule.attrs if not a.doc
        ]
    for macro in reference.macros:
        if not macro.doc:
            missing.append(f"{macro.path}: macro {macro.name} has no doc string")
        covered = {a.name for a in macro.wraps.attrs} if macro.wraps else set()
        missing += [
            f"{macro.path}: macro {macro.name}: argument {p} is not in its doc string's Args: section"
            for p in macro.params
            if p not in covered | COMMON_ARGUMENTS | {name for name, _ in macro.arguments}
        ]
    for provider in reference.providers:
        if not provider.doc:
            missing.append(f"{provider.path}: provider {provider.name} has no doc")
        missing += [
            f"{provider.path}: {provider.name}: field {f} has no doc" for f, d in provider.fields if not d
        ]
    missing += [
        f"{c.path}: constant {c.name} has no comment above it" for c in reference.constants if not c.doc
    ]
    return missing


def _cell(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes escaped."""
    return re.sub(r"\s*\n\s*", " ", text).replace("|", "\\|")


def _rule_section(rule: Rule, title: str, signature: str) -> list[str]:
    lines = [f"### {title}", "", "```starlark", signature, "```", ""]
    lines += [f"{rule.kind.capitalize()} in `{rule.path}`.", ""]
    if rule.doc:
        lines += [rule.doc, ""]
    return lines + _attributes(rule)


def _attributes(rule: Rule) -> list[str]:
    """The attribute table of a rule and what it returns."""
    lines = ["| Attribute | Type | Default | Mandatory | Description |", "|---|---|---|---|---|"]
    for a in rule.attrs:
        default = f"`{_cell(a.default)}`" if a.default else ""
        doc = a.doc + ("" if not a.constraints or a.doc.endswith((".", ":", "!", "?")) else ".")
        text = " ".join(filter(None, [doc, a.constraints]))
        lines.append(
            f"| `{a.name}` | {a.type} | {default} | {'yes' if a.mandatory else 'no'} | {_cell(text)} |"
        )
    lines.append("")
    if rule.returns:
        lines += ["Returns: " + ", ".join(_provider_link(p) for p in rule.returns) + ".", ""]
    if rule.output_groups:
        lines += ["Output groups: " + ", ".join(f"`{g}`" for g in rule.output_groups) + ".", ""]
    if rule.notes:
        lines += [*rule.notes, ""]
    return lines


def _provider_link(name: str) -> str:
    return f"`{name}`" if name in BUILTIN_PROVIDERS else f"[`{name}`](#{name.lower()})"


def render(reference: Reference) -> str:
    """The whole page."""
    lines = [
        "# Rule reference",
        "",
        f"<!-- Generated by `{COMMAND}` (sparkseal/devtools/rules_doc.py) from the doc strings of the .bzl "
        "files: do not edit; edit the doc strings and rerun. -->",
        "",
        f"Everything `{PUBLIC}` exports, read from the `doc` of each rule, attribute and provider field (and "
        "the doc string of each macro). Load what you use from it:",
        "",
        "```starlark",
        'load("//rules:defs.bzl", "oci_image", "oci_layer")',
        "```",
        "",
        "How the rules make the image together is [How a build works](building.md#how-a-build-works).",
        "",
    ]
    sections = [
        ("Rules", [r.name for r in reference.rules]),
        ("Macros", [m.name for m in reference.macros]),
        ("Repository rules", [r.name for r in reference.repository_rules]),
        ("Providers", [p.name for p in reference.providers]),
        ("Constants", [c.name for c in reference.constants]),
    ]
    for title, names in sections:
        anchor = title.lower().replace(" ", "-")
        lines.append(f"- [{title}](#{anchor}): " + ", ".join(f"[`{n}`](#{n.lower()})" for n in names))
    lines.append("")
    lines += ["## Rules", ""]
    for rule in reference.rules:
        lines += _rule_section(rule, rule.name, f"{rule.name}({', '.join(a.name for a in rule.attrs)})")
    lines += ["## Macros", ""]
    for macro in reference.macros:
        lines += [f"### {macro.name}", "", "```starlark", macro.signature, "```", ""]
        lines += [f"Macro in `{macro.path}`.", "", macro.doc, ""]
        if macro.arguments:
            lines += ["| Argument | Description |", "|---|---|"]
            lines += [f"| `{name}` | {_cell(text)} |" for name, text in macro.arguments]
            lines.append("")
        if macro.wraps:
            lines += ["The attributes of the rule it declares:", ""]
            lines += _attributes(macro.wraps)
    lines += ["## Repository rules", ""]
    for rule in reference.repository_rules:
        lines += _rule_section(rule, rule.name, f"{rule.name}({', '.join(a.name for a in rule.attrs)})")
    lines += ["## Providers", ""]
    for provider in reference.providers:
        lines += [f"### {provider.name}", "", f"Provider in `{provider.path}`.", "", provider.doc, ""]
        lines += ["| Field | Description |", "|---|---|"]
        lines += [f"| `{name}` | {_cell(doc)} |" for name, doc in provider.fields]
        lines.append("")
    lines += ["## Constants", ""]
    for constant in reference.constants:
        lines += [f"### {constant.name}", "", f"Constant in `{constant.path}`.", "", constant.doc, ""]
        lines += ["```starlark", f"{constant.name} = {constant.value}", "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def stale(root: Path) -> list[str]:
    """One line when docs/rules.md differs from what the doc strings say (none: it is up to date)."""
    page = root / PAGE
    want = render(read(root))
    if not page.is_file() or page.read_text() != want:
        return [
            f"{PAGE} differs from the doc strings of the .bzl files: run `{COMMAND}` and commit the result"
        ]
    return []


def write(root: Path) -> bool:
    """Write docs/rules.md atomically (through a temporary file) when it changed; True when written."""
    page = root / PAGE
    text = render(read(root))
    if page.is_file() and page.read_text() == text:
        return False
    handle, temporary = tempfile.mkstemp(dir=page.parent, prefix=f".{page.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, page)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m sparkseal.devtools.rules_doc",
        description=f"Write {PAGE} from the doc strings of what {PUBLIC} exports (what `{COMMAND}` runs).",
    )
    parser.add_argument("--check", action="store_true", help=f"change nothing; exit 1 when {PAGE} is stale")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale(args.root)
            for line in problems:
                print(line, file=sys.stderr)
            return 1 if problems else 0
        if write(args.root):
            print(f"{COMMAND}: rewrote {PAGE}")
    except RulesDocError as error:
        print(f"{COMMAND}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
