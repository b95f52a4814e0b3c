"""Bazel repository names as the user wrote them: the apparent name behind a bzlmod canonical name.

Under bzlmod Bazel names each repository canonically, and those names reach execution logs, paths and
messages: ``_main~sparkseal~vllm_sdist`` (Bazel 6 and 7: module, extension, name joined by ``~``; a
module's own repository is ``rules_python~0.22.1`` or ``rules_python~``) or ``+sparkseal+vllm_sdist``
(Bazel 8: ``+``, the root module's name empty; ``rules_python+``). In WORKSPACE mode, and in what a user
writes (MODULE.bazel's ``use_repo``, BUILD labels), the same repository is ``vllm_sdist``: so a comparison
of two Bazel modes (bench/hosts.py) or a message to a user reads names through :func:`apparent_text`.

The apparent name is the last part of an extension's repository and the module's name for a module's
repository; a ``use_repo`` that renames a repository is not seen from here (sparkseal's MODULE.bazel
renames none). rules/private/common.bzl's ``apparent_repo_name`` is the same rule for Starlark;
tests/unit/test_repo_names.py holds the two to the same answers.
"""

from __future__ import annotations

import re

SEPARATORS = ("~", "+")
_PART = r"[A-Za-z0-9_.-]*"
_NAME = r"[A-Za-z0-9_.~+-]*"
# A repository in a label: `@@name//` (canonical syntax) or `@name//`.
_LABEL = re.compile(rf"(?<![\w@.~+-])(@@?)({_NAME})(?=//)")
# A repository's directory in a path: below `external/`, a runfiles tree, or `../` (a short path).
_DIRECTORY = re.compile(rf"((?<![\w.~+-])external/|\.runfiles/|(?<![\w./~+-])\.\./)({_NAME})(?![\w.~+-])")
# A canonical name standing alone, in the two forms that no other word takes: a module's extension
# repository with `~` (three parts or more: `_main~sparkseal~vllm_sdist`), or the root module's with `+`
# (`+sparkseal+vllm_sdist`). Two-part names (`rules_python~`) and `+` names with a module part are
# rewritten only where a label or a path says they are repositories: Debian file names carry both
# separators (`libssl3_3.0.22-1~deb12u2_arm64.deb`, `g++-12_12.2.0-14+deb12u1_arm64.deb`).
_BARE = re.compile(
    rf"(?<![\w./~+-])([A-Za-z_]{_PART}~{_PART}(?:~{_PART})*~[A-Za-z0-9_.-]+|\+[A-Za-z_]{_PART}\+[A-Za-z0-9_.-]+)"
    r"(?![\w.~+-])"
)


def apparent_name(canonical: str) -> str:
    """The name a user writes for the repository Bazel calls ``canonical``; a name that is no canonical
    one (a WORKSPACE name, the main repository's empty name) is returned as it is.

    ``_main~sparkseal~vllm_sdist`` and ``+sparkseal+vllm_sdist`` are ``vllm_sdist``;
    ``rules_python~0.22.1``, ``rules_python~`` and ``rules_python+`` are ``rules_python``.
    """
    separator = next((s for s in SEPARATORS if s in canonical), None)
    if separator is None:
        return canonical
    parts = canonical.split(separator)
    if len(parts) == 2:
        return parts[0] or parts[1]  # a module's repository: module~version
    return parts[-1]  # an extension's (or use_repo_rule's) repository: module~[version~]extension~name


def _label(match: re.Match[str]) -> str:
    at, name = match.group(1), match.group(2)
    if at == "@@" and name == "":
        return ""  # `@@//pkg:name` is the main repository's `//pkg:name`
    return "@" + apparent_name(name)


def apparent_text(text: str) -> str:
    """``text`` with every canonical repository name in it written as the apparent one: labels
    (``@@_main~sparkseal~vllm_sdist//file:x`` is ``@vllm_sdist//file:x``, ``@@//pkg:x`` is ``//pkg:x``),
    paths (``external/+sparkseal+vllm_sdist/file`` is ``external/vllm_sdist/file``, likewise below a
    ``.runfiles/`` tree and after a leading ``../``) and extensions' repository names standing alone."""
    text = _LABEL.sub(_label, text)
    text = _DIRECTORY.sub(lambda m: m.group(1) + apparent_name(m.group(2)), text)
    return _BARE.sub(lambda m: apparent_name(m.group(1)), text)
