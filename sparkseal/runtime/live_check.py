"""Validate a running vLLM OpenAI-compatible server before DSpark goes into service (``live-check``).

The defects this guards against show up only in a live engine: a first request that never returns after
CUDA-graph capture, speculative decoding configured but never drafting, a prefix-cache hit that answers
differently from the cold prompt, completions that drift from the model's own non-speculative output, and
engine failures that a client sees only as slowness (dead engine core, RPC timeouts, NCCL errors, illegal
memory accesses, out-of-memory) and that the server log records. Each step reports its figures; a defect
is a *finding* (exit 1). A server that cannot be reached at all, or bad arguments, exit 2.

Prompts are token ids, so the check works against ``--skip-tokenizer-init`` servers and needs no
tokenizer here; ``return_token_ids`` (a vLLM extension of the completions API) makes completions
comparable token by token. Requests run at temperature 0. Every request has a deadline: a hang becomes a
finding, never a stuck process.

The lossless check compares the soak's completions with a reference file that ``--record`` wrote against
the same model served without speculation. The reference carries its own prompts and ``max_tokens``, so
``--against`` replays exactly what was recorded, and the reference's top ``--top-logprobs`` (5)
log-probabilities at every position. Speculative decoding verifies drafts with the target model, so its
greedy output equals the non-speculative one up to floating-point rounding: the verification pass runs
other kernels and batch shapes than a one-token decode, and in bf16 that can flip the choice between
near-equal tokens. A nearly flat model has several of them at a position, and rounding may pick any, not
only the runner-up. So a completion that first differs where the token the server chose was within
``--tie-margin`` (in log-probability) of the reference's best token there, whatever its rank among the
recorded ones, is counted as a near-tie flip, not a finding; a chosen token beyond the margin, or not
among the recorded top tokens at all, is a finding. The same rule judges the long prompt served from the
prefix cache against the cold prompt, which asks for log-probabilities for that reason: vLLM does not
promise that a cached prefill rounds like a cold one.

Speculative decoding that drafts but whose drafts are rejected is slower than none, so drafting alone is
not enough: ``--min-acceptance`` (accepted over drafted tokens), ``--min-accepted-length`` (accepted draft
tokens per draft step, the bonus token not counted; vLLM's "mean acceptance length" is one more) and,
serially, ``--min-request-accepted-length`` (the same for every single request, read from ``/metrics``
around each request, since an average over many requests can hide a few whose drafts go wrong) make a
draft that does not draft well a finding. ``--prompts FILE`` serves held-out prompts (token ids) instead
of random ones, so the figures say something about the model's own text; ``--record`` keeps them in the
reference. The soak also reports the server's own decode speed per request (tokens after the first over
the time from first to last token, from vLLM's histograms), which no client-side pause disturbs.

With tensor parallelism, two more steps prove that the ranks agree. The module check: the sparkseal vLLM
plugin logs, in every worker, that the module files of every rank are identical (or stops them all); the
server log must show that line once per rank, with one digest. The NCCL check (``--nccl-logs DIR``, the
folder of the per-rank ``NCCL_DEBUG_FILE`` logs written with ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS``
including ``COLL``): after the check's requests, every rank's normalised collective sequence must be the
same (``sparkseal nccl-diff``'s rules); the first divergence is a finding.

``--profile reference`` is the validation GB10 owners ran by hand for DSpark (two GB10s, tensor parallel
2, a 1M-token-context target, 5 speculative tokens, ``--max-num-seqs 1``): its counts become the defaults
(``PROFILES``), each still overridable, and the steps it adds are steps of this one checker, off unless
asked for: one cold prompt of ``--context-tokens`` (660,000) on a server whose ``max_model_len``
(``/v1/models``) is at least ``--min-max-model-len`` (1,048,576), with its own drafted and accepted tokens
read from ``/metrics`` around it; a prefix-cache hit that must really hit; and, with ``--teardown-pid``,
the server stopped after the checks and the GPUs polled with ``nvidia-smi`` until their memory and
utilisation are back to idle. live-check stops a server only when told its pid: a check that must not
end the service it checks does not get one. Every step reports its own time; progress goes to the
``progress`` callback (the CLI's stderr), with a heartbeat while one request runs for minutes.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sparkseal.core.nccl import NcclLogError, RankLog, first_divergence, parse_log

REFERENCE_FORMAT = "sparkseal-live-reference/1"

# Log-probabilities recorded per position (--record) and asked of the long prompt, cold and cached. Two were
# too few: on a nearly flat model the token a rounding flip picks is often the third or fourth best, and a
# token the record does not rank cannot be judged by its margin. vLLM serves up to 20 (--max-logprobs).
TOP_LOGPROBS = 5

# Prometheus counters of vLLM's v1 engine (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py).
METRIC_DRAFTS = "vllm:spec_decode_num_drafts"
METRIC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
METRIC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
METRIC_PREFIX_QUERIES = "vllm:prefix_cache_queries"
METRIC_PREFIX_HITS = "vllm:prefix_cache_hits"
METRIC_TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
METRIC_TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
METRIC_GENERATION_SUM = "vllm:request_generation_tokens_sum"
METRIC_DECODE_SUM = "vllm:request_decode_time_seconds_sum"
METRIC_DECODE_COUNT = "vllm:request_decode_time_seconds_count"
PROMPTS_FORMAT = "sparkseal-prompts/1"

# What a healthy server never logs. Each pattern names the failure it stands for.
LOG_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("traceback", re.compile(r"^Traceback \(most recent call last\):")),
    (
        "engine-dead",
        re.compile(r"EngineDeadError|Engine core .*(?:died|dead)|EngineCore encountered a fatal error"),
    ),
    ("rpc-timeout", re.compile(r"RPC call to \S+ timed out|TimeoutError: RPC|rpc.*timed out", re.IGNORECASE)),
    (
        "nccl-error",
        re.compile(r"NCCL error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|NCCL WARN"),
    ),
    ("illegal-memory-access", re.compile(r"illegal memory access|cudaErrorIllegalAddress", re.IGNORECASE)),
    ("out-of-memory", re.compile(r"CUDA out of memory|OutOfMemoryError|cudaErrorMemoryAllocation")),
)


class UsageError(Exception):
    """Bad arguments or input files: exit 2."""


class Unreachable(Exception):
    """The server does not answer at all: exit 2."""


class RequestFailed(Exception):
    """One request failed: an HTTP error, a malformed answer, or no answer before its deadline."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Finding:
    check: str
    kind: str
    message: str


@dataclass
class Step:
    name: str
    ok: bool
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # long lists: in the JSON report only
    seconds: float = 0.0  # wall time of the step itself


@contextmanager
def _timed(step: Step) -> Iterator[Step]:
    start = time.monotonic()
    try:
        yield step
    finally:
        step.seconds = round(time.monotonic() - start, 3)


