"""The command-line options of live-check, beside the checker they configure (the defaults shown come
from ``config``, their one home)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

# live-check options that a --profile may set: their parsers default to None, so that what a user gives
# wins over the profile, and the profile over the plain default (config.options_for).
_PROFILED = (
    "soak",
    "max_tokens",
    "concurrency",
    "long_prompt_tokens",
    "speculation",
    "require_cache_hit",
    "context_tokens",
    "min_max_model_len",
)


def _live_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.live_check.client import Unreachable
    from sparkseal.live_check.config import UsageError, options_for
    from sparkseal.live_check.report import render
    from sparkseal.live_check.run import run

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        parser.error(f"--api-key-env {args.api_key_env}: the variable is not set")
    given = {name: getattr(args, name) for name in _PROFILED if getattr(args, name) is not None}
    try:
        options = options_for(
            args.profile,
            args.url,
            **given,
            model=args.model,
            timeout=args.timeout,
            first_timeout=args.first_timeout,
            prompt_tokens=args.prompt_tokens,
            vocab_low=args.vocab[0],
            vocab_high=args.vocab[1],
            seed=args.seed,
            tie_margin=args.tie_margin,
            top_logprobs=args.top_logprobs,
            record=args.record,
            against=args.against,
            log=args.log,
            api_key=api_key,
            nccl_logs=args.nccl_logs,
            require_module_check=args.require_module_check,
            prompts=args.prompts,
            min_acceptance=args.min_acceptance,
            min_accepted_length=args.min_accepted_length,
            min_request_accepted_length=args.min_request_accepted_length,
            context_timeout=args.context_timeout,
            teardown_pid=args.teardown_pid,
            teardown_timeout=args.teardown_timeout,
            idle_memory_mib=args.idle_memory_mib,
            idle_utilization=args.idle_utilization,
            idle_timeout=args.idle_timeout,
            progress_interval=args.progress_interval,
            wait=args.wait,
        )
        # Progress goes to stderr, --json or not: the report alone is on stdout.
        report = run(options, lambda line: print(f"live-check: {line}", file=sys.stderr, flush=True))
    except UsageError as error:
        parser.error(str(error))
    except Unreachable as error:
        print(f"sparkseal live-check: server unreachable: {error}", file=sys.stderr)
        return 2
    print(render(report, args.json))
    return 0 if report.ok else 1


def _vocab_arg(value: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+):(\d+)", value)
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH with LOW < HIGH (token ids), got {value!r}")
    return int(match.group(1)), int(match.group(2))


def _positive(kind: type) -> object:
    def parse(value: str) -> object:
        number = kind(value)
        if number <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
        return number

    return parse


def add_commands(commands: argparse._SubParsersAction) -> None:
    from sparkseal.live_check.config import PROFILES, TOP_LOGPROBS, default

    def defaults(name: str) -> str:
        """'default: X' and, where a profile sets the option, 'reference: Y' (from live_check, not here)."""
        shown = [f"default: {default(name)}"]
        shown += [f"--profile {p}: {default(name, p)}" for p in sorted(PROFILES) if name in PROFILES[p]]
        return "; ".join(shown)

    live = commands.add_parser(
        "live-check",
        help="validate a running vLLM server (first request, soak, prefix cache, DSpark, lossless, log)",
        description="Validate a running vLLM OpenAI-compatible server before taking DSpark into service: "
        "a first request with a deadline, a soak of greedy requests, a long prompt cold and then from the "
        "prefix cache (both must answer alike up to a near-tie flip), drafted and accepted tokens from "
        "/metrics, the soak's completions against a reference recorded without speculation, and the server "
        "log scanned for tracebacks, dead engines, RPC timeouts, NCCL errors, illegal memory accesses and "
        "out-of-memory. Prompts are token ids, so servers started with --skip-tokenizer-init work. "
        "--profile reference runs the reference validation of DSpark on GB10s with its counts as defaults: a "
        "660,000-token cold prompt on a server of at least 1,048,576 tokens of context among them. Progress "
        "goes to stderr. Exit 0 pass, 1 a finding, 2 a usage error or an unreachable server.",
    )
    live.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    live.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    live.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the server to answer /v1/models before the checks (a server started a "
        "moment ago refuses connections while it loads its model); past it, the server is unreachable "
        "(exit 2) (default: 0, no wait)",
    )
    live.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="a validation sequence's counts as defaults, each still overridable: reference: 120 serial "
        "requests of 64 tokens, a 28,820-token prompt cold then cached (it must hit the prefix cache), a "
        "660,000-token cold prompt, speculation required",
    )
    live.add_argument("--soak", type=_positive(int), help=f"soak requests ({defaults('soak')})")
    live.add_argument(
        "--max-tokens", type=_positive(int), help=f"tokens per completion ({defaults('max_tokens')})"
    )
    live.add_argument(
        "--concurrency",
        type=_positive(int),
        help=f"concurrent clients in the soak ({defaults('concurrency')})",
    )
    live.add_argument(
        "--prompt-tokens", type=_positive(int), default=64, help="soak prompt length (default: 64)"
    )
    live.add_argument(
        "--long-prompt-tokens",
        type=_positive(int),
        help=f"the prompt served cold then from the prefix cache ({defaults('long_prompt_tokens')})",
    )
    live.add_argument(
        "--require-cache-hit",
        action=argparse.BooleanOptionalAction,
        help="the cached long prompt must hit the prefix cache, by usage.prompt_tokens_details or /metrics "
        f"({defaults('require_cache_hit')})",
    )
    context = live.add_argument_group(
        "long context",
        "one cold prompt at the server's long context: HTTP 200, tokens generated, and the drafted and "
        "accepted tokens of that request alone, from /metrics around it (run no other client meanwhile)",
    )
    context.add_argument(
        "--context-tokens",
        type=_positive(int),
        metavar="N",
        help=f"the cold prompt's length ({defaults('context_tokens')}: off)",
    )
    context.add_argument(
        "--min-max-model-len",
        type=_positive(int),
        metavar="N",
        help="the max_model_len /v1/models must list, else a finding naming both (default: the prompt "
        f"plus --max-tokens; --profile reference: {default('min_max_model_len', 'reference')})",
    )
    context.add_argument(
        "--context-timeout",
        type=_positive(float),
        default=default("context_timeout"),
        metavar="S",
        help=f"seconds for that request (default: {default('context_timeout'):g})",
    )
    teardown = live.add_argument_group(
        "teardown",
        "live-check stops the server only when given its pid (SIGTERM, never a kill), after every request, "
        "then polls nvidia-smi until every GPU is idle; without nvidia-smi that step is skipped and says so",
    )
    teardown.add_argument(
        "--teardown-pid",
        type=_positive(int),
        metavar="PID",
        help="the server's process (e.g. $! of the shell that started vllm serve or podman run)",
    )
    teardown.add_argument(
        "--teardown-timeout",
        type=_positive(float),
        default=default("teardown_timeout"),
        metavar="S",
        help=f"seconds for it to exit after SIGTERM (default: {default('teardown_timeout'):g})",
    )
    teardown.add_argument(
        "--idle-memory-mib",
        type=float,
        default=default("idle_memory_mib"),
        metavar="MIB",
        help=f"idle: memory.used at most this (default: {default('idle_memory_mib'):g})",
    )
    teardown.add_argument(
        "--idle-utilization",
        type=float,
        default=default("idle_utilization"),
        metavar="PCT",
        help=f"idle: utilization.gpu at most this (default: {default('idle_utilization'):g})",
    )
    teardown.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=default("idle_timeout"),
        metavar="S",
        help=f"seconds to wait for idle GPUs (default: {default('idle_timeout'):g})",
    )
    live.add_argument(
        "--vocab",
        type=_vocab_arg,
        default=(100, 1000),
        metavar="LOW:HIGH",
        help="token ids of prompts (default: 100:1000)",
    )
    live.add_argument("--seed", type=int, default=0, help="seed of the soak prompts (default: 0)")
    live.add_argument(
        "--timeout", type=_positive(float), default=60.0, help="seconds per request (default: 60)"
    )
    live.add_argument(
        "--first-timeout",
        type=_positive(float),
        default=300.0,
        help="seconds for the first request and the long prompt (default: 300)",
    )
    live.add_argument(
        "--speculation",
        choices=("auto", "required", "off"),
        help="auto: if the server exports speculative-decoding metrics, something must be drafted; "
        f"required: it must export them too; off: no check ({defaults('speculation')})",
    )
    live.add_argument(
        "--tie-margin",
        type=float,
        default=0.1,
        help="a first difference from the reference, or of the cached long prompt from the cold one, where "
        "the token the server chose was this close in log-probability to the best token recorded there "
        "(whatever its rank among the --top-logprobs recorded) is a near-tie flip, not a finding; a token "
        "beyond it or not recorded at all is (default: 0.1; 0: exact match)",
    )
    live.add_argument(
        "--top-logprobs",
        type=_positive(int),
        default=TOP_LOGPROBS,
        metavar="K",
        help="log-probabilities recorded per position by --record and asked for the long prompt, cold and "
        f"cached; at most the server's --max-logprobs (default: {TOP_LOGPROBS})",
    )
    reference = live.add_mutually_exclusive_group()
    reference.add_argument(
        "--record", type=Path, help="write the soak's prompts and completions as the reference"
    )
    reference.add_argument(
        "--against", type=Path, help="compare the soak's completions with a recorded reference"
    )
    live.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help='soak prompts as token ids (JSON: {"format": "sparkseal-prompts/1", "prompts": [[id, ...], '
        "...]}, as bench/live/train_dspark.py writes held-out text), the first --soak of them, instead of "
        "random ids; --record keeps them in the reference",
    )
    floors = live.add_argument_group(
        "acceptance floors",
        "a speculating server whose drafts are mostly rejected decodes slower than one without speculation; "
        "each floor below makes that a finding (and implies --speculation required)",
    )
    floors.add_argument(
        "--min-acceptance",
        type=float,
        metavar="RATE",
        help="accepted over drafted tokens during the check, 0 to 1",
    )
    floors.add_argument(
        "--min-accepted-length",
        type=float,
        metavar="TOKENS",
        help="accepted draft tokens per draft step during the check, the bonus token not counted (of "
        "num_speculative_tokens; vLLM's 'mean acceptance length' is this plus one)",
    )
    floors.add_argument(
        "--min-request-accepted-length",
        type=float,
        metavar="TOKENS",
        help="the same for every soak request alone, read from /metrics before and after each request (needs "
        "--concurrency 1): an average can hide a few requests whose drafts go wrong",
    )
    live.add_argument("--log", type=Path, help="the server's log, scanned for failures")
    live.add_argument(
        "--nccl-logs",
        type=Path,
        metavar="DIR",
        help="the per-rank NCCL_DEBUG_FILE logs (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,COLL): every rank's "
        "collective sequence must be the same; implies --require-module-check",
    )
    live.add_argument(
        "--require-module-check",
        action="store_true",
        help="the server log must show the sparkseal plugin's cross-rank module check for every rank",
    )
    live.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the server's API key"
    )
    live.add_argument(
        "--progress-interval",
        type=_positive(float),
        default=default("progress_interval"),
        metavar="S",
        help="seconds between progress lines on stderr while one request runs "
        f"(default: {default('progress_interval'):g})",
    )
    live.add_argument("--json", action="store_true", help="print a JSON report")
    live.set_defaults(handler=_live_check, parser=live)
