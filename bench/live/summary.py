"""Tabulate one ``h200.sh run OUT --trained`` folder of live-check reports (Markdown, for live_h200.md).

One row per check; then DSpark against plain decoding at 1, 8 and 32 clients (the server's own per-request
decode speed, and the clients' wall-clock output rate); then each check's acceptance curve over the draft
block's positions; then every request's acceptance at one client,
our wheel against the unpatched one, request by request, since an average can hide a few requests.

    python3 bench/live/summary.py /tmp/sparkseal-live-trained
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def reports(folder: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".summary.json") or path.name == "reference.json":
            continue
        try:
            found[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError:
            found[path.stem] = {"unreadable": path.read_text()[:200]}
    return found


def step(report: dict[str, Any], name: str) -> dict[str, Any]:
    for entry in report.get("steps", []):
        if entry["name"] == name:
            return entry
    return {"figures": {}, "details": {}}


def lossless(figures: dict[str, Any]) -> str:
    if "recorded" in figures:
        return f"recorded {figures['recorded']}"
    if "compared" not in figures:
        return "—"
    return (
        f"{figures['equal']} equal, {figures['near_tie_flips']} near-tie, {figures['differing']} differ "
        f"of {figures['compared']}"
    )


def table(found: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| check | clients | requests | soak tok/s | decode tok/s per request | mean TTFT ms "
        "| drafted / accepted | acceptance | accepted per draft step | lossless | result |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for name, report in found.items():
        if "unreadable" in report:
            lines.append(f"| {name} | unreadable: {report['unreadable']!r} |")
            continue
        soak = step(report, "soak")["figures"]
        spec = step(report, "speculation")["figures"]
        ttft = soak.get("ttft_mean_s")
        drafted = f"{spec['draft_tokens']} / {spec['accepted_tokens']}" if "draft_tokens" in spec else "—"
        result = "pass" if report["ok"] else "; ".join(f["kind"] for f in report["findings"])
        lines.append(
            f"| {name} | {soak.get('concurrency', '')} | {soak.get('requests', '')} "
            f"| {soak.get('output_tokens_per_s', '')} | {soak.get('decode_tokens_per_s', '—')} "
            f"| {round(ttft * 1000, 1) if ttft is not None else '—'} | {drafted} "
            f"| {spec.get('acceptance_rate', '—')} | {spec.get('accepted_per_draft', '—')} "
            f"| {lossless(step(report, 'lossless')['figures'])} | {result} |"
        )
    return lines


def ratios(found: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| wheel | clients | decode tok/s per request, DSpark / plain | soak tok/s, DSpark / plain |",
        "|---|---:|---|---|",
    ]
    for wheel in ("ours", "upstream"):
        for clients in (1, 8, 32):
            plain = step(found.get(f"plain-c{clients}", {}), "soak")["figures"]
            spec = step(found.get(f"{wheel}-c{clients}", {}), "soak")["figures"]
            cells = []
            for key in ("decode_tokens_per_s", "output_tokens_per_s"):
                if plain.get(key) and spec.get(key):
                    cells.append(f"{spec[key]} / {plain[key]} = {spec[key] / plain[key]:.2f}x")
                else:
                    cells.append("—")
            lines.append(f"| {wheel} | {clients} | {cells[0]} | {cells[1]} |")
    return lines


def position_curves(found: dict[str, dict[str, Any]]) -> list[str]:
    """Each speculating check's acceptance curve over the draft block: the share of its draft steps that
    accepted a token at each position (live-check's ``accepted_per_position``, the check's own deltas)."""
    curves = {
        name: step(report, "speculation")["figures"].get("accepted_per_position")
        for name, report in found.items()
        if "unreadable" not in report
    }
    curves = {name: curve for name, curve in curves.items() if curve}
    if not curves:
        return ["per-position acceptance: no check reports accepted_per_position"]
    width = max(len(curve) for curve in curves.values())
    lines = [
        "| check | " + " | ".join(f"position {k}" for k in range(width)) + " |",
        "|---|" + "---:|" * width,
    ]
    for name, curve in curves.items():
        cells = [f"{rate:.3f}" for rate in curve] + ["—"] * (width - len(curve))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def per_request(found: dict[str, dict[str, Any]]) -> list[str]:
    ours = step(found.get("ours-requests", {}), "speculation").get("details", {}).get("per_request")
    upstream = step(found.get("upstream-requests", {}), "speculation").get("details", {}).get("per_request")
    if ours is None or upstream is None:
        return ["per-request acceptance: ours-requests or upstream-requests has no per-request figures"]
    same = sum(a == b for a, b in zip(ours, upstream, strict=False))

    def lengths(entries: list[Any]) -> list[float]:
        return sorted(a / d for d, a in (e for e in entries if e) if d > 0)

    mine, theirs = lengths(ours), lengths(upstream)
    if not mine or not theirs:
        empty = " and ".join(name for name, got in (("ours", mine), ("upstream", theirs)) if not got)
        return [f"per-request acceptance: {empty}-requests has no request that made a draft step"]
    return [
        f"per-request acceptance at one client: {same} of {len(ours)} requests drafted and accepted exactly "
        f"the same counts on both wheels",
        f"ours: lowest {mine[0]:.3f}, median {statistics.median(mine):.3f}, highest {mine[-1]:.3f} "
        f"accepted per draft step; upstream: lowest {theirs[0]:.3f}, median {statistics.median(theirs):.3f}, "
        f"highest {theirs[-1]:.3f}",
    ]


def main(argv: list[str]) -> int:
    """Print the tables; exit 1, naming what it skipped, if the folder has no report or an unreadable one."""
    if len(argv) != 2:
        print("usage: summary.py FOLDER (an h200.sh run OUT --trained results folder)", file=sys.stderr)
        return 2
    folder = Path(argv[1])
    if not folder.is_dir():
        print(f"summary: {folder}: expected a folder of live-check reports, found none", file=sys.stderr)
        return 1
    found = reports(folder)
    if not found:
        print(f"summary: {folder}: expected live-check reports (*.json), found none", file=sys.stderr)
        return 1
    print(
        "\n".join([*table(found), "", *ratios(found), "", *position_curves(found), "", *per_request(found)])
    )
    unreadable = sorted(name for name, report in found.items() if "unreadable" in report)
    if unreadable:
        names = ", ".join(f"{name}.json" for name in unreadable)
        print(f"summary: {folder}: unreadable reports, left out of the figures: {names}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
