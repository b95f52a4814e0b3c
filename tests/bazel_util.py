"""Running Bazel from tests: real workspace builds and small fixture workspaces."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.toolchain_cache import seed_repository_cache

REPO = Path(__file__).resolve().parent.parent
BAZEL = shutil.which("bazel")

# What a fixture workspace copies from the real repository: the rules, the action programs and the
# offline stand-ins; locks, patches and overlay are the fixture's own.
FIXTURE_COPIES = (
    "rules",
    "sparkseal",
    "third_party/bazel",
    "third_party/scan",
    "third_party/toolchains",
    "third_party/zstd",
    "third_party/vllm/BUILD",
    "patches/vllm/BUILD",
    "overlay/vllm/BUILD",
    "BUILD",
    "platforms",
)

_SUMMARY = re.compile(r"^INFO: \d+ process(?:es)?(?:: (.*))?\.$", re.MULTILINE)


def _venv_scanner() -> str:
    """The kingfisher binary of the test venv (hash-locked at the version scanner.lock.json pins), so that
    fixture workspaces need not download it; empty when it is not installed (the rule then downloads)."""
    try:
        import kingfisher  # type: ignore[import-untyped]
    except ImportError:
        return ""
    return str(kingfisher.get_binary_path())


# The secret scanner of oci_layer's scan, for fixture workspaces (the rule checks its locked version).
SCANNER_WORKSPACE = f"""
load("//rules:defs.bzl", "secret_scanner")

secret_scanner(
    name = "secret_scanner",
    lock = "//third_party/scan:scanner.lock.json",
    local_binary = {_venv_scanner()!r},
)
"""

# The offline stand-ins and the locked toolchains (their .debs come from the repository cache, which
# toolchain_cache.seed_repository_cache fills): enough for a workspace that runs none of our rules.
BASE_WORKSPACE = """\
workspace(name = "sparkseal")

local_repository(name = "rules_cc", path = "third_party/bazel/rules_cc")
local_repository(name = "rules_java", path = "third_party/bazel/rules_java")
local_repository(name = "remote_coverage_tools", path = "third_party/bazel/remote_coverage_tools")
local_repository(name = "rules_python", path = "third_party/bazel/rules_python")

load("//rules:defs.bzl", "sparkseal_toolchains")

sparkseal_toolchains()
"""

# The zstd compressor of zstd layers, fetched only by a build that asks for them (--config=zstd); a test
# that does puts the locked wheel into the workspace's repository cache first (zstd_wheel_into).
ZSTD_WORKSPACE = """
load("//rules:defs.bzl", "host_wheel")

host_wheel(
    name = "zstandard",
    lock = "//third_party/zstd:zstandard.lock.json",
    module = "zstandard",
)
"""

# ... and the secret scanner and zstd compressor (their rules are in //rules:defs.bzl): for our rules
# that need no locked download.
MINIMAL_WORKSPACE = BASE_WORKSPACE + SCANNER_WORKSPACE + ZSTD_WORKSPACE

FIXTURE_WORKSPACE = (
    MINIMAL_WORKSPACE
    + """
load("//rules:defs.bzl", "patch_series", "vllm_lock")

vllm_lock(name = "vllm_lock", lock = "//third_party/vllm:vllm.lock.json")

load("@vllm_lock//:repositories.bzl", "vllm_repositories")

vllm_repositories()

patch_series(name = "vllm_patches", series = "//patches/vllm:series")
"""
)


# FIXTURE_WORKSPACE under bzlmod: the sparkseal extension's tags for the same repositories (MODULE.bazel
# of the repository otherwise, so its offline overrides are written once).
FIXTURE_MODULE_TAGS = f"""\
sparkseal.toolchains()
sparkseal.secret_scanner(
    name = "secret_scanner",
    local_binary = {json.dumps(_venv_scanner())},
    lock = "//third_party/scan:scanner.lock.json",
)
sparkseal.host_wheel(
    name = "zstandard",
    lock = "//third_party/zstd:zstandard.lock.json",
    module = "zstandard",
)
sparkseal.vllm_lock(name = "vllm_lock", lock = "//third_party/vllm:vllm.lock.json")
sparkseal.patch_series(name = "vllm_patches", series = "//patches/vllm:series")
"""
FIXTURE_MODULE_REPOS = (
    "secret_scanner",
    "sparkseal_cc_linux_aarch64",
    "sparkseal_cc_linux_x86_64",
    "sparkseal_python_linux_aarch64",
    "sparkseal_python_linux_x86_64",
    "vllm_lock",
    "vllm_patches",
    "zstandard",
)
_PROJECT_TAGS = "sparkseal.repositories()\n"
_USE_REPO = re.compile(r"^use_repo\(\n    sparkseal,\n.*?^\)\n", re.MULTILINE | re.DOTALL)


def fixture_module(tags: str = FIXTURE_MODULE_TAGS, repos: Sequence[str] = FIXTURE_MODULE_REPOS) -> str:
    """The repository's MODULE.bazel with the sparkseal extension's ``tags`` and ``use_repo`` of ``repos``
    in place of the project's own: everything else (the offline overrides, toolchains) stays as it is."""
    text = (REPO / "MODULE.bazel").read_text()
    if text.count(_PROJECT_TAGS) != 1 or len(_USE_REPO.findall(text)) != 1:
        raise AssertionError(
            f"{REPO / 'MODULE.bazel'}: expected one {_PROJECT_TAGS.strip()} and one use_repo(sparkseal, ...)"
        )
    imports = "".join(f"    {json.dumps(name)},\n" for name in repos)
    text = text.replace(_PROJECT_TAGS, tags)
    return _USE_REPO.sub(lambda _: f"use_repo(\n    sparkseal,\n{imports})\n", text)


