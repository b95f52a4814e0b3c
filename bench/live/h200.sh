#!/usr/bin/env bash
# The live runs of bench/results/live_h200.md, on an H200 machine with no network (run from the repository
# root there). Phases, each one command:
#   bench/live/h200.sh receive .stage/NAME-NN ...   keep arriving parts (sha256-checked)
#   bench/live/h200.sh install                      reassemble, check, install deps / our vLLM / upstream vLLM
#   bench/live/h200.sh train [DIR]                  train the tiny target and its DSpark draft (train_dspark.py)
#   bench/live/h200.sh run OUT [--weights | --trained] [PHASE ...]
#       serve the test model and run live-check (phases: plain ours upstream, default all; plain records the
#       reference the others compare with; tp2, on two GPUs: ours with --tensor-parallel-size 2, the
#       module check and the NCCL sequences of both ranks), results in OUT/live-results.tar.gz. --weights serves seeded
#       safetensors weights instead of vLLM's dummy weights (see bench/live/test_model.py), and uses vLLM's
#       own sampler instead of FlashInfer's, whose kernels a fresh machine would first JIT-compile for ~2 min.
#       replay: tests/gpu/test_dspark_replay_gpu.py on our wheel (must pass) and the unpatched one (must fail);
#       reference[-ours|-upstream]: live-check --profile reference --dspark-replay against both wheels serving the
#       seeded model at a 1,048,576-token context (our wheel must pass, the unpatched one fail in dspark-replay).
#       --trained serves the trained pair (DSPARK_MODEL, default /tmp/sparkseal-dspark; trained first if absent)
#       on held-out prompts at 32 sequences: plain records the reference and decodes at 1, 8 and 32 clients;
#       ours and upstream run the same with DSpark and the acceptance floors (FLOOR_ACCEPTANCE,
#       FLOOR_ACCEPTED), then once more at one client with the per-request floor (FLOOR_REQUEST), whose
#       /metrics reads between requests would slow the wall-clock figure; agree runs the GPU test that holds
#       vLLM's drafts to the training forward's (tests/gpu/test_dspark_draft_gpu.py); profile times a decode
#       step's phases, plain and with DSpark (bench/live/profile_step.py).
set -euo pipefail

root=/tmp/sparkseal-stage
python=${PYTHON:-python3}
stage() { "$python" bench/live/stage.py "$@"; }

case "${1:-}" in
receive)
    shift
    stage receive "$@"
    ;;
