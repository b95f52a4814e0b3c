"""Read the commit id that a vLLM release records in ``vllm/_version.py`` and check it against the lock."""

from __future__ import annotations

import ast

# git's shortest default abbreviation; a shorter prefix matches too many commits to identify one.
MIN_COMMIT_ID = 7


class CommitMismatch(Exception):
    """The content's commit id disagrees with the lock, or cannot be read."""


def commit_id_from_version_file(text: str, where: str) -> str:
    """Return the hex commit id from a ``_version.py`` text (``'g752a3a504'`` gives ``'752a3a504'``).

    ``where`` names the file in error messages.
    """
    try:
        module = ast.parse(text, filename=where)
    except SyntaxError as exc:
        raise CommitMismatch(f"{where}: cannot parse: {exc}") from exc
    for node in module.body:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Constant):
            continue
        names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if names & {"commit_id", "__commit_id__"} and isinstance(node.value.value, str):
            value = node.value.value
            hex_id = value[1:] if value.startswith("g") else value
            if len(hex_id) < MIN_COMMIT_ID or any(c not in "0123456789abcdef" for c in hex_id):
                raise CommitMismatch(f"{where}: commit_id {value!r} is not a git commit id")
            return hex_id
    raise CommitMismatch(f"{where}: no commit_id assignment found")


def check_commit(found: str, locked: str, where: str) -> None:
    """Fail unless ``found`` (possibly abbreviated) and the locked commit name the same commit."""
    for value, what in ((found, "commit id"), (locked, "locked commit")):
        if len(value) < MIN_COMMIT_ID or any(c not in "0123456789abcdef" for c in value):
            raise CommitMismatch(
                f"{where}: {what} {value!r} does not name a commit "
                f"(at least {MIN_COMMIT_ID} lowercase hex digits)"
            )
    short, long_ = sorted((found, locked), key=len)
    if not long_.startswith(short):
        raise CommitMismatch(f"{where}: commit id is {found!r}, but the lock expects commit {locked!r}")
