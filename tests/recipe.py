"""The recipes of docs/serving.md (serving) and docs/auditing.md (the auditor's walkthrough) as data: their
marked command blocks, read from the page, so a test runs the page's own commands rather than a copy of them.

A recipe's blocks are fenced code blocks whose info string is ``sh recipe=NAME step=STEP`` (the page says
so at its top); their order on the page is the recipe's order. The first step, ``vars``, assigns the shell
variables that differ from one machine to another (``NAME=value``, one a line); every other step reads
only those and what it assigns itself. A test runs each step as ``vars`` (with its own values substituted
for some of the variables, nothing else changed) followed by the step, in one ``bash`` each.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "serving.md"
AUDITING_PAGE = REPO / "docs" / "auditing.md"
# The info string that marks a recipe's block; anything after the step is left for the page to use.
MARK = re.compile(r"^(`{3,})sh\s+recipe=(?P<recipe>[\w-]+)\s+step=(?P<step>[\w-]+)\s*$")
ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=")
# `$NAME` or `${NAME...}`; `$(`, `$!`, `$?`, `$1`, `$$` are no variable names.
USE = re.compile(r"\$\{?(?P<name>[A-Za-z_][A-Za-z0-9_]*)")
# What the shell itself defines, and a step may read without a definition in the recipe.
SHELL_VARIABLES = frozenset({"HOME", "PWD", "USER", "PATH"})


class RecipeError(AssertionError):
    """A recipe on the page is not as the tests need it: the message names the page, the line, what was
    expected and what was found."""


@dataclass(frozen=True)
class Step:
    """One marked block: its step name, the page line of its first command and its text."""

    name: str
    line: int
    text: str


def recipe_steps(text: str, recipe: str, page: Path = PAGE) -> list[Step]:
    """The blocks of ``recipe`` on the page, in page order; a step named twice is an error."""
    steps: list[Step] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        mark = MARK.match(lines[index].strip())
        index += 1
        if mark is None or mark["recipe"] != recipe:
            continue
        start, body = index + 1, []
        while index < len(lines) and lines[index].strip() != mark.group(1):
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise RecipeError(f"{page}:{start - 1}: recipe {recipe} step {mark['step']}: no closing fence")
        index += 1
        if any(step.name == mark["step"] for step in steps):
            raise RecipeError(f"{page}:{start - 1}: recipe {recipe}: step {mark['step']} a second time")
        steps.append(Step(mark["step"], start, "\n".join(body) + "\n"))
    return steps


def steps_by_name(steps: list[Step], expected: list[str], recipe: str, page: Path = PAGE) -> dict[str, Step]:
    """The steps by name, once they are exactly ``expected``, in that order."""
    found = [step.name for step in steps]
    if found != expected:
        raise RecipeError(
            f"{page}: recipe {recipe}: expected the steps {expected} in this order, found {found}"
        )
    return {step.name: step for step in steps}


def _code(text: str) -> list[tuple[int, str]]:
    """(line offset, line) of a block without its comments (a `#` at a line's start or after a space)."""
    return [(number, re.sub(r"(^|\s)#.*$", "", line)) for number, line in enumerate(text.splitlines())]


def assigned(step: Step) -> list[str]:
    """The variables a step assigns at a line's start, in order."""
    return [m["name"] for _, line in _code(step.text) if (m := ASSIGNMENT.match(line.strip()))]


def undefined_uses(steps: list[Step], page: Path = PAGE) -> list[str]:
    """Every variable a step reads that the ``vars`` step (the first) or the step itself has not assigned
    above it, as ``page:line: recipe step reads $NAME, ...``."""
    if not steps or steps[0].name != "vars":
        return [f"{page}: the first step of a recipe is vars, found {[s.name for s in steps[:1]]}"]
    common = set(assigned(steps[0])) | SHELL_VARIABLES
    problems = []
    for step in steps:
        known = set(common) if step is not steps[0] else set(SHELL_VARIABLES)
        for offset, line in _code(step.text):
            # Single-quoted text is not expanded: a JSON or Go template there is no variable.
            expanded = re.sub(r"'[^']*'", "''", line)
            for use in USE.finditer(expanded):
                if use["name"] not in known:
                    problems.append(
                        f"{page}:{step.line + offset}: step {step.name} reads ${use['name']}, which the vars "
                        "step does not assign and the step does not assign above it"
                    )
            if m := ASSIGNMENT.match(line.strip()):
                known.add(m["name"])
    return problems


def substitute(vars_step: Step, values: dict[str, str], page: Path = PAGE) -> str:
    """The ``vars`` step with each variable of ``values`` assigned that value instead (shell-quoted), every
    other line as the page has it. A name the step does not assign is an error: the page changed."""
    missing = sorted(set(values) - set(assigned(vars_step)))
    if missing:
        raise RecipeError(
            f"{page}:{vars_step.line}: the vars step assigns {assigned(vars_step)}; expected also {missing}"
        )
    lines = []
    for line in vars_step.text.splitlines():
        m = ASSIGNMENT.match(line.strip())
        if m and m["name"] in values:
            line = f"{m['name']}={shlex.quote(values[m['name']])}  # substituted by the test"
        lines.append(line)
    return "\n".join(lines) + "\n"


def script(vars_text: str, step: Step, page: Path = PAGE) -> str:
    """What one ``bash`` runs for a step: strict mode, the variables, then the step as the page has it."""
    where = page.relative_to(REPO) if page.is_relative_to(REPO) else page
    return f"set -euo pipefail\n{vars_text}# {where}:{step.line}: step {step.name}\n{step.text}"


def container_names(step: Step) -> list[str]:
    """The names a step gives the containers it starts (``--name NAME``)."""
    return re.findall(r"--name[= ](\S+)", step.text)


def stopped_names(step: Step) -> list[str]:
    """The containers a step stops by name (``podman stop [-t N] NAME``)."""
    return re.findall(r"podman stop(?: -t \d+)? ([\w.-]+)", step.text)


# The fake vLLM server in a container of the image: the image with one layer more, holding the fake
# server's modules, whose entrypoint is the fake. The recipe's commands run unchanged against it, with
# $IMAGE naming it.
FAKE_ROOT = "/opt/sparkseal-fake"
FAKE_FILES = (
    "tests/__init__.py",
    "tests/servers/__init__.py",
    *(f"tests/servers/{name}.py" for name in ("fake_openai", "fake_vllm", "loopback")),
)
FAKE_ENTRYPOINT = ["/opt/venv/bin/python3", "-m", "tests.servers.fake_vllm"]


# Copies FAKE_FILES from /src into FAKE_ROOT, run by the image's own Python: the image has no coreutils
# (its root file system is Debian's minimal set plus Python's, sh but no mkdir or cp).
FAKE_COPY = (
    "import os, shutil, sys\n"
    "for path in sys.argv[2:]:\n"
    "    target = os.path.join(sys.argv[1], path)\n"
    "    os.makedirs(os.path.dirname(target), exist_ok=True)\n"
    "    shutil.copyfile(os.path.join('/src', path), target)\n"
)


def fake_image_commands(run: list[str], image: str, container: str, tag: str) -> list[list[str]]:
    """The two podman commands that make ``tag`` from ``image``: a container ``container`` (``run``: podman
    run's options without ``--rm``) copies the fake server's files from the read-only checkout with the
    image's Python (``FAKE_COPY``), then ``podman commit`` keeps that as one layer with the fake as
    entrypoint and ``FAKE_ROOT`` on its path."""
    mount = f"{REPO / 'tests'}:/src/tests:ro"
    entrypoint = f"ENTRYPOINT {json.dumps(FAKE_ENTRYPOINT)}"
    python = FAKE_ENTRYPOINT[0]
    return [
        [*run, "--name", container, "-v", mount, "--entrypoint", python, image, "-c", FAKE_COPY, FAKE_ROOT,
         *FAKE_FILES],
        [
            "podman",
            "commit",
            "--quiet",
            "--change",
            entrypoint,
            "--change",
            f"ENV PYTHONPATH={FAKE_ROOT}",
            container,
            tag,
        ],
    ]  # fmt: skip


def podman_shim(podman: str, global_options: list[str], run_options: list[str]) -> str:
    """A ``podman`` program for the front of PATH: the real one with what this host's podman needs
    (``global_options`` always, ``run_options`` after ``run``), so the recipe's ``podman`` lines run as
    written. On a CI machine that is runc and explicit ulimits (tests/podman.py)."""
    real = shlex.quote(podman)
    before = " ".join(shlex.quote(option) for option in global_options)
    after = " ".join(shlex.quote(option) for option in run_options)
    return (
        "#!/bin/sh\n"
        "# The recipe's podman, as this host needs it (written by tests/recipe.py).\n"
        f'if [ "$1" = run ]; then shift; exec {real} {before} run {after} "$@"; fi\n'
        f'exec {real} {before} "$@"\n'
    )
