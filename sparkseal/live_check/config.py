"""The live check's options, as one table: each is a field of ``Options`` whose declaration holds its flag,
default, help text, metavar, choices and valid values; the command line is built from these fields
(``options.add_commands``), so nothing of an option is written twice. Beside them the profiles that set
several at once, and the checks: of each value (``refusal``, one place whether the value came from the
command line, a profile or a Python caller) and of their combinations (``check_options``)."""

from __future__ import annotations

import json
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# Log-probabilities recorded per position (--record) and asked of the long prompt, cold and cached. Two were
# too few: on a nearly flat model the token a rounding flip picks is often the third or fourth best, and a
# token the record does not rank cannot be judged by its margin. vLLM serves up to 20 (--max-logprobs).
TOP_LOGPROBS = 5


class UsageError(Exception):
    """Bad arguments or input files: exit 2."""


@dataclass(frozen=True)
class Range:
    """The numbers an option accepts, from ``low`` (itself excluded when ``low_open``) to ``high``, and the
    words that refuse any other (NaN is in no range: it compares false with both ends).

    ``refusal`` is a ``str.format`` template of ``flag``, ``value``, ``given`` (the value as typed, or as
    ``--help`` shows it for a Python caller) and every option by its field name, so a refusal may name two
    options. ``typed``: the refusal quotes what was typed and argparse frames it ("argument --soak: ..."),
    so the command line checks it as it parses that argument, as argparse's own type checks always did; an
    untyped refusal is whole and comes after parsing, with the checks of combinations."""

    low: float
    high: float = math.inf
    low_open: bool = False
    refusal: str = ""
    typed: bool = False

    def holds(self, value: Any) -> bool:
        above = self.low < value if self.low_open else self.low <= value
        return above and value <= self.high


@dataclass(frozen=True)
class Ascending:
    """Two token ids, LOW below HIGH (``--vocab``): the ids prompts are drawn from. Same interface as
    ``Range``: the refusal quotes what was typed."""

    refusal: str
    typed: bool = True

    def holds(self, value: Any) -> bool:
        return len(value) == 2 and 0 <= value[0] < value[1]


@dataclass(frozen=True)
class Rates:
    """Rates from 0 to 1, one per position of the draft block (``--min-position-acceptance``). Same
    interface as ``Range``: the refusal quotes what was typed."""

    refusal: str
    typed: bool = True

    def holds(self, value: Any) -> bool:
        return len(value) > 0 and all(0 <= rate <= 1 for rate in value)


def _rates(text: str) -> tuple[float, ...]:
    """``R0,R1,...`` as floats; other text as no rates, which ``Rates`` refuses in its own words."""
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        return ()


POSITIVE = Range(0, low_open=True, refusal="expected a positive number, got {given!r}", typed=True)
DRAFT_TOKENS = Range(0, refusal="{flag} {value:g}: expected tokens per draft step, at least 0")
# One refusal for both GPU idle thresholds, naming both: they are read together, as one idle condition.
IDLE = (
    "--idle-memory-mib {idle_memory_mib:g}, --idle-utilization {idle_utilization:g}: expected MiB at "
    "least 0 and a percentage from 0 to 100"
)


