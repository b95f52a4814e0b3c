"""``sparkseal verify``: rebuild targets in a varied environment and compare with the first build.

The first build is the caller's own: ``bazel build TARGETS`` in the checkout, with its usual output base.
The second build runs in a fresh copy of the checkout under a temporary directory, with a clean output base
and the environment varied in the spirit of reprotest (:data:`VARIATIONS`). Downloads are shared through the
caller's repository cache: every file there is verified against its locked sha256, so sharing it changes no
input, while any disk or remote cache is switched off so that every action runs again.

Outputs are found through Bazel's Build Event Protocol (``--build_event_json_file``): the files each target
reports, keyed by their path below ``bazel-bin``, a tree artifact by each file inside it. Comparison and the
diffoscope reports are in :mod:`sparkseal.audit.compare`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from sparkseal.core import digests
from sparkseal.core.source import Source, SourceError, parse_status
from sparkseal.scan.scanner import ScanInputError, git_listed

DEFAULT_TARGETS = ("//:image", "//:pex")

# What differs between the first and the second build, besides the checkout path and the output base.
# TZ at the far end of the offsets, a locale other than C, the group-write bit of the umask flipped, a
# HOME without any rc file, and files created in reverse order. The build user is not varied: Bazel's
# repository cache belongs to the caller.
SECOND_TZ = "Pacific/Kiritimati"
SECOND_LOCALE = "fr_CH.UTF-8"
# Bazel 4's server decodes file names with the locale's charset: under a non-UTF-8 (or missing) locale a
# tree artifact with a non-ASCII name (Debian's ca-certificates has some) fails validation. So the
# second locale must be an installed UTF-8 one. `make tools` and `make setup` compile ours
# (.ci/setup-locale); without it, another installed language's UTF-8 locale, else C.UTF-8, which glibc
# builds in (2.35 and later; bookworm's is 2.36), so that an auditor's machine varies the locale too, if
# only from a language's locale to C.UTF-8 (collation, messages).
UTF8_LOCALE = re.compile(r"(?i)^[a-z]{2,3}_[A-Z]{2}\.utf-?8$")
BUILTIN_UTF8_LOCALE = "C.UTF-8"
_BIN = re.compile(r"/bazel-out/[^/]+/bin/(.+)$")


class RebuildError(Exception):
    """A build could not run or failed; the message names the workspace and the reason."""


@dataclass
class Build:
    """One build: where it ran, its environment changes, and each target's outputs (bin path -> file)."""

    workspace: Path
    output_base: Path | None
    variations: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, dict[str, Path]] = field(default_factory=dict)


