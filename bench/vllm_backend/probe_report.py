"""Read the ``[dspark-probe]`` lines of server logs (bench/vllm_backend/hooks/dspark_probe.py) as tables.

    python3 bench/vllm_backend/probe_report.py SERVER.log [SERVER.log ...]

For each log: the KV-cache groups (block and kernel block sizes, which hold the draft's layers), then per
draft step and draft layer each described context position with the slot the insert wrote, the slot in
kernel-block units, the slot the draft decode reads, and the record before the insert, after it and after
the draft step (``ok`` for a written record: scale bytes set, no NaN; else what is wrong); then every watched
record that changed and the call that changed it; the NaN rows of the target's hidden states, of each op of
DSpark's combine step and of the plain sampler's logits; the target ops whose output first held a NaN row or
was all zeros; each checked hyper-connection (mHC) step whose new residual differs from its reference
(``MHC``), with a tally per token count, and the attention metadata's decode/prefill split of the first real
steps. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TAG = "[dspark-probe] "


def events(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if TAG in line:
            try:
                found.append(json.loads(line.split(TAG, 1)[1]))
            except ValueError as error:
                found.append({"kind": "unreadable", "error": str(error), "line": line[:200]})
    return found


def state(summary: dict[str, Any] | None) -> str:
    """``ok`` for a record the insert wrote (scale bytes set, no NaN byte), else what is off."""
    if summary is None:
        return "-"
    scale = summary["scale"][:7]
    problems = []
    if not any(scale):
        problems.append("scale 00")
    if summary["nope_zero"] == 448:
        problems.append("NoPE 00")
    if summary["nope_nan"]:
        problems.append(f"NoPE NaN x{summary['nope_nan']}")
    if summary["rope_nan"]:
        problems.append(f"RoPE NaN x{summary['rope_nan']} ({summary['rope_head'][0]})")
    if not problems:
        return f"ok (scale {scale[0]})"
    return ", ".join(problems)


def rows(fields: dict[str, Any]) -> str:
    """A tensor's rows as the probe described them: NaN rows, all-zero rows, largest magnitude."""
    return (
        f"{fields['rows']} rows, NaN rows {fields['nan_rows']}, {fields['zero_rows']} all-zero, "
        f"max {fields['absmax']:.3g}"
    )


def mhc(event: dict[str, Any]) -> str:
    """One checked mHC step: where, which kernel vLLM took, and the rows that went wrong."""
    if not event["small"]:
        kernel = "separate post and pre kernels"
    else:
        kernel = "small kernel, " + (
            "covers the hidden size" if event["covers"] else "does NOT cover the hidden size"
        )
    if event.get("unfused"):
        kernel = "unfused by the probe's switch"
    return (
        f"MHC {event['phase']} forward {event['forward']} {event['layer']} {event['part']}: "
        f"{event['tokens']} tokens, hidden {event['hidden']} ({kernel}): residual differs in rows "
        f"{event['differ_rows']} (max relative {event['max_rel']:.3g} of {event['ref_absmax']:.3g}), "
        f"reference NaN rows {event['ref_nan_rows']}, next input NaN rows {event['layer_input_nan_rows']}"
    )


def metadata(event: dict[str, Any]) -> str:
    """The decode/prefill split each attention metadata kind gave one real step."""
    parts = []
    for kind, entry in event["kinds"].items():
        if not isinstance(entry, dict):
            parts.append(f"{kind}: {entry}")
            continue
        split = ""
        if "num_decodes" in entry:
            split = (
                f" decodes {entry['num_decodes']} ({entry.get('num_decode_tokens')} tokens), prefills "
                f"{entry.get('num_prefills')} ({entry.get('num_prefill_tokens')} tokens)"
            )
        extra = "".join(
            f", {name} {entry[name]}"
            for name in ("query_start_loc_cpu", "seq_lens", "block_size")
            if name in entry
        )
        parts.append(f"{kind} x{entry['layers']}:{split}{extra}")
    return (
        f"metadata forward {event['forward']} ({event['tokens']} tokens, positions {event['positions']}, "
        f"input ids {event['input_ids']}): " + "; ".join(parts)
    )


def report(path: Path) -> list[str]:
    out = [f"== {path}"]
    for event in events(path):
        kind = event["kind"]
        if kind == "groups":
            out.append(
                f"groups: draft groups {event['draft_group_ids']}, draft layer -> group index "
                f"{event['layer_group_idx']}, {event['num_query_per_req']} query rows per request"
            )
            for group in event["groups"]:
                out.append(
                    f"  gid {group['gid']} {group['spec']}: block {group['block_size']}, kernel block "
                    f"{group['kernel_block_size']}, {group['layers']} layers, draft {group['draft_layers']}"
                )
            for cache in event["caches"]:
                out.append(f"  cache {cache['layer']}: shape {cache['shape']} stride {cache['stride']}")
        elif kind == "context":
            out.append(
                f"step {event['step']} {event['layer']} (gid {event['gid']}, block {event['block_size']}, "
                f"kernel {event['kernel_block_size']}): seq_lens {event['seq_lens']}, block table "
                f"{event['block_table_rows']}"
            )
            for row in event["rows"]:
                out.append(
                    f"  req {row['req']} pos {row['position']} (target {row['target_position']}): slot "
                    f"{row['slot']} kernel {row['kernel_slot']} read {row['read']} | before "
                    f"{state(row.get('before'))} | inserted {state(row.get('inserted'))} | after draft "
                    f"{state(row.get('after_draft'))}"
                    + (f" | read record {state(row['read_record'])}" if "read_record" in row else "")
                )
        elif kind == "changed":
            out.append(
                f"CHANGED step {event['step']} check {event['check']} in {event['where']}: {event['layer']} "
                f"pos {event['position']} slot {event['slot']}: {state(event['before'])} -> "
                f"{state(event['after'])}"
            )
        elif kind == "combine":
            parts = [f"aux {i}: {rows(a)}" for i, a in enumerate(event.get("aux", []))]
            parts += [
                f"{name}: {rows(event[name])}"
                for name in ("main_proj", "main_norm", "last_hidden")
                if name in event
            ]
            out.append(f"combine step {event['step']} ({event['tokens']} tokens): " + "; ".join(parts))
        elif kind == "target":
            out.append(f"TARGET after {event['proposes']} draft steps, {event['where']}: {rows(event)}")
        elif kind == "hidden":
            out.append(f"hidden step {event['step']}: {event['rows']} rows, NaN rows {event['nan_rows']}")
        elif kind == "sampler":
            out.append(
                f"sampler call {event['call']}: logits {event['logits']}, NaN rows {event['nan_rows']} at "
                f"positions {event['positions']}"
            )
        elif kind == "mhc":
            out.append(mhc(event))
        elif kind == "mhc-tally":
            calls = ", ".join(f"{name} x{count}" for name, count in event["calls"].items())
            out.append(f"mhc tally {event['where']} ({event['phase']}): {calls}")
        elif kind == "metadata":
            out.append(metadata(event))
        else:
            out.append(f"{kind}: {json.dumps({k: v for k, v in event.items() if k != 'kind'})[:300]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.logs if not path.is_file()]
    if missing:
        print(f"probe_report: no such log: {', '.join(missing)}", file=sys.stderr)
        return 2
    for path in args.logs:
        print("\n".join(report(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
