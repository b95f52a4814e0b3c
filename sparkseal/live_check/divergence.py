"""Where a completion first leaves the one it is held to, and whether that is a near-tie flip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkseal.live_check.client import Completion


def _first_difference(a: list[int] | str, b: list[int] | str) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def output_of(completion: Completion) -> list[int] | str:
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


def judge_divergence(
    got: list[int] | str, want: list[int] | str, top: list[dict[int, float]] | None, tie_margin: float
) -> Divergence:
    """Judge by ``want``'s own log-probabilities: it is the answer ``got`` is held to (reference, cold)."""
    at = _first_difference(got, want)
    lengths = (len(got), len(want))
    if not isinstance(got, list) or not isinstance(want, list) or at >= min(lengths):
        return Divergence(at, None, None, {}, tie_margin, lengths)
    recorded = top[at] if top is not None and at < len(top) else {}
    return Divergence(at, got[at], want[at], recorded, tie_margin, lengths)
