"""The DSpark replay probe of the running server: the writes patch 0001 keeps from happening, counted inside
the engine (``sparkseal.core.dspark_replay``) and read through vLLM's ``POST /collective_rpc``."""

from __future__ import annotations

from typing import Any

from sparkseal.core.dspark_replay import ENVIRONMENT, RPC_METHOD, findings
from sparkseal.live_check.client import Client, RequestFailed
from sparkseal.live_check.config import Options
from sparkseal.live_check.report import Report

# Figures shown per rank; the JSON report's details keep every rank's whole answer.
SHOWN = ("steps", "rejected_rows", "rejected_rows_written", "null_block_query_rows", "padded_sample_rows")


def replay_step(report: Report, options: Options, client: Client) -> None:
    with report.timed("dspark-replay", ok=True) as step:
        if not options.dspark_replay:
            step.skipped = "not asked (--dspark-replay)"
            return
        try:
            answer = client.post_json("/collective_rpc", {"method": RPC_METHOD}, options.timeout)
        except RequestFailed as error:
            hint = ""
            if "HTTP 404" in str(error):
                hint = ": the server serves no /collective_rpc; start it with VLLM_SERVER_DEV_MODE=1"
            elif "not implemented" in str(error):
                hint = f": the sparkseal probe is not installed; start the server with {ENVIRONMENT}=1"
            report.flag(step, error.kind, f"dspark-replay: {error}{hint}")
            return
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or not results:
            report.flag(step, "malformed", f"dspark-replay: /collective_rpc answered {str(answer)[:200]!r}")
            return
        step.details = {"ranks": results}
        for rank, result in enumerate(results):
            if not isinstance(result, dict):
                text = str(result)
                hint = f" (start the server with {ENVIRONMENT}=1)" if "not implemented" in text else ""
                message = f"dspark-replay: rank {rank} answered {text[:200]!r}{hint}"
                report.flag(step, "not-installed", message)
                continue
            step.figures.update(_figures(result, rank, len(results)))
            for message in findings(result, rank):
                report.flag(step, "replay", f"dspark-replay: {message}")


def _figures(result: dict[str, Any], rank: int, ranks: int) -> dict[str, Any]:
    prefix = f"rank{rank}_" if ranks > 1 else ""
    return {prefix + key: result.get(key) for key in SHOWN}
