"""The soak's completions against (or recorded as) the reference served without speculation."""

from __future__ import annotations

import json
from typing import Any

from sparkseal.live_check.client import Completion, RequestFailed
from sparkseal.live_check.config import Options, UsageError
from sparkseal.live_check.divergence import Divergence, judge_divergence, output_of
from sparkseal.live_check.inputs import REFERENCE_FORMAT, reference_top
from sparkseal.live_check.report import Report


def lossless_step(
    report: Report,
    options: Options,
    prompts: list[list[int]],
    results: list[Completion | RequestFailed],
    max_tokens: int,
    reference: dict[str, Any] | None,
) -> None:
    with report.timed("lossless", ok=True) as step:
        outputs = [output_of(r) if isinstance(r, Completion) else None for r in results]
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
            divergence = judge_divergence(
                got, want, reference_top(options.against, index, top), options.tie_margin
            )
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
