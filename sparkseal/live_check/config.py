"""The live check's options: their defaults, the profiles that set several at once, and their checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# Log-probabilities recorded per position (--record) and asked of the long prompt, cold and cached. Two were
# too few: on a nearly flat model the token a rounding flip picks is often the third or fourth best, and a
# token the record does not rank cannot be judged by its margin. vLLM serves up to 20 (--max-logprobs).
TOP_LOGPROBS = 5


class UsageError(Exception):
    """Bad arguments or input files: exit 2."""


@dataclass(frozen=True)
class Options:
    url: str
    model: str | None = None
    timeout: float = 60.0
    first_timeout: float = 300.0
    soak: int = 120
    max_tokens: int = 32
    concurrency: int = 1
    prompt_tokens: int = 64
    long_prompt_tokens: int = 2048
    vocab_low: int = 100
    vocab_high: int = 1000
    seed: int = 0
    speculation: str = "auto"  # auto | required | off
    tie_margin: float = 0.1
    top_logprobs: int = TOP_LOGPROBS
    record: Path | None = None
    against: Path | None = None
    log: Path | None = None
    api_key: str | None = None
    nccl_logs: Path | None = None
    require_module_check: bool = False
    prompts: Path | None = None
    min_acceptance: float | None = None
    min_accepted_length: float | None = None
    min_request_accepted_length: float | None = None
    profile: str | None = None
    require_cache_hit: bool = False  # the cached long prompt must hit the prefix cache
    context_tokens: int | None = None  # one cold prompt of this many tokens (off: None)
    context_timeout: float = 1800.0
    min_max_model_len: int | None = None  # None: the context prompt plus --max-tokens
    teardown_pid: int | None = None  # stop this process after the checks, then wait for idle GPUs
    teardown_timeout: float = 120.0
    idle_memory_mib: float = 512.0
    idle_utilization: float = 0.0
    idle_timeout: float = 60.0
    idle_poll: float = 1.0
    progress_interval: float = 30.0
    wait: float = 0.0

    @property
    def floors(self) -> bool:
        return any(
            floor is not None
            for floor in (self.min_acceptance, self.min_accepted_length, self.min_request_accepted_length)
        )


# The reference validation of DSpark on GB10s, as defaults: 120 serial requests of 64 tokens (7,680 generated
# tokens), a 28,820-token prompt cold then from the prefix cache, a 660,000-token cold prompt on a server of
# at least 1,048,576 tokens of context, speculative decoding required. Everything here stays overridable.
PROFILES: dict[str, dict[str, Any]] = {
    "reference": {
        "soak": 120,
        "max_tokens": 64,
        "concurrency": 1,
        "long_prompt_tokens": 28_820,
        "require_cache_hit": True,
        "context_tokens": 660_000,
        "min_max_model_len": 1_048_576,
        "speculation": "required",
    },
}


def default(name: str, profile: str | None = None) -> Any:
    """An option's default, under ``profile`` if it sets one: the one home of the defaults the CLI shows."""
    if profile is not None and name in PROFILES[profile]:
        return PROFILES[profile][name]
    return next(f.default for f in fields(Options) if f.name == name)


def options_for(profile: str | None, url: str, **given: Any) -> Options:
    """The options of a run: the plain defaults, then ``profile``'s, then what was given explicitly."""
    if profile is not None and profile not in PROFILES:
        raise UsageError(f"--profile {profile}: expected one of {sorted(PROFILES)}")
    return Options(url=url, profile=profile, **{**PROFILES.get(profile, {}), **given})


def _check_added_steps(options: Options) -> None:
    """The added steps' arguments, before any request: a wrong one must not cost a 660,000-token prompt."""
    if options.context_tokens is not None:
        if options.context_tokens < 1:
            raise UsageError(f"--context-tokens {options.context_tokens}: expected at least 1 token")
        needed = options.context_tokens + options.max_tokens
        if options.min_max_model_len is not None and options.min_max_model_len < needed:
            raise UsageError(
                f"--min-max-model-len {options.min_max_model_len}: a {options.context_tokens}-token prompt "
                f"and {options.max_tokens} generated tokens need at least {needed}"
            )
    for flag, value in (
        ("--context-timeout", options.context_timeout),
        ("--teardown-timeout", options.teardown_timeout),
        ("--idle-timeout", options.idle_timeout),
    ):
        if value <= 0:
            raise UsageError(f"{flag} {value:g}: expected seconds, more than 0")
    if options.idle_memory_mib < 0 or not 0 <= options.idle_utilization <= 100:
        raise UsageError(
            f"--idle-memory-mib {options.idle_memory_mib:g}, --idle-utilization "
            f"{options.idle_utilization:g}: expected MiB at least 0 and a percentage from 0 to 100"
        )
    pid = options.teardown_pid
    if pid is not None:
        if pid <= 1 or pid == os.getpid():
            raise UsageError(f"--teardown-pid {pid}: not a server's process id")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise UsageError(f"--teardown-pid {pid}: no such process") from None
        except PermissionError:
            raise UsageError(f"--teardown-pid {pid}: not allowed to signal it") from None


def check_options(options: Options) -> None:
    """Every argument, before any request: a wrong one must not cost a soak or a 660,000-token prompt."""
    if options.record is not None and options.against is not None:
        raise UsageError("--record and --against exclude each other")
    if options.soak < 1 or options.concurrency < 1 or options.max_tokens < 1 or options.top_logprobs < 1:
        raise UsageError("--soak, --concurrency, --max-tokens and --top-logprobs must be at least 1")
    if options.log is not None and not options.log.is_file():
        raise UsageError(f"--log {options.log}: no such file")
    if options.nccl_logs is not None and not options.nccl_logs.is_dir():
        raise UsageError(f"--nccl-logs {options.nccl_logs}: expected a folder of per-rank NCCL logs")
    if (options.require_module_check or options.nccl_logs is not None) and options.log is None:
        raise UsageError("the module check reads the server log: give --log FILE")
    if options.prompts is not None and options.against is not None:
        raise UsageError("--prompts and --against exclude each other: the reference carries its own prompts")
    if options.floors and options.speculation == "off":
        raise UsageError("acceptance floors need the speculation check: not with --speculation off")
    if options.min_acceptance is not None and not 0.0 <= options.min_acceptance <= 1.0:
        raise UsageError(f"--min-acceptance {options.min_acceptance:g}: expected a rate from 0 to 1")
    for flag, floor in (
        ("--min-accepted-length", options.min_accepted_length),
        ("--min-request-accepted-length", options.min_request_accepted_length),
    ):
        if floor is not None and floor < 0:
            raise UsageError(f"{flag} {floor:g}: expected tokens per draft step, at least 0")
    if options.wait < 0:
        raise UsageError(f"--wait {options.wait:g}: expected seconds, at least 0")
    if options.min_request_accepted_length is not None and options.concurrency != 1:
        raise UsageError(
            "--min-request-accepted-length reads /metrics around each request, so it needs --concurrency 1 "
            f"(got {options.concurrency})"
        )
    _check_added_steps(options)
