#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# One call on the GPU machine: run the named steps in order ('a+b' runs a and b side by side), skip a
# step whose expected seconds no longer fit before the deadline, and pack each step's outputs into one
# file under $OUT (the transfer takes at most 8 files back). Prints every step's summary last.
#
#   OUT=<dir> STEPS="tbo+models probe-bench-ab trace-census l2" [DEADLINE_S=560] lab/session.sh
#
# Steps (expected seconds on an H200 with the carried prebuilt builds):
#   probe-bench-ab  integration: override probe, traced llama-bench on SmolLM2, off-vs-unpatched A/B (240)
#   tbo             integration: test-backend-ops -o MUL_MAT stock + each forced route, traced (300)
#   models          e2e: SmolLM2 rebuilt, llama 8B-dims L4/L16 Q4_K_M, qwen3 27B-dims L4 mix (180)
#   trace-census    e2e: traced llama-bench workloads (FA on) and the census (120)
#   tune            e2e: ggml-dispatch tune run on .carry/census.parquet or the trace-census output (TUNE_SECONDS)
#   agree1 agree2 l2  tuner proof: harness vs test-backend-ops, cost to +-1% CI, L2 rotation (240, 210, 40)
#   ab              e2e: stock / table / crude A/B on the 8B-dims models (needs models; 300)
#   profile         e2e: CUPTI kernel timelines of each arm on the 16-layer model (needs models; 120)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}"
STEPS=${STEPS:?set STEPS}
DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-560} ))
W=$REPO/build/session
mkdir -p "$W" "$OUT"
source "$REPO/lab/cuda-env.sh"
export PYTHONUNBUFFERED=1
log() { echo "session [$(date +%T)]: $*" >&2; }

expected() {
    case $1 in
        probe-bench-ab) echo 240 ;; tbo) echo 300 ;; models) echo 180 ;; trace-census) echo 120 ;;
        tune) echo 150 ;; agree1) echo 240 ;; agree2) echo 210 ;; l2) echo 40 ;;
        ab) echo 300 ;; profile) echo 120 ;; *) echo 60 ;;
    esac
}

run_step() {  # $1 = step; output folder $W/$1
    local s=$1 o=$W/$1
    mkdir -p "$o"
    local t0=$(date +%s)
    case $s in
        probe-bench-ab) OUT=$o PARTS=probe,bench,ab WORK=$W/integration bash lab/integration.sh ;;
        tbo) OUT=$o PARTS=tbo TBO_JOBS=${TBO_JOBS:-7} TBO_TIMEOUT=${TBO_TIMEOUT:-220} WORK=$W/integration bash lab/integration.sh ;;
        models) OUT=$o PARTS=models WORK=$W/e2e bash lab/e2e.sh ;;
        trace-census) OUT=$o PARTS=trace,census WORK=$W/e2e bash lab/e2e.sh ;;
        tune)
            local census=$W/trace-census/census.parquet
            [ -f "$census" ] || census=$REPO/.carry/census.parquet
            mkdir -p "$W/e2e/tune-in" && cp "$census" "$W/e2e/tune-in/census.parquet"
            # a journal carried from an earlier call's output resumes that sweep
            [ -f .carry/tuning.journal.jsonl ] && cp .carry/tuning.journal.jsonl "$o/tuning.journal.jsonl"
            # the sweep gets what is left before the deadline (it resumes from its journal in a later call)
            OUT=$o PARTS=tune WORK=$W/e2e CENSUS=$W/e2e/tune-in/census.parquet \
                TUNE_SECONDS=${TUNE_SECONDS:-$(( DEADLINE - $(date +%s) - 45 ))} bash lab/e2e.sh ;;
        agree1 | agree2 | l2)
            local part=${s#agree}
            [ "$s" = l2 ] && part=3
            mkdir -p "$W/prebuilt/bin"
            bash lab/prebuilt.sh patched "$W/prebuilt/bin"
            [ -d "$W/agree-tree/llama.cpp" ] || { mkdir -p "$W/agree-tree" && tar -xJf .carry/llama.cpp.tar.xz -C "$W/agree-tree"; }
            PYTHONPATH=$REPO python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
                install --llama-cpp "$W/agree-tree/llama.cpp" >&2
            # part 2 needs only part 1's eligibility: an earlier call's harness-agreement.jsonl, if carried
            if [ -f .carry/harness-agreement.jsonl ] && [ ! -f "$W/tuner/agreement-work/harness-agreement.jsonl" ]; then
                mkdir -p "$W/tuner/agreement-work" && cp .carry/harness-agreement.jsonl "$W/tuner/agreement-work/"
            fi
            OUT=$o BUILD_DIR=$W/prebuilt LLAMA_CPP_DIR=$W/agree-tree/llama.cpp REFERENCE_TSV=.carry/h200-mul-mat-routes.tsv \
                PARTS=$part WORK=$W/tuner bash lab/tune-agreement.sh ;;
        ab) OUT=$o PARTS=ab WORK=$W/e2e bash lab/e2e.sh ;;
        profile) OUT=$o PARTS=profile WORK=$W/e2e bash lab/e2e.sh ;;
        *) log "unknown step $s"; return 2 ;;
    esac
    local rc=$?
    echo "$s rc=$rc $(( $(date +%s) - t0 ))s" >>"$W/steps.txt"
    log "$s: rc=$rc in $(( $(date +%s) - t0 )) s"
}

: >"$W/steps.txt"
for group in $STEPS; do
    IFS=+ read -ra parts <<<"$group"
    need=0
    for s in "${parts[@]}"; do e=$(expected "$s"); [ "$e" -gt "$need" ] && need=$e; done
    if [ $(( $(date +%s) + need )) -gt "$DEADLINE" ]; then
        log "skip $group: needs ${need}s, $(( DEADLINE - $(date +%s) ))s left"
        echo "$group skipped (needs ${need}s)" >>"$W/steps.txt"
        continue
    fi
    for s in "${parts[@]}"; do run_step "$s" & done
    wait
done

# pack: one file per step (<= 7) + the step log
for d in "$W"/*/; do
    s=$(basename "$d")
    case $s in integration | e2e | tuner | prebuilt | agree-tree) continue ;; esac
    [ -n "$(ls -A "$d")" ] && tar -czf "$OUT/$s.tar.gz" -C "$d" .
done
cp "$W/steps.txt" "$OUT/steps.txt"
cat "$W/steps.txt"
for d in "$W"/*/; do
    [ -f "$d/summary.md" ] && { echo "=== $(basename "$d")"; head -c 3000 "$d/summary.md"; echo; }
done