def _token_ids(text: str) -> tuple[int, ...]:
    """``LOW:HIGH`` as its two ids; other text as no ids, which ``Ascending`` refuses in its own words."""
    match = re.fullmatch(r"(\d+):(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else ()


@dataclass(frozen=True)
class Group:
    """A titled section of ``--help`` (an argparse argument group) for options that work together."""

    title: str
    description: str


CONTEXT = Group(
    "long context",
    "one cold prompt at the server's long context: HTTP 200, tokens generated, and the drafted and "
    "accepted tokens of that request alone, from /metrics around it (run no other client meanwhile)",
)
TEARDOWN = Group(
    "teardown",
    "live-check stops the server only when given its pid (SIGTERM, never a kill), after every request, "
    "then polls nvidia-smi until every GPU is idle; without nvidia-smi that step is skipped and says so",
)
FLOORS = Group(
    "acceptance floors",
    "a speculating server whose drafts are mostly rejected decodes slower than one without speculation; "
    "each floor below makes that a finding (and implies --speculation required)",
)


@dataclass(frozen=True)
class Option:
    """One option as declared on its field of ``Options``; ``OPTIONS`` adds what the field itself says.

    ``help`` may hold ``{default}``, which ``--help`` fills with the default and each profile's value;
    ``shown`` is the default in words, where its value (None) would not say what happens then.
    ``parse``: the text of the command line to a value, by default the field's type (argparse names
    it when it fails: "invalid int value"). ``exclusive``: options of one name exclude each other.
    ``environment``: the flag names an environment variable that holds the value (a secret must not be
    on a command line, where ``ps`` shows it)."""

    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    valid: Range | Ascending | None = None
    group: Group | None = None
    exclusive: str | None = None
    shown: str | None = None
    flag: str = ""  # "": --name, the field's name with dashes
    parse: Callable[[str], Any] | None = None
    environment: bool = False
    # From the field, by _table: its name, default, type, and whether it has no default (then it is a
    # positional argument of the command line: the server's url).
    name: str = ""
    default: Any = None
    kind: type = object
    required: bool = False

    def show(self, value: Any) -> str:
        """A value as ``--help`` shows it: floats without a needless ``.0``, token ranges as LOW:HIGH."""
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, tuple):
            return ":".join(map(str, value))
        return str(value)

    def problem(self, value: Any, given: str, values: Mapping[str, Any]) -> str | None:
        """Why ``value`` is refused, None if it is not: the words after argparse's "argument FLAG: " when
        ``typed``, else the whole message. The choices are argparse's own words (Python 3.11)."""
        if self.choices and value not in self.choices:
            return f"invalid choice: {given!r} (choose from {', '.join(map(repr, self.choices))})"
        if self.valid is not None and not self.valid.holds(value):
            return self.valid.refusal.format(**values, flag=self.flag, value=value, given=given)
        return None

    @property
    def typed(self) -> bool:
        """Whether a refusal quotes what was typed, in argparse's frame: then the parser checks it."""
        return bool(self.choices) or (self.valid is not None and self.valid.typed)


def option(default: Any = MISSING, help: str = "", **declared: Any) -> Any:
    """A field of ``Options`` with its option's declaration (``Option``'s fields) as metadata."""
    return field(default=default, metadata={"option": Option(help=help, **declared)})


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


