"""vLLM general plugin: before a deployment serves, every rank proves it runs the same module files.

How vLLM 0.25.1 runs it (read from ``vllm/plugins/__init__.py`` and its callers): ``load_general_plugins()``
loads every entry point of the group ``vllm.general_plugins`` and calls it with no argument, once per
process, in the API process, the engine-core process and each worker (``WorkerWrapperBase.init_worker``).
In a worker that happens before the distributed environment exists, so the plugin cannot gather anything
yet. Instead :func:`register` wraps ``vllm.distributed.parallel_state.initialize_model_parallel``: every
worker reaches it through ``ensure_model_parallel_initialized`` (which looks the name up in its module at
call time) right after the process groups are made and before the model is loaded. The wrapper then runs
:func:`check_ranks` over the world group's CPU (gloo) group. The world group holds the tensor-parallel
group (with pipeline parallelism, several of them), so one check covers every rank of the deployment. In
the API and engine-core processes the wrapper is installed but never called.

The check hashes what ``sparkseal verify-modules`` checks by default (``sparkseal.integrity.verify``): every
distribution of the worker interpreter's site-packages directory and the files there that no RECORD
names. It compares them with the image's manifest when the image carries one, and all-gathers a digest of
the hashes. When digests
differ or any rank found a problem, every rank gathers the full lists, and every rank raises the same
:class:`RankMismatchError` naming the differing files and ranks: worker start-up fails everywhere instead
of one rank serving different code. ``VLLM_PLUGINS`` (a vLLM setting) selects which plugins load; the
plugin's entry point name is ``sparkseal``.

The plugin also registers our sparse-MLA kernel as vLLM's ``CUSTOM`` attention backend (a class path;
see :func:`register_attention_backend` and ``sparkseal.vllm_integration.vllm_backend``).

Nothing here imports vllm or torch at module import time.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from sparkseal.core.manifest import IMAGE_MANIFEST_PATH, ManifestError, listing_digest, load_manifest
from sparkseal.integrity.verify import (
    UNOWNED,
    VerifyError,
    compare_files,
    default_site_packages,
    expected_files,
    installed_module,
    installed_site,
    site_results,
    unowned_outside,
)

# A child of vLLM's own logger: vLLM configures only the "vllm" logger tree, so a logger of another name
# stays silent in the server's log, where `sparkseal live-check` looks for this check's result.
logger = logging.getLogger("vllm.sparkseal")

# At most this many differing files are named in the error; the count of the rest follows.
MAX_LISTED = 20
_WRAPPED = "_sparkseal_rank_check"


class RankMismatchError(RuntimeError):
    """Ranks run different module files, or a rank's files differ from the image manifest."""


@dataclass(frozen=True)
class LocalState:
    """What one rank found: sha256 per distribution and path, and the problems it saw on its own."""

    files: Mapping[str, Mapping[str, str]]
    problems: tuple[str, ...]

    def digest(self) -> str:
        """One sha256 over every distribution's files (``<distribution>/<path>`` listing)."""
        return listing_digest({f"{d}/{p}": h for d, paths in self.files.items() for p, h in paths.items()})


def local_state(
    modules: Sequence[str] | None = None,
    search_path: Sequence[str] | None = None,
    manifest_path: Path | None = IMAGE_MANIFEST_PATH,
    site: Path | None = None,
    jobs: int | None = None,
) -> LocalState:
    """Hash this process's modules; compare them with the manifest when ``manifest_path`` exists.

    ``modules=None``: every distribution of ``site`` (``None``: the interpreter's site-packages) and its
    files no RECORD names, as ``verify-modules`` checks by default; named modules: those alone, found on
    ``search_path``.
    """
    manifest, manifest_problem = None, None
    if manifest_path is not None and manifest_path.exists():
        try:
            manifest = load_manifest(manifest_path)
        except ManifestError as error:
            manifest_problem = str(error)
    if modules is None:
        files, problems = _site_state(manifest, manifest_path, site, jobs)
    else:
        files, problems = _modules_state(manifest, manifest_path, modules, search_path, jobs)
    if manifest_problem is not None:
        problems.append(manifest_problem)
    return LocalState(files, tuple(problems))