def sha256_file(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    return "sha256:" + digests.sha256_file(path)


def checkout_files(root: Path) -> list[str]:
    """What ``git`` would commit: tracked and untracked-not-ignored paths, symlinks included."""
    try:
        return [n for n in git_listed(root) if os.path.lexists(root / n)]
    except ScanInputError as error:
        raise RebuildError(f"expected a git checkout: {error}") from error


def copy_checkout(root: Path, dest: Path) -> None:
    """Copy the checkout's files to ``dest``, creating them in reverse path order (a reprotest variation)."""
    for name in reversed(checkout_files(root)):
        source, target = root / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def _file_paths(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise RebuildError(f"build event names an output at {uri}: expected a file:// URI")
    return Path(unquote(parsed.path))


def read_outputs(bep: Path) -> dict[str, dict[str, Path]]:
    """Each completed target's default outputs from a BEP JSON file: ``{label: {bin path: file}}``."""
    sets: dict[str, dict] = {}
    completed: dict[str, list[str]] = {}
    with open(bep, encoding="utf-8") as stream:
        for line in stream:
            event = json.loads(line)
            ident = event.get("id", {})
            if "namedSet" in ident:
                sets[ident["namedSet"]["id"]] = event.get("namedSetOfFiles", {})
            elif "targetCompleted" in ident and event.get("completed", {}).get("success"):
                groups = event["completed"].get("outputGroup", [])
                completed[ident["targetCompleted"]["label"]] = [
                    s["id"] for g in groups if g.get("name") == "default" for s in g.get("fileSets", [])
                ]

    def files(set_ids: list[str], seen: set[str]) -> Iterator[Path]:
        for set_id in set_ids:
            if set_id in seen:
                continue
            seen.add(set_id)
            named = sets.get(set_id, {})
            for entry in named.get("files", []):
                yield _file_paths(entry["uri"])
            yield from files([s["id"] for s in named.get("fileSets", [])], seen)

    outputs: dict[str, dict[str, Path]] = {}
    for label, set_ids in completed.items():
        found = {}
        for path in files(set_ids, set()):
            match = _BIN.search(path.as_posix())
            found[match.group(1) if match else path.name] = path
        outputs[label] = found
    return outputs


def artifact_digests(outputs: Mapping[str, Path]) -> dict[str, str]:
    """``{bin path: sha256}`` of every output file; a directory contributes each file below it."""
    digests = {}
    for rel, path in outputs.items():
        if path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for name in sorted(filenames):
                    file = Path(dirpath) / name
                    digests[f"{rel}/{file.relative_to(path).as_posix()}"] = sha256_file(file)
        else:
            digests[rel] = sha256_file(path)
    return digests


def run_bazel(
    workspace: Path,
    targets: list[str],
    *,
    output_base: Path | None = None,
    env: Mapping[str, str] | None = None,
    startup: list[str] | None = None,
    flags: list[str] | None = None,
    umask: int | None = None,
    log: Path,
) -> dict[str, dict[str, Path]]:
    """``bazel build TARGETS`` in ``workspace``: the outputs by target; :class:`RebuildError` on failure."""
    bazel = shutil.which("bazel")
    if bazel is None:
        raise RebuildError(
            "bazel is not on PATH (`make tools` installs it, with diffoscope, for `sparkseal verify`)"
        )
    bep = log.with_suffix(".bep.json")
    command = [bazel, *(startup or [])]
    if output_base is not None:
        command.append(f"--output_base={output_base}")
    command += ["build", f"--build_event_json_file={bep}", *(flags or []), "--", *targets]
    previous = os.umask(umask) if umask is not None else None
    try:
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.run(
                command, cwd=workspace, env=dict(env or os.environ), stdout=out, stderr=subprocess.STDOUT
            )
    finally:
        if previous is not None:
            os.umask(previous)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise RebuildError(
            f"bazel build {' '.join(targets)} in {workspace} failed ({proc.returncode}):\n{tail}"
        )
    outputs = read_outputs(bep)
    missing = [t for t in targets if not any(_same_target(t, label) for label in outputs)]
    if missing:
        raise RebuildError(f"{workspace}: no outputs reported for {', '.join(missing)} (see {log})")
    return outputs


def _same_target(requested: str, label: str) -> bool:
    # Bazel reports an alias under the name it was asked for; "//:image" and "@//:image" are one target.
    return label.lstrip("@") == requested.lstrip("@")


def repository_cache(workspace: Path) -> Path:
    """The repository cache the workspace's .bazelrc names (``~`` expanded), else Bazel's default."""
    rc = workspace / ".bazelrc"
    if rc.is_file():
        for line in rc.read_text(encoding="utf-8").splitlines():
            match = re.match(r"build\s+--repository_cache=(\S+)", line.strip())
            if match:
                return Path(match.group(1)).expanduser()
    return Path.home() / ".cache" / "bazel" / "_bazel_root" / "cache" / "repos" / "v1"


def installed_locales() -> list[str]:
    """``locale -a``: the locales this machine can use."""
    listed = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False)
    return listed.stdout.split() if listed.returncode == 0 else []


def second_locale(current: str, available: list[str]) -> str | None:
    """An installed UTF-8 locale other than ``current``: :data:`SECOND_LOCALE` first, then another
    language's, then :data:`BUILTIN_UTF8_LOCALE`; None if none (``current`` is the only one)."""
    names = [SECOND_LOCALE, *sorted(a for a in available if UTF8_LOCALE.match(a)), BUILTIN_UTF8_LOCALE]
    usable = {a.lower().replace("-", "") for a in available}
    for name in names:
        key = name.lower().replace("-", "")
        if key in usable and key != current.lower().replace("-", ""):
            return name
    return None


def second_environment(home: Path) -> tuple[dict[str, str], dict[str, str], int]:
    """The varied environment of the second build: (env, what changed and how, umask)."""
    current = os.umask(0)
    os.umask(current)
    umask = current ^ 0o020
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BAZEL", "LC_"))}
    env.update(HOME=str(home), TZ=SECOND_TZ)
    first_locale = os.environ.get("LC_ALL") or os.environ.get("LANG") or "unset"
    locale = second_locale(first_locale, installed_locales())
    if locale is None:
        change = (
            f"not varied: no UTF-8 locale other than {first_locale} is installed (Bazel needs UTF-8; "
            f"`make tools` compiles {SECOND_LOCALE})"
        )
    else:
        env.update(LANG=locale, LC_ALL=locale)
        change = f"{first_locale} -> {locale}"
    variations = {
        "HOME": f"{os.environ.get('HOME', '')} -> {home} (no user rc files)",
        "LANG/LC_ALL": change,
        "TZ": f"{os.environ.get('TZ', 'unset')} -> {SECOND_TZ}",
        "umask": f"{current:04o} -> {umask:04o}",
        "file creation order": "sorted -> reverse sorted",
    }
    return env, variations, umask


def workspace_status(workspace: Path) -> tuple[Source, str]:
    """What the workspace status command (``sparkseal.fetch.workspace_status``) says of ``workspace``: the
    source it records and the text Bazel would write."""
    done = subprocess.run(
        [sys.executable, "-m", "sparkseal.fetch.workspace_status", "--root", str(workspace)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return Source(unknown=f"the workspace status command failed ({done.returncode})"), ""
    try:
        return parse_status(done.stdout, "the workspace status command's output"), done.stdout
    except SourceError as error:
        return Source(unknown=str(error)), ""


def _status_command(scratch: Path, status: str) -> Path:
    """A workspace status command that prints ``status``: the copy is no git checkout, but holds the
    files of the checkout the status describes, so the rebuild records the same source."""
    text = scratch / "workspace-status.txt"
    text.write_text(status, encoding="utf-8")
    script = scratch / "workspace-status"
    script.write_text(f"#!/bin/sh\nexec cat '{text}'\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def second_build(
    workspace: Path, targets: list[str], scratch: Path, bazel_args: list[str] | None = None, status: str = ""
) -> Build:
    """Copy the checkout below ``scratch`` and build ``targets`` there with every variation applied;
    ``status`` (the first checkout's workspace status) stands in for git, which the copy lacks."""
    clone = scratch / "rebuild" / "src" / workspace.name
    output_base = scratch / "rebuild" / "output-base"
    home = scratch / "rebuild" / "home"
    home.mkdir(parents=True)
    copy_checkout(workspace, clone)
    env, variations, umask = second_environment(home)
    variations = {
        "checkout path": f"{workspace} -> {clone}",
        "output base": "the checkout's -> a new empty one",
        **variations,
    }
    flags = [
        f"--repository_cache={repository_cache(workspace)}",
        "--disk_cache=",
        "--remote_cache=",
        "--noremote_accept_cached",
    ]
    if status:
        flags.append(f"--workspace_status_command={_status_command(scratch / 'rebuild', status)}")
    flags += bazel_args or []
    try:
        outputs = run_bazel(
            clone,
            targets,
            output_base=output_base,
            env=env,
            startup=["--max_idle_secs=10"],
            flags=flags,
            umask=umask,
            log=scratch / "second.log",
        )
    finally:
        subprocess.run(
            ["bazel", f"--output_base={output_base}", "shutdown"],
            cwd=clone,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    return Build(clone, output_base, variations, outputs)


def first_build(
    workspace: Path, targets: list[str], scratch: Path, bazel_args: list[str] | None = None
) -> Build:
    """``bazel build TARGETS`` in the checkout itself, as its user would (``bazel_args`` passed through)."""
    outputs = run_bazel(workspace, targets, flags=bazel_args, log=scratch / "first.log")
    return Build(workspace, None, {}, outputs)


def make_scratch(parent: Path | None) -> Path:
    """A fresh scratch directory for the rebuild (removed by the caller unless kept)."""
    return Path(tempfile.mkdtemp(prefix="sparkseal-verify-", dir=parent))
