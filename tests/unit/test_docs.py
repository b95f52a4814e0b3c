"""The docs stay true: links and anchors lead somewhere, named paths exist, named commands run.

``README.md`` and ``docs/*.md`` link to each other and name repository paths, ``sparkseal`` commands,
benchmark scripts, ``make`` targets and Bazel labels and configs. When a file moves or a command is renamed,
the check names the page and the line: every relative link leads to a file and its ``#fragment`` to one of
that page's headings (GitHub's anchor rules); every repository path written alone in backticks exists; every
``sparkseal ...``, ``python3 -m ...`` (of this repository's packages) and ``python3 bench/...`` command
answers ``--help`` with exit 0, and every ``--option`` written after a ``sparkseal`` command is one it
accepts; every ``make`` target is in the Makefile; every Bazel label names a package
with a BUILD file that declares the target (by name, or by the ``"prefix_" + platform`` of its macros), and
every ``--config`` is in ``.bazelrc``. No Bazel runs: the labels are read from the BUILD files.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkseal.core.platforms import PLATFORMS

REPO = Path(__file__).resolve().parents[2]
# Top-level folders whose paths the docs name; a backticked `folder/...` must exist.
PATH_ROOTS = (
    ".ci",
    "bench",
    "docs",
    "kernels_sm121",
    "overlay",
    "patches",
    "platforms",
    "rules",
    "sparkseal",
)
PATH_ROOTS += ("tests", "third_party")
# Python packages of this repository that `python3 -m PACKAGE.module` may name.
OUR_PACKAGES = {"sparkseal", "tests", "bench"}
PLACEHOLDER = re.compile(r"[<>{}*…$]|\.\.\.")


def pages(root: Path) -> list[str]:
    """README.md and every page of docs/, as repository paths."""
    return ["README.md", *(f"docs/{p.name}" for p in sorted((root / "docs").glob("*.md")))]


@dataclass
class Page:
    """What a Markdown page holds, each item with its line number."""

    headings: list[str] = field(default_factory=list)
    links: list[tuple[int, str]] = field(default_factory=list)
    spans: list[tuple[int, str]] = field(default_factory=list)
    code_lines: list[tuple[int, str]] = field(default_factory=list)


def parse(text: str) -> Page:
    """Headings, inline links and code spans of the prose, and the lines of fenced code blocks."""
    page = Page()
    prose: list[str] = []
    fence: str | None = None
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and marker:
            fence = marker.group(1)
            prose.append("")
            continue
        if fence is not None:
            if stripped.startswith(fence) and not stripped[len(fence) :].strip():
                fence = None
            else:
                # a shell line continued with a backslash is one command, at the line where it starts
                start = start or number
                joined = pending + line.rstrip().removesuffix("\\")
                if line.rstrip().endswith("\\"):
                    pending = joined + " "
                else:
                    page.code_lines.append((start, joined))
                    pending, start = "", 0
            prose.append("")
            continue
        prose.append(line)
        heading = re.match(r"#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
        if heading:
            page.headings.append(heading.group(1))
    body = "\n".join(prose)
    blanked = body
    for span in re.finditer(r"(`+)(.+?)\1", body, re.DOTALL):
        line = body.count("\n", 0, span.start()) + 1
        page.spans.append((line, " ".join(span.group(2).split())))
        blanked = blanked[: span.start()] + re.sub(r"[^\n]", " ", span.group(0)) + blanked[span.end() :]
    for link in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", blanked):
        page.links.append((blanked.count("\n", 0, link.start()) + 1, link.group(1)))
    return page


def anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Page) -> set[str]:
    """Every heading's id, repeated headings numbered as GitHub numbers them (``x``, ``x-1``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in page.headings:
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


# The key under which a command's node holds the options it accepts (no subcommand is named so).
OPTIONS = "--"


def _command_tree(parser: argparse.ArgumentParser) -> dict[str, dict]:
    tree: dict[str, dict] = {}
    options = {option for action in parser._actions for option in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            tree = {name: _command_tree(sub) for name, sub in action.choices.items()}
    tree[OPTIONS] = {option: {} for option in options}
    return tree


def sparkseal_commands() -> dict[str, dict]:
    """The ``sparkseal`` command's subcommands, nested (``{"provenance": {"check": {...}, ...}, ...}``),
    each node with the options that command accepts under ``OPTIONS``."""
    from sparkseal.cli import build_parser

    return _command_tree(build_parser())


@dataclass
class Findings:
    """What the docs name: problems found without running anything, and the commands to run."""

    problems: list[str] = field(default_factory=list)
    commands: dict[tuple[str, ...], str] = field(default_factory=dict)  # argv after python -> first place


def _segments(code: str, fenced: bool) -> list[str]:
    if fenced:
        code = re.sub(r"(^|\s)#.*$", "", code)
    return [s.strip() for s in re.split(r"&&|\|\||;|\|", code) if s.strip()]


def _words(segment: str) -> list[str]:
    words = segment.split()
    while words and (words[0] == "$" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0])):
        words = words[1:]
    return words