def _site_state(
    manifest: Mapping[str, Any] | None, manifest_path: Path | None, site: Path | None, jobs: int | None
) -> tuple[dict[str, dict[str, str]], list[str]]:
    try:
        site = default_site_packages() if site is None else site
        installed = installed_site(site, unowned_outside(manifest) if manifest else (), jobs)
    except VerifyError as error:
        return {}, [str(error)]
    files = {key: found.files for key, found in installed.distributions.items()}
    files[UNOWNED] = installed.unowned
    problems = []
    if manifest is not None and manifest_path is not None:
        for result in site_results(manifest, manifest_path, installed):
            if result.problem:
                problems.append(result.problem)
            problems.extend(f"{finding.message()} (manifest {manifest_path})" for finding in result.findings)
    return files, problems


def _modules_state(
    manifest: Mapping[str, Any] | None,
    manifest_path: Path | None,
    modules: Sequence[str],
    search_path: Sequence[str] | None,
    jobs: int | None,
) -> tuple[dict[str, dict[str, str]], list[str]]:
    files: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    installed = []
    for module in modules:
        try:
            found = installed_module(module, search_path, jobs)
        except VerifyError as error:
            problems.append(str(error))
            continue
        installed.append(found)
        files[found.distribution] = found.files
    if manifest is not None:
        for found in installed:
            expected = expected_files(manifest, found)
            if expected is None:
                problems.append(f"distribution {found.distribution} is not in the manifest {manifest_path}")
                continue
            for finding in compare_files(expected, found.files):
                problems.append(f"{finding.message()} (manifest {manifest_path})")
    return files, problems


def scope(modules: Sequence[str] | None, site: Path | None = None) -> str:
    """What the check covered, as the rank's log line names it."""
    if modules is not None:
        return ", ".join(modules)
    try:
        where = default_site_packages() if site is None else site
    except VerifyError:
        where = "site-packages"
    return f"every distribution in {where}"


def _differences(ranks: Sequence[int], per_rank: Sequence[Mapping[str, Mapping[str, str]]]) -> list[str]:
    keys = sorted({(d, p) for files in per_rank for d, paths in files.items() for p in paths})
    lines = []
    for dist, path in keys:
        hashes = [files.get(dist, {}).get(path) for files in per_rank]
        if len(set(hashes)) > 1:
            found = ", ".join(
                f"rank {rank} {'sha256 ' + h if h else 'no file'}"
                for rank, h in zip(ranks, hashes, strict=True)
            )
            lines.append(f"{dist}: {path}: {found}")
    return lines


def describe_mismatch(
    ranks: Sequence[int],
    digests: Sequence[str],
    problems: Sequence[tuple[int, str]],
    per_rank: Sequence[Mapping[str, Mapping[str, str]]] | None,
) -> str:
    """The error text every rank raises: differing digests, the files that differ and each rank's problems."""
    lines = ["sparkseal: the ranks of this deployment do not run the same verified module files"]
    if len(set(digests)) > 1:
        lines.append(
            "module digests differ: "
            + ", ".join(f"rank {r} {d}" for r, d in zip(ranks, digests, strict=True))
        )
    differences = _differences(ranks, per_rank) if per_rank is not None else []
    lines.extend(f"  {line}" for line in differences[:MAX_LISTED])
    if len(differences) > MAX_LISTED:
        lines.append(f"  ... and {len(differences) - MAX_LISTED} more differing files")
    lines.extend(f"rank {rank}: {problem}" for rank, problem in problems)
    return "\n".join(lines)


