"""What the soak sends: random or given token-id prompts, and a recorded reference to replay."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from sparkseal.live_check.config import Options, UsageError

REFERENCE_FORMAT = "sparkseal-live-reference/1"


PROMPTS_FORMAT = "sparkseal-prompts/1"


def make_prompts(count: int, length: int, low: int, high: int, seed: int) -> list[list[int]]:
    """Deterministic token-id prompts; distinct, so no request is a prefix-cache hit of another."""
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(length)] for _ in range(count)]


def cold_prompt(length: int, low: int, high: int) -> list[int]:
    """A prompt no earlier request shares a prefix with (seeded by the clock), fast at 660,000 tokens."""
    return random.Random(time.time_ns()).choices(range(low, high), k=length)


def load_prompts(path: Path) -> list[list[int]]:
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


def load_reference(path: Path) -> dict[str, Any]:
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


def reference_top(path: Path | None, index: int, top: Any) -> list[dict[int, float]] | None:
    """One reference completion's recorded ``[token, log-prob]`` pairs per position, as dictionaries."""
    if top is None:
        return None
    try:
        return [{int(token): float(logprob) for token, logprob in position} for position in top]
    except (TypeError, ValueError) as error:
        raise UsageError(
            f"--against {path}: top_logprobs of completion #{index} are not [token, log-prob] pairs ({error})"
        ) from None


def soak_prompts(
    options: Options, reference: dict[str, Any] | None, given: list[list[int]] | None, model: str
) -> tuple[list[list[int]], int]:
    """The soak's prompts and ``max_tokens``: the reference's own (it must be of the served model), else
    the first ``--soak`` given prompts, else random ones."""
    if reference is not None and reference.get("model") != model:
        raise UsageError(
            f"--against {options.against}: recorded from model {reference.get('model')!r}, "
            f"but the server serves {model!r}"
        )
    max_tokens = int(reference["max_tokens"]) if reference else options.max_tokens
    if reference:
        prompts = [[int(token) for token in prompt] for prompt in reference["prompts"]]
    elif given is not None:
        prompts = given[: options.soak]
    else:
        prompts = make_prompts(options.soak, options.prompt_tokens, *options.vocab, options.seed)
    return prompts, max_tokens