@contextmanager
def _heartbeat(progress: Callable[[str], None], label: str, interval: float) -> Iterator[None]:
    """``label`` now, then every ``interval`` seconds with the time so far, until the block ends: one
    request of a long prompt runs for minutes, and a silent check cannot be told from a stuck one."""
    progress(f"{label} ...")
    start = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            progress(f"{label}: {time.monotonic() - start:.0f} s elapsed")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass
class Report:
    url: str
    model: str = ""
    profile: str | None = None
    steps: list[Step] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def flag(self, step: Step, kind: str, message: str) -> None:
        """A finding of ``step``: the step fails, and the finding is reported under its name."""
        step.ok = False
        self.findings.append(Finding(step.name, kind, message))


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


def redact_url(url: str) -> str:
    """The URL without user information, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class Client:
    """A small OpenAI-API client on urllib: one deadline per request, errors sorted by kind."""

    def __init__(self, base: str, api_key: str | None) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"URL {redact_url(base)!r}: expected http://HOST:PORT of a vLLM server")
        self.base = base.rstrip("/")
        self.shown = redact_url(self.base)
        self.api_key = api_key
        self.answered = False  # once the server has answered, a refused connection means it went away

    def _open(self, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.base + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
            self.answered = True
            return status, raw
        except urllib.error.HTTPError as error:
            self.answered = True
            detail = error.read()[:300].decode(errors="replace").strip()
            raise RequestFailed("http-error", f"{path}: HTTP {error.code} {error.reason}: {detail}") from None
        except TimeoutError:
            raise RequestFailed("timeout", f"{path}: no answer within {timeout:g} s") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, (TimeoutError, socket.timeout)):
                raise RequestFailed("timeout", f"{path}: no answer within {timeout:g} s") from None
            if self.answered:
                raise RequestFailed("connection", f"{path}: {error.reason}") from None
            raise Unreachable(f"{self.shown}{path}: {error.reason}") from None
        except (ConnectionError, OSError) as error:
            raise RequestFailed("connection", f"{path}: {error}") from None

    def wait_until_ready(self, seconds: float, timeout: float, progress: Callable[[str], None]) -> None:
        """Poll ``/v1/models`` until the server answers it with 200, for at most ``seconds``.

        A server started a moment ago refuses connections (or answers 503) while it loads its model, and an
        operator who starts it in the background and checks it at once should not get "unreachable" for
        that. Past the deadline it is unreachable, with the last error seen.
        """
        deadline = time.monotonic() + seconds
        progress(f"waiting up to {seconds:g} s for {self.shown}/v1/models")
        while True:
            remaining = deadline - time.monotonic()
            try:
                self._open("/v1/models", None, max(0.1, min(timeout, remaining)))
                self.answered = False  # the checks start afresh: a refusal before them is "unreachable"
                return
            except (Unreachable, RequestFailed) as error:
                last = str(error)
            if time.monotonic() + 1.0 > deadline:
                self.answered = False
                raise Unreachable(
                    f"{self.shown}/v1/models: no answer within {seconds:g} s (--wait); last: {last}"
                )
            time.sleep(1.0)

    def get_json(self, path: str, timeout: float) -> Any:
        _, raw = self._open(path, None, timeout)
        return _decode(path, raw)

    def get_text(self, path: str, timeout: float) -> str:
        _, raw = self._open(path, None, timeout)
        return raw.decode(errors="replace")

    def post_json(self, path: str, body: dict[str, Any], timeout: float) -> Any:
        _, raw = self._open(path, body, timeout)
        return _decode(path, raw)


def _decode(path: str, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        shown = raw[:80].decode(errors="replace")
        raise RequestFailed("malformed", f"{path}: answer is not JSON ({error}): {shown!r}") from None


@dataclass
class Completion:
    tokens: list[int] | None
    text: str
    completion_tokens: int
    cached_tokens: int | None
    seconds: float
    top_logprobs: list[dict[int, float]] | None = None


def _top_logprobs(choice: dict[str, Any]) -> list[dict[int, float]]:
    """vLLM's per-position top log-probabilities, keys ``token_id:N`` (``return_tokens_as_token_ids``)."""
    positions = []
    for entry in choice["logprobs"]["top_logprobs"]:
        positions.append(
            {int(str(key).removeprefix("token_id:")): float(value) for key, value in entry.items()}
        )
    return positions


def complete(
    client: Client, model: str, prompt: list[int], max_tokens: int, timeout: float, logprobs: int = 0
) -> Completion:
    """One greedy completion of a token-id prompt, checked for the fields the checks rely on."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # vLLM extensions: every completion runs to max_tokens, and comes back as token ids.
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if logprobs:
        body["logprobs"] = logprobs
        body["return_tokens_as_token_ids"] = True
    start = time.monotonic()
    answer = client.post_json("/v1/completions", body, timeout)
    seconds = time.monotonic() - start
    try:
        choice = answer["choices"][0]
        usage = answer["usage"]
        completion_tokens = int(usage["completion_tokens"])
        text = choice.get("text") or ""
        tokens = choice.get("token_ids")
        if tokens is not None:
            tokens = [int(token) for token in tokens]
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        top = _top_logprobs(choice) if logprobs else None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise RequestFailed(
            "malformed",
            "/v1/completions: answer lacks choices[0], usage.completion_tokens or the asked-for "
            f"logprobs ({error!r})",
        ) from None
    cached_tokens = int(cached) if cached is not None else None
    return Completion(tokens, text, completion_tokens, cached_tokens, seconds, top)


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each Prometheus sample family over its labels (``_total`` folded into the family name)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not match:
            continue
        name = match.group(1)
        if name.endswith("_created"):
            continue
        name = name.removesuffix("_total")
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


def make_prompts(count: int, length: int, low: int, high: int, seed: int) -> list[list[int]]:
    """Deterministic token-id prompts; distinct, so no request is a prefix-cache hit of another."""
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(length)] for _ in range(count)]


def scan_log(path: Path) -> list[tuple[str, int, str]]:
    """(pattern name, line number, line) for every line of the server log that names a failure."""
    hits = []
    with path.open(encoding="utf-8", errors="replace") as stream:
        for number, line in enumerate(stream, start=1):
            for name, pattern in LOG_PATTERNS:
                if pattern.search(line):
                    hits.append((name, number, line.rstrip()[:300]))
                    break
    return hits


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _soak(
    client: Client,
    model: str,
    prompts: list[list[int]],
    max_tokens: int,
    timeout: float,
    concurrency: int,
    logprobs: int,
) -> tuple[list[Completion | RequestFailed], float]:
    """Run every prompt once with ``concurrency`` clients; results in prompt order, and the wall time."""
    results: list[Completion | RequestFailed | None] = [None] * len(prompts)
    cursor = iter(range(len(prompts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            try:
                results[index] = complete(client, model, prompts[index], max_tokens, timeout, logprobs)
            except RequestFailed as error:
                results[index] = error
            except Unreachable as error:
                results[index] = RequestFailed("connection", str(error))

    start = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None], time.monotonic() - start


def _serial_soak_with_metrics(
    client: Client, model: str, prompts: list[list[int]], max_tokens: int, timeout: float, logprobs: int
) -> tuple[list[Completion | RequestFailed], float, list[tuple[int, int] | None]]:
    """The soak with one client, reading the speculative-decoding counters around every request: each
    request's (drafts, accepted tokens), None where a request failed or /metrics did not answer."""
    results: list[Completion | RequestFailed] = []
    per_request: list[tuple[int, int] | None] = []
    start = time.monotonic()
    for prompt in prompts:
        before = _metrics(client, timeout)
        try:
            results.append(complete(client, model, prompt, max_tokens, timeout, logprobs))
        except RequestFailed as error:
            results.append(error)
            per_request.append(None)
            continue
        except Unreachable as error:
            results.append(RequestFailed("connection", str(error)))
            per_request.append(None)
            continue
        after = _metrics(client, timeout)
        if before is None or after is None:
            per_request.append(None)
            continue
        drafts = after.get(METRIC_DRAFTS, 0.0) - before.get(METRIC_DRAFTS, 0.0)
        accepted = after.get(METRIC_ACCEPTED_TOKENS, 0.0) - before.get(METRIC_ACCEPTED_TOKENS, 0.0)
        per_request.append((int(drafts), int(accepted)))
    return results, time.monotonic() - start, per_request


