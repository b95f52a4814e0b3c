"""vLLM's DSpark draft drafts what the training forward (bench/live/tiny_qwen3.py) drafts (``-m gpu``).

A draft trained on another function than the one vLLM evaluates accepts little, and nothing on the CPU can
show which function vLLM evaluates. So this test serves the trained pair (bench/live/train_dspark.py,
folder in ``$SPARKSEAL_DSPARK_MODEL``) with vLLM's offline engine in this process, records every draft
block its DSpark speculator proposes with the block's anchor position and token, and drafts the same
blocks with the training forward from the completed sequence. The anchor must be the sequence's token at
that position (the layout: the token just sampled, at the first query position), and the drafts must
agree, up to bf16 rounding of two different kernels at near-ties.

Needs a CUDA GPU, an importable vLLM with DSpark (v0.25.1) and the trained model; skips otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "live"))

import tiny_qwen3  # noqa: E402

pytestmark = pytest.mark.gpu

BLOCK = 5
PROMPTS = 12
NEW_TOKENS = 64
# Two implementations in bf16 (vLLM's fused kernels and plain PyTorch) may order sums differently, which
# flips a draft where two tokens are within rounding of each other; a trained draft has few such places.
MIN_BLOCK_AGREEMENT = 0.9
MIN_FIRST_TOKEN_AGREEMENT = 0.95


@pytest.fixture
def model_dir(vllm_in_process: None) -> Path:
    folder = os.environ.get("SPARKSEAL_DSPARK_MODEL")
    if not folder or not (Path(folder) / "draft" / "model.safetensors").is_file():
        pytest.skip("no trained model: set SPARKSEAL_DSPARK_MODEL to bench/live/train_dspark.py's --out")
    return Path(folder)


def test_vllm_drafts_what_the_training_forward_drafts(model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    # The engine core runs in this process (vllm_in_process), so that the speculator can be observed.
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    recorded: list[tuple[int, int, list[int]]] = []
    propose = DSparkSpeculator.propose

    def observed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        drafts = propose(self, *args, **kwargs)
        if not kwargs.get("dummy_run", False) and drafts.shape[0] == 1:
            # After the step, the speculator's input buffers hold the block's first query row.
            recorded.append(
                (
                    int(self.input_buffers.positions[0]),
                    int(self.input_buffers.input_ids[0]),
                    drafts[0].tolist(),
                )
            )
        return drafts

    monkeypatch.setattr(DSparkSpeculator, "propose", observed)
    llm = LLM(
        model=str(model_dir / "target"),
        speculative_config={
            "method": "dspark",
            "model": str(model_dir / "draft"),
            "num_speculative_tokens": BLOCK,
        },
        skip_tokenizer_init=True,
        load_format="safetensors",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=1,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        seed=0,
    )
    target, draft = tiny_qwen3.load_models(model_dir, device="cuda")
    prompts = json.loads((model_dir / "prompts.json").read_text())["prompts"][:PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False)
    blocks = agree = first_agree = 0
    anchors_wrong: list[tuple[int, int, int]] = []
    accepted = 0
    for prompt in prompts:
        recorded.clear()
        output = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        sequence = list(prompt) + list(output.outputs[0].token_ids)
        steps = [(p, a, d) for p, a, d in recorded if p < len(sequence)]
        assert steps, "the speculator proposed no draft block"
        for position, anchor, _ in steps:
            if sequence[position] != anchor:
                anchors_wrong.append((position, anchor, sequence[position]))
        tokens = torch.tensor([sequence], device="cuda")
        anchors = torch.tensor([[p for p, _, _ in steps]], device="cuda")
        ours = tiny_qwen3.draft_blocks(target, draft, tokens, anchors, BLOCK)[0].tolist()
        for (position, _, theirs), mine in zip(steps, ours, strict=True):
            blocks += 1
            agree += theirs == mine
            first_agree += theirs[0] == mine[0]
            truth = sequence[position + 1 : position + 1 + BLOCK]
            accepted += next(
                (i for i, (d, t) in enumerate(zip(theirs, truth, strict=False)) if d != t), len(truth)
            )
    print(
        f"draft blocks {blocks}: all {BLOCK} tokens equal {agree / blocks:.3f}, first token equal "
        f"{first_agree / blocks:.3f}; vLLM's drafts accepted {accepted / blocks:.2f} tokens per block"
    )
    assert not anchors_wrong, f"anchor is not the sequence's token at its position: {anchors_wrong[:5]}"
    assert first_agree / blocks >= MIN_FIRST_TOKEN_AGREEMENT
    assert agree / blocks >= MIN_BLOCK_AGREEMENT
