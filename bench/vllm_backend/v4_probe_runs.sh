#!/usr/bin/env bash
# The DeepSeek V4 + DSpark probe runs of bench/results/vllm_backend.md section 6, one after the other, on a
# GPU machine where bench/live/h200.sh install has staged the wheels. Started as a job that outlives one
# remote command (bench/live/device.sh start v4 bench/vllm_backend/v4_probe_runs.sh RESULTS [RUN ...]):
#   a  target and draft on our class, vLLM's dummy weights, one client (the failing configuration)
#   k  the same with SPARKSEAL_DSPARK_KERNEL_BLOCKS=1, only where run a's probe saw a draft KV-cache group
#      whose block size is not its kernel block size
#   s  run a with seeded, non-flat weights (SPARKSEAL_SEEDED_WEIGHTS=1)
#   f  both on vLLM's FlashMLA class, dummy weights, one client (the control)
#   g  run f with vLLM's CUDA graphs (EAGER=0): the configuration that served 120 of 120 in section 4c
#   z  run a with every KV cache zeroed after vLLM's warm-up (SPARKSEAL_ZERO_KV_AFTER_WARMUP=1)
#   y  run f likewise
#   c  run a with the hyper-connection check (SPARKSEAL_MHC_CHECK=1): every fused mHC step of the warm-up and
#      of the first real steps against a float32 reference, and the first real steps' attention metadata
#   u  run c with the probe's runtime fix (SPARKSEAL_MHC_UNFUSED_SMALL=1): the separate mHC kernels where
#      vLLM's small-batch fused kernel does not cover the hidden size (the test model's 512)
#   p  run c with patches/vllm/0004-*.patch (the mHC coverage fix) in the staged vLLM: a wheel built with the
#      series has it; an older staged wheel gets it applied for this run only (restored after it)
#   q  run p on vLLM's FlashMLA class (the control of 0004)
#   w  run c with a test model of hidden size 2048 (V4_HIDDEN=2048), which the fused mHC kernel covers,
#      and vLLM unpatched: if it serves, the failure is the 512 test model's, not V4 + DSpark's
#   m  (only where run p, if it ran first, passed) the served matrix with 0004: h200.sh serve-dsv4-dspark
#      (CUDA graphs, seeded non-flat weights, the sampler's NaN count): FlashMLA's non-speculative reference,
#      then target and draft on our class at 1 and 8 clients, each lossless against it
#   n  the same reference, then our class without speculation (h200.sh serve-dsv4, 8 clients): does our
#      class alone match vLLM's on the seeded model?
#   o  the same reference, then target and draft on vLLM's FlashMLA class (serve-dsv4-dspark
#      FLASHMLA_SPARSE_DSV4): is vLLM's own class lossless under DSpark on the seeded model?
#   (m, n and o share one folder, RESULTS/matrix, so the reference is recorded once.)
# RUNs default to "a z f y"; the mHC runs of section 6b: "c w p q"; the next runs of section 7: "n o m w q". Each run's reports and server log land in RESULTS/NAME/serve-dsv4, its console in
# RESULTS/NAME.log; then the warm-up's compile caches go to RESULTS/caches (bench/live/device.sh caches).
# CACHES=DIR first restores the caches a previous machine saved (bench/live/device.sh restore DIR).
set -uo pipefail

