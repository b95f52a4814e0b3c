"""Both lock readers on every lock of third_party/: the Starlark one (rules/private/locks.bzl, run by Bazel)
returns what the Python one (sparkseal.core.locks) returns, and refuses every broken copy with the same
text.

A scratch workspace holds locks.bzl (and the platforms.bzl it loads) and one target a lock: a rule that
reads the lock's text in its analysis and writes what the reader returns as JSON. A broken copy fails its
target's analysis; `--keep_going` analyses them all in one build.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sparkseal.core import locks
from tests.bazel_util import BAZEL, REPO, starlark_workspace
from tests.lock_cases import BROKEN
from tests.lock_cases import locks as third_party_locks

PROBE = """\
load(":locks.bzl", "parse_lock")

def _impl(ctx):
    lock = parse_lock(ctx.attr.kind, ctx.attr.text, ctx.attr.where)
    out = ctx.actions.declare_file(ctx.label.name + ".json")
    ctx.actions.write(out, json.encode(lock))
    return [DefaultInfo(files = depset([out]))]

lock_probe = rule(
    implementation = _impl,
    attrs = {"kind": attr.string(), "text": attr.string(), "where": attr.string()},
)
"""


def _target(name: str, kind: str, text: str, where: str) -> str:
    # A JSON string is a Starlark string literal (the locks are ASCII).
    return (
        f"lock_probe(name = {json.dumps(name)}, kind = {json.dumps(kind)}, where = {json.dumps(where)}, "
        f"text = {json.dumps(text)})\n"
    )


def _as_json(value: object) -> object:
    """What the Python reader returns, as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(value)))  # type: ignore[call-overload]


@pytest.mark.bazel
@pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)")
def test_both_readers_return_the_same_locks_and_refuse_the_same_faults(tmp_path: Path) -> None:
    good = dict(enumerate(sorted(third_party_locks().items())))
    build = ['load(":probe.bzl", "lock_probe")\n']
    for index, (rel, kind) in good.items():
        build.append(_target(f"lock_{index}", kind, (REPO / rel).read_text(), f"//{rel}"))
    for case in BROKEN:
        text = json.dumps(case.document(), indent=2)
        build.append(_target(f"broken_{case.id}", case.kind, text, f"{case.id}/{case.rel}"))
    files = {"probe.bzl": PROBE, "BUILD": "\n".join(build)}
    ws = starlark_workspace(tmp_path, "locks", ["locks.bzl", "platforms.bzl"], files)
    try:
        result = ws.bazel("build", "--keep_going", "//:all")
        outputs = {index: ws.bin_path(f"lock_{index}.json") for index in good}
        read = {index: json.loads(path.read_text()) for index, path in outputs.items() if path.is_file()}
    finally:
        ws.shutdown()
    assert result.returncode != 0, "every broken copy must fail its target"
    for index, (rel, kind) in good.items():
        assert index in read, f"{rel}: the Starlark reader refused it:\n{result.output}"
        assert read[index] == _as_json(locks.read_lock(kind, REPO / rel)), f"{rel}: the readers disagree"
    for case in BROKEN:
        assert f"Error in fail: sparkseal: {case.id}/{case.rel}: {case.message}\n" in result.output, case.id
    # No more failures than the broken copies: each fails for its own fault.
    assert result.output.count("Error in fail: sparkseal: ") == len(BROKEN), result.output