def _is_python(word: str) -> bool:
    return re.fullmatch(r"(?:\S*/)?python3?(?:\.\d+)?", word) is not None


def _make_targets(root: Path) -> set[str]:
    text = (root / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE))


def _bazelrc_configs(root: Path) -> set[str]:
    text = (root / ".bazelrc").read_text() if (root / ".bazelrc").exists() else ""
    return set(re.findall(r"^\w+:([\w-]+)\s", text, re.MULTILINE))


def label_problem(root: Path, label: str) -> str | None:
    """Why ``label`` names nothing in ``root`` (no BUILD file, no such target), or None."""
    package, _, name = label[2:].partition(":")
    build = next(
        (root / package / n for n in ("BUILD", "BUILD.bazel") if (root / package / n).is_file()), None
    )
    if build is None:
        return f"{label}: no BUILD file in {package or 'the top folder'}"
    if not name or (root / package / name).exists():
        return None  # a package, or a source file of it
    text = build.read_text()
    macro = root / "rules/private/image.bzl"
    if not package and macro.is_file():
        # The top BUILD's per-platform image targets are declared by the sparkseal_image macro it calls.
        text += macro.read_text()
    candidates = [name]
    if "." in name:
        candidates.append(name.rpartition(".")[0])  # .load, .push and the like come with their target
    for candidate in candidates:
        if f'"{candidate}"' in text:
            return None
        for platform in PLATFORMS:
            stem = re.escape(candidate.removesuffix(platform))
            if candidate.endswith(f"_{platform}") and re.search(
                rf'":?{stem}"\s*\+\s*platform|"{stem}%s"\s*%\s*platform', text
            ):
                return None
    return f"{label}: {build.relative_to(root)} declares no target {name!r}"


def path_problems(root: Path, code: str) -> list[str]:
    """Why a repository path among the words of ``code`` names nothing: it does not exist, or its first
    folder is a misspelling of one of :data:`PATH_ROOTS` (``test/unit/x.py``, ``sparksel/cli.py``).

    A path alone is read whole; in a longer span or a command, every word that names a file (``pytest
    tests/unit/test_x.py``) or a folder ending in ``/``: a name like the registry repository
    ``sparkseal/vllm`` in a message is no path. A ``--flag=`` before a path, a ``:LINE`` or ``::test``
    after it, quotes, brackets and trailing punctuation are not part of it. Paths of other trees
    (``vllm/v1/...``, ``/usr/bin``) and placeholders are left alone.
    """
    problems = []
    words = code.split()
    for word in words:
        # `(path):` and `path),` in a quoted message: the closing bracket comes before the punctuation
        path = re.sub(r"^--?[\w-]+=", "", word.strip("\"'()[]")).rstrip(".,:;\"')]")
        path = re.sub(r"(?:::\S*|:\d+(?::\d+)?)$", "", path)
        if "/" not in path or path.startswith("/") or "://" in path or PLACEHOLDER.search(path):
            continue
        if len(words) > 1 and not path.endswith("/") and "." not in path.rsplit("/", 1)[-1]:
            continue
        first = path.split("/")[0]
        if first in PATH_ROOTS:
            if not (root / path).exists():
                problems.append(f"{path} does not exist")
        elif first and not (root / first).exists():
            close = difflib.get_close_matches(first, PATH_ROOTS, n=1, cutoff=0.8)
            if close:
                problems.append(f"{path} does not exist: no folder {first}/ (did you mean {close[0]}/?)")
    return problems