def check_ranks(local: LocalState, group: Any = None) -> str:
    """All-gather ``local`` over ``group`` (a gloo group; ``None``: the default group); return the digest.

    Every rank must call this at the same point. When the digests differ or a rank reported a problem,
    every rank raises the same :class:`RankMismatchError`.
    """
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    ranks = dist.get_process_group_ranks(group)
    summaries: list[Any] = [None] * len(ranks)
    dist.all_gather_object(summaries, (local.digest(), list(local.problems)), group=group)
    digests = [digest for digest, _ in summaries]
    problems = [(rank, p) for rank, (_, found) in zip(ranks, summaries, strict=True) for p in found]
    if len(set(digests)) == 1 and not problems:
        return digests[0]
    per_rank = None
    if len(set(digests)) > 1:  # the same on every rank, so every rank gathers here
        per_rank = [None] * len(ranks)
        dist.all_gather_object(per_rank, {d: dict(p) for d, p in local.files.items()}, group=group)
    raise RankMismatchError(describe_mismatch(ranks, digests, problems, per_rank))


def install_hook(
    parallel_state: ModuleType,
    modules: Sequence[str] | None = None,
    search_path: Sequence[str] | None = None,
    manifest_path: Path | None = IMAGE_MANIFEST_PATH,
    site: Path | None = None,
) -> None:
    """Wrap ``parallel_state.initialize_model_parallel`` so the rank check runs right after it (once).

    ``modules``, ``search_path``, ``site``: what to check, as for :func:`local_state`.
    """
    original: Callable[..., Any] = parallel_state.initialize_model_parallel
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def initialize_model_parallel(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        state = local_state(modules, search_path, manifest_path, site)
        world = parallel_state.get_world_group()
        digest = check_ranks(state, world.cpu_group)
        logger.info(
            "sparkseal: rank %d of %d: %s identical on every rank (digest %s)",
            world.rank_in_group,
            world.world_size,
            scope(modules, site),
            digest,
        )
        return result

    setattr(initialize_model_parallel, _WRAPPED, True)
    parallel_state.initialize_model_parallel = initialize_model_parallel


BACKEND_CLASS = "sparkseal.vllm_integration.vllm_backend.SparksealSparseMLABackend"
_PREFERRED = "_sparkseal_sparse_mla_first"


def register_attention_backend(environ: Mapping[str, str] | None = None) -> None:
    """Make vLLM's ``CUSTOM`` backend our sparse-MLA backend; with the switch, prefer it on 12.x.

    Registration is a class path only: vLLM imports the backend (and with it the kernel bindings)
    when a model selects it. With ``SPARKSEAL_SPARSE_MLA=1``, MLA models on capability 12.x (GB10)
    choose among ``CUSTOM`` and vLLM's dense ``TRITON_MLA`` only: a sparse model our backend cannot
    serve then fails at start-up with its reason, instead of silently running vLLM's own kernel.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from sparkseal.vllm_integration.sparse_mla_vllm import switch_enabled

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS)
    if not switch_enabled(os.environ if environ is None else environ):
        return
    from vllm.platforms import cuda

    original = cuda._get_backend_priorities
    if getattr(original, _PREFERRED, False):
        return

    @functools.wraps(original)
    def priorities(use_mla: bool, device_capability: Any, *args: Any, **kwargs: Any) -> list[Any]:
        found = original(use_mla, device_capability, *args, **kwargs)
        if not use_mla or device_capability.major != 12:
            return found
        dense = [b for b in found if b == AttentionBackendEnum.TRITON_MLA]
        return [AttentionBackendEnum.CUSTOM, *dense]

    setattr(priorities, _PREFERRED, True)
    cuda._get_backend_priorities = priorities
    logger.info("sparkseal: sparse MLA on capability 12.x runs the sparkseal kernels (%s)", BACKEND_CLASS)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: the rank check, our attention backend, and with
    ``SPARKSEAL_DSPARK_REPLAY=1`` the DSpark replay probe (``sparkseal.vllm_integration.dspark_replay``)."""
    from vllm.distributed import parallel_state

    from sparkseal.vllm_integration import dspark_replay

    install_hook(parallel_state)
    register_attention_backend()
    if dspark_replay.enabled():
        dspark_replay.install()
