"""A small fake of vLLM's OpenAI-compatible server on loopback, with switchable defects, for live-check tests.

The model is a deterministic function of the prompt: completion token ``i`` is
``(sum(prompt) * 31 + i * 7) % 997``, so a cached and a cold prompt answer alike, and a faulty mode can
change exactly one answer. Its log-probabilities rank, at every position, the model's token first (-0.5)
and ``ranked(token, r)`` r-th after it (``runner_up_gap`` below the best for the runner-up, ``rank_step``
more for each further rank); as vLLM does, a chosen token outside the asked-for top k is added to them.
Counters follow vLLM's Prometheus names. Each request counts one draft step per three tokens, five
drafted tokens per step and ``accepted_per_draft`` of them accepted (``weak_accepted_per_draft`` for the
``weak_request``-th distinct prompt); its decoding takes ``decode_s_per_token`` per token after the first,
in vLLM's per-request histograms; its time to first token is ``prefill_s_per_token`` per prompt token
not served from the prefix cache. /v1/models lists ``max_model_len``, and a prompt plus ``max_tokens``
beyond it is refused with vLLM's HTTP 400. Cheap at 660,000 prompt tokens: nothing is computed per token
but a sum, so the long-context step costs the tests a JSON round trip.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.servers.loopback import free_port

MODEL = "fake-dspark"
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


@dataclass
class Behaviour:
    """What the fake does wrong (all off: a healthy DSpark server)."""

    speculation: bool = True  # export spec-decode metrics
    drafting: bool = True  # and count drafted tokens
    hang_first: float = 0.0  # seconds the first completion sleeps
    hang_all: float = 0.0  # seconds every completion sleeps
    status: int = 200  # HTTP status of completions
    malformed: bool = False  # completions answer with broken JSON
    drop_usage: bool = False  # completions omit usage
    cache_differs: bool = False  # a repeated prompt answers differently
    perturb_request: int | None = None  # the n-th distinct prompt answers differently
    runner_up_request: int | None = None  # the n-th distinct prompt takes a lower-ranked token at position 3
    runner_up_rank: int = 1  # the rank of that token (1: the runner-up)
    runner_up_gap: float = 0.05  # log-probability gap between the best and the runner-up token
    rank_step: float = 1.0  # and between each further rank and the one before it
    cache_rank: int | None = None  # a repeated prompt takes the token of this rank at position 3
    accepted_per_draft: int = 2  # of 5 drafted tokens per draft step
    speculative_tokens: int = 5  # drafted per step; positions of vllm:spec_decode_num_accepted_tokens_per_pos
    stops_at: int | None = None  # without ignore_eos, completions end after this many tokens
    weak_request: int | None = None  # the n-th distinct prompt accepts weak_accepted_per_draft instead
    weak_accepted_per_draft: int = 0
    decode_s_per_token: float = 0.002
    models_status: int = 200
    empty_completions: bool = False
    prefix_caching: bool = True  # a repeated prompt is served from the prefix cache
    # vLLM serves whole cache blocks from the prefix cache and always computes the last prompt token: 16 is
    # its default block size; a real DSpark server (bench/results/live_h200.md, run 4) served 28,800 of a
    # repeated 28,820-token prompt, blocks of 32 to 128 tokens.
    cache_block_tokens: int = 16
    prefix_metrics: bool = True  # export vllm:prefix_cache_*
    short_completions: bool = False  # every completion stops one token short of max_tokens
    max_model_len: int | None = 1_048_576  # None: /v1/models lists none
    prefill_s_per_token: float = 1e-5
    long_prompt_over: int = 100_000  # prompts longer than this sleep hang_long seconds
    hang_long: float = 0.0
    drafting_long: bool = True  # count drafted tokens for prompts over long_prompt_over
    # POST /collective_rpc: None answers 404 (vLLM without VLLM_SERVER_DEV_MODE=1); a list is the workers'
    # results, as vLLM's dev endpoint returns them ({"results": [...]}); rpc_status another HTTP status.
    rpc_results: list[Any] | None = None
    rpc_status: int = 200
    rpc_calls: list[dict[str, Any]] = field(default_factory=list)
    seen_prompts: list[tuple[int, ...]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    accepted_per_position: dict[int, float] = field(default_factory=dict)  # position -> accepted tokens
    histograms: dict[str, float] = field(default_factory=dict)  # sample name (…_sum, …_count) -> value


def answer(prompt: list[int], max_tokens: int) -> list[int]:
    base = sum(prompt) * 31
    return [(base + i * 7) % 997 for i in range(max_tokens)]


def ranked(token: int, rank: int) -> int:
    """The token the fake model ranks ``rank``-th after ``token`` wherever ``token`` is its best (0: itself).

    Distinct for every rank below 997, since 997 is prime; ``token + 1`` (a perturbed answer) is none of
    the first 100.
    """
    return (token + 500 * rank) % 997


def runner_up(token: int) -> int:
    """The token the fake model ranks second wherever ``token`` is its best."""
    return ranked(token, 1)


def logprob(behaviour: Behaviour, rank: int) -> float:
    """The log-probability of the fake model's ``rank``-th token after its best."""
    if rank == 0:
        return -0.5
    return -0.5 - behaviour.runner_up_gap - behaviour.rank_step * (rank - 1)


