"""Speculative decoding over the check: drafted and accepted tokens, against the acceptance floors."""

from __future__ import annotations

import statistics

from sparkseal.live_check.config import Options, draft_block_size
from sparkseal.live_check.metrics import (
    METRIC_ACCEPTED_PER_POSITION,
    METRIC_ACCEPTED_TOKENS,
    METRIC_DRAFT_TOKENS,
    METRIC_DRAFTS,
    positions,
)
from sparkseal.live_check.report import Report, Step


def speculation_step(
    report: Report,
    options: Options,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    per_request: list[tuple[int, int] | None] | None = None,
) -> None:
    with report.timed("speculation", ok=True) as step:
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
                    f"speculation: acceptance rate {rate:.4f} ({int(accepted)} of {int(drafted)} drafted "
                    "tokens "
                    f"accepted) is below the floor --min-acceptance {options.min_acceptance:g}",
                )
        if options.min_accepted_length is not None:
            step.figures["floor_accepted_per_draft"] = options.min_accepted_length
            if length < options.min_accepted_length:
                report.flag(
                    step,
                    "short-acceptance",
                    f"speculation: {length:.3f} draft tokens accepted per draft step (over {int(drafts)} "
                    "steps, "
                    f"the bonus token not counted) is below the floor --min-accepted-length "
                    f"{options.min_accepted_length:g}",
                )
        position_figures(report, step, options, before, after, drafts)
        if options.min_request_accepted_length is not None and per_request is not None:
            request_floor(report, step, options.min_request_accepted_length, per_request)


def position_figures(
    report: Report,
    step: Step,
    options: Options,
    before: dict[str, float],
    after: dict[str, float],
    drafts: float,
) -> None:
    """The acceptance curve over the draft block: per position, the share of the check's draft steps that
    accepted a token there (a token is accepted only where every one before it was, so the curve falls);
    against ``--min-position-acceptance``, position by position."""
    start, end = positions(before), positions(after)
    curve = [round((end[k] - start.get(k, 0.0)) / drafts, 4) for k in sorted(end)]
    if curve:
        step.figures["accepted_per_position"] = curve
    floors = options.min_position_acceptance
    if floors is None:
        return
    step.figures["floor_position_acceptance"] = list(floors)
    if len(curve) < len(floors):
        report.flag(
            step,
            "no-position-figures",
            f"speculation: the server exports {METRIC_ACCEPTED_PER_POSITION} for {len(curve)} positions, "
            f"--min-position-acceptance names {len(floors)}",
        )
    for position, (rate, floor) in enumerate(zip(curve, floors, strict=False)):
        if rate < floor:
            report.flag(
                step,
                "low-position-acceptance",
                f"speculation: position {position} of the draft block accepted a token in {rate:.4f} of "
                f"{int(drafts)} draft steps, below its floor {floor:g} (--min-position-acceptance)",
            )


def draft_fit_step(report: Report, options: Options, metrics: dict[str, float] | None) -> bool:
    """With ``--draft-config``: the server's speculative-token count (the positions /metrics exports) must
    be the draft's block size, before any request; False (the checks stop) when it is not, or unknown."""
    with report.timed("draft-fit", ok=True) as step:
        if options.draft_config is None:
            step.skipped = "no --draft-config FILE"
            return True
        block = draft_block_size(options.draft_config)
        served = positions(metrics)
        step.figures = {"draft_block_size": block, "speculative_tokens": len(served) or None}
        if not served:
            report.flag(
                step,
                "unknown-speculative-tokens",
                f"draft fit: the server exports no {METRIC_ACCEPTED_PER_POSITION}: its speculative-token "
                f"count cannot be held to the draft's block size {block} ({options.draft_config})",
            )
            return False
        if len(served) != block:
            report.flag(
                step,
                "draft-mismatch",
                f"draft fit: the server drafts {len(served)} tokens per step, but the draft "
                f"{options.draft_config} was trained for blocks of {block}: serve it with "
                f'"num_speculative_tokens": {block}',
            )
            return False
        return True


def request_floor(
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
