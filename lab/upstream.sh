#!/usr/bin/env bash
# Lab script (GPU machine): the hook on a newer llama.cpp tree than the pinned one (issue #48, item 6).
# Carry: .carry/upstream.tar.xz from `python -m lab.upstream_carry b11549 -o .carry/upstream.tar.xz` (the tree
# with the hook installed, every feature that fits, and its install-check.json).
#   PARTS="build tbo" OUT=... bash lab/upstream.sh
#   build  cmake + build test-backend-ops and llama-bench (sm_90) in $WORK (kept while the machine is warm)
#   tbo    test-backend-ops test for MUL_MAT, MUL_MAT_ID and FLASH_ATTN_EXT: the hook with no table
#          (stock), GGML_CUDA_DISPATCH=off, and each forced configuration of MM_MODES / ID_MODES /
#          FA_MODES; a route trace each; $OUT/tbo-summary.tsv holds op, mode, exit code, passed/total,
#          FAIL lines, seconds and the trace keys that ran the forced configuration (reason "forced": 0
#          means every node refused it and ran stock). ID_MODES has the moe_split configurations: 2j with
#          and without stream-k (the side stream), 2j_wave, 2j_fused, fit and fit64; at J = 64 the split's
#          tiles are wider than the tree's J at small batches, where the padding must follow them.
#   model  the 16-layer 8B-dimension Q4_K_M model (lab.models dense, written beside the build, then the tree's
#          llama-quantize; needs .carry/smollm2.meta.gguf for the tokenizer)
#   ab     TABLE=table.json (a committed table of another tree: installed with --allow-upstream-mismatch, so the
#          A/B says whether its gains carry over): llama-bench rebuilt with it, `ggml-dispatch ab` stock (dispatch
#          off) / table, pp2048 at ubatch AB_UBATCH (256,512,2048) and tg128, AB_PAIRS (8) pairs of -r AB_REPS (3),
#          peak VRAM per run; skipped with a line when the GPU is not the table's
#   autotune  `ggml-dispatch autotune` on the model with this tree and build (the product's one command):
#          trace, census, tune (AT_TUNE_SECONDS, default 300), codegen with --vram-budget AT_VRAM_MIB (16384),
#          rebuild, A/B (AT_PAIRS 8 pairs of -r 3) and report; AT_SKIP="hook build ab report" stops before the A/B
#          (the build part built the tree), and
#          the same call without it resumes there (autotune's state file)
# Calls of at most 10 minutes: PARTS="build model", then PARTS=autotune AT_SKIP="hook build ab report", then
# PARTS=autotune AT_SKIP="hook build" (the same AT_ variables otherwise: a changed one makes autotune redo its stage).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/out/upstream}
WORK=${WORK:-/tmp/ggml-dispatch-upstream}
PARTS=${PARTS:-build tbo}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT" "$WORK"
LOG=$OUT/upstream.log
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
# shellcheck source=lab/cuda-env.sh
source "$REPO/lab/cuda-env.sh"
SRC=$WORK/llama.cpp
BUILD=$WORK/build
MODELS=$WORK/models
mkdir -p "$MODELS"
export PYTHONPATH=$REPO:$SRC/gguf-py PYTHONUNBUFFERED=1
dispatch() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }

if has_part build; then
    rm -rf "$SRC"
    tar -xJf "$REPO/.carry/upstream.tar.xz" -C "$WORK"
    cp "$SRC/install-check.json" "$OUT/"
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
    log "configure"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF >>"$LOG" 2>&1 || { log "configure failed"; tail -30 "$LOG"; exit 1; }
    log "build"
    if has_part model && [ ! -f "$MODELS/llama8b-L16.f16.gguf" ] && [ ! -f "$MODELS/llama8b-L16.gguf" ]; then
        (python3 -m lab.models clone "$REPO/.carry/smollm2.meta.gguf" -o "$MODELS/smollm2.gguf" &&
            python3 -m lab.models dense --preset llama8b --layers 16 --tokenizer-from "$MODELS/smollm2.gguf" \
                -o "$MODELS/llama8b-L16.f16.gguf") >"$MODELS/model.log" 2>&1 &  # disk-bound: beside the build
    fi
    targets=(test-backend-ops llama-bench)
    has_part model && targets+=(llama-quantize)
    cmake --build "$BUILD" --target "${targets[@]}" -j "$JOBS" >>"$LOG" 2>&1 || { log "build failed"; grep -m20 -B2 -A8 "error" "$LOG" | tail -60; exit 1; }
    log "build done"
fi

if has_part model; then
    wait  # the f16 model written beside the build
    if [ ! -f "$MODELS/llama8b-L16.gguf" ]; then
        [ -f "$MODELS/llama8b-L16.f16.gguf" ] || python3 -m lab.models dense --preset llama8b --layers 16 \
            --tokenizer-from "$MODELS/smollm2.gguf" -o "$MODELS/llama8b-L16.f16.gguf" >>"$MODELS/model.log" 2>&1
        "$BUILD/bin/llama-quantize" "$MODELS/llama8b-L16.f16.gguf" "$MODELS/llama8b-L16.gguf" Q4_K_M "$JOBS" \
            >>"$MODELS/model.log" 2>&1 && rm -f "$MODELS/llama8b-L16.f16.gguf" ||
            { log "model failed"; tail -20 "$MODELS/model.log"; exit 1; }
    fi
    log "model $(du -h "$MODELS/llama8b-L16.gguf" | cut -f1)"
fi

