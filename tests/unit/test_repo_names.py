"""Bazel repository names as the user wrote them (sparkseal/core/repo_names.py and its Starlark twin)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkseal.core.repo_names import apparent_name, apparent_text
from tests.bazel_util import BAZEL, REPO, starlark_workspace

# canonical name -> apparent name, Bazel 6/7 (`~`) and Bazel 8 (`+`) alike.
NAMES = {
    "_main~sparkseal~vllm_sdist": "vllm_sdist",
    "_main~sparkseal~python_deps_linux_aarch64_torch": "python_deps_linux_aarch64_torch",
    "rules_python~0.22.1~pip~pip_torch": "pip_torch",  # Bazel 6: a module's extension, its version in
    "rules_python~~pip~pip_torch": "pip_torch",  # Bazel 7.1: the version left out
    "_main~_repo_rules~local_tools": "local_tools",  # use_repo_rule
    "rules_python~0.22.1": "rules_python",  # a module's own repository
    "rules_python~": "rules_python",
    "+sparkseal+vllm_sdist": "vllm_sdist",  # Bazel 8: the root module's name is empty
    "rules_python++pip+pip_torch": "pip_torch",
    "rules_python+": "rules_python",
    "vllm_sdist": "vllm_sdist",  # WORKSPACE names are apparent already
    "": "",  # the main repository
}


@pytest.mark.parametrize(("canonical", "apparent"), NAMES.items())
def test_apparent_name(canonical: str, apparent: str) -> None:
    assert apparent_name(canonical) == apparent


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # labels, as str(label) and Bazel's messages print them
        ("@@_main~sparkseal~vllm_sdist//file:file", "@vllm_sdist//file:file"),
        ("@_main~sparkseal~vllm_sdist//file:file", "@vllm_sdist//file:file"),
        ("@@+sparkseal+vllm_sdist//file:file", "@vllm_sdist//file:file"),
        ("@@rules_python~0.22.1//python:defs.bzl", "@rules_python//python:defs.bzl"),
        ("@@rules_python+//python:defs.bzl", "@rules_python//python:defs.bzl"),
        ("@@//third_party/vllm:wheel_linux_x86_64", "//third_party/vllm:wheel_linux_x86_64"),
        ("@@platforms//os:linux", "@platforms//os:linux"),
        ("@//pkg:x and @vllm_sdist//file:file", "@//pkg:x and @vllm_sdist//file:file"),
        # execution-root paths, output paths, runfiles trees and short paths
        (
            "external/_main~sparkseal~vllm_sdist/file/vllm-0.25.1.tar.gz",
            "external/vllm_sdist/file/vllm-0.25.1.tar.gz",
        ),
        (
            "bazel-out/k8-opt/bin/external/+sparkseal+python_deps/site/a.py",
            "bazel-out/k8-opt/bin/external/python_deps/site/a.py",
        ),
        (
            "bazel-out/k8-opt-exec/bin/sparkseal/actions/sbom.runfiles/rules_python~/python/x.py",
            "bazel-out/k8-opt-exec/bin/sparkseal/actions/sbom.runfiles/rules_python/python/x.py",
        ),
        ("../rules_python+/python/x.py", "../rules_python/python/x.py"),
        ("../_main~sparkseal~vllm_sdist/file/x", "../vllm_sdist/file/x"),
        # a message naming paths and a repository standing alone
        (
            "sparkseal: external/_main~sparkseal~vllm_sdist/file/v.tar.gz: expected a gzip stream "
            "(while fetching @_main~sparkseal~vllm_sdist); repository +sparkseal+python_deps",
            "sparkseal: external/vllm_sdist/file/v.tar.gz: expected a gzip stream "
            "(while fetching @vllm_sdist); repository python_deps",
        ),
        # what only looks like a canonical name stays: Debian file names and versions, C++, paths below
        # a repository
        (
            "external/debian_linux_x86_64/file/libssl3_3.0.22-1~deb12u2_arm64.deb",
            "external/debian_linux_x86_64/file/libssl3_3.0.22-1~deb12u2_arm64.deb",
        ),
        (
            "external/debian_linux_x86_64/file/g++-12_12.2.0-14+deb12u1_arm64.deb",
            "external/debian_linux_x86_64/file/g++-12_12.2.0-14+deb12u1_arm64.deb",
        ),
        ("libstdc++6 and 7.7.1+ds-8+b1 and a+b+c", "libstdc++6 and 7.7.1+ds-8+b1 and a+b+c"),
        ("~/.cache/bazel and x~y", "~/.cache/bazel and x~y"),
        ("pool/main/a/a~b~c/a~b~c_1.deb", "pool/main/a/a~b~c/a~b~c_1.deb"),
        ("user@example//not a label", "user@example//not a label"),
    ],
)
def test_apparent_text(text: str, expected: str) -> None:
    assert apparent_text(text) == expected
    assert apparent_text(expected) == expected  # what it writes is apparent already


# The Starlark twin: label_string and the fail() texts of rules/private strip canonical names with
# common.bzl's apparent_repo_name, which must give the same answers.
TWIN_BUILD = """\
load(":common.bzl", "apparent_repo_name", "label_string")

