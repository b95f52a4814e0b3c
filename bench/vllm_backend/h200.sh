#!/usr/bin/env bash
# The runs of bench/results/vllm_backend.md on an H200 machine with no network (repository root there),
# after bench/live/h200.sh receive/install staged our vLLM wheel, the sparkseal wheel and the locked
# dependencies into /tmp/sparkseal-stage. The repository's sparkseal/ (the backend under test) replaces the
# staged wheel's Python files; the kernel library is the one the staged sparkseal wheel ships.
#   bench/vllm_backend/h200.sh compare OUT   per-layer agreement with FLASHMLA_SPARSE (4 engines)
#   bench/vllm_backend/h200.sh gpu-test OUT [TEST ...]  pytest -m gpu: tests/gpu/test_vllm_backend_gpu.py,
#                                            test_vllm_dsv4_gpu.py, test_sparse_mla_gpu.py, test_sparse_mla_sanitizers.py
#                                            (compute-sanitizer and nvcc on PATH or in /usr/local/cuda/bin), or TESTs
#   bench/vllm_backend/h200.sh dsv4 OUT      DeepSeek V4 decode through our class against FlashMLA's class
#                                            (bench/vllm_backend/dsv4_decode.py), at the device limit and capped
#   bench/vllm_backend/h200.sh serve-dsv4 OUT [CAP]  a tiny DeepSeek V4 (model_dsv4.py) served through our V4 class,
#                                            with live-check; needs CuTe DSL and TileLang (stage.py plan --deepseek-v4)
#   bench/vllm_backend/h200.sh serve-dsv4-dspark OUT [CAP [BACKEND [DRAFT_BACKEND]]]  the same target with its
#                                            DSpark draft (model_dsv4.py --dspark), the target through our V4 class
#                                            (BACKEND CUSTOM, refused unless SPARKSEAL_SPARSE_MLA_V4_SPECULATIVE=1,
#                                            which this phase sets) or vLLM's (FLASHMLA_SPARSE_DSV4), the draft
#                                            through DRAFT_BACKEND (default BACKEND), live-check --speculation
#                                            required against FlashMLA's reference
#   bench/vllm_backend/h200.sh serve OUT     FLASHMLA_SPARSE records a reference; our backend serves with
#                                            CUDA graphs, then capped at GB10's 101376 B of shared memory,
#                                            and sparkseal live-check compares both with the reference
set -euo pipefail