def _load_prompts(path: Path) -> list[list[int]]:
    """Token-id prompts from ``{"format": "sparkseal-prompts/1", "prompts": [[id, ...], ...]}`` (or a bare
    list of lists), as bench/live/train_dspark.py writes them."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--prompts {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--prompts {path}: not JSON ({error})") from None
    if isinstance(document, dict):
        if document.get("format") != PROMPTS_FORMAT:
            raise UsageError(
                f"--prompts {path}: expected format {PROMPTS_FORMAT!r}, found {document.get('format')!r}"
            )
        document = document.get("prompts")
    if (
        not isinstance(document, list)
        or not document
        or not all(
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
            for prompt in document
        )
    ):
        raise UsageError(f"--prompts {path}: expected a non-empty list of non-empty lists of token ids")
    return document


def _load_reference(path: Path) -> dict[str, Any]:
    try:
        reference = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--against {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--against {path}: not a reference file ({error})") from None
    if not isinstance(reference, dict) or reference.get("format") != REFERENCE_FORMAT:
        found = reference.get("format") if isinstance(reference, dict) else type(reference).__name__
        raise UsageError(f"--against {path}: expected format {REFERENCE_FORMAT!r}, found {found!r}")
    prompts, completions = reference.get("prompts"), reference.get("completions")
    if not isinstance(prompts, list) or not isinstance(completions, list) or len(prompts) != len(completions):
        raise UsageError(f"--against {path}: expected as many completions as prompts")
    return reference


def _first_difference(a: list[int] | str, b: list[int] | str) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def _output(completion: Completion) -> list[int] | str:
    return completion.tokens if completion.tokens is not None else completion.text


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


@dataclass(frozen=True)
class Divergence:
    """The first token where a completion leaves the one it is held to, judged by the latter's log-probs.

    Only the first difference is judged: after it the two completions continue from different prefixes, so
    nothing later says anything about rounding.
    """

    at: int
    chosen: int | None  # None: text completions, or one completion ended here
    expected: int | None
    top: dict[int, float]  # the expected completion's recorded log-probabilities at ``at``; empty if none
    tie_margin: float
    lengths: tuple[int, int]

    @property
    def margin(self) -> float | None:
        """How far below the best recorded token the chosen one was; None when it was not recorded."""
        if self.chosen is None or self.chosen not in self.top:
            return None
        return max(self.top.values()) - self.top[self.chosen]

    @property
    def rank(self) -> int | None:
        """The chosen token's rank (1: best) among the recorded tokens; None when it was not recorded."""
        if self.chosen is None or self.chosen not in self.top:
            return None
        return 1 + sum(logprob > self.top[self.chosen] for logprob in self.top.values())

    @property
    def near_tie(self) -> bool:
        margin = self.margin
        return margin is not None and margin <= self.tie_margin

    def figures(self) -> dict[str, Any]:
        margin = self.margin
        return {
            "token": self.at,
            "chosen": self.chosen,
            "expected": self.expected,
            "rank": self.rank,
            "margin": round(margin, 4) if margin is not None else None,
        }

    def describe(self, chooser: str, holder: str) -> str:
        """Why this difference is (or is not) a near-tie, naming both tokens and the margin."""
        if self.chosen is None or self.expected is None:
            if self.lengths[0] != self.lengths[1]:
                return f"{chooser} has {self.lengths[0]} tokens, {holder} {self.lengths[1]}"
            return "the answers are text, not token ids, so no near-tie can be judged"
        said = f"{chooser} chose token {self.chosen} where {holder} chose {self.expected}"
        if self.expected in self.top:
            said += f" (log-prob {self.top[self.expected]:.4g})"
        if not self.top:
            return f"{said}; {holder} recorded no log-probabilities there"
        margin, rank = self.margin, self.rank
        if margin is None or rank is None:
            spread = max(self.top.values()) - min(self.top.values())
            return (
                f"{said}; {self.chosen} is not among {holder}'s top {len(self.top)} there, so its margin "
                f"is at least {spread:.4g} (tie margin {self.tie_margin:g})"
            )
        return (
            f"{said}; {holder} ranked {self.chosen} {_ordinal(rank)} of {len(self.top)} at log-prob "
            f"{self.top[self.chosen]:.4g}, a margin of {margin:.4g}, "
            f"{'within' if self.near_tie else 'beyond'} the tie margin {self.tie_margin:g}"
        )


def _divergence(
    got: list[int] | str, want: list[int] | str, top: list[dict[int, float]] | None, tie_margin: float
) -> Divergence:
    """Judge by ``want``'s own log-probabilities: it is the answer ``got`` is held to (reference, cold)."""
    at = _first_difference(got, want)
    lengths = (len(got), len(want))
    if not isinstance(got, list) or not isinstance(want, list) or at >= min(lengths):
        return Divergence(at, None, None, {}, tie_margin, lengths)
    recorded = top[at] if top is not None and at < len(top) else {}
    return Divergence(at, got[at], want[at], recorded, tie_margin, lengths)


def _reference_top(path: Path | None, index: int, top: Any) -> list[dict[int, float]] | None:
    """One reference completion's recorded ``[token, log-prob]`` pairs per position, as dictionaries."""
    if top is None:
        return None
    try:
        return [{int(token): float(logprob) for token, logprob in position} for position in top]
    except (TypeError, ValueError) as error:
        raise UsageError(
            f"--against {path}: top_logprobs of completion #{index} are not [token, log-prob] pairs ({error})"
        ) from None


