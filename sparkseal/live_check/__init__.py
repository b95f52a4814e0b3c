"""Validate a running vLLM OpenAI-compatible server before DSpark goes into service (``live-check``).

The defects this guards against show up only in a live engine: a first request that never returns after
CUDA-graph capture, speculative decoding configured but never drafting, a prefix-cache hit that answers
differently from the cold prompt, completions that drift from the model's own non-speculative output, and
engine failures that a client sees only as slowness (dead engine core, RPC timeouts, NCCL errors, illegal
memory accesses, out-of-memory) and that the server log records. Each step reports its figures; a defect
is a *finding* (exit 1). A server that cannot be reached at all, or bad arguments, exit 2.

Prompts are token ids, so the check works against ``--skip-tokenizer-init`` servers and needs no
tokenizer here; ``return_token_ids`` (a vLLM extension of the completions API) makes completions
comparable token by token. Requests run at temperature 0. Every request has a deadline: a hang becomes a
finding, never a stuck process.

The lossless check compares the soak's completions with a reference file that ``--record`` wrote against
the same model served without speculation. The reference carries its own prompts and ``max_tokens``, so
``--against`` replays exactly what was recorded, and the reference's top ``--top-logprobs`` (5)
log-probabilities at every position. Speculative decoding verifies drafts with the target model, so its
greedy output equals the non-speculative one up to floating-point rounding: the verification pass runs
other kernels and batch shapes than a one-token decode, and in bf16 that can flip the choice between
near-equal tokens. A nearly flat model has several of them at a position, and rounding may pick any, not
only the runner-up. So a completion that first differs where the token the server chose was within
``--tie-margin`` (in log-probability) of the reference's best token there, whatever its rank among the
recorded ones, is counted as a near-tie flip, not a finding; a chosen token beyond the margin, or not
among the recorded top tokens at all, is a finding. The same rule judges the long prompt served from the
prefix cache against the cold prompt, which asks for log-probabilities for that reason: vLLM does not
promise that a cached prefill rounds like a cold one.

Speculative decoding that drafts but whose drafts are rejected is slower than none, so drafting alone is
not enough: ``--min-acceptance`` (accepted over drafted tokens), ``--min-accepted-length`` (accepted draft
tokens per draft step, the bonus token not counted; vLLM's "mean acceptance length" is one more) and,
serially, ``--min-request-accepted-length`` (the same for every single request, read from ``/metrics``
around each request, since an average over many requests can hide a few whose drafts go wrong) make a
draft that does not draft well a finding. ``--prompts FILE`` serves held-out prompts (token ids) instead
of random ones, so the figures say something about the model's own text; ``--record`` keeps them in the
reference. The soak also reports the server's own decode speed per request (tokens after the first over
the time from first to last token, from vLLM's histograms), which no client-side pause disturbs.

With tensor parallelism, two more steps prove that the ranks agree. The module check: the sparkseal vLLM
plugin logs, in every worker, that the module files of every rank are identical (or stops them all); the
server log must show that line once per rank, with one digest. The NCCL check (``--nccl-logs DIR``, the
folder of the per-rank ``NCCL_DEBUG_FILE`` logs written with ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS``
including ``COLL``): after the check's requests, every rank's normalised collective sequence must be the
same (``sparkseal nccl-diff``'s rules); the first divergence is a finding.

``--profile reference`` is the validation GB10 owners ran by hand for DSpark (two GB10s, tensor parallel
2, a 1M-token-context target, 5 speculative tokens, ``--max-num-seqs 1``): its counts become the defaults
(``PROFILES``), each still overridable, and the steps it adds are steps of this one checker, off unless
asked for: one cold prompt of ``--context-tokens`` (660,000) on a server whose ``max_model_len``
(``/v1/models``) is at least ``--min-max-model-len`` (1,048,576), with its own drafted and accepted tokens
read from ``/metrics`` around it; a prefix-cache hit that must really hit; and, with ``--teardown-pid``,
the server stopped after the checks and the GPUs polled with ``nvidia-smi`` until their memory and
utilisation are back to idle. live-check stops a server only when told its pid: a check that must not
end the service it checks does not get one. Every step reports its own time; progress goes to the
``progress`` callback (the CLI's stderr), with a heartbeat while one request runs for minutes.
"""