root=/tmp/sparkseal-stage
python=${PYTHON:-python3}
repo=$(pwd)
export SPARKSEAL_KERNELS_LIB=$root/ours/sparkseal/_lib/libsparkseal_kernels.so
export PYTHONPATH=$root/ours:$root/deps
# The working tree's sparkseal package replaces the staged wheel's Python files, and the wheel's RECORD
# is rewritten to match: the plugin's module check compares the files with it at start-up.
"$python" - "$repo/sparkseal" "$root/ours" <<'PY'
import base64, csv, hashlib, io, pathlib, shutil, sys
source, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for path in source.rglob("*.py"):
    target = site / "sparkseal" / path.relative_to(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
(dist,) = site.glob("sparkseal-*.dist-info")
rows = [r for r in csv.reader(io.StringIO((dist / "RECORD").read_text())) if not r[0].startswith("sparkseal/")]
for path in sorted((site / "sparkseal").rglob("*")):
    if path.is_file() and "__pycache__" not in path.parts:
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append([str(path.relative_to(site)), f"sha256={digest}", str(len(data))])
out = io.StringIO()
csv.writer(out, lineterminator="\n").writerows(rows)
(dist / "RECORD").write_text(out.getvalue())
PY
export VLLM_USE_FLASHINFER_SAMPLER=0
# A failed server, check or report fails the phase, after the phase's other runs: each phase ends with
# `exit $status`, and its runs set status=1 (serve.py says what failed).
status=0
# Lines of server logs matching PATTERN: for a reader's eye. No matching line is no failure (grep's exit 1);
# a missing log is (exit 2): no server wrote it.
log_lines() { # PATTERN LOG...
    grep -h "$1" "${@:2}" || [ $? = 1 ]
}
models=/tmp/sparkseal-dsv32
out=$2
mkdir -p "$out"
for heads in 16 128; do
    topk=512
    [ "$heads" = 128 ] && topk=2048
    [ -f "$models/h$heads/target/config.json" ] ||
        "$python" bench/vllm_backend/model.py --out "$models/h$heads" --heads "$heads" --topk "$topk" >/dev/null
done

# DeepSeek V4 (serve-dsv4, serve-dsv4-dspark): the tiny target and its DSpark draft, the sites (V4 needs CuTe
# DSL and TileLang: `stage.py plan --deepseek-v4` stages them into deps, or they are installed into
# $root/extra), and FlashMLA's V4 class's non-speculative reference that both phases check against.
# V4_SERVE_ARGS adds serve.py arguments to every V4 server (e.g. --vllm-arg=--enforce-eager); V4_HIDDEN sets
# the test model's hidden size (model_dsv4.py --hidden, default 512).
v4=/tmp/sparkseal-dsv4/h16
v4_out=$out/serve-dsv4
v4_ref=$v4_out/flashmla-reference.json
v4_long=(--long-prompt-tokens 2048 --vocab 100:1000)
dsv4_setup() {
    # Rewritten each time: the target's configuration does not change with --dspark, so a recorded
    # reference stays valid.
    "$python" bench/vllm_backend/model_dsv4.py --out "$v4" --heads 16 --hidden "${V4_HIDDEN:-512}" --dspark >/dev/null
    sites=(--site "$root/ours" --site "$root/deps")
    [ -d "$root/extra" ] && sites+=(--site "$root/extra")
    # TileLang's libcudart stub, once loaded, is what FlashInfer's find_loaded_library("libcudart") finds
    # ("undefined symbol: cudaDeviceReset" in vLLM's kernel warm-up): point it at the real library.
    local cudart stub
    cudart=$("$python" -c 'import glob, nvidia; print(sorted(f for p in nvidia.__path__ for f in glob.glob(p + "/cu*/lib/libcudart.so.*"))[0])')
    for stub in "$root"/deps/tilelang/lib/libcudart_stub.so "$root"/extra/tilelang/lib/libcudart_stub.so; do
        if [ -f "$stub" ] && [ ! -L "$stub" ]; then
            mv "$stub" "$stub.orig"
            ln -s "$cudart" "$stub"
        fi
    done
}
serve_v4() {
    local extra=()
    read -r -a extra <<<"${V4_SERVE_ARGS:-}"
    "$python" bench/live/serve.py --model-dir "$v4" "${sites[@]}" --max-num-seqs 8 --out "$v4_out" \
        --vllm-arg=--kv-cache-dtype --vllm-arg=fp8 --start-deadline "${START_DEADLINE:-420}" "$@" \
        ${extra[@]+"${extra[@]}"} || status=1
}
dsv4_reference() {
    # FlashMLA's V4 class records the reference once (vLLM's JIT compilations happen in this first server).
    [ -f "$v4_ref" ] || serve_v4 --name dsv4-flashmla --vllm-arg=--attention-backend --vllm-arg=FLASHMLA_SPARSE_DSV4 \
        --check "dsv4-flashmla:--record $v4_ref ${v4_long[*]}"
}

case $1 in
compare)
    for heads in 16 128; do
        for kv in fp8_ds_mla auto; do
            name=compare-h$heads-$kv
            echo "== $name"
            "$python" bench/vllm_backend/compare.py --model "$models/h$heads/target" --kv-cache-dtype "$kv" \
                --out "$out/$name.json" >"$out/$name.log" 2>&1 || status=1
            tail -n 32 "$out/$name.log"
        done
    done
    exit $status
    ;;