def run(options: Options, progress: Callable[[str], None] = lambda _line: None) -> Report:
    """Run every step against the server; findings go into the report, unreachable raises."""
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
    _check_profile_options(options)
    reference = _load_reference(options.against) if options.against is not None else None
    given_prompts = _load_prompts(options.prompts) if options.prompts is not None else None
    client = Client(options.url, options.api_key)
    report = Report(url=client.shown, profile=options.profile)

    if options.wait > 0:
        client.wait_until_ready(options.wait, options.timeout, progress)

    # Reachability and the model name (an unreachable server raises Unreachable here).
    server = Step("server", ok=False)
    report.steps.append(server)
    max_model_len: int | None = None
    with _timed(server):
        try:
            models = client.get_json("/v1/models", options.timeout)
            listed = [str(entry["id"]) for entry in models["data"]]
        except RequestFailed as error:
            report.flag(server, error.kind, f"server: {error}")
        except (KeyError, TypeError):
            report.flag(
                server, "malformed", f"/v1/models: no model list in the answer: {str(models)[:200]!r}"
            )
        else:
            report.model = options.model or (listed[0] if listed else "")
            if not report.model or report.model not in listed:
                report.flag(
                    server,
                    "no-model",
                    f"/v1/models: model {report.model!r} is not served (listed: {listed})",
                )
            else:
                server.ok = True
                server.figures = {"models": listed}
                max_model_len = _max_model_len(models["data"], report.model)
                if max_model_len is not None:
                    server.figures["max_model_len"] = max_model_len
    if not server.ok:
        _skip_rest(report, "the server check failed", first=True)
        _closing_steps(report, options, progress)
        return report
    metrics_before = _metrics(client, options.timeout)

    if reference is not None and reference.get("model") != report.model:
        raise UsageError(
            f"--against {options.against}: recorded from model {reference.get('model')!r}, "
            f"but the server serves {report.model!r}"
        )
    max_tokens = int(reference["max_tokens"]) if reference else options.max_tokens
    if reference:
        prompts = [[int(token) for token in prompt] for prompt in reference["prompts"]]
    elif given_prompts is not None:
        prompts = given_prompts[: options.soak]
    else:
        prompts = make_prompts(
            options.soak, options.prompt_tokens, options.vocab_low, options.vocab_high, options.seed
        )

    # 1. The first request, with its own (long) deadline: graph capture and compilation may still be warming.
    first = Step("first-request", ok=False)
    report.steps.append(first)
    try:
        with _timed(first), _heartbeat(progress, "first request", options.progress_interval):
            result = complete(client, report.model, prompts[0], max_tokens, options.first_timeout)
        first.ok = True
        first.figures = {"seconds": round(result.seconds, 3), "completion_tokens": result.completion_tokens}
    except RequestFailed as error:
        report.flag(first, error.kind, f"first request: {error}")
        _skip_rest(report, "the first request failed", first=False)
        _closing_steps(report, options, progress)
        return report

    # 2. The soak: every prompt once, serially or with several clients.
    progress(f"soak: {len(prompts)} requests of {max_tokens} tokens, {options.concurrency} client(s) ...")
    soak_start = time.monotonic()
    soak_before = _metrics(client, options.timeout)
    # Only a recording asks for log-probabilities: a checked server runs exactly the requests it serves.
    logprobs = options.top_logprobs if options.record is not None else 0
    per_request: list[tuple[int, int] | None] | None = None
    if options.min_request_accepted_length is not None:
        results, wall, per_request = _serial_soak_with_metrics(
            client, report.model, prompts, max_tokens, options.timeout, logprobs
        )
    else:
        results, wall = _soak(
            client, report.model, prompts, max_tokens, options.timeout, options.concurrency, logprobs
        )
    soak_after = _metrics(client, options.timeout)
    done = [r for r in results if isinstance(r, Completion)]
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, RequestFailed)]
    tokens = sum(r.completion_tokens for r in done)
    soak = Step("soak", ok=not failed)
    soak.figures = {
        "requests": len(prompts),
        "succeeded": len(done),
        "failed": len(failed),
        "concurrency": options.concurrency,
        "max_tokens": max_tokens,
        "completion_tokens": tokens,
        "expected_completion_tokens": len(prompts) * max_tokens,
        "seconds": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
    }
    if done:
        latencies = [r.seconds for r in done]
        soak.figures["latency_p50_s"] = round(statistics.median(latencies), 4)
        soak.figures["latency_p95_s"] = round(_percentile(latencies, 0.95), 4)
    ttft = _mean_delta(soak_before, soak_after, METRIC_TTFT_SUM, METRIC_TTFT_COUNT)
    if ttft is not None:
        soak.figures["ttft_mean_s"] = round(ttft, 4)
    decode = _decode_rate(soak_before, soak_after)
    if decode is not None:
        soak.figures["decode_tokens_per_s"] = decode
    if per_request is not None:
        soak.figures["per_request_metrics"] = True  # /metrics read between requests: wall time includes it
    empty = [i for i, r in enumerate(results) if isinstance(r, Completion) and r.completion_tokens == 0]
    if empty:
        report.flag(soak, "empty", f"soak: {len(empty)} request(s) returned no tokens (first: #{empty[0]})")
    # Every request sets ignore_eos, so each runs to max_tokens: fewer is a server that stopped early.
    short = [
        (i, r.completion_tokens)
        for i, r in enumerate(results)
        if isinstance(r, Completion) and 0 < r.completion_tokens < max_tokens
    ]
    if short:
        index, count = short[0]
        report.flag(
            soak,
            "short",
            f"soak: {len(short)} request(s) returned fewer than the {max_tokens} tokens asked for, "
            f"{tokens} of {len(prompts) * max_tokens} in all (first: #{index}, {count} tokens)",
        )
    soak.seconds = round(time.monotonic() - soak_start, 3)
    report.steps.append(soak)
    for kind in sorted({r.kind for _, r in failed}):
        of_kind = [(i, r) for i, r in failed if r.kind == kind]
        index, error = of_kind[0]
        report.flag(
            soak,
            kind,
            f"soak: {len(of_kind)} of {len(prompts)} requests failed ({kind}); first #{index}: {error}",
        )

    # 3. A long cold prompt, then the same prompt again: a prefix-cache hit, which must answer the same up
    # to a near-tie flip (vLLM's cached and cold prefills run other batch shapes, so they may round apart).
    cache = Step("prefix-cache", ok=False)
    report.steps.append(cache)
    with _timed(cache):
        _prefix_cache_step(report, cache, options, client, max_tokens, progress)

    # 4. One cold prompt at the server's long context, its speculation counted on that request alone.
    context = Step("long-context", ok=True)
    report.steps.append(context)
    with _timed(context):
        _context_step(report, context, options, client, max_tokens, max_model_len, progress)

    # 5. Speculative decoding: drafted and accepted tokens over the whole check.
    metrics_after = _metrics(client, options.timeout)
    speculation_start = time.monotonic()
    _speculation_step(report, options, metrics_before, metrics_after, per_request)
    report.step("speculation").seconds = round(time.monotonic() - speculation_start, 3)

    # 6. Lossless: the soak's completions against (or recorded as) the non-speculative reference.
    lossless_start = time.monotonic()
    _lossless_step(report, options, prompts, results, max_tokens, reference)
    report.step("lossless").seconds = round(time.monotonic() - lossless_start, 3)

    # 7. Teardown when asked, then the server's log; with several ranks, their module check and NCCL.
    _closing_steps(report, options, progress)
    return report