@dataclass(frozen=True)
class Options:
    """A live check's options. The fields' order is ``--help``'s; a field without ``option`` is no flag."""

    url: str = option(help="the server, e.g. http://127.0.0.1:8000")
    model: str | None = option(None, "served model name ({default})", shown="the first one /v1/models lists")
    wait: float = option(
        0.0,
        "wait up to SECONDS for the server to answer /v1/models before the checks (a server started a "
        "moment ago refuses connections while it loads its model); past it, the server is unreachable "
        "(exit 2) ({default}, no wait)",
        metavar="SECONDS",
        valid=Range(0, refusal="{flag} {value:g}: expected seconds, at least 0"),
    )
    profile: str | None = option(
        None,
        "a validation sequence's counts as defaults, each still overridable: reference: 120 serial "
        "requests of 64 tokens, a 28,820-token prompt cold then cached (it must hit the prefix cache), a "
        "660,000-token cold prompt, speculation required",
        choices=tuple(sorted(PROFILES)),
    )
    soak: int = option(120, "soak requests ({default})", valid=POSITIVE)
    max_tokens: int = option(32, "tokens per completion ({default})", valid=POSITIVE)
    concurrency: int = option(1, "concurrent clients in the soak ({default})", valid=POSITIVE)
    prompt_tokens: int = option(64, "soak prompt length ({default})", valid=POSITIVE)
    long_prompt_tokens: int = option(
        2048, "the prompt served cold then from the prefix cache ({default})", valid=POSITIVE
    )
    require_cache_hit: bool = option(
        False,
        "the cached long prompt must hit the prefix cache, by usage.prompt_tokens_details or /metrics "
        "({default})",
    )
    context_tokens: int | None = option(
        None, "the cold prompt's length ({default}: off)", metavar="N", valid=POSITIVE, group=CONTEXT
    )
    min_max_model_len: int | None = option(
        None,
        "the max_model_len /v1/models must list, else a finding naming both ({default})",
        shown="the prompt plus --max-tokens",
        metavar="N",
        valid=POSITIVE,
        group=CONTEXT,
    )
    context_timeout: float = option(
        1800.0, "seconds for that request ({default})", metavar="S", valid=POSITIVE, group=CONTEXT
    )
    teardown_pid: int | None = option(
        None,
        "the server's process (e.g. $! of the shell that started vllm serve or podman run)",
        metavar="PID",
        valid=POSITIVE,
        group=TEARDOWN,
    )
    teardown_timeout: float = option(
        120.0, "seconds for it to exit after SIGTERM ({default})", metavar="S", valid=POSITIVE, group=TEARDOWN
    )
    idle_memory_mib: float = option(
        512.0,
        "idle: memory.used at most this ({default})",
        metavar="MIB",
        valid=Range(0, refusal=IDLE),
        group=TEARDOWN,
    )
    idle_utilization: float = option(
        0.0,
        "idle: utilization.gpu at most this ({default})",
        metavar="PCT",
        valid=Range(0, 100, refusal=IDLE),
        group=TEARDOWN,
    )
    idle_timeout: float = option(
        60.0, "seconds to wait for idle GPUs ({default})", metavar="S", valid=POSITIVE, group=TEARDOWN
    )
    vocab: tuple[int, int] = option(
        (100, 1000),
        "token ids of prompts ({default})",
        metavar="LOW:HIGH",
        parse=_token_ids,
        valid=Ascending("expected LOW:HIGH with LOW < HIGH (token ids), got {given!r}"),
    )
    seed: int = option(0, "seed of the soak prompts ({default})")
    timeout: float = option(60.0, "seconds per request ({default})", valid=POSITIVE)
    first_timeout: float = option(
        300.0, "seconds for the first request and the long prompt ({default})", valid=POSITIVE
    )
    speculation: str = option(
        "auto",
        "auto: if the server exports speculative-decoding metrics, something must be drafted; "
        "required: it must export them too; off: no check ({default})",
        choices=("auto", "required", "off"),
    )
    tie_margin: float = option(
        0.1,
        "a first difference from the reference, or of the cached long prompt from the cold one, where "
        "the token the server chose was this close in log-probability to the best token recorded there "
        "(whatever its rank among the --top-logprobs recorded) is a near-tie flip, not a finding; a token "
        "beyond it or not recorded at all is ({default}; 0: exact match)",
    )
    top_logprobs: int = option(
        TOP_LOGPROBS,
        "log-probabilities recorded per position by --record and asked for the long prompt, cold and "
        "cached; at most the server's --max-logprobs ({default})",
        metavar="K",
        valid=POSITIVE,
    )
    record: Path | None = option(
        None, "write the soak's prompts and completions as the reference", exclusive="reference"
    )
    against: Path | None = option(
        None, "compare the soak's completions with a recorded reference", exclusive="reference"
    )
    prompts: Path | None = option(
        None,
        'soak prompts as token ids (JSON: {"format": "sparkseal-prompts/1", "prompts": [[id, ...], '
        "...]}, as bench/live/train_dspark.py writes held-out text), the first --soak of them, instead of "
        "random ids; --record keeps them in the reference",
        metavar="FILE",
    )
    min_acceptance: float | None = option(
        None,
        "accepted over drafted tokens during the check, 0 to 1",
        metavar="RATE",
        valid=Range(0, 1, refusal="{flag} {value:g}: expected a rate from 0 to 1"),
        group=FLOORS,
    )
    min_accepted_length: float | None = option(
        None,
        "accepted draft tokens per draft step during the check, the bonus token not counted (of "
        "num_speculative_tokens; vLLM's 'mean acceptance length' is this plus one)",
        metavar="TOKENS",
        valid=DRAFT_TOKENS,
        group=FLOORS,
    )
    min_position_acceptance: tuple[float, ...] | None = option(
        None,
        "per position of the draft block, the share of draft steps that accepted a token there (vLLM's "
        "spec_decode_num_accepted_tokens_per_pos over its drafts, during the check): position 0 first; a "
        "position below its rate, or one the server does not export, is a finding",
        metavar="R0,R1,...",
        parse=_rates,
        valid=Rates("expected rates from 0 to 1, one per position, as R0,R1,..., got {given!r}"),
        group=FLOORS,
    )
    min_request_accepted_length: float | None = option(
        None,
        "the same for every soak request alone, read from /metrics before and after each request (needs "
        "--concurrency 1): an average can hide a few requests whose drafts go wrong",
        metavar="TOKENS",
        valid=DRAFT_TOKENS,
        group=FLOORS,
    )
    dspark_replay: bool = option(
        False,
        "read the DSpark replay probe through POST /collective_rpc (a server with VLLM_SERVER_DEV_MODE=1 "
        "and SPARKSEAL_DSPARK_REPLAY=1): draft K/V of rejected tokens or in the null block 0, and padded "
        "sample rows acting as a request, are findings; the bugs vLLM's DSpark fix (patch 0001) removes",
    )
    stop_at_eos: bool = option(
        False,
        "soak requests stop at the model's end of text (no ignore_eos): acceptance measured on text as it "
        "ends, not on generations forced past it; completions may then be shorter than --max-tokens",
    )
    draft_config: Path | None = option(
        None,
        "the draft's config.json: its block_size (or dflash_config.block_size) must equal the server's "
        "speculative-token count (the positions /metrics exports), else no request is sent",
        metavar="FILE",
    )
    log: Path | None = option(None, "the server's log, scanned for failures")
    nccl_logs: Path | None = option(
        None,
        "the per-rank NCCL_DEBUG_FILE logs (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,COLL): every rank's "
        "collective sequence must be the same; implies --require-module-check",
        metavar="DIR",
    )
    require_module_check: bool = option(
        False, "the server log must show the sparkseal plugin's cross-rank module check for every rank"
    )
    api_key: str | None = option(
        None,
        "environment variable holding the server's API key",
        flag="--api-key-env",
        metavar="VAR",
        environment=True,
    )
    progress_interval: float = option(
        30.0,
        "seconds between progress lines on stderr while one request runs ({default})",
        metavar="S",
        valid=POSITIVE,
    )
    # Seconds between nvidia-smi polls while waiting for idle GPUs: no flag, tests shorten it.
    idle_poll: float = 1.0

    @property
    def floors(self) -> bool:
        return any(
            floor is not None
            for floor in (
                self.min_acceptance,
                self.min_accepted_length,
                self.min_position_acceptance,
                self.min_request_accepted_length,
            )
        )


