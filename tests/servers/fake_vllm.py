"""``vllm serve``'s command line in front of the fake OpenAI server, for running the serving recipe of
docs/serving.md in a container without a GPU.

The recipe's server container runs ``sparkseal serve MODEL --port PORT ...`` (the image's entrypoint); the
recipe's test runs this module there instead (``python3 -m tests.servers.fake_vllm MODEL --port PORT ...``),
so the arguments the page gives reach a server that reads the ones the reference validation depends on, as
vLLM would: ``--port``, ``--max-model-len`` (vLLM otherwise takes the model's own; here
``DEFAULT_MAX_MODEL_LEN``, short of the reference's 1,048,576, so a recipe that drops it fails its check),
``--speculative-config`` (without it nothing is drafted, as with vLLM) and ``--no-enable-prefix-caching``.
Every other vLLM option is accepted and ignored. Like vLLM, it shuts down cleanly on SIGTERM (exit 0): as
a container's first process it must handle the signal itself, or ``podman stop`` waits out its timeout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence

from tests.servers.fake_openai import Behaviour, FakeServer

# What a Qwen3 configuration gives vLLM without --max-model-len (its max_position_embeddings).
DEFAULT_MAX_MODEL_LEN = 40_960


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options the fake reads, and the vLLM options it ignores (returned, to be logged)."""
    parser = argparse.ArgumentParser(prog="fake vllm serve", allow_abbrev=False)
    parser.add_argument("model")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    parser.add_argument("--speculative-config", type=json.loads, default=None)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    return parser.parse_known_args(list(argv))


def behaviour_for(args: argparse.Namespace) -> Behaviour:
    """A healthy server configured as the arguments say: drafting only with a speculative config."""
    return Behaviour(
        speculation=args.speculative_config is not None,
        max_model_len=args.max_model_len,
        prefix_caching=args.enable_prefix_caching,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args, ignored = parse(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with FakeServer(behaviour_for(args), port=args.port) as server:
        # The server log the recipe keeps: what was served, and how, as vLLM's start-up lines say it.
        print(
            f"fake vllm serve {args.model}: listening on {server.url}, max_model_len {args.max_model_len}, "
            f"speculative config {json.dumps(args.speculative_config)}, ignored {ignored}",
            flush=True,
        )
        while not stop.wait(0.2):
            pass
        print("fake vllm serve: shutting down on a signal", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