def _prefix_cache_step(
    report: Report,
    cache: Step,
    options: Options,
    client: Client,
    max_tokens: int,
    progress: Callable[[str], None],
) -> None:
    """A long prompt cold, then again from the prefix cache: the same answer up to a near-tie flip (vLLM's
    cached and cold prefills run other batch shapes, so they may round apart). Each run's prefill time is
    the server's own time to first token, read from its histogram around that request alone."""
    long_prompt = cold_prompt(options.long_prompt_tokens, options.vocab_low, options.vocab_high)
    before = _metrics(client, options.timeout)
    k = options.top_logprobs
    label = f"prefix cache: a {len(long_prompt)}-token prompt"
    try:
        with _heartbeat(progress, f"{label}, cold", options.progress_interval):
            cold = complete(client, report.model, long_prompt, max_tokens, options.first_timeout, k)
        between = _metrics(client, options.timeout)
        with _heartbeat(progress, f"{label}, cached", options.progress_interval):
            warm = complete(client, report.model, long_prompt, max_tokens, options.first_timeout, k)
    except RequestFailed as error:
        report.flag(cache, error.kind, f"long prompt: {error}")
        return
    after = _metrics(client, options.timeout)
    cache.ok = True
    cache.figures = {
        "prompt_tokens": len(long_prompt),
        "cold_s": round(cold.seconds, 4),
        "cached_s": round(warm.seconds, 4),
        "speedup": round(cold.seconds / warm.seconds, 2) if warm.seconds > 0 else None,
    }
    for name, (start, end) in (("cold_prefill_s", (before, between)), ("cached_prefill_s", (between, after))):
        ttft = _mean_delta(start, end, METRIC_TTFT_SUM, METRIC_TTFT_COUNT)
        if ttft is not None:
            cache.figures[name] = round(ttft, 4)
    if warm.cached_tokens is not None:
        cache.figures["cached_tokens"] = warm.cached_tokens
    hits = None
    if between is not None and after is not None and METRIC_PREFIX_HITS in after:
        hits = int(after[METRIC_PREFIX_HITS] - between.get(METRIC_PREFIX_HITS, 0))
        cache.figures["prefix_cache_hit_tokens"] = hits
    if options.require_cache_hit:
        seen = warm.cached_tokens if warm.cached_tokens is not None else hits
        if seen is None:
            report.flag(
                cache,
                "no-cache-figures",
                f"prefix cache: neither usage.prompt_tokens_details.cached_tokens nor /metrics' "
                f"{METRIC_PREFIX_HITS} says whether the second {len(long_prompt)}-token prompt was served "
                "from the prefix cache",
            )
        elif seen <= 0:
            report.flag(
                cache,
                "no-cache-hit",
                f"prefix cache: the second {len(long_prompt)}-token prompt hit no cached token "
                "(is the server started with --enable-prefix-caching?)",
            )
    if _output(cold) != _output(warm):
        divergence = _divergence(_output(warm), _output(cold), cold.top_logprobs, options.tie_margin)
        cache.figures["tie_margin"] = options.tie_margin
        if divergence.near_tie:
            cache.figures["near_tie_flip"] = divergence.figures()
        else:
            cache.figures["first_difference"] = divergence.figures()
            report.flag(
                cache,
                "mismatch",
                f"the cached long prompt answered differently from the cold one at token "
                f"{divergence.at}: {divergence.describe('the cached answer', 'the cold answer')}",
            )


def _closing_steps(report: Report, options: Options, progress: Callable[[str], None]) -> None:
    """Teardown when asked, then what the logs say: run also when the requests failed, since a failing rank
    is why they may have; after the teardown, since a server's last words and NCCL's come as it stops."""
    teardown = Step("teardown", ok=True)
    report.steps.append(teardown)
    with _timed(teardown):
        stopped = _teardown_step(report, teardown, options, progress)
    idle = Step("gpu-idle", ok=True)
    report.steps.append(idle)
    with _timed(idle):
        _gpu_idle_step(report, idle, options, progress, stopped)
    for name, check in (
        ("server-log", _log_step),
        ("module-check", _module_check_step),
        ("nccl", _nccl_step),
    ):
        start = time.monotonic()
        check(report, options)
        report.step(name).seconds = round(time.monotonic() - start, 3)


def cold_prompt(length: int, low: int, high: int) -> list[int]:
    """A prompt no earlier request shares a prefix with (seeded by the clock), fast at 660,000 tokens."""
    return random.Random(time.time_ns()).choices(range(low, high), k=length)


def _max_model_len(data: list[Any], model: str) -> int | None:
    """The ``max_model_len`` vLLM lists for ``model`` in /v1/models, if it lists one."""
    for entry in data:
        if isinstance(entry, dict) and str(entry.get("id")) == model:
            value = entry.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _check_profile_options(options: Options) -> None:
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


