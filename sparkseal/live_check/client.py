"""A small OpenAI-API client on urllib for the live check: one deadline per request, errors by kind."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sparkseal.live_check.config import UsageError


class Unreachable(Exception):
    """The server does not answer at all: exit 2."""


class RequestFailed(Exception):
    """One request failed: an HTTP error, a malformed answer, or no answer before its deadline."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


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
    client: Client,
    model: str,
    prompt: list[int],
    max_tokens: int,
    timeout: float,
    logprobs: int = 0,
    ignore_eos: bool = True,
) -> Completion:
    """One greedy completion of a token-id prompt, checked for the fields the checks rely on."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # vLLM extensions: the completion runs to max_tokens (unless ``ignore_eos`` is off: then it ends at
        # the model's end of text), and comes back as token ids.
        "ignore_eos": ignore_eos,
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