class FakeServer:
    def __init__(self, behaviour: Behaviour | None = None, port: int | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                b = server.behaviour
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    if b.models_status != 200:
                        self._send(b.models_status, b'{"error": "down"}')
                        return
                    card: dict[str, Any] = {"id": MODEL, "object": "model", "owned_by": "vllm"}
                    if b.max_model_len is not None:
                        card["max_model_len"] = b.max_model_len
                    self._send(200, json.dumps({"object": "list", "data": [card]}).encode())
                elif self.path == "/metrics":
                    self._send(200, server.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                if self.path == "/collective_rpc":
                    self._send(*server.collective_rpc(body))
                    return
                self._send(*server.complete(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def collective_rpc(self, body: dict[str, Any]) -> tuple[int, bytes]:
        b = self.behaviour
        with self._lock:
            b.rpc_calls.append(body)
        if b.rpc_results is None:
            return 404, b'{"detail": "Not Found"}'
        if b.rpc_status != 200:
            return b.rpc_status, json.dumps({"detail": str(b.rpc_results[0])}).encode()
        return 200, json.dumps({"results": b.rpc_results}).encode()

    def metrics(self) -> str:
        b = self.behaviour
        lines = [
            "# HELP vllm:num_requests_running Number of requests.",
            "# TYPE vllm:num_requests_running gauge",
        ]
        lines.append(f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0')
        with self._lock:
            counters = dict(b.counters)
            per_position = dict(b.accepted_per_position)
        if b.speculation:  # vLLM registers the counters at start-up, so they exist at 0 before any draft
            for name in SPEC_COUNTERS:
                counters.setdefault(name, 0.0)
            # One series per position of the draft block, all of them created at start-up too.
            family = "vllm:spec_decode_num_accepted_tokens_per_pos"
            lines.append(f"# TYPE {family} counter")
            for position in range(b.speculative_tokens):
                labels = f'engine="0",model_name="{MODEL}",position="{position}"'
                lines.append(f"{family}_total{{{labels}}} {per_position.get(position, 0.0)}")
        for name, value in sorted(counters.items()):
            if name.startswith("vllm:spec_decode") and not b.speculation:
                continue
            if name.startswith("vllm:prefix_cache") and not b.prefix_metrics:
                continue
            lines.append(f"# TYPE {name} counter")
            lines.append(f'{name}_total{{engine="0",model_name="{MODEL}"}} {value}')
            lines.append(f'{name}_created{{engine="0",model_name="{MODEL}"}} 1.7e9')
        with self._lock:
            histograms = dict(b.histograms)
        for name, value in sorted(histograms.items()):
            lines.append(f'{name}{{engine="0",model_name="{MODEL}"}} {value}')
        return "\n".join(lines) + "\n"

    def _count(self, name: str, value: float) -> None:
        self.behaviour.counters[name] = self.behaviour.counters.get(name, 0.0) + value

    def complete(self, body: dict[str, Any]) -> tuple[int, bytes]:
        b = self.behaviour
        with self._lock:
            self.requests += 1
            first = self.requests == 1
            prompt = tuple(int(t) for t in body["prompt"])
            repeated = prompt in b.seen_prompts
            if not repeated:
                b.seen_prompts.append(prompt)
            distinct_index = b.seen_prompts.index(prompt)
        long = len(prompt) > b.long_prompt_over
        if first and b.hang_first:
            time.sleep(b.hang_first)
        if long and b.hang_long:
            time.sleep(b.hang_long)
        if b.hang_all:
            time.sleep(b.hang_all)
        if b.status != 200:
            return b.status, b'{"error": {"message": "EngineCore died"}}'
        if b.malformed:
            return 200, b'{"choices": [ {"text": "trunc'
        asked = int(body["max_tokens"])
        if b.max_model_len is not None and len(prompt) + asked > b.max_model_len:
            message = (
                f"This model's maximum context length is {b.max_model_len} tokens. However, you requested "
                f"{len(prompt) + asked} tokens ({len(prompt)} in the messages, {asked} in the completion)."
            )
            return 400, json.dumps({"error": {"message": message, "code": 400}}).encode()
        max_tokens = 0 if b.empty_completions else asked - b.short_completions
        if b.stops_at is not None and body.get("ignore_eos") is False:
            max_tokens = min(max_tokens, b.stops_at)
        best = answer(list(prompt), max_tokens)
        tokens = list(best)
        if (b.cache_differs and repeated) or (
            b.perturb_request is not None and distinct_index == b.perturb_request
        ):
            tokens = tokens[:3] + [(t + 1) % 997 for t in tokens[3:]]
        if b.runner_up_request is not None and distinct_index == b.runner_up_request and len(tokens) > 3:
            tokens[3] = ranked(best[3], b.runner_up_rank)
        if b.cache_rank is not None and repeated and len(tokens) > 3:
            tokens[3] = ranked(best[3], b.cache_rank)
        with self._lock:
            self._count("vllm:prefix_cache_queries", len(prompt))
            whole = (len(prompt) - 1) // b.cache_block_tokens * b.cache_block_tokens
            hits = whole if repeated and b.prefix_caching else 0
            self._count("vllm:prefix_cache_hits", hits)  # vLLM exports it from start-up, at 0 too
            if b.speculation and b.drafting and (b.drafting_long or not long):
                steps = max(1, max_tokens // 3)
                weak = b.weak_request is not None and distinct_index == b.weak_request
                per_step = b.weak_accepted_per_draft if weak else b.accepted_per_draft
                self._count("vllm:spec_decode_num_drafts", steps)
                self._count("vllm:spec_decode_num_draft_tokens", b.speculative_tokens * steps)
                self._count("vllm:spec_decode_num_accepted_tokens", per_step * steps)
                # A token is accepted at a position only where every one before it was.
                for position in range(min(per_step, b.speculative_tokens)):
                    b.accepted_per_position[position] = b.accepted_per_position.get(position, 0.0) + steps
            if tokens:
                for name, value in (
                    ("vllm:request_generation_tokens_sum", len(tokens)),
                    ("vllm:request_generation_tokens_count", 1),
                    ("vllm:request_decode_time_seconds_sum", (len(tokens) - 1) * b.decode_s_per_token),
                    ("vllm:request_decode_time_seconds_count", 1),
                    ("vllm:time_to_first_token_seconds_sum", (len(prompt) - hits) * b.prefill_s_per_token),
                    ("vllm:time_to_first_token_seconds_count", 1),
                ):
                    b.histograms[name] = b.histograms.get(name, 0.0) + value
        usage: dict[str, Any] = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt) + len(tokens),
        }
        document: dict[str, Any] = {
            "id": f"cmpl-{self.requests}",
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": "", "token_ids": tokens, "finish_reason": "length"}],
        }
        if not b.drop_usage:
            document["usage"] = usage
        if body.get("logprobs"):
            assert body.get("return_tokens_as_token_ids") is True  # keys are "token_id:N" without a tokenizer
            top = int(body["logprobs"])
            positions = []
            for model, chosen in zip(best, tokens, strict=True):
                position = {f"token_id:{ranked(model, r)}": logprob(b, r) for r in range(top)}
                position.setdefault(f"token_id:{chosen}", -20.0)
                positions.append(position)
            document["choices"][0]["logprobs"] = {"top_logprobs": positions}
        return 200, json.dumps(document).encode()