def _context_step(
    report: Report,
    step: Step,
    options: Options,
    client: Client,
    max_tokens: int,
    max_model_len: int | None,
    progress: Callable[[str], None],
) -> None:
    """One cold prompt of ``--context-tokens`` on a server long enough for it: HTTP 200, tokens generated,
    and DSpark's drafted and accepted tokens of that request alone (``/metrics`` read just before and just
    after it; another client's requests in between would be counted too, so none should run)."""
    tokens = options.context_tokens
    if tokens is None:
        step.skipped = (
            f"no --context-tokens (--profile reference sends {PROFILES['reference']['context_tokens']})"
        )
        return
    needed = options.min_max_model_len or tokens + max_tokens
    step.figures = {"prompt_tokens": tokens, "max_model_len": max_model_len, "min_max_model_len": needed}
    if max_model_len is None:
        report.flag(
            step,
            "no-max-model-len",
            f"long context: /v1/models lists no max_model_len for {report.model!r}; expected at least "
            f"{needed}",
        )
        return
    if max_model_len < needed:
        report.flag(
            step,
            "max-model-len",
            f"long context: the server's max_model_len is {max_model_len}, expected at least {needed} "
            f"(--min-max-model-len) for a {tokens}-token prompt: serve with --max-model-len {needed} or more",
        )
        return
    prompt = cold_prompt(tokens, options.vocab_low, options.vocab_high)
    before = _metrics(client, options.timeout)
    label = f"long context: a {tokens}-token cold prompt (deadline {options.context_timeout:g} s)"
    try:
        with _heartbeat(progress, label, options.progress_interval):
            result = complete(client, report.model, prompt, max_tokens, options.context_timeout)
    except RequestFailed as error:
        report.flag(step, error.kind, f"long context: {tokens}-token prompt: {error}")
        return
    after = _metrics(client, options.timeout)
    step.figures |= {"completion_tokens": result.completion_tokens, "request_s": round(result.seconds, 3)}
    if result.cached_tokens is not None:
        step.figures["cached_tokens"] = result.cached_tokens
    ttft = _mean_delta(before, after, METRIC_TTFT_SUM, METRIC_TTFT_COUNT)
    if ttft is not None:
        step.figures["prefill_s"] = round(ttft, 3)
    if result.completion_tokens <= 0:
        report.flag(step, "empty", f"long context: the {tokens}-token prompt returned no tokens")
    if options.speculation == "off":
        return
    if before is None or after is None:
        report.flag(
            step, "no-metrics", "long context: /metrics did not answer; drafted tokens cannot be counted"
        )
        return
    if METRIC_DRAFT_TOKENS not in after:
        return  # the speculation step says whether that is a finding
    drafted = int(after[METRIC_DRAFT_TOKENS] - before.get(METRIC_DRAFT_TOKENS, 0.0))
    accepted = int(after.get(METRIC_ACCEPTED_TOKENS, 0.0) - before.get(METRIC_ACCEPTED_TOKENS, 0.0))
    step.figures |= {
        "drafts": int(after.get(METRIC_DRAFTS, 0.0) - before.get(METRIC_DRAFTS, 0.0)),
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
    }
    if drafted <= 0:
        report.flag(
            step,
            "nothing-drafted",
            f"long context: no token was drafted on the {tokens}-token request ({METRIC_DRAFT_TOKENS} did "
            "not move)",
        )


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (exited, its parent not yet told) has stopped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def _teardown_step(report: Report, step: Step, options: Options, progress: Callable[[str], None]) -> bool:
    """SIGTERM to ``--teardown-pid`` (vLLM's own clean shutdown), then wait for it to exit. True when the
    server is gone. It is never killed: a server that does not stop is a finding the operator looks at."""
    pid = options.teardown_pid
    if pid is None:
        step.skipped = "no --teardown-pid: live-check leaves the server running"
        return False
    step.figures = {"pid": pid, "signal": "SIGTERM"}
    progress(f"teardown: SIGTERM to the server, pid {pid} ...")
    try:
        if not _running(pid):
            raise ProcessLookupError
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        report.flag(step, "not-running", f"teardown: pid {pid} had already exited before the teardown")
        return True
    deadline = time.monotonic() + options.teardown_timeout
    start = time.monotonic()
    while _running(pid):
        if time.monotonic() > deadline:
            report.flag(
                step,
                "still-running",
                f"teardown: pid {pid} still runs {options.teardown_timeout:g} s after SIGTERM "
                "(--teardown-timeout); it was not killed",
            )
            return False
        time.sleep(min(0.1, options.idle_poll))
    step.figures["exit_s"] = round(time.monotonic() - start, 3)
    return True


def _read_gpus(smi: str) -> list[tuple[str, float | None, float | None]]:
    """(index, memory.used MiB, utilization.gpu %) per GPU; None where the GPU does not report it (a GB10's
    unified memory has no memory.used: ``[N/A]``)."""
    command = [smi, "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RequestFailed("nvidia-smi", f"gpu idle: {smi} failed: {error}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:300]
        raise RequestFailed("nvidia-smi", f"gpu idle: {smi} exited {done.returncode}: {said}")

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    gpus = []
    for line in done.stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3:
            raise RequestFailed(
                "nvidia-smi", f"gpu idle: {smi}: expected index, memory, utilisation: {line!r}"
            )
        gpus.append((cells[0], number(cells[1]), number(cells[2])))
    if not gpus:
        raise RequestFailed("nvidia-smi", f"gpu idle: {smi} lists no GPU")
    return gpus


def _busy(gpus: list[tuple[str, float | None, float | None]], options: Options) -> list[str]:
    """Each figure above its idle threshold, named with the threshold."""
    said = []
    for index, memory, utilization in gpus:
        if memory is not None and memory > options.idle_memory_mib:
            said.append(
                f"GPU {index} memory.used {memory:g} MiB > --idle-memory-mib {options.idle_memory_mib:g}"
            )
        if utilization is not None and utilization > options.idle_utilization:
            said.append(
                f"GPU {index} utilization.gpu {utilization:g} % > --idle-utilization "
                f"{options.idle_utilization:g}"
            )
    return said


def _gpu_idle_step(
    report: Report, step: Step, options: Options, progress: Callable[[str], None], stopped: bool
) -> None:
    """After the teardown, every GPU's memory and utilisation back to idle, polled until --idle-timeout."""
    if options.teardown_pid is None:
        step.skipped = "no --teardown-pid: a serving GPU is not idle"
        return
    if not stopped:
        step.skipped = "the server did not stop"
        return
    smi = shutil.which("nvidia-smi")
    if smi is None:
        step.skipped = "no nvidia-smi on PATH: the GPUs' memory and utilisation cannot be read here"
        return
    progress(f"gpu idle: polling nvidia-smi for up to {options.idle_timeout:g} s ...")
    start = time.monotonic()
    while True:
        try:
            gpus = _read_gpus(smi)
        except RequestFailed as error:
            report.flag(step, error.kind, str(error))
            return
        busy = _busy(gpus, options)
        elapsed = time.monotonic() - start
        if not busy or elapsed >= options.idle_timeout:
            break
        time.sleep(options.idle_poll)
    step.figures = {
        "gpus": [{"index": i, "memory_used_mib": m, "utilization_pct": u} for i, m, u in gpus],
        "idle_memory_mib": options.idle_memory_mib,
        "idle_utilization": options.idle_utilization,
    }
    unreported = [i for i, m, u in gpus if m is None or u is None]
    if unreported:
        step.figures["not_reported_by_gpus"] = unreported
    if all(m is None and u is None for _, m, u in gpus):
        report.flag(step, "unreadable", f"gpu idle: {smi} reports neither memory.used nor utilization.gpu")
        return
    if busy:
        report.flag(
            step,
            "busy",
            f"gpu idle: {options.idle_timeout:g} s after teardown (--idle-timeout): {'; '.join(busy)}",
        )
        return
    step.figures["idle_after_s"] = round(time.monotonic() - start, 3)


def _metrics(client: Client, timeout: float) -> dict[str, float] | None:
    try:
        return parse_metrics(client.get_text("/metrics", timeout))
    except RequestFailed:
        return None


def _mean_delta(
    before: dict[str, float] | None, after: dict[str, float] | None, total: str, count: str
) -> float | None:
    """The mean of a Prometheus histogram over an interval (its _sum and _count deltas)."""
    if before is None or after is None or total not in after or count not in after:
        return None
    n = after[count] - before.get(count, 0.0)
    return (after[total] - before.get(total, 0.0)) / n if n > 0 else None


def _decode_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Tokens per second of one request's decoding, from vLLM's per-request histograms over an interval:
    each request's tokens after the first over its first-to-last-token time, summed over requests."""
    if (
        before is None
        or after is None
        or METRIC_DECODE_SUM not in after
        or METRIC_GENERATION_SUM not in after
    ):
        return None
    seconds = after[METRIC_DECODE_SUM] - before.get(METRIC_DECODE_SUM, 0.0)
    requests = after.get(METRIC_DECODE_COUNT, 0.0) - before.get(METRIC_DECODE_COUNT, 0.0)
    tokens = after[METRIC_GENERATION_SUM] - before.get(METRIC_GENERATION_SUM, 0.0) - requests
    return round(tokens / seconds, 1) if seconds > 0 and tokens > 0 else None


