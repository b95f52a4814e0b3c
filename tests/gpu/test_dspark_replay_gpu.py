"""DSpark's draft step keeps rejected, null-block and padded rows inert in the running engine (``-m gpu``).

Patch 0001 (vLLM PR #51538) is what makes this pass; greedy outputs cannot show it, so the test counts the
writes themselves (``sparkseal.vllm_integration.dspark_replay``): vLLM's offline engine in this process
serves the seeded test model (bench/live/test_model.py) with its DSpark draft, 5 speculative tokens,
probabilistic drafting at temperature 1 (seeded), FULL_AND_PIECEWISE CUDA graphs and up to 8 requests of
different lengths at a time, so batches are padded to captured graph sizes and the random draft is
rejected at almost every step. Then ``collective_rpc`` asks the worker for its counts, and every finding
(``sparkseal.core.dspark_replay.findings``) fails the test, by name.

The same test against the unpatched upstream wheel must fail (bench/live/h200.sh run OUT --weights
replay-upstream): that is what shows the check can fail. Needs a CUDA GPU, an importable vLLM with
DSpark (v0.25.1), torch and safetensors; skips otherwise.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "live"))

import test_model

from sparkseal.core.dspark_replay import RPC_METHOD, findings

pytestmark = pytest.mark.gpu

SPECULATIVE_TOKENS = 5
REQUESTS = 24
MAX_NUM_SEQS = 8


def test_draft_steps_leave_rejected_null_block_and_padded_rows_inert(
    vllm_in_process: None, tmp_path: Path
) -> None:
    if importlib.util.find_spec("safetensors") is None:
        pytest.skip("safetensors is not installed")
    model_dir = tmp_path / "dspark-model"
    test_model.write(model_dir, weights=True)
    # The probe is installed in this process, where the engine core and its speculator run.
    from vllm import LLM, SamplingParams

    from sparkseal.vllm_integration import dspark_replay

    assert dspark_replay.install(), "vLLM has no DFlash speculator to observe"
    llm = LLM(
        model=str(model_dir / "target"),
        speculative_config={
            "method": "dspark",
            "model": str(model_dir / "draft"),
            "num_speculative_tokens": SPECULATIVE_TOKENS,
            "draft_sample_method": "probabilistic",
        },
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"},
        skip_tokenizer_init=True,
        load_format="safetensors",
        max_model_len=2048,
        max_num_seqs=MAX_NUM_SEQS,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=True,
        seed=0,
    )
    rng = random.Random(20261207)
    # Lengths from a few tokens to several blocks, so requests join and leave the batch at different steps.
    prompts = [
        {"prompt_token_ids": [rng.randrange(100, 1000) for _ in range(rng.randrange(3, 400))]}
        for _ in range(REQUESTS)
    ]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=rng.randrange(16, 96), detokenize=False)
        for i in range(REQUESTS)
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(out.outputs[0].token_ids) > 0 for out in outputs)

    (answer,) = llm.collective_rpc(RPC_METHOD)
    print(f"dspark replay probe: {answer}")
    # The check was exercised: draft steps of requests ran, drafts were rejected, batches were padded.
    assert answer["steps"] > 0
    assert answer["rejected_rows"] > 0
    assert answer["padded_sample_rows"] > 0
    assert answer["capture_rows_written"] is not None, "graph capture was not observed"
    assert findings(answer) == []