@dataclass
class BazelResult:
    """Exit code and combined output of one Bazel command."""

    returncode: int
    output: str


@dataclass
class Workspace:
    """A Bazel workspace with its own output base and repository cache.

    ``max_idle_secs``: how long its Bazel server outlives the last command. A scratch workspace's server
    goes soon (30 s); the real workspace's is shared by many tests, spread over the session, and keeps its
    analysis and its digests of the outputs (gigabytes of image layers, which a new server hashes again)
    only while it lives, so that one is kept for the whole session and shut down at its end.
    """

    root: Path
    output_base: Path
    repository_cache: Path
    env: dict[str, str]
    max_idle_secs: int = 30

    def bazel(self, *args: str, timeout: float = 900) -> BazelResult:
        """Run ``bazel --output_base=... <args>`` in the workspace and return its output."""
        assert BAZEL is not None, "bazel is not installed (run make setup)"
        seed_repository_cache(self.repository_cache)
        command = [
            BAZEL,
            f"--output_base={self.output_base}",
            f"--max_idle_secs={self.max_idle_secs}",
            *args[:1],
            f"--repository_cache={self.repository_cache}",
            *args[1:],
        ]
        proc = subprocess.run(
            command,
            cwd=self.root,
            # Our rules copy a hit Bazel could not hard-link from this folder: the workspace's own cache,
            # never the user's.
            env={**self.env, "SPARKSEAL_REPOSITORY_CACHE": str(self.repository_cache)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        return BazelResult(proc.returncode, proc.stdout)

    def bin_path(self, rel: str) -> Path:
        """Path of an output under this workspace's bazel-bin."""
        out = self.bazel("info", "bazel-bin")
        assert out.returncode == 0, out.output
        return Path(out.output.strip().splitlines()[-1]) / rel

    def shutdown(self) -> None:
        """Stop this workspace's Bazel server."""
        if BAZEL and self.output_base.exists():
            subprocess.run(
                [BAZEL, f"--output_base={self.output_base}", "shutdown"],
                cwd=self.root,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
                check=False,
            )


def base_env(**extra: str) -> dict[str, str]:
    """The environment for Bazel in tests: the caller's, minus Bazel-affecting variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BAZEL", "TEST_", "PYTEST"))}
    env.update(extra)
    return env


def starlark_workspace(tmp_path: Path, name: str, copies: Sequence[str], files: dict[str, str]) -> Workspace:
    """A scratch workspace under ``tmp_path`` for the test of a Starlark twin: ``rules/private/<copy>`` of
    each of ``copies`` and ``files`` (name -> text) at its root, and no other file of ours."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "WORKSPACE").write_text(f'workspace(name = "{name}")\n')
    for copy in copies:
        shutil.copy(REPO / "rules/private" / copy, root / copy)
    for rel, text in files.items():
        (root / rel).write_text(text)
    return Workspace(root, tmp_path / "output-base", tmp_path / "repository-cache", base_env())


def make_fixture_workspace(root: Path, workspace: str = FIXTURE_WORKSPACE, module: str | None = None) -> None:
    """Copy the rules and action programs into ``root`` and write a fixture WORKSPACE and .bazelrc; with
    ``module`` (``fixture_module()``), also that MODULE.bazel and the repository's WORKSPACE.bzlmod."""
    for rel in FIXTURE_COPIES:
        source = REPO / rel
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copyfile(source, target)
    (root / "WORKSPACE").write_text(workspace)
    if module is not None:
        (root / "MODULE.bazel").write_text(module)
        shutil.copyfile(REPO / "WORKSPACE.bzlmod", root / "WORKSPACE.bzlmod")
    rc = (REPO / ".bazelrc").read_text()
    (root / ".bazelrc").write_text(
        "\n".join(line for line in rc.splitlines() if "repository_cache" not in line)
    )


def process_summary(output: str) -> dict[str, int]:
    """Bazel's last ``INFO: N processes: 3 remote cache hit, 2 internal.`` line as ``{kind: count}``."""
    matches = _SUMMARY.findall(output)
    if not matches:
        raise AssertionError(
            f"Bazel output: expected an 'INFO: N processes: ...' line, found none in:\n{output}"
        )
    summary: dict[str, int] = {}
    for part in filter(None, matches[-1].split(", ")):
        count, kind = part.split(" ", 1)
        summary[kind] = int(count)
    return summary


def spawned_processes(output: str) -> dict[str, int]:
    """The process summary without Bazel-internal actions: where each action ran or was found."""
    return {kind: n for kind, n in process_summary(output).items() if kind != "internal"}


def copy_checkout(source: Path, target: Path) -> Path:
    """Copy a checkout's working tree to ``target`` (no ``.git``, ``bazel-*`` links or caches); return it."""
    shutil.copytree(
        source,
        target,
        ignore=lambda d, names: [n for n in names if n.startswith("bazel-") or n in {".git", "__pycache__"}],
    )
    return target


def remove_tree(path: Path) -> None:
    """Delete ``path`` even where Bazel left read-only directories."""
    if path.exists():
        subprocess.run(["chmod", "-R", "u+w", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)