def _skip_rest(report: Report, why: str, first: bool) -> None:
    names = ("first-request",) * first + ("soak", "prefix-cache", "long-context", "speculation", "lossless")
    for name in names:
        report.steps.append(Step(name, ok=False, skipped=why))


def _speculation_step(
    report: Report,
    options: Options,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    per_request: list[tuple[int, int] | None] | None = None,
) -> None:
    step = Step("speculation", ok=True)
    report.steps.append(step)
    if options.speculation == "off":
        step.skipped = "--speculation off"
        return
    if after is None:
        report.flag(
            step,
            "no-metrics",
            "speculation: /metrics is not served; drafted tokens cannot be counted",
        )
        return
    if METRIC_DRAFT_TOKENS not in after:
        if options.speculation == "required" or options.floors:
            report.flag(
                step,
                "not-configured",
                f"speculation: the server exports no {METRIC_DRAFT_TOKENS}: "
                "speculative decoding is not configured",
            )
        else:
            step.skipped = "the server is not configured for speculative decoding"
        return
    before = before or {}
    drafted = after[METRIC_DRAFT_TOKENS] - before.get(METRIC_DRAFT_TOKENS, 0.0)
    accepted = after.get(METRIC_ACCEPTED_TOKENS, 0.0) - before.get(METRIC_ACCEPTED_TOKENS, 0.0)
    drafts = after.get(METRIC_DRAFTS, 0.0) - before.get(METRIC_DRAFTS, 0.0)
    step.figures = {
        "drafts": int(drafts),
        "draft_tokens": int(drafted),
        "accepted_tokens": int(accepted),
        "acceptance_rate": round(accepted / drafted, 4) if drafted > 0 else None,
        "accepted_per_draft": round(accepted / drafts, 3) if drafts > 0 else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts > 0 else None,
    }
    if drafted <= 0:
        report.flag(
            step,
            "nothing-drafted",
            "speculation: configured, but no token was drafted during the check",
        )
        return
    rate, length = accepted / drafted, accepted / drafts
    if options.min_acceptance is not None:
        step.figures["floor_acceptance"] = options.min_acceptance
        if rate < options.min_acceptance:
            report.flag(
                step,
                "low-acceptance",
                f"speculation: acceptance rate {rate:.4f} ({int(accepted)} of {int(drafted)} drafted tokens "
                f"accepted) is below the floor --min-acceptance {options.min_acceptance:g}",
            )
    if options.min_accepted_length is not None:
        step.figures["floor_accepted_per_draft"] = options.min_accepted_length
        if length < options.min_accepted_length:
            report.flag(
                step,
                "short-acceptance",
                f"speculation: {length:.3f} draft tokens accepted per draft step (over {int(drafts)} steps, "
                f"the bonus token not counted) is below the floor --min-accepted-length "
                f"{options.min_accepted_length:g}",
            )
    if options.min_request_accepted_length is not None and per_request is not None:
        _request_floor(report, step, options.min_request_accepted_length, per_request)


def _request_floor(
    report: Report, step: Step, floor: float, per_request: list[tuple[int, int] | None]
) -> None:
    """Every request's accepted draft tokens per draft step against ``floor`` (serial soak only).

    A request whose counts /metrics did not give, or that made no draft step, has no figure to judge: it
    is named in a finding, never dropped without a word, since the floor holds for every request.
    """
    lengths = {}  # request -> accepted per draft step; a request with no draft step has none
    for index, entry in enumerate(per_request):
        if entry is not None and entry[0] > 0:
            lengths[index] = entry[1] / entry[0]
    step.details["per_request"] = [list(entry) if entry is not None else None for entry in per_request]
    step.figures["floor_request_accepted_per_draft"] = floor
    step.figures["requests_measured"] = len(lengths)
    unmeasured = [i for i, entry in enumerate(per_request) if entry is None]
    undrafted = [i for i, entry in enumerate(per_request) if entry is not None and entry[0] <= 0]
    step.figures["requests_unmeasured"] = len(unmeasured)
    step.figures["requests_without_draft_steps"] = len(undrafted)
    if lengths and (unmeasured or undrafted):
        said = [
            f"{len(found)} {what} ({', '.join(f'#{i}' for i in found)})"
            for found, what in (
                (unmeasured, "whose counts /metrics did not give"),
                (undrafted, "that made no draft step"),
            )
            if found
        ]
        report.flag(
            step,
            "unjudged-requests",
            f"speculation: {' and '.join(said)} of {len(per_request)} requests cannot be held to the floor "
            f"--min-request-accepted-length {floor:g}",
        )
    if not lengths:
        report.flag(
            step,
            "no-request-figures",
            f"speculation: no request's drafts could be counted from /metrics ({len(per_request)} requests)",
        )
        return
    ordered = sorted(lengths.values())
    lowest = min(lengths, key=lambda i: (lengths[i], i))
    below = [i for i, value in lengths.items() if value < floor]
    step.figures |= {
        "request_accepted_per_draft_min": round(ordered[0], 3),
        "request_accepted_per_draft_median": round(statistics.median(ordered), 3),
        "request_accepted_per_draft_max": round(ordered[-1], 3),
        "lowest_request": lowest,
        "requests_below_floor": len(below),
    }
    if below:
        drafts, accepted = per_request[lowest] or (0, 0)
        report.flag(
            step,
            "low-request-acceptance",
            f"speculation: {len(below)} of {len(lengths)} requests accepted fewer than {floor:g} draft "
            f"tokens per draft step (lowest: request #{lowest}, {lengths[lowest]:.3f}: {accepted} accepted "
            f"over {drafts} draft steps)",
        )