def _table() -> dict[str, Option]:
    """Each declared field's ``Option``, completed from the field: name, flag, default and type (of
    ``X | None``, X), in the fields' order."""
    hints = typing.get_type_hints(Options)
    table = {}
    for declared in fields(Options):
        if "option" not in declared.metadata:
            continue
        hint = hints[declared.name]
        if isinstance(hint, types.UnionType):
            (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
        base: Option = declared.metadata["option"]
        table[declared.name] = replace(
            base,
            name=declared.name,
            flag=base.flag or "--" + declared.name.replace("_", "-"),
            default=None if declared.default is MISSING else declared.default,
            kind=typing.get_origin(hint) or hint,
            required=declared.default is MISSING,
        )
    return table


OPTIONS: dict[str, Option] = _table()


def refusal(name: str, value: Any, values: Mapping[str, Any] | None = None) -> str | None:
    """Why option ``name`` refuses ``value``, as the command line words it, None if it does not: the one
    check of a value, whether typed, set by a profile or given by a Python caller. ``values`` are the other
    options, for a refusal that names two."""
    declared = OPTIONS[name]
    problem = declared.problem(value, declared.show(value), values or {})
    if problem is not None and declared.typed:
        return f"argument {declared.flag}: {problem}"
    return problem


def options_for(profile: str | None, url: str, **given: Any) -> Options:
    """The options of a run: the plain defaults, then ``profile``'s, then what was given explicitly."""
    if profile is not None and (problem := refusal("profile", profile)) is not None:
        raise UsageError(problem)
    return Options(url=url, profile=profile, **{**PROFILES.get(profile, {}), **given})


def _check_values(options: Options) -> None:
    """Each option's value, in ``--help``'s order; None is an option left off."""
    values = {name: getattr(options, name) for name in OPTIONS}
    for name, value in values.items():
        if value is not None and (problem := refusal(name, value, values)) is not None:
            raise UsageError(problem)


def _check_added_steps(options: Options) -> None:
    """The added steps' arguments, before any request: a wrong one must not cost a 660,000-token prompt."""
    if options.context_tokens is not None:
        needed = options.context_tokens + options.max_tokens
        if options.min_max_model_len is not None and options.min_max_model_len < needed:
            raise UsageError(
                f"--min-max-model-len {options.min_max_model_len}: a {options.context_tokens}-token prompt "
                f"and {options.max_tokens} generated tokens need at least {needed}"
            )
    pid = options.teardown_pid
    if pid is not None:
        if pid == 1 or pid == os.getpid():
            raise UsageError(f"--teardown-pid {pid}: not a server's process id")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise UsageError(f"--teardown-pid {pid}: no such process") from None
        except PermissionError:
            raise UsageError(f"--teardown-pid {pid}: not allowed to signal it") from None


def _check_exclusive(options: Options) -> None:
    """Options declared exclusive (``--record``, ``--against``) set together, in argparse's words for the
    two typed in the table's order: a Python caller hears what the command line says."""
    taken: dict[str, Option] = {}
    for declared in OPTIONS.values():
        if declared.exclusive is None or getattr(options, declared.name) == declared.default:
            continue
        if declared.exclusive in taken:
            raise UsageError(
                f"argument {declared.flag}: not allowed with argument {taken[declared.exclusive].flag}"
            )
        taken[declared.exclusive] = declared


def check_options(options: Options) -> None:
    """Every argument, before any request: a wrong one must not cost a soak or a 660,000-token prompt.
    Each value first, against its own range, then the combinations and the files."""
    _check_values(options)
    _check_exclusive(options)
    if options.log is not None and not options.log.is_file():
        raise UsageError(f"--log {options.log}: no such file")
    if options.draft_config is not None:
        draft_block_size(options.draft_config)  # a missing or unreadable file is refused before any request
    if options.nccl_logs is not None and not options.nccl_logs.is_dir():
        raise UsageError(f"--nccl-logs {options.nccl_logs}: expected a folder of per-rank NCCL logs")
    if (options.require_module_check or options.nccl_logs is not None) and options.log is None:
        raise UsageError("the module check reads the server log: give --log FILE")
    if options.prompts is not None and options.against is not None:
        raise UsageError("--prompts and --against exclude each other: the reference carries its own prompts")
    if options.floors and options.speculation == "off":
        raise UsageError("acceptance floors need the speculation check: not with --speculation off")
    if options.min_request_accepted_length is not None and options.concurrency != 1:
        raise UsageError(
            "--min-request-accepted-length reads /metrics around each request, so it needs --concurrency 1 "
            f"(got {options.concurrency})"
        )
    _check_added_steps(options)


def draft_block_size(path: Path) -> int:
    """The block size a DSpark/DFlash draft was trained for, from its config.json (``block_size``, or
    ``dflash_config.block_size``): the speculative-token count it drafts well at (vllm#41834: acceptance fell
    from 34.7% to 4.4% at 7 speculative tokens against a block of 5)."""
    try:
        config = json.loads(path.read_text())
    except OSError as error:
        raise UsageError(f"--draft-config {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(f"--draft-config {path}: not JSON: {error}") from None
    nested = config.get("dflash_config") if isinstance(config, dict) else None
    for where, value in (
        ("block_size", config.get("block_size") if isinstance(config, dict) else None),
        ("dflash_config.block_size", nested.get("block_size") if isinstance(nested, dict) else None),
    ):
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"--draft-config {path}: {where} is {value!r}, expected a positive integer")
            return value
    raise UsageError(
        f"--draft-config {path}: no block_size (nor dflash_config.block_size): the draft's block size is not "
        "known"
    )