serve)
    heads=${3:-16}
    kv=${4:-fp8_ds_mla}
    results=$out/serve-h$heads-$kv
    ref=$results/reference.json
    long=(--long-prompt-tokens 2048 --vocab 100:1000)
    serve() {
        "$python" bench/live/serve.py --model-dir "$models/h$heads" --site "$root/ours" \
            --site "$root/deps" --max-num-seqs 8 --out "$results" \
            --vllm-arg=--kv-cache-dtype --vllm-arg="$kv" --vllm-arg=--block-size --vllm-arg=64 "$@" || status=1
    }
    serve --name flashmla --vllm-arg=--attention-backend --vllm-arg=FLASHMLA_SPARSE \
        --check "flashmla-serial:--record $ref ${long[*]}"
    serve --name ours --vllm-arg=--attention-backend --vllm-arg=CUSTOM \
        --check "ours-serial:--against $ref ${long[*]}" \
        --check "ours-conc8:--concurrency 8 --against $ref ${long[*]}"
    serve --name ours-gb10-smem --vllm-arg=--attention-backend --vllm-arg=CUSTOM \
        --env SPARKSEAL_SPARSE_MLA_MAX_SMEM=101376 \
        --check "ours-gb10-smem-conc8:--concurrency 8 --against $ref ${long[*]}"
    log_lines "Using .* backend\|CUSTOM\|sparkseal" "$results"/*.server.log | sort | uniq -c | sed -n 1,20p
    exit $status
    ;;
gpu-test)
    # The GPU tests of the backend and the kernel, with this staged vLLM (or the test files named after OUT).
    shift 2
    tests=("$@")
    [ ${#tests[@]} -gt 0 ] || tests=(tests/gpu/test_vllm_backend_gpu.py tests/gpu/test_vllm_dsv4_gpu.py
        tests/gpu/test_sparse_mla_gpu.py tests/gpu/test_sparse_mla_sanitizers.py)
    "$python" -m pytest -m gpu -q -p no:cacheprovider "${tests[@]}" 2>&1 | tee "$out/gpu-test.log" | tail -n 15
    ;;
serve-dsv4)
    # A tiny DeepSeek V4 (bench/vllm_backend/model_dsv4.py) served through our V4 class; $3 caps the
    # kernel's shared memory (0: the device's limit). Ours is compared with FlashMLA's reference (near-ties
    # within live-check's tie margin are counted).
    cap=${3:-0}
    dsv4_setup
    dsv4_reference
    serve_v4 --name "dsv4-ours-smem$cap" --vllm-arg=--attention-backend --vllm-arg=CUSTOM \
        --env SPARKSEAL_SPARSE_MLA_MAX_SMEM="$cap" \
        --check "dsv4-ours-smem$cap:--concurrency 8 --against $v4_ref ${v4_long[*]}"
    log_lines "Sparkseal\|sparkseal\|CUSTOM\|Error\|error" "$v4_out"/*.server.log | sort | uniq -c | sed -n 1,30p
    exit $status
    ;;
nan-dsv4-dspark)
    # Where a NaN starts (bench/results/vllm_backend.md 5): target and draft through BACKEND (default CUSTOM),
    # eager (the checks synchronise), CONCURRENCY clients (default 1), SOAK requests (default 120); our V4
    # class's debug switch (sparkseal/vllm_integration/vllm_dsv4_debug.py), the sampler's NaN count and the
    # DSpark context-record probe (bench/vllm_backend/hooks) on; SEED > 0 seeds the weights (hooks), 0 keeps
    # vLLM's dummy weights.
    conc=${3:-1}
    backend=${4:-CUSTOM}
    seed=${5:-0}
    soak=${6:-120}
    dsv4_setup
    sites=(--site "$repo/bench/vllm_backend/hooks" "${sites[@]}")
    name=nan-dsv4-dspark-$backend-c$conc-seed$seed
    env=(--env SPARKSEAL_SPARSE_MLA_V4_SPECULATIVE=1 --env SPARKSEAL_SAMPLER_NAN=1 --env SPARKSEAL_DSPARK_PROBE=1
        --env "SPARKSEAL_SPARSE_MLA_V4_DEBUG=$v4_out/$name-dumps")
    [ "$seed" = 0 ] || env+=(--env "SPARKSEAL_SEEDED_WEIGHTS=$seed")
    # EAGER=0 keeps vLLM's CUDA graphs (the probe then sees the eager parts of each step only).
    eager=()
    [ "${EAGER:-1}" = 0 ] || eager=(--vllm-arg=--enforce-eager)
    [ "${EAGER:-1}" = 0 ] && name=$name-graphs
    serve_v4 --name "$name" --dspark --draft-attention-backend "$backend" --vllm-arg=--attention-backend \
        --vllm-arg="$backend" ${eager[@]+"${eager[@]}"} "${env[@]}" \
        --check "$name:--speculation required --concurrency $conc --soak $soak ${v4_long[*]}"
    log_lines "sparkseal debug\|sampler-nan\|seeded-weights\|Error\|error" "$v4_out/$name.server.log" | sed -n 1,60p
    dumps=("$v4_out/$name-dumps"/*.pt)
    if [ -e "${dumps[0]}" ]; then
        "$python" bench/vllm_backend/replay_nan.py "${dumps[@]}" 2>&1 | tail -80 || status=1
    fi
    "$python" - "$v4_out/$name.json" <<'PY' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
for step in report["steps"]:
    print(step["name"], step.get("ok"), json.dumps(step.get("details", step))[:400])
PY
    exit $status
    ;;
serve-dsv4-dspark)
    # The same target with its DSpark draft (model_dsv4.py --dspark: V4 decoder layers after the target's).
    # vLLM builds the draft under the speculative config's attention_backend, not --attention-backend
    # (vllm/v1/worker/gpu/spec_decode/dspark/utils.py), so both name the backend. Speculative decoding is
    # lossless under greedy sampling: checked against FlashMLA's non-speculative reference, with
    # --speculation required (drafted tokens counted from /metrics; the dummy draft's acceptance is not
    # judged). $4 FLASHMLA_SPARSE_DSV4 serves the pair on vLLM's own class instead (a control); $5 puts the
    # draft on another class than the target. Our class refuses a target under speculative decoding (an
    # H200 run died at the first verification step, bench/results/vllm_backend.md 4c): this phase sets the
    # override, to reproduce that. The DSpark replay probe counts the draft's writes over both checks and
    # the second reads it (live-check --dspark-replay: patch 0001's rows on V4's draft groups).
    cap=${3:-0}
    backend=${4:-CUSTOM}
    draft_backend=${5:-$backend}
    dsv4_setup
    dsv4_reference
    name=dsv4-dspark-ours-smem$cap
    [ "$backend" = CUSTOM ] || name=dsv4-dspark-$backend
    [ "$draft_backend" = "$backend" ] || name=$name-draft-$draft_backend
    serve_v4 --name "$name" --dspark --draft-attention-backend "$draft_backend" \
        --vllm-arg=--attention-backend --vllm-arg="$backend" --env SPARKSEAL_SPARSE_MLA_MAX_SMEM="$cap" \
        --env SPARKSEAL_SPARSE_MLA_V4_SPECULATIVE=1 --env SPARKSEAL_DSPARK_REPLAY=1 --env VLLM_SERVER_DEV_MODE=1 \
        --check "$name-c1:--speculation required --against $v4_ref ${v4_long[*]}" \
        --check "$name-c8:--speculation required --concurrency 8 --against $v4_ref ${v4_long[*]} --dspark-replay"
    log=$v4_out/$name.server.log
    log_lines "Sparkseal\|sparkseal\|CUSTOM\|DSpark\|Error\|error" "$log" | sort | uniq -c | sed -n 1,30p
    # Our class announces itself once for the target's layers and once more for the draft's; each must,
    # where that side was given CUSTOM.
    announced() {
        if grep -qF "DeepSeek V4 decode runs the sparkseal $1" "$log"; then
            echo "our V4 class: '$1' announced"
        elif [ "$2" = CUSTOM ]; then
            echo "our V4 class: '$1' NOT announced" >&2
            status=1
        fi
    }
    announced "kernel (" "$backend"
    announced "kernel in the speculative draft (" "$draft_backend"
    for check in c1 c8; do
        "$python" - "$v4_out/$name-$check.json" <<'PY' || status=1
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as error:
    sys.exit(f"{sys.argv[1]}: unreadable: {error}")
steps = {step["name"]: step for step in report["steps"]}
print(sys.argv[1].rsplit("/", 1)[-1], "ok" if report["ok"] else "FINDINGS")
for name in ("speculation", "lossless", "prefix-cache"):
    print("  ", name, steps.get(name, {}).get("figures"))
for finding in report["findings"]:
    print("  ", finding["message"][:300])
sys.exit(0 if report["ok"] else 1)
PY
    done
    exit $status
    ;;
dsv4)
    for cap in 0 101376; do
        echo "== max_smem $cap"
        "$python" bench/vllm_backend/dsv4_decode.py --max-smem "$cap" --out "$out/dsv4-smem$cap.json"
    done
    ;;
*)
    echo "usage: $0 compare|serve|gpu-test|dsv4|serve-dsv4|serve-dsv4-dspark OUT" >&2
    exit 2
    ;;
esac
