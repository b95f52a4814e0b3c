"""Where a Bazel build's time went, by action: the longest actions of a ``--profile`` trace and the sum of
each kind (the part of an action's description before its target).

Bazel writes a Chrome-trace JSON profile with ``--profile=FILE.gz``; each executed action is a complete
event (``"ph": "X"``) of category ``action processing`` whose name is the action's progress message. Wall
time of one action is its event's duration; the sum over actions is the work the build's cores shared.

    bazel build //:image --profile=/tmp/profile.gz
    python3 bench/profile_actions.py /tmp/profile.gz [--top 25]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

ACTION_CATEGORY = "action processing"


def actions(profile: Path) -> list[tuple[str, float]]:
    """(progress message, seconds) of every action the profile records."""
    opener = gzip.open if profile.suffix == ".gz" else open
    with opener(profile, "rt") as stream:
        document = json.load(stream)
    events = document["traceEvents"] if isinstance(document, dict) else document
    return [
        (event["name"], event["dur"] / 1e6)
        for event in events
        if event.get("ph") == "X" and event.get("cat") == ACTION_CATEGORY and "dur" in event
    ]


def kind(message: str) -> str:
    """The words of a progress message before the first label or path."""
    words = []
    for word in message.split():
        if word.startswith(("//", "@", "external/", "bazel-out/", "'")) or "/" in word:
            break
        words.append(word)
    return " ".join(words) or message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    found = actions(args.profile)
    total = sum(seconds for _, seconds in found)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for message, seconds in found:
        by_kind[kind(message)].append(seconds)
    print(f"{len(found)} actions, {total:.1f} s of action time in all\n")
    print("| action | s |\n|---|---:|")
    for message, seconds in sorted(found, key=lambda item: -item[1])[: args.top]:
        print(f"| {message} | {seconds:.1f} |")
    print("\n| kind | actions | s | share |\n|---|---:|---:|---:|")
    for name, times in sorted(by_kind.items(), key=lambda item: -sum(item[1]))[: args.top]:
        print(f"| {name} | {len(times)} | {sum(times):.1f} | {sum(times) / total:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
