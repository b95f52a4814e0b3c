"""The command line of live-check, built from the fields of ``config.Options`` (each declares its flag,
default, help, metavar, choices and valid values there, their one home): nothing of an option is written
here but ``--json``, which is the report's form, not the check's."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkseal.live_check.config import Option


def _live_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.live_check.client import Unreachable
    from sparkseal.live_check.config import OPTIONS, UsageError, options_for
    from sparkseal.live_check.report import render
    from sparkseal.live_check.run import run

    # Every option's parser defaults to nothing, so only what was typed is given: it wins over the profile,
    # and the profile over the plain default (config.options_for).
    given = {name: value for name, value in vars(args).items() if name in OPTIONS}
    for declared in OPTIONS.values():
        if declared.environment and (variable := given.pop(declared.name, None)):
            value = os.environ.get(variable)
            if not value:
                parser.error(f"{declared.flag} {variable}: the variable is not set")
            given[declared.name] = value
    try:
        options = options_for(given.pop("profile", None), **given)
        # Progress goes to stderr, --json or not: the report alone is on stdout.
        report = run(options, lambda line: print(f"live-check: {line}", file=sys.stderr, flush=True))
    except UsageError as error:
        parser.error(str(error))
    except Unreachable as error:
        print(f"sparkseal live-check: server unreachable: {error}", file=sys.stderr)
        return 2
    print(render(report, args.json))
    return 0 if report.ok else 1


def _shown_default(declared: Option) -> str:
    """'default: X' and, where a profile sets the option, '--profile P: Y': what ``{default}`` in a help
    text reads, from the field's default and ``PROFILES``, never typed again here."""
    from sparkseal.live_check.config import PROFILES

    shown = [f"default: {declared.shown or declared.show(declared.default)}"]
    shown += [
        f"--profile {profile}: {declared.show(PROFILES[profile][declared.name])}"
        for profile in sorted(PROFILES)
        if declared.name in PROFILES[profile]
    ]
    return "; ".join(shown)


def _converter(declared: Option) -> Callable[[str], Any]:
    """The argparse ``type`` of an option: its parse, then, for a refusal that quotes what was typed, the
    option's own check (``Option.problem``, the one a profile's or a Python caller's value meets too)."""
    parse = declared.parse or declared.kind
    if not declared.typed:
        return parse  # argparse names it when the text is no number: "invalid float value: 'x'"

    # argparse names this function when the text is no number at all ("invalid parse value: 'x'"): the
    # command line's words for --soak x since the positive-number checks were written, kept as they are.
    def parse_and_check(text: str) -> Any:
        value = parse(text)
        problem = declared.problem(value, text, {})
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse_and_check.__name__ = "parse"
    return parse_and_check


def _add(container: argparse._ActionsContainer, declared: Option) -> None:
    """One option on the parser, from its declaration. Its default is argparse.SUPPRESS, so that an option
    not typed is absent from the namespace and the profile or the field supplies it."""
    from sparkseal.live_check.config import PROFILES

    help_text = declared.help.replace("{default}", _shown_default(declared))
    if declared.required:
        container.add_argument(declared.name, help=help_text)
        return
    shared: dict[str, Any] = {"dest": declared.name, "default": argparse.SUPPRESS, "help": help_text}
    if declared.kind is bool:
        # A switch that a profile turns on also needs its --no- form, to turn it off again.
        profiled = any(declared.name in values for values in PROFILES.values())
        action = argparse.BooleanOptionalAction if profiled else "store_true"
        container.add_argument(declared.flag, action=action, **shared)
        return
    container.add_argument(
        declared.flag,
        type=_converter(declared),
        metavar=declared.metavar,
        choices=declared.choices or None,
        **shared,
    )


def add_commands(commands: argparse._SubParsersAction) -> None:
    from sparkseal.live_check.config import OPTIONS, Group

    live = commands.add_parser(
        "live-check",
        help="validate a running vLLM server (first request, soak, prefix cache, DSpark, lossless, log)",
        description="Validate a running vLLM OpenAI-compatible server before taking DSpark into service: "
        "a first request with a deadline, a soak of greedy requests, a long prompt cold and then from the "
        "prefix cache (both must answer alike up to a near-tie flip), drafted and accepted tokens from "
        "/metrics, the soak's completions against a reference recorded without speculation, and the server "
        "log scanned for tracebacks, dead engines, RPC timeouts, NCCL errors, illegal memory accesses and "
        "out-of-memory. Prompts are token ids, so servers started with --skip-tokenizer-init work. "
        "--profile reference runs the reference validation of DSpark on GB10s with its counts as defaults: a "
        "660,000-token cold prompt on a server of at least 1,048,576 tokens of context among them. Progress "
        "goes to stderr. Exit 0 pass, 1 a finding, 2 a usage error or an unreachable server.",
    )
    groups: dict[Group, argparse._ArgumentGroup] = {}
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for declared in OPTIONS.values():
        container: argparse._ActionsContainer = live
        if declared.group is not None:
            if declared.group not in groups:
                groups[declared.group] = live.add_argument_group(
                    declared.group.title, declared.group.description
                )
            container = groups[declared.group]
        if declared.exclusive is not None:
            if declared.exclusive not in exclusive:
                exclusive[declared.exclusive] = container.add_mutually_exclusive_group()
            container = exclusive[declared.exclusive]
        _add(container, declared)
    live.add_argument("--json", action="store_true", help="print a JSON report")
    live.set_defaults(handler=_live_check, parser=live)