if has_part ab; then
    : "${TABLE:?ab: set TABLE=table.json}"
    want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpu"]["name"])' "$TABLE")
    if ! grep -q "^$want," "$OUT/gpu.txt" 2>/dev/null && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -qx "$want"; then
        log "skip ab: $TABLE applies on $want, this GPU is $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    else
        dispatch install --llama-cpp "$SRC" --table "$TABLE" --allow-upstream-mismatch >>"$LOG" 2>&1 ||
            { log "install failed"; tail -20 "$LOG"; exit 1; }
        cmake --build "$BUILD" --target llama-bench -j "$JOBS" >>"$LOG" 2>&1 || { log "rebuild failed"; exit 1; }
        log "table $(basename "$(dirname "$TABLE")") built; A/B"
        timeout "${AB_TIMEOUT:-540}" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' ab \
            --arm "stock=$BUILD/bin/llama-bench:off" --arm "table=$BUILD/bin/llama-bench:table" \
            --model "llama8b-L16=$MODELS/llama8b-L16.gguf" \
            --bench "-ngl 99 -fa on -b 2048 -p 2048 -ub ${AB_UBATCH:-256,512,2048} -n 0" --bench "-ngl 99 -fa on -p 0 -n 128" \
            --pairs "${AB_PAIRS:-8}" --reps "${AB_REPS:-3}" --vram --expect-table "$TABLE" --log "$WORK/ab-runs.log" \
            -o "$OUT/ab-table.jsonl" >>"$LOG" 2>&1 || log "ab stopped (deadline or error): the records so far are in ab-table.jsonl"
        gzip -c "$WORK/ab-runs.log" >"$OUT/ab-runs.log.gz" 2>/dev/null
        log "ab done"
    fi
fi

if has_part autotune; then
    skip=()
    for s in ${AT_SKIP:-}; do skip+=(--skip "$s"); done
    timeout "${AT_TIMEOUT:-560}" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' autotune \
        --llama-cpp "$SRC" --build-dir "$BUILD" --model "$MODELS/llama8b-L16.gguf" \
        --workload decode,prefill --ubatch 256,512,2048 --vram-budget "${AT_VRAM_MIB:-16384}" --trials 5 \
        --coverage "${AT_COVERAGE:-0.95}" --tune-seconds "${AT_TUNE_SECONDS:-300}" --pairs "${AT_PAIRS:-8}" --reps 3 \
        -o "$WORK/at" "${skip[@]}" >>"$LOG" 2>&1
    log "autotune rc $?"
    tail -25 "$LOG"
    tar -czf "$OUT/autotune.tar.gz" -C "$WORK" at
fi

if has_part tbo; then
    TBO=$WORK/tbo
    rm -rf "$TBO"; mkdir -p "$TBO"
    run_tbo() {  # $1 = op, $2 = stock | off | force:<config>
        local op=$1 mode=$2 env=table
        [ "$mode" = off ] && env=off
        [[ "$mode" == force:* ]] && env=$mode
        local name="$op-${mode//[^A-Za-z0-9_=.-]/_}"
        local t=$(date +%s)
        GGML_CUDA_DISPATCH=$env GGML_CUDA_ROUTE_TRACE=$TBO/trace-$name.jsonl \
            timeout "${TBO_TIMEOUT:-400}" "$BUILD/bin/test-backend-ops" test -o "$op" -b CUDA0 >"$TBO/log-$name.txt" 2>&1
        local rc=$?
        local pass=$(grep -Eo '[0-9]+/[0-9]+ tests passed' "$TBO/log-$name.txt" | tail -1)
        local fails=$(grep -c 'FAIL' "$TBO/log-$name.txt")
        local forced=$(grep -c '"reason":"forced"' "$TBO/trace-$name.jsonl" 2>/dev/null)
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$op" "$mode" "$rc" "${pass:-none}" "$fails" "$(( $(date +%s) - t ))" \
            "${forced:-0}" >>"$OUT/tbo-summary.tsv"
    }
    printf 'op\tmode\trc\tpassed\tFAIL_lines\tseconds\tforced_keys\n' >"$OUT/tbo-summary.tsv"
    MM_MODES=${MM_MODES:-"stock off force:mmvq force:mmq force:mmq/j=64,stream_k=off force:mmq/stream_k=on force:cublas force:cublas/compute=f32 force:mmf force:mmvf"}
    ID_MODES=${ID_MODES:-"stock off force:mmvq force:mmq force:mmq/j=32,stream_k=off force:mmf
        force:mmq/j=64,split=2j force:mmq/j=64,stream_k=off,split=2j force:mmq/j=32,stream_k=off,split=2j_wave
        force:mmq/j=64,stream_k=off,split=2j_fused force:mmq/j=16,stream_k=off,split=2j_fused
        force:mmq/stream_k=off,split=fit force:mmq/stream_k=off,split=fit64"}
    FA_MODES=${FA_MODES:-"stock off force:fa_vec force:fa_tile force:fa_mma force:fa_mma/ncols2=4 force:fa_vec/blocks=32"}
    jobs_list=()
    for m in $MM_MODES; do jobs_list+=("MUL_MAT $m"); done
    for m in $ID_MODES; do jobs_list+=("MUL_MAT_ID $m"); done
    for m in $FA_MODES; do jobs_list+=("FLASH_ATTN_EXT $m"); done
    running=0
    for j in "${jobs_list[@]}"; do
        if [ "$running" -ge "${TBO_JOBS:-4}" ]; then wait -n; running=$((running - 1)); fi
        # shellcheck disable=SC2086
        run_tbo $j &
        running=$((running + 1))
    done
    wait
    log "test-backend-ops done"
    tar -czf "$OUT/tbo-logs.tar.gz" -C "$TBO" .
    column -t -s $'\t' "$OUT/tbo-summary.tsv"
fi
log "end"