def _lossless_step(
    report: Report,
    options: Options,
    prompts: list[list[int]],
    results: list[Completion | RequestFailed],
    max_tokens: int,
    reference: dict[str, Any] | None,
) -> None:
    step = Step("lossless", ok=True)
    report.steps.append(step)
    outputs = [_output(r) if isinstance(r, Completion) else None for r in results]
    if options.record is not None:
        if any(output is None for output in outputs):
            report.flag(
                step, "incomplete", f"--record {options.record}: not written, some soak requests failed"
            )
            return
        document = {
            "format": REFERENCE_FORMAT,
            "model": report.model,
            "max_tokens": max_tokens,
            "logprobs": options.top_logprobs,
            "prompts": prompts,
            "completions": outputs,
            "top_logprobs": [
                [
                    sorted(([t, lp] for t, lp in position.items()), key=lambda x: -x[1])
                    for position in r.top_logprobs
                ]
                if isinstance(r, Completion) and r.top_logprobs is not None
                else None
                for r in results
            ],
        }
        tmp = options.record.with_name(options.record.name + ".tmp")
        tmp.write_text(json.dumps(document, separators=(",", ":")) + "\n")
        tmp.replace(options.record)
        step.figures = {
            "recorded": len(outputs),
            "file": str(options.record),
            "top_logprobs": options.top_logprobs,
        }
        return
    if reference is None:
        step.skipped = "no reference (--against FILE)"
        return
    equal = 0
    differing: list[tuple[int, Divergence]] = []
    ties: list[tuple[int, Divergence]] = []
    tops = reference.get("top_logprobs") or [None] * len(outputs)
    for index, (got, want, top) in enumerate(zip(outputs, reference["completions"], tops, strict=True)):
        if got is None:
            continue
        if isinstance(got, list) != isinstance(want, list):
            raise UsageError(
                f"--against {options.against}: completion #{index} is not of the kind the server returns"
            )
        if got == want:
            equal += 1
            continue
        divergence = _divergence(got, want, _reference_top(options.against, index, top), options.tie_margin)
        (ties if divergence.near_tie else differing).append((index, divergence))
    step.figures = {
        "compared": equal + len(differing) + len(ties),
        "equal": equal,
        "near_tie_flips": len(ties),
        "differing": len(differing),
        "tie_margin": options.tie_margin,
    }
    if ties:
        step.figures["largest_tie_margin"] = round(max(d.margin or 0.0 for _, d in ties), 4)
    if differing:
        index, divergence = differing[0]
        step.figures["first_difference"] = {"request": index, **divergence.figures()}
        report.flag(
            step,
            "mismatch",
            f"lossless: {len(differing)} of {step.figures['compared']} completions differ from "
            f"{options.against} beyond a near-tie (first: request #{index} at token {divergence.at}: "
            f"{divergence.describe('the server', 'the reference')})",
        )


# The sparkseal vLLM plugin's line (sparkseal/runtime/plugin.py), as vLLM's logging prints it.
_MODULE_CHECK = re.compile(
    r"sparkseal: rank (?P<rank>\d+) of (?P<ranks>\d+): (?P<modules>.+) identical on every rank "
    r"\(digest (?P<digest>[0-9a-f]+)\)"
)


def _module_check_step(report: Report, options: Options) -> None:
    required = options.require_module_check or options.nccl_logs is not None
    step = Step("module-check", ok=True)
    report.steps.append(step)
    if options.log is None:
        step.skipped = "no server log (--log FILE)"
        return
    seen: dict[int, tuple[int, str]] = {}
    with options.log.open(encoding="utf-8", errors="replace") as stream:
        for line in stream:
            match = _MODULE_CHECK.search(line)
            if match:
                seen[int(match["rank"])] = (int(match["ranks"]), match["digest"])
    if not seen:
        if required:
            report.flag(
                step,
                "did-not-run",
                f"module check: {options.log} has no line of the sparkseal plugin's cross-rank check "
                "(is the sparkseal wheel installed beside vLLM, and VLLM_PLUGINS unset or naming sparkseal?)",
            )
        else:
            step.skipped = "the server log shows no cross-rank module check"
        return
    world = {ranks for ranks, _ in seen.values()}
    digests = {digest for _, digest in seen.values()}
    step.figures = {"ranks": sorted(seen), "world_size": sorted(world), "digest": sorted(digests)}
    missing = sorted(set(range(max(world))) - set(seen))
    if len(world) > 1 or len(digests) > 1 or missing:
        report.flag(
            step,
            "incomplete",
            f"module check: ranks {sorted(seen)} reported (world sizes {sorted(world)}, digests "
            f"{sorted(digests)}); missing ranks {missing}",
        )


def _nccl_step(report: Report, options: Options) -> None:
    step = Step("nccl", ok=True)
    report.steps.append(step)
    if options.nccl_logs is None:
        step.skipped = "no NCCL logs (--nccl-logs DIR)"
        return
    logs: list[RankLog] = []
    try:
        for path in sorted(p for p in options.nccl_logs.iterdir() if p.is_file()):
            log = parse_log(path)
            if log.collectives:  # the API server and the engine core run no collective
                logs.append(log)
    except NcclLogError as error:
        report.flag(step, "unreadable", f"nccl: {error}")
        return
    positions = [log.position for log in logs]
    if len(logs) < 2 or None in positions or len(set(positions)) != len(positions):
        named = ", ".join(f"{log.path.name} (rank {log.position})" for log in logs) or "none"
        report.flag(
            step,
            "ranks",
            f"nccl: expected one log with collectives per rank, at least two, in {options.nccl_logs}; "
            f"found {named}",
        )
        return
    logs.sort(key=lambda log: log.position or 0)
    step.figures = {
        "ranks": len(logs),
        "collectives_per_rank": [len(log.collectives) for log in logs],
        "p2p_per_rank": [log.p2p for log in logs],
        "logs": [log.path.name for log in logs],
    }
    divergence = first_divergence(logs)
    if divergence is None:
        return
    index = divergence.index
    step.figures["first_divergence"] = {"index": index, "fields": list(divergence.fields)}
    described = "; ".join(
        f"rank {log.position}: "
        + (
            f"{log.path.name}:{log.collectives[index].line} {log.collectives[index].record.describe()}"
            if index < len(log.collectives)
            else f"{log.path.name} ends after {len(log.collectives)} collectives"
        )
        for log in logs
    )
    report.flag(
        step,
        "divergence",
        f"nccl: the ranks diverge at collective #{index} (differs in: {', '.join(divergence.fields)}): "
        f"{described}",
    )


def _log_step(report: Report, options: Options) -> None:
    step = Step("server-log", ok=True)
    report.steps.append(step)
    if options.log is None:
        step.skipped = "no server log (--log FILE)"
        return
    hits = scan_log(options.log)
    counts: dict[str, int] = {}
    for name, _, _ in hits:
        counts[name] = counts.get(name, 0) + 1
    step.figures = {"lines_matched": len(hits), "by_kind": counts}
    for name in counts:
        first = next(hit for hit in hits if hit[0] == name)
        report.flag(step, name, f"{options.log}:{first[1]}: {name} ({counts[name]} line(s)): {first[2]}")


def render(report: Report, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {
                "url": report.url,
                "model": report.model,
                "profile": report.profile,
                "ok": report.ok,
                "steps": [
                    {k: v for k, v in asdict(step).items() if k != "details" or v} for step in report.steps
                ],
                "findings": [asdict(finding) for finding in report.findings],
            },
            indent=2,
            sort_keys=True,
        )
    profile = f", profile {report.profile}" if report.profile else ""
    lines = [f"live-check {report.url} (model {report.model or '?'}{profile})"]
    for step in report.steps:
        if step.skipped:
            lines.append(f"  {step.name:<14} skipped: {step.skipped}")
            continue
        figures = ", ".join(f"{key} {value}" for key, value in step.figures.items())
        verdict = "ok" if step.ok else "FINDING"
        lines.append(f"  {step.name:<14} {verdict} ({step.seconds:.3f} s){': ' + figures if figures else ''}")
    for finding in report.findings:
        lines.append(f"finding: {finding.message}")
    lines.append("result: pass" if report.ok else f"result: {len(report.findings)} finding(s)")
    return "\n".join(lines)