install)
    # Parts arrive as one pack (all) or two (deps, vllm); our vLLM, sparkseal and the delta go to
    # vllm-wheels/ ($root/vllm holds the received parts of the vllm pack).
    rm -rf "$root/in" "$root/wheels" "$root/vllm-wheels"
    for name in deps vllm all; do
        if [ -f "$root/$name/manifest.json" ]; then stage unpack "$name" --dest "$root/in"; fi
    done
    mkdir -p "$root/wheels" "$root/vllm-wheels"
    mv "$root"/in/vllm-*.whl "$root"/in/sparkseal-*.whl "$root/vllm-wheels/"
    # Files carried beside the packs (.stage/extra: a newer sparkseal wheel, the upstream delta) win.
    if compgen -G ".stage/extra/*" >/dev/null; then
        if compgen -G ".stage/extra/sparkseal-*.whl" >/dev/null; then rm -f "$root"/vllm-wheels/sparkseal-*.whl; fi
        cp .stage/extra/* "$root/vllm-wheels/"
    fi
    # The upstream delta travels only for the runs that compare with the unpatched wheel.
    if compgen -G "$root/in/*.delta" >/dev/null; then mv "$root"/in/*.delta "$root/vllm-wheels/"; fi
    upstream=
    if compgen -G "$root/vllm-wheels/*.delta" >/dev/null; then upstream=" and upstream"; fi
    mv "$root"/in/*.whl "$root/wheels/"
    ours=$(ls "$root"/vllm-wheels/vllm-*.whl)
    pip=("$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
    rm -rf "$root/deps" "$root/ours" "$root/upstream-site"
    "${pip[@]}" --target "$root/deps" "$root"/wheels/*.whl
    "${pip[@]}" --target "$root/ours" "$ours" "$root"/vllm-wheels/sparkseal-*.whl
    grep -c "sample_idx_mapping = torch.full" "$root/ours/vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
    if [ -n "$upstream" ]; then
        mkdir -p "$root/upstream"
        stage delta apply --base "$ours" --delta "$root"/vllm-wheels/vllm-*-upstream.delta \
            --out "$root/upstream/$(basename "$ours")"
        "${pip[@]}" --target "$root/upstream-site" "$root"/upstream/vllm-*.whl "$root"/vllm-wheels/sparkseal-*.whl
        if grep -q "sample_idx_mapping = torch.full" "$root/upstream-site/vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"; then
            echo "install: the upstream tree carries the fix: wrong wheel" >&2
            exit 1
        fi
    fi
    echo "install: deps $(find "$root/wheels" -name "*.whl" | wc -l) wheels; ours$upstream vLLM installed"
    ;;
train)
    "$python" bench/live/train_dspark.py --out "${2:-/tmp/sparkseal-dspark}"
    ;;
run)
    out=$2
    shift 2
    model=/tmp/sparkseal-model
    results=/tmp/sparkseal-live
    format=dummy
    trained=
    if [ "${1:-}" = --trained ]; then
        shift
        trained=1
        model=${DSPARK_MODEL:-/tmp/sparkseal-dspark}
        results=/tmp/sparkseal-live-trained
        format=safetensors
        export VLLM_USE_FLASHINFER_SAMPLER=0
        [ -f "$model/manifest.json" ] || "$python" bench/live/train_dspark.py --out "$model"
    elif [ "${1:-}" = --weights ]; then
        shift
        model=/tmp/sparkseal-model-weights
        results=/tmp/sparkseal-live-weights
        format=safetensors
        export VLLM_USE_FLASHINFER_SAMPLER=0
        [ -f "$model/draft/model.safetensors" ] || "$python" bench/live/test_model.py --out "$model" --weights
    else
        "$python" bench/live/test_model.py --out "$model"
    fi
    phases=${*:-plain ours upstream}
    if [ -n "$trained" ]; then phases=${*:-agree plain ours upstream}; fi
    mkdir -p "$results" "$out"
    # A server that fails (it never came up, or a check failed) fails the run, after the other phases ran
    # and the results were packed: each is named at the end.
    failed=()
    serve() {
        "$python" bench/live/serve.py --model-dir "$model" --load-format "$format" --out "$results" "$@" ||
            failed+=("$2")
    }
    # The site a wheel's server runs from: ours, or the unpatched upstream wheel's.
    site_of() {
        if [ "$1" = upstream ]; then echo "$root/upstream-site"; else echo "$root/ours"; fi
    }
    # A live-check report against what was expected of it (pass; kind=K: a finding of kind K; only=STEP:
    # findings, all of step STEP), with a line for the reader; a report that does not meet it fails the run.
    judge() {
        "$python" - "$results/$1.json" "$2" <<'PY' || failed+=("$1 (expected $2)")
import json, sys
path, expect = sys.argv[1], sys.argv[2]
report = json.load(open(path))
found = [(f["check"], f["kind"]) for f in report["findings"]]
print(path.rsplit("/", 1)[-1], "pass" if report["ok"] else found,
      {s["name"]: s.get("figures") for s in report["steps"] if s["name"] in ("draft-fit", "speculation", "soak")})
if expect == "pass":
    met = report["ok"]
elif expect.startswith("kind="):
    met = any(kind == expect[5:] for _, kind in found)
else:
    met = bool(found) and all(check == expect.removeprefix("only=") for check, _ in found)
sys.exit(0 if met else 1)
PY
    }
    ref=$results/reference.json
    long=(--long-prompt-tokens 2048 --vocab 100:1000)
    held=(--prompts "$model/prompts.json" --soak "${SOAK:-64}" --max-tokens "${MAX_TOKENS:-128}")
    floors=(--min-acceptance "${FLOOR_ACCEPTANCE:-0.5}" --min-accepted-length "${FLOOR_ACCEPTED:-2.5}")
    # The trained draft's block size holds the server's speculative-token count (refused before any request).
    [ -z "$trained" ] || floors+=(--draft-config "$model/draft/config.json")
    # FLOOR_POSITIONS=R0,R1,...: per-position acceptance floors (live-check --min-position-acceptance).
    [ -z "${FLOOR_POSITIONS:-}" ] || floors+=(--min-position-acceptance "$FLOOR_POSITIONS")
    for phase in $phases; do
        if [ -n "$trained" ]; then
            case $phase in
            agree)
                # A failed or missing test fails the run: the phases after it compare against it.
                if ! SPARKSEAL_DSPARK_MODEL=$model PYTHONPATH="$root/ours:$root/deps:$PWD" \
                    "$python" -m pytest -m gpu tests/gpu/test_dspark_draft_gpu.py -q -s -p no:cacheprovider \
                    >"$results/agree.log" 2>&1; then
                    tail -20 "$results/agree.log"
                    echo "run --trained: agree failed (see $results/agree.log)" >&2
                    exit 1
                fi
                tail -5 "$results/agree.log"
                ;;
            plain)
                serve --name plain-seqs32 --site "$root/ours" --site "$root/deps" --max-num-seqs 32 \
                    --check "plain-record:--record $ref ${held[*]} ${long[*]}" \
                    --check "plain-c1:--against $ref ${long[*]}" \
                    --check "plain-c8:--concurrency 8 --against $ref ${long[*]}" \
                    --check "plain-c32:--concurrency 32 --against $ref ${long[*]}"
                ;;
            profile)
                # Where a decode step's time goes, plain and with DSpark (bench/live/profile_step.py).
                for mode in plain dspark; do
                    PYTHONPATH="$root/ours:$root/deps:$PWD" "$python" bench/live/profile_step.py --model-dir "$model" \
                        --mode "$mode" --out "$results/profile-$mode.json" >"$results/profile-$mode.log" 2>&1 ||
                        failed+=("profile-$mode")
                    tail -1 "$results/profile-$mode.log"
                done
                ;;
            ours | upstream)
                site=$(site_of "$phase")
                serve --name "$phase-dspark-seqs32" --site "$site" --site "$root/deps" --dspark --max-num-seqs 32 \
                    --check "$phase-c1:--speculation required --against $ref ${long[*]} ${floors[*]}" \
                    --check "$phase-requests:--speculation required --against $ref ${long[*]} ${floors[*]} --min-request-accepted-length ${FLOOR_REQUEST:-1.0}" \
                    --check "$phase-c8:--speculation required --concurrency 8 --against $ref ${long[*]} ${floors[*]}" \
                    --check "$phase-c32:--speculation required --concurrency 32 --against $ref ${long[*]} ${floors[*]}"
                ;;
            *)
                echo "run --trained: unknown phase $phase" >&2
                exit 2
                ;;
            esac
            continue
        fi
        case $phase in
        plain)
            serve --name plain-seqs8 --site "$root/ours" --site "$root/deps" --max-num-seqs 8 \
                --check "plain-serial:--record $ref ${long[*]}" \
                --check "plain-conc8:--concurrency 8 --against $ref ${long[*]}"
            ;;
        ours | upstream)
            site=$(site_of "$phase")
            serve --name "$phase-dspark-seqs1" --site "$site" --site "$root/deps" --dspark --max-num-seqs 1 \
                --check "$phase-dspark-seqs1:--speculation required --against $ref ${long[*]}"
            serve --name "$phase-dspark-seqs8" --site "$site" --site "$root/deps" --dspark --max-num-seqs 8 \
                --check "$phase-dspark-conc8:--speculation required --concurrency 8 --against $ref ${long[*]}"
            ;;
        replay)
            # Patch 0001's check, both ways: tests/gpu/test_dspark_replay_gpu.py passes on our wheel and must
            # fail, naming what the draft step wrote where, on the unpatched upstream wheel.
            for wheel in ours upstream; do
                rc=0
                PYTHONPATH="$(site_of "$wheel"):$root/deps:$PWD" "$python" -m pytest -m gpu tests/gpu/test_dspark_replay_gpu.py \
                    -q -s -p no:cacheprovider >"$results/replay-$wheel.log" 2>&1 || rc=$?
                echo "replay-$wheel: pytest exit $rc"
                telling="dspark replay probe|AssertionError|draft K/V|padded sample rows|null block"
                # The log's telling lines, for a reader's eye: none matching is no failure (grep's exit 1).
                grep -E "$telling" "$results/replay-$wheel.log" | cut -c1-400 | head -8 || true
                if [ "$wheel" = ours ] && [ "$rc" != 0 ]; then failed+=("replay-ours"); fi
                if [ "$wheel" = upstream ] && { [ "$rc" = 0 ] || ! grep -q "draft K/V\|padded sample rows" \
                    "$results/replay-$wheel.log"; }; then failed+=("replay-upstream (expected to fail by name)"); fi
            done
            ;;
        fit)
            # live-check's acceptance reading on a real server (issue 49): the per-position curve from vLLM's
            # counters, a draft whose block fits, one that does not (refused before any request), and a soak
            # that stops at the end of its text.
            misfit=$results/misfit-draft-config.json
            "$python" -c 'import json,sys; c=json.load(open(sys.argv[1])); c["block_size"]=7; json.dump(c, open(sys.argv[2], "w"))' \
                "$model/draft/config.json" "$misfit"
            fit_args="--speculation required --soak 16 --max-tokens 32 --long-prompt-tokens 256 ${long[*]:2}"
            "$python" bench/live/serve.py --model-dir "$model" --load-format "$format" --out "$results" \
                --name fit-dspark --site "$root/ours" --site "$root/deps" --dspark --max-num-seqs 8 \
                --check "fit:--draft-config $model/draft/config.json --min-position-acceptance 0,0,0,0,0 $fit_args" \
                --check "fit-eos:--stop-at-eos $fit_args" \
                --check "misfit:--draft-config $misfit $fit_args" || true  # misfit must fail: judged next
            judge fit pass
            judge fit-eos pass
            judge misfit kind=draft-mismatch
            ;;
        reference | reference-ours | reference-upstream)
            # The reference validation (live-check --profile reference) on the seeded model stretched to a
            # 1,048,576-token context, with the DSpark replay probe; live-check stops the server itself.
            # REFERENCE_MODEL=DIR serves a trained pair (train_dspark.py's --out) stretched the same way.
            long_model=/tmp/sparkseal-model-1m
            if [ -n "${REFERENCE_MODEL:-}" ]; then
                long_model=/tmp/sparkseal-model-1m-trained
                rm -rf "$long_model" && cp -r "$REFERENCE_MODEL" "$long_model"
                "$python" bench/live/test_model.py --stretch "$long_model" --max-positions 1048576
            fi
            [ -f "$long_model/draft/model.safetensors" ] ||
                "$python" bench/live/test_model.py --out "$long_model" --weights --max-positions 1048576 >/dev/null
            wheels="ours upstream"
            [ "$phase" = reference ] || wheels=${phase#reference-}
            for wheel in $wheels; do
                # Our wheel must pass, the unpatched one fail through the replay step alone (judge).
                "$python" bench/live/serve.py --model-dir "$long_model" --load-format safetensors --out "$results" \
                    --name "reference-$wheel" --site "$(site_of "$wheel")" --site "$root/deps" --dspark \
                    --draft-sample-method probabilistic --max-num-seqs 1 --max-model-len 1048576 \
                    --vllm-arg=--max-num-batched-tokens=4096 --start-deadline 600 \
                    --env SPARKSEAL_DSPARK_REPLAY=1 --env VLLM_SERVER_DEV_MODE=1 \
                    --check "reference-$wheel:--profile reference --dspark-replay --teardown-pid {pid}" || true # judged next
                if [ "$wheel" = ours ]; then judge reference-ours pass; else judge reference-upstream only=dspark-replay; fi
            done
            ;;
        tp2)
            serve --name ours-dspark-tp2 --site "$root/ours" --site "$root/deps" --dspark --max-num-seqs 8 \
                --tensor-parallel-size 2 --nccl-logs "$results/nccl-tp2" \
                --check "ours-dspark-tp2:--speculation required --concurrency 8 --against $ref ${long[*]} --nccl-logs $results/nccl-tp2"
            ;;
        *)
            echo "run: unknown phase $phase" >&2
            exit 2
            ;;
        esac
    done
    tar -C "$results" -czf "$out/live-results.tar.gz" .
    if [ -n "$trained" ]; then "$python" bench/live/summary.py "$results" || failed+=("summary"); fi
    for summary in "$results"/*.summary.json; do "$python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["name"], d.get("startup_s"), d.get("error", ""), {k: v["exit"] for k, v in d["checks"].items()})' "$summary"; done
    for report in "$results"/*.json; do
        case $report in *summary.json | *reference.json) continue ;; esac
        "$python" -c 'import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception as e: print(sys.argv[1], "unreadable", e); raise SystemExit(1)
print(sys.argv[1].rsplit("/",1)[-1], "ok" if d["ok"] else "FINDINGS", [f["message"][:160] for f in d["findings"]])' "$report" ||
            failed+=("$(basename "$report") unreadable")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "run: failed: ${failed[*]}" >&2
        exit 1
    fi
    ;;
*)
    echo "usage: bench/live/h200.sh receive DIR... | install | run OUT [PHASE...]" >&2
    exit 2
    ;;
esac