def check(root: Path, names: list[str]) -> Findings:
    """Everything the pages ``names`` of ``root`` link to and name, checked without running a command."""
    findings = Findings()
    parsed = {name: parse((root / name).read_text()) for name in names}
    targets = _make_targets(root)
    configs = _bazelrc_configs(root)
    tree = sparkseal_commands()
    for name, page in parsed.items():
        for line, target in page.links:
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto: ...
            path, _, fragment = target.partition("#")
            file = (root / name).parent / path if path else root / name
            if not file.exists():
                findings.problems.append(f"{name}:{line}: link to {target}: {path} does not exist")
                continue
            if fragment and file.suffix == ".md":
                known = anchors(
                    parsed.get(str(file.resolve().relative_to(root.resolve())), parse(file.read_text()))
                )
                if fragment not in known:
                    problem = f"{file.relative_to(root)} has no heading #{fragment}"
                    findings.problems.append(f"{name}:{line}: link to {target}: {problem}")
        codes = [(line, code, False) for line, code in page.spans]
        codes += [(line, code, True) for line, code in page.code_lines]
        for line, code, fenced in codes:
            findings.problems += [f"{name}:{line}: {problem}" for problem in path_problems(root, code)]
            for config in re.findall(r"--config=([\w-]+)", code):
                if config not in configs:
                    findings.problems.append(f"{name}:{line}: --config={config} is not in .bazelrc")
            for label in re.findall(r"(?<![\w:/@])//[^\s`'\"(),;=\]]*", code):
                label = label.rstrip(".:")
                if PLACEHOLDER.search(label):
                    continue
                problem = label_problem(root, label)
                if problem:
                    findings.problems.append(f"{name}:{line}: {problem}")
            for segment in _segments(code, fenced):
                _command(findings, tree, targets, _words(segment), f"{name}:{line}")
    for name in names:
        if name != "README.md" and not any(
            (root / "README.md").parent / target.partition("#")[0] == root / name
            for _, target in parsed["README.md"].links
        ):
            findings.problems.append(f"README.md: does not link to {name}")
    return findings


def _command(
    findings: Findings, tree: dict[str, dict], targets: set[str], words: list[str], where: str
) -> None:
    if not words:
        return
    if words[0] == "sparkseal":
        _sparkseal(findings, tree, words[1:], where)
    elif "--entrypoint" in words[:-2] and words[words.index("--entrypoint") + 1] == "sparkseal":
        # `podman run ... --entrypoint sparkseal IMAGE COMMAND ...`: the image's own sparkseal
        _sparkseal(findings, tree, words[words.index("--entrypoint") + 3 :], where)
    elif _is_python(words[0]) and len(words) > 2 and words[1] == "-m":
        module = words[2]
        if module == "sparkseal":
            _sparkseal(findings, tree, words[3:], where)
        elif module.split(".")[0] in OUR_PACKAGES:
            findings.commands.setdefault(("-m", module, "--help"), where)
    elif _is_python(words[0]) and len(words) > 1 and re.fullmatch(r"bench/[\w/]+\.py", words[1]):
        findings.commands.setdefault((words[1], "--help"), where)
    elif words[0] == "make":
        for word in words[1:]:
            if word.startswith("-") or "=" in word:
                continue
            if word not in targets:
                findings.problems.append(f"{where}: make {word}: no such target in the Makefile")


def _sparkseal(findings: Findings, tree: dict[str, dict], words: list[str], where: str) -> None:
    if not words or not re.fullmatch(r"[a-z][a-z-]*", words[0]):
        return  # `sparkseal` alone, or a placeholder
    path: list[str] = []
    node = tree
    for word in words:
        if word == OPTIONS or word not in node:
            break
        path.append(word)
        node = node[word]
    if not path:
        findings.problems.append(f"{where}: sparkseal {words[0]}: no such command")
        return
    following = words[len(path)] if len(words) > len(path) else ""
    if set(node) - {OPTIONS} and re.fullmatch(r"[a-z][a-z-]*", following):
        # A command with subcommands takes one next: a plain word there is a misspelt one.
        findings.problems.append(f"{where}: sparkseal {' '.join([*path, following])}: no such command")
        return
    findings.commands.setdefault(("-m", "sparkseal", *path, "--help"), where)
    # Every option written after the command is one it accepts (`[--json]` and `--key=VALUE` alike).
    for word in words[len(path) :]:
        option = re.match(r"\[?(--[a-z][a-z0-9-]*)", word)
        if option and option.group(1) not in node[OPTIONS]:
            command = " ".join(path)
            findings.problems.append(f"{where}: sparkseal {command}: no option {option.group(1)}")


def test_links_anchors_paths_targets_and_labels_are_alive() -> None:
    assert check(REPO, pages(REPO)).problems == []


def _run(argv: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess[str]]:
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    return argv, result


def test_every_command_named_answers_help() -> None:
    commands = check(REPO, pages(REPO)).commands
    assert ("-m", "sparkseal", "verify", "--help") in commands
    assert any(argv[0].startswith("bench/") for argv in commands)
    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [
            f"{commands[argv]}: python {' '.join(argv)}: exit {result.returncode}: {result.stderr[-400:]}"
            for argv, result in pool.map(_run, sorted(commands))
            if result.returncode != 0
        ]
    assert failed == []