results=${1:?usage: $0 RESULTS}
mkdir -p "$results"
soak=${SOAK:-3}
logged() { # NAME COMMAND...: COMMAND into RESULTS/NAME.log, its exit status into RESULTS/NAME.rc
    local name=$1 t0=$SECONDS
    shift
    "$@" >"$results/$name.log" 2>&1
    echo $? >"$results/$name.rc"
    echo "== $name: exit $(cat "$results/$name.rc") after $((SECONDS - t0)) s"
}
run() { # NAME BACKEND SEED
    local name=$1 backend=$2 seed=$3
    echo "== $name ($backend, seed $seed) $(date +%T)"
    logged "$name" bench/vllm_backend/h200.sh nan-dsv4-dspark "$results/$name" 1 "$backend" "$seed" "$soak"
    # A summary for the console: a run whose log has none of these lines has said why above.
    grep -h "healthy after\|live-check exit\|not healthy\|exited with status" "$results/$name.log" || true
    local logs=("$results/$name"/serve-dsv4/*.server.log)
    if [ -e "${logs[0]}" ]; then
        python3 bench/vllm_backend/probe_report.py "${logs[@]}" >"$results/$name.probe.txt" 2>&1
        # The lines that decide: groups, the last context positions, changes, NaN rows.
        grep -m 60 "null-block\|engine-ready\|zeroed\|CHANGED\|NaN rows \[[0-9]\|TARGET\|combine\|error" \
            "$results/$name.probe.txt" |
            cut -c1-400
        # The mHC check (runs c, u, p, q): the tallies, the first real steps' bad steps and their metadata.
        grep -m 30 "mhc tally\|mhc-unfused\|MHC real\|metadata forward" "$results/$name.probe.txt" | cut -c1-400
    fi
}
kernel_blocks() {
    # Run k only where run a's probe saw a draft group whose block size is not its kernel block size.
    local mismatch
    mismatch=$(python3 - "$results"/a/serve-dsv4/*.server.log <<'PY'
import json, sys
for path in sys.argv[1:]:
    for line in open(path, errors="replace"):
        if '[dspark-probe] {"kind": "groups"' in line:
            doc = json.loads(line.split("[dspark-probe] ", 1)[1])
            draft = set(doc["draft_group_ids"])
            print(sum(1 for g in doc["groups"] if g["gid"] in draft and g["block_size"] != g["kernel_block_size"]))
            raise SystemExit
print("unknown")
PY
    )
    echo "== draft groups whose block size is not the kernel's: $mismatch"
    if [ "$mismatch" != 0 ]; then SPARKSEAL_DSPARK_KERNEL_BLOCKS=1 run k CUSTOM 0; fi
}
fix=patches/vllm/0004-deepseek-v4-mhc-small-batch-fused-kernel-coverage.patch
matrix() { # NAME PHASE BACKEND: an h200.sh phase on the seeded model with CUDA graphs, in RESULTS/matrix
    local name=$1 phase=$2 backend=$3
    echo "== $name ($phase $backend, seeded weights, CUDA graphs) $(date +%T)"
    V4_SERVE_ARGS="--site $PWD/bench/vllm_backend/hooks --env SPARKSEAL_SEEDED_WEIGHTS=1 --env SPARKSEAL_SAMPLER_NAN=1" \
        logged "$name" bench/vllm_backend/h200.sh "$phase" "$results/matrix" 0 "$backend"
    grep -h "healthy after\|live-check exit\|not healthy\|exited with status\|ok$\|FINDINGS\|speculation\|lossless\|prefix-cache\|sampler-nan\|announced" \
        "$results/$name.log" | cut -c1-400 | head -60
}
with_fix() { # FUNCTION NAME ...: FUNCTION NAME ... with 0004 in the staged vLLM (applied for the run if absent)
    local site files=() f fn=$1
    shift
    site=$(PYTHONPATH=/tmp/sparkseal-stage/ours:/tmp/sparkseal-stage/deps "${PYTHON:-python3}" -c \
        'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("vllm").origin).parent.parent)') ||
        { echo "== $1: the staged vLLM was not found"; return; }
    mapfile -t files < <(sed -n 's|^+++ b/||p' "$fix")
    if grep -q _FUSED_POST_PRE_THREADS "$site/${files[0]}"; then
        echo "== $1: $fix is in the staged vLLM"
        "$fn" "$@"
        return
    fi
    for f in "${files[@]}"; do cp -p "$site/$f" "$site/$f.orig"; done
    # The strict applier of the working tree's sparkseal (exact context, or nothing is written).
    if "${PYTHON:-python3}" -c 'import pathlib, sys
from sparkseal.core.patchset import apply_patch
print(apply_patch(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))' "$site" "$fix"; then
        echo "== $1: $fix applied to $site for this run"
        "$fn" "$@"
    else
        echo "== $1: $fix does not apply to $site; not run"
    fi
    for f in "${files[@]}"; do mv "$site/$f.orig" "$site/$f"; done
}
if [ -n "${CACHES:-}" ]; then bench/live/device.sh restore "$CACHES"; fi
shift
runs=${*:-a z f y}
first=${FIRST_START_DEADLINE:-900}
export START_DEADLINE=${START_DEADLINE:-600}
for name in $runs; do
    case $name in
    a) START_DEADLINE=$first run a CUSTOM 0 ;;
    k) kernel_blocks ;;
    s) START_DEADLINE=$first run s CUSTOM 1 ;;
    f) START_DEADLINE=$first run f FLASHMLA_SPARSE_DSV4 0 ;;
    g) EAGER=0 START_DEADLINE=$first run g FLASHMLA_SPARSE_DSV4 0 ;;
    z) SPARKSEAL_ZERO_KV_AFTER_WARMUP=1 START_DEADLINE=$first run z CUSTOM 0 ;;
    y) SPARKSEAL_ZERO_KV_AFTER_WARMUP=1 START_DEADLINE=$first run y FLASHMLA_SPARSE_DSV4 0 ;;
    c) SPARKSEAL_MHC_CHECK=1 START_DEADLINE=$first run c CUSTOM 0 ;;
    u) SPARKSEAL_MHC_CHECK=1 SPARKSEAL_MHC_UNFUSED_SMALL=1 START_DEADLINE=$first run u CUSTOM 0 ;;
    p) SPARKSEAL_MHC_CHECK=1 START_DEADLINE=$first with_fix run p CUSTOM 0 ;;
    q) SPARKSEAL_MHC_CHECK=1 START_DEADLINE=$first with_fix run q FLASHMLA_SPARSE_DSV4 0 ;;
    m)
        # The matrix only where run p (the same patch, one client) served, when it ran before.
        if [ -f "$results/p.rc" ] && [ "$(cat "$results/p.rc")" != 0 ]; then
            echo "== m: not run (run p failed)"
        else
            with_fix matrix m serve-dsv4-dspark CUSTOM
        fi
        ;;
    n) with_fix matrix n serve-dsv4 0 ;;
    o) with_fix matrix o serve-dsv4-dspark FLASHMLA_SPARSE_DSV4 ;;
    w) V4_HIDDEN=2048 SPARKSEAL_MHC_CHECK=1 START_DEADLINE=$first run w CUSTOM 0 ;;
    *) echo "v4_probe_runs: unknown run $name" >&2 ;;
    esac
    # Only the machine's first server compiles the warm-up's kernels.
    first=$START_DEADLINE
done
bench/live/device.sh caches "$results/caches"