NAMES = {names!r}

def _impl(ctx):
    lines = ["%s\\t%s" % (name, apparent_repo_name(name)) for name in NAMES]
    lines.append("label\\t" + label_string(Label("@bazel_tools//tools/build_defs:x")))
    out = ctx.actions.declare_file("names.txt")
    ctx.actions.write(out, "\\n".join(lines) + "\\n")
    return [DefaultInfo(files = depset([out]))]

names = rule(implementation = _impl)
"""


@pytest.mark.bazel
@pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)")
def test_the_starlark_twin_gives_the_same_names(tmp_path: Path) -> None:
    ws = starlark_workspace(
        tmp_path,
        "twin",
        ["common.bzl"],
        {
            "names.bzl": TWIN_BUILD.format(names=list(NAMES)),
            "BUILD": 'load(":names.bzl", "names")\n\nnames(name = "names")\n',
        },
    )
    try:
        result = ws.bazel("build", "//:names")
        assert result.returncode == 0, result.output
        written = ws.bin_path("names.txt").read_text()
    finally:
        ws.shutdown()
    pairs = [line.split("\t") for line in written.splitlines()]
    assert pairs == [[name, apparent] for name, apparent in NAMES.items()] + [
        ["label", "@bazel_tools//tools/build_defs:x"]
    ]


# --- fail() texts name labels and repositories as the user wrote them ---

_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
# A label or a repository name printed as Bazel spells it: str(label) is `@@//pkg:x` from Bazel 7 on,
# `rctx.name` the canonical `_main~sparkseal~x` under bzlmod.
_RAW = re.compile(r"\b(?:\w+\.)*label\b(?![.\w])|\brctx\.name\b|\brctx\.attr\.lock\b|\bstr\(")
_WRAPPERS = ("label_string(", "apparent_repo_name(")


def _calls(text: str, name: str) -> list[tuple[int, str]]:
    """(line, arguments with string literals blanked) of every call of ``name`` in Starlark ``text``."""
    code = _STRING.sub('""', text)
    found = []
    for match in re.finditer(rf"(?<![\w.]){name}\(", code):
        depth, end = 1, match.end()
        while depth and end < len(code):
            depth += {"(": 1, ")": -1}.get(code[end], 0)
            end += 1
        found.append((code.count("\n", 0, match.start()) + 1, code[match.end() : end - 1]))
    return found


def raw_names_in_fail_texts(files: dict[str, str]) -> list[str]:
    """``path:line: expression`` for every label or repository name a fail() prints unconverted."""
    offenders = []
    for path, text in sorted(files.items()):
        for line, arguments in _calls(text, "fail"):
            for raw in _RAW.finditer(arguments):
                if not arguments[: raw.start()].endswith(_WRAPPERS):
                    offenders.append(f"{path}:{line}: {raw.group(0)}")
    return offenders


def test_fail_texts_print_labels_through_label_string() -> None:
    files = {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "rules").rglob("*.bzl"))}
    assert raw_names_in_fail_texts(files) == []


def test_the_fail_text_check_names_a_raw_label() -> None:
    planted = {
        "rules/private/x.bzl": (
            'def f(ctx, rctx):\n    fail("sparkseal: %s (while fetching @%s)" % (\n        ctx.label,\n'
            "        rctx.name,\n    ))\n"
            '    fail("sparkseal: %s: %s" % (label_string(ctx.attr.src.label),\n'
            "        apparent_repo_name(rctx.name)))\n"
            '    fail("sparkseal: %s: (str(x))" % str(rctx.attr.lock))\n'
        )
    }
    assert raw_names_in_fail_texts(planted) == [
        "rules/private/x.bzl:2: ctx.label",
        "rules/private/x.bzl:2: rctx.name",
        "rules/private/x.bzl:8: str(",
        "rules/private/x.bzl:8: rctx.attr.lock",
    ]
