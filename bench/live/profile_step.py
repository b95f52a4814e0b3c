"""Where a decode step's time goes, plain or with DSpark: target forward, sampler, draft, the rest (issue 49).

DSpark pays only when the tokens it adds per step outweigh what a step with a draft costs more than one
without. This serves the trained pair (``bench/live/train_dspark.py``'s folder) with vLLM's offline engine in
this process, one request at a time on the held-out prompts, and times four phases of vLLM 0.25.1's V2
model runner around each call: ``execute_model`` (the target's forward: with DSpark, the verification of
the drafted tokens), ``sample`` (the sampler; with DSpark the rejection sampler), the speculator's
``propose`` (the draft), and everything else of the engine's step (scheduling, the host). Each timed call
is bracketed by ``torch.cuda.synchronize()``, so a phase's time is its own work and the phases add up to
the step; that removes the overlap vLLM's asynchronous scheduling would give, so the figures attribute
time and do not measure throughput (the live soak does: ``h200.sh run OUT --trained``).

    PYTHONPATH=$STAGE/ours:$STAGE/deps:$PWD python3 bench/live/profile_step.py --model-dir DIR \\
        --mode dspark --out dspark.json     # then --mode plain --out plain.json: the two side by side
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

PHASES = ("target", "sampler", "draft")
SPECULATIVE_TOKENS = 5


class Timers:
    """Seconds per phase and calls per phase, each call synchronised on both sides."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.active = False

    def wrap(self, owner: type, method: str, phase: str) -> None:
        import torch

        original = getattr(owner, method)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active or kwargs.get("dummy_run"):
                return original(*args, **kwargs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                torch.cuda.synchronize()
                self.seconds[phase] += time.perf_counter() - start
                self.calls[phase] += 1

        setattr(owner, method, timed)


def profile(model_dir: Path, mode: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, to be timed
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ["VLLM_PLUGINS"] = ""
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    timers = Timers()
    timers.wrap(GPUModelRunner, "execute_model", "target")
    timers.wrap(GPUModelRunner, "sample", "sampler")
    timers.wrap(DFlashSpeculator, "propose", "draft")
    speculative = None
    if mode == "dspark":
        speculative = {
            "method": "dspark",
            "model": str(model_dir / "draft"),
            "num_speculative_tokens": SPECULATIVE_TOKENS,
        }
    llm = LLM(
        model=str(model_dir / "target"),
        speculative_config=speculative,
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"},
        skip_tokenizer_init=True,
        load_format="safetensors",
        max_model_len=4096,
        max_num_seqs=1,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up, not timed
    timers.active = True
    tokens = 0
    start = time.perf_counter()
    for prompt in prompts:
        output = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        tokens += len(output.outputs[0].token_ids)
    wall = time.perf_counter() - start
    timers.active = False
    steps = timers.calls["target"]
    phases = {phase: round(timers.seconds[phase], 4) for phase in PHASES}
    rest = wall - sum(timers.seconds.values())
    return {
        "mode": mode,
        "requests": len(prompts),
        "generated_tokens": tokens,
        "engine_steps": steps,
        "tokens_per_step": round(tokens / steps, 3) if steps else None,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "phase_s": {**phases, "rest": round(rest, 4)},
        "phase_ms_per_step": {
            name: round(1000 * value / steps, 3) if steps else None
            for name, value in {**phases, "rest": rest}.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True, help="train_dspark.py's --out folder")
    parser.add_argument("--mode", choices=("plain", "dspark"), required=True)
    parser.add_argument("--requests", type=int, default=16, help="held-out prompts served, one at a time")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    prompts_file = args.model_dir / "prompts.json"
    try:
        prompts = json.loads(prompts_file.read_text())["prompts"][: args.requests]
    except (OSError, ValueError, KeyError) as error:
        print(
            f"profile_step: {prompts_file}: expected train_dspark.py's held-out prompts ({error})",
            file=sys.stderr,
        )
        return 2
    if not prompts:
        print(f"profile_step: {prompts_file}: no prompts", file=sys.stderr)
        return 2
    result = profile(args.model_dir, args.mode, prompts, args.max_tokens)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
