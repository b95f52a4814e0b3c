"""What the build reads from the host is named in docs/building.md, and nothing more appears unnamed.

The rules (``rules/**/*.bzl``) and the action programs (``sparkseal/actions/*.py``) are read for each way a
build can reach the host rather than a declared input: a program a repository rule runs from the host's
``PATH`` (``rctx.execute(["uname", ...])``, ``rctx.which``), a script's interpreter (``#!/bin/sh``), an
absolute path of the host's file system in a string, an environment variable a repository rule reads, and
the host's C library (``libc6``, which the locked tools run on). Each is a key that the section "What the
build reads from the host" must name in backticks: a new one fails here until the docs say what it is.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = "docs/building.md"
SECTION = "What the build reads from the host"
SCANNED = ("rules/**/*.bzl", "sparkseal/actions/*.py")

# A program a repository rule runs or looks up on the host's PATH: its first word, a string literal.
_PROGRAM = re.compile(r"\b(?:rctx|repository_ctx)\.(?:execute\(\s*\[\s*|which\(\s*)\"([^\"]+)\"")
# The interpreter of a script a rule or an action writes: `#!` at the start of a string literal.
_SHEBANG = re.compile(r"[fbr]?(?:\"\"\"|\"|')#!(/[^\s\\\"']+(?: [a-z]+)?)")
# A host path in a string literal, not the tail of a concatenation (`VENV + "/bin/python"`).
_PATH = re.compile(
    r"(?<!\+ )[\"'](/(?:bin|dev|etc|home|lib|lib64|proc|root|sbin|tmp|usr|var)(?:/[^\"'\s]*)?)[\"']"
)
# Environment variables a repository rule reads: `environ = [...]` lists and `rctx.os.environ.get(...)`.
_ENVIRON_LIST = re.compile(r"^[A-Z_]*ENVIRON\s*=\s*\[([^\]]*)\]", re.MULTILINE)
_ENVIRON_GET = re.compile(r"\bos\.environ\.get\(\s*(\"[A-Z_]+\"|[A-Z_]+)")
_CONSTANT = re.compile(r"^([A-Z_]+)\s*=\s*\"([A-Z_]+)\"", re.MULTILINE)
# The host's C library: the Debian package the locked toolchains leave out, since the host's runs them.
_LIBC = re.compile(r"\"(libc6)\"")


def host_reads(texts: dict[str, str]) -> dict[str, list[str]]:
    """Each key of a host read in ``texts`` (path -> text) and the places (``path:line``) that make it."""
    constants = {name: value for text in texts.values() for name, value in _CONSTANT.findall(text)}
    found: dict[str, list[str]] = {}

    def add(key: str, path: str, text: str, offset: int) -> None:
        found.setdefault(key, []).append(f"{path}:{text.count(chr(10), 0, offset) + 1}")

    for path, text in texts.items():
        for pattern in (_PROGRAM, _SHEBANG, _PATH, _LIBC):
            for match in pattern.finditer(text):
                add(match.group(1), path, text, match.start())
        for match in _ENVIRON_LIST.finditer(text):
            for word in re.findall(r"\"([A-Z_]+)\"|\b([A-Z_]+)\b", match.group(1)):
                add(word[0] or constants.get(word[1], word[1]), path, text, match.start())
        for match in _ENVIRON_GET.finditer(text):
            name = match.group(1)
            add(
                name.strip('"') if name.startswith('"') else constants.get(name, name),
                path,
                text,
                match.start(),
            )
    return found


def section(text: str, title: str) -> str:
    """The body of the Markdown section headed ``title`` (any level), up to the next heading of its level."""
    heading = re.search(rf"^(#+) {re.escape(title)}[ \t]*$", text, re.MULTILINE)
    assert heading, f"{DOC}: expected a section headed {title!r}, found none"
    level = len(heading.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, heading.end())
    return text[heading.end() : end.start() if end else len(text)]


def unnamed(found: dict[str, list[str]], docs: str) -> list[str]:
    """The host reads ``docs`` does not name in backticks, each with where it is made."""
    return [
        f"`{key}` ({', '.join(places)})" for key, places in sorted(found.items()) if f"`{key}`" not in docs
    ]


def _sources(root: Path) -> dict[str, str]:
    files = sorted({p for pattern in SCANNED for p in root.glob(pattern)})
    return {p.relative_to(root).as_posix(): p.read_text() for p in files}


def test_every_host_read_of_the_build_is_named_in_the_docs() -> None:
    found = host_reads(_sources(REPO))
    for known in ("python3", "/bin/sh", "libc6", "uname", "HOME"):  # the scan sees what is there today
        assert known in found, f"expected the scan to find `{known}`, found {sorted(found)}"
    docs = section((REPO / DOC).read_text(), SECTION)
    missing = unnamed(found, docs)
    assert missing == [], f"{DOC}, section {SECTION!r}: host reads it does not name: {missing}"


def test_a_planted_host_read_is_caught() -> None:
    planted = {
        "rules/private/x.bzl": (
            'X_ENVIRON = ["PIP_INDEX_URL", CACHE_ENV]\n'
            'CACHE_ENV = "SPARKSEAL_REPOSITORY_CACHE"\n'
            "def _impl(rctx):\n"
            '    rctx.execute(["mv", "a", "b"])\n'
            '    rctx.which("git")\n'
            '    home = rctx.os.environ.get("HOME", "")\n'
            '    script = """#!/usr/bin/env bash\\nexec x\\n"""\n'
            '    rctx.file("a", "/usr/lib/x86_64-linux-gnu/libc.so.6")\n'
            '    venv = VENV + "/bin/python"  # an image path below a prefix: not the host\'s\n'
            '    skip = ["libc6"]\n'
        ),
        "sparkseal/actions/y.py": "WRAPPER = f'#!/bin/sh\\nexec {x}\\n'\nSYSTEM_PATH = (\"/bin\",)\n",
    }
    found = host_reads(planted)
    assert found == {
        "PIP_INDEX_URL": ["rules/private/x.bzl:1"],
        "SPARKSEAL_REPOSITORY_CACHE": ["rules/private/x.bzl:1"],
        "mv": ["rules/private/x.bzl:4"],
        "git": ["rules/private/x.bzl:5"],
        "HOME": ["rules/private/x.bzl:6"],
        "/usr/bin/env bash": ["rules/private/x.bzl:7"],
        "/usr/lib/x86_64-linux-gnu/libc.so.6": ["rules/private/x.bzl:8"],
        "libc6": ["rules/private/x.bzl:10"],
        "/bin/sh": ["sparkseal/actions/y.py:1"],
        "/bin": ["sparkseal/actions/y.py:2"],
    }
    docs = "`mv`, `git`, `HOME`, `/usr/bin/env bash`, `libc6`, `/bin/sh`, `/bin`, `PIP_INDEX_URL`, "
    docs += "`SPARKSEAL_REPOSITORY_CACHE`"
    assert unnamed(found, docs) == ["`/usr/lib/x86_64-linux-gnu/libc.so.6` (rules/private/x.bzl:8)"]


def test_the_section_ends_at_the_next_heading_of_its_level() -> None:
    text = "# A\n\n### What the build reads from the host\n\n`x`\n\n#### Sub\n\n`y`\n\n### Next\n\n`z`\n"
    assert section(text, SECTION) == "\n\n`x`\n\n#### Sub\n\n`y`\n\n"