def test_github_anchors() -> None:
    assert anchor("Configs (in `.bazelrc`)") == "configs-in-bazelrc"
    assert anchor("GB10 operators: serve with DSpark, then `sparkseal live-check`") == (
        "gb10-operators-serve-with-dspark-then-sparkseal-live-check"
    )
    assert anchor("DeepSeek V3.2 and V4 on GB10: our sparse-MLA kernel as vLLM's attention backend") == (
        "deepseek-v32-and-v4-on-gb10-our-sparse-mla-kernel-as-vllms-attention-backend"
    )
    assert anchor("The [docs](x.md) page, and_more") == "the-docs-page-and_more"
    assert anchors(parse("# A\n\n## A\n\n```\n# not a heading\n```\n### A\n")) == {"a", "a-1", "a-2"}


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "here.py").write_text("")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "BUILD").write_text('[thing(name = "tool_" + platform) for platform in PLATFORMS]\n')
    (tmp_path / "Makefile").write_text("image: setup\n\tbazel build //:image\n")
    (tmp_path / ".bazelrc").write_text("build:disk --disk_cache=x\n")
    (tmp_path / "README.md").write_text(
        "# Title\n\n"
        "See [good](docs/a.md#real-heading), [gone](docs/missing.md) and [bad](docs/a.md#no-heading),\n"
        "[here](#title), [not here](#nowhere) and [the web](https://example.org/x#y).\n\n"
        "`tests/here.py`, `tests/gone.py`, `tests/<kind>/x.py` and `make image`.\n"
        "Misspelt: `sparksel/cli.py`, `pytest test/here.py -q` and `pytest tests/gone.py::t`; "
        "`vllm/v1/x.py` is upstream's.\n"
        "A quoted message: `where (tests/here.py): x`, `see tests/here.py), then (tests/gone.py);`.\n"
    )
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## Real heading\n\n"
        "```sh\n"
        "sparkseal provenance check P.json   # a comment: sparkseal nothing-here\n"
        "sparkseal no-such-command --json\n"
        "sparkseal provenance check P.json [--json] --no-such-option=1\n"
        "sparkseal provenance chek P.json\n"
        "$run --entrypoint sparkseal $img live-check http://x --wait 9 --no-wait\n"
        "FOO=1 python3 bench/x.py --flag \\\n    --more\n"
        "python3 -m sparkseal.fetch.lock_wheels && make nope\n"
        "bazel build --config=disk --config=nope //pkg:tool_linux_x86_64 //pkg:other //nope:x \\\n"
        "    //pkg:tool_linux_aarch64.load //pkg\n"
        "```\n\n"
        "Not checked: `https://host:1/x`, `@repo//:file.bzl`, `//pkg:tool_<platform>`, `sparkseal` alone.\n"
    )
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    return tmp_path


def test_a_planted_break_of_each_kind_is_named(planted: Path) -> None:
    findings = check(planted, pages(planted))
    assert findings.problems == [
        "README.md:3: link to docs/missing.md: docs/missing.md does not exist",
        "README.md:3: link to docs/a.md#no-heading: docs/a.md has no heading #no-heading",
        "README.md:4: link to #nowhere: README.md has no heading #nowhere",
        "README.md:6: tests/gone.py does not exist",
        "README.md:7: sparksel/cli.py does not exist: no folder sparksel/ (did you mean sparkseal/?)",
        "README.md:7: test/here.py does not exist: no folder test/ (did you mean tests/?)",
        "README.md:7: tests/gone.py does not exist",
        "README.md:8: tests/gone.py does not exist",
        "docs/a.md:7: sparkseal no-such-command: no such command",
        "docs/a.md:8: sparkseal provenance check: no option --no-such-option",
        "docs/a.md:9: sparkseal provenance chek: no such command",
        "docs/a.md:10: sparkseal live-check: no option --no-wait",
        "docs/a.md:13: make nope: no such target in the Makefile",
        "docs/a.md:14: --config=nope is not in .bazelrc",
        "docs/a.md:14: //pkg:other: pkg/BUILD declares no target 'other'",
        "docs/a.md:14: //nope:x: no BUILD file in nope",
        "README.md: does not link to docs/orphan.md",
    ]
    assert findings.commands == {
        ("-m", "sparkseal", "provenance", "check", "--help"): "docs/a.md:6",
        ("-m", "sparkseal", "live-check", "--help"): "docs/a.md:10",
        ("bench/x.py", "--help"): "docs/a.md:11",
        ("-m", "sparkseal.fetch.lock_wheels", "--help"): "docs/a.md:13",
    }
