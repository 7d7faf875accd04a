#!/usr/bin/env bash
# Lab script (GPU machine): the seed workload, a qwen35 model served by llama-server (issue #50; the
# mmvq decode configurations of issue #51 ride along when the carried tree has the mmvq_params feature).
# Carry (here): python -m lab.upstream_carry "pinned (0.3.36)" -o .carry/upstream.tar.xz
#               make .carry/libkernel_timeline.so
#   OUT=... bash lab/qwen35.sh          (repeat the same call on the warm machine until it prints "all done")
#   OUT=... PARTS="tune table ab" ...   (a subset)
# A part that finished leaves $WORK/done-<part> and is skipped by later calls (REDO="part ..." runs it again),
# so one command, repeated, walks the whole list across calls of at most 10 minutes.
#   build    cmake + llama-server, test-backend-ops (sm_90) from the carried hooked tree, in $WORK
#   model    lab.qwen35 write: Qwen3.5-27B per-layer shapes, Q5_K/Q6_K/Q8_0, Q35_LAYERS layers + MTP,
#            the real vocabulary, a synthetic SPM tokenizer (llama-server needs one)
#   trace    lab.serve_ab trace (stock, route trace on), both modes -> census.parquet
#   profile  lab.serve_ab profile (stock, CUPTI kernel timeline) -> attribution.md (lab.qwen35_attrib)
#   tbo      test-backend-ops -o MUL_MAT at M <= 8 with each forced mmvq / mmvf configuration (issue #51)
#   tune     ggml-dispatch tune run on the census (--max-seconds TUNE_SECONDS, journal resumes), pruned to
#            the candidates below unless TUNE_ARGS replaces them
#   tune-attn  the same on the attention census (CENSUS_ATTN), FLASH_ATTN_EXT pruned to TUNE_ATTN_PRUNED below
#   table    codegen of the sweeps (VRAM_BUDGET_MIB, default 2048, for KV shadows) -> table (or
#            TABLE=path/table.json as it is); install it into the tree; rebuild llama-server
#   ab       lab.serve_ab ab: stock (GGML_CUDA_DISPATCH=off) vs table, AB_PAIRS pairs, both modes
# A part skips itself (with a line in the log) when less than its expected seconds are left of DEADLINE_S.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/out/qwen35}
WORK=${WORK:-/tmp/ggml-dispatch-qwen35}
PARTS=${PARTS:-build model trace profile tune tune-attn table ab tbo}
JOBS=${JOBS:-$(nproc)}
DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-570} ))
LAYERS=${Q35_LAYERS:-32}
mkdir -p "$OUT" "$WORK"
LOG=$OUT/qwen35.log
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
done_part() { touch "$WORK/done-$1"; log "$1 done"; }
fits() {  # $1 = part, $2 = expected seconds: not done yet (or in REDO), and enough time left
    if [ -f "$WORK/done-$1" ] && [[ " ${REDO:-} " != *" $1 "* ]]; then return 1; fi
    local left=$(( DEADLINE - $(date +%s) ))
    if [ "$left" -lt "$2" ]; then log "skip $1: ${left}s left, expects $2s"; STOPPED=1; return 1; fi
    [ -z "${STOPPED:-}" ]
}
# shellcheck source=lab/cuda-env.sh
source "$REPO/lab/cuda-env.sh"
SRC=$WORK/llama.cpp
BUILD=$WORK/build
MODEL=$WORK/qwen35-L$LAYERS.gguf
NAME=qwen35-27b-L$LAYERS
export PYTHONPATH=$REPO:$SRC/gguf-py PYTHONUNBUFFERED=1
dispatch() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
serve() { python3 -m lab.serve_ab "$@" --server "$BUILD/bin/llama-server" --model "$MODEL" --name "$NAME"; }

if has_part build && fits build 420; then
    rm -rf "$SRC"
    tar -xJf "$REPO/.carry/upstream.tar.xz" -C "$WORK"
    cp "$SRC/install-check.json" "$OUT/"
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
    if has_part model && [ ! -f "$WORK/done-model" ]; then  # disk-bound: beside the CPU-bound build
        (python3 -m lab.qwen35 write -o "$MODEL" --layers "$LAYERS" --tokenizer spm >"$WORK/model.log" 2>&1 &&
            touch "$WORK/done-model") &
    fi
    log "configure"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF >>"$LOG" 2>&1 || { log "configure failed"; tail -30 "$LOG"; exit 1; }
    log "build"
    cmake --build "$BUILD" --target ${BUILD_TARGETS:-llama-server test-backend-ops} -j "$JOBS" >>"$LOG" 2>&1 ||
        { log "build failed"; grep -m20 -B2 -A8 "error" "$LOG" | tail -60; exit 1; }
    done_part build
fi

wait  # a model write started beside the build
if has_part model && fits model 90; then
    python3 -m lab.qwen35 write -o "$MODEL" --layers "$LAYERS" --tokenizer spm >>"$LOG" 2>&1 ||
        { log "model failed"; tail -20 "$LOG"; exit 1; }
    log "model $(du -h "$MODEL" | cut -f1)"
    done_part model
fi

if has_part trace && fits trace 90; then
    serve trace -o "$WORK/trace" ${TRACE_ARGS:-} >>"$LOG" 2>&1 || { log "trace failed"; tail -30 "$LOG"; }
    cp "$WORK"/trace/phases-*.jsonl "$OUT/" 2>/dev/null
    dispatch census ingest "$WORK"/trace/trace-*.jsonl --gguf "$MODEL" -o "$OUT/census.parquet" >>"$LOG" 2>&1 ||
        log "census failed"
    dispatch census show "$OUT/census.parquet" >"$OUT/census.txt" 2>&1
    dispatch census attention "$WORK"/trace/trace-*.jsonl -o "$OUT/census-attention.parquet" >>"$LOG" 2>&1 &&
        cp "$OUT/census-attention.parquet" "$WORK/" || log "attention census failed"
    tar -czf "$OUT/trace.tar.gz" -C "$WORK/trace" . 2>/dev/null
    cp "$OUT/census.parquet" "$WORK/census.parquet" && done_part trace
fi

if has_part profile && fits profile 80; then
    cp "$REPO/.carry/libcupti.so.13" "$WORK/" 2>/dev/null
    LD_LIBRARY_PATH=$WORK:$LD_LIBRARY_PATH serve profile --timeline "$REPO/.carry/libkernel_timeline.so" \
        -o "$WORK/profile" ${PROFILE_ARGS:-} >>"$LOG" 2>&1 || { log "profile failed"; tail -30 "$LOG"; }
    python3 -m lab.qwen35_attrib "$WORK/profile" -o "$OUT/attribution.md" --json "$OUT/attribution.json" \
        >>"$LOG" 2>&1 || log "attribution failed"
    tar -czf "$OUT/profile.tar.gz" -C "$WORK/profile" . 2>/dev/null
    [ -f "$OUT/attribution.md" ] && done_part profile
fi

# the census of the trace part, else one carried in .carry (a committed trace's)
CENSUS=${CENSUS:-$WORK/census.parquet}
[ -f "$CENSUS" ] || CENSUS=$REPO/.carry/census.parquet

# The candidates a sweep of this census times within one session's device time (about 50 cases of 30
# candidates at --coverage 0.9, 5 trials): the compiled mmvq pairs (uncapped and at 64 registers) and mmvf
# blocks (decode, verify),
# mmq tile widths a verify batch (M 3-12) or a ubatch of 1024 picks from, cuBLAS with f16 compute; no
# weight=cached candidate (the seed's 16 GB cards leave no VRAM for weight copies).
TUNE_PRUNED=(--coverage 0.9 --trials 5 --routes mmvf,mmvq,mmq,cublas --only 'mmvf/*'
    --only 'mmvq/nwarps=1,rows=1' --only 'mmvq/nwarps=2,rows=1' --only 'mmvq/nwarps=4,rows=1'
    --only 'mmvq/nwarps=4,rows=2' --only 'mmvq/nwarps=8,rows=1' --only 'mmvq/nwarps=8,rows=2' --only 'mmvq/*,regs=64'
    --only 'mmq/j=8,*' --only 'mmq/j=16,*' --only 'mmq/j=32,*' --only 'mmq/j=48,*' --only 'mmq/j=64,*'
    --only 'mmq/j=96,*' --only 'mmq/j=128,*' --only 'cublas/out=f32,compute=f16'
    --only 'cublas/out=f16,compute=f16')
if [ -n "${TUNE_ARGS:-}" ]; then read -ra TUNE_CANDIDATES <<<"$TUNE_ARGS"; else TUNE_CANDIDATES=("${TUNE_PRUNED[@]}"); fi

# FLASH_ATTN_EXT at the seed's D 256 / GQA 6 over the Q8_0 cache (the MTP layer's f16 cache too), from the
# attention census of the same traces (`ggml-dispatch census attention`; CENSUS_ATTN, else the carried
# .carry/census-attention.parquet): decode, verify (M 3, 4, 12) and the depth fill's ubatches up to
# --coverage 0.6 (27 cases of about 37 candidates): each kernel plain, from an f16 KV shadow and reused,
# and the MMA column splits with stream-k, with and without the shadow (kv=reuse is not timed: codegen
# derives it from kv=shadow).
TUNE_ATTN_PRUNED=(--coverage 0.6 --trials 5 --only 'fa_vec' --only 'fa_vec/kv=shadow' --only 'fa_tile'
    --only 'fa_tile/kv=shadow' --only 'fa_mma/kv=shadow' --only 'fa_mma/ncols1=*,sparse=off,stream_k=on'
    --only 'fa_mma/ncols1=*,sparse=off,stream_k=on,kv=shadow')
if [ -n "${TUNE_ATTN_ARGS:-}" ]; then read -ra TUNE_ATTN_CANDIDATES <<<"$TUNE_ATTN_ARGS"
else TUNE_ATTN_CANDIDATES=("${TUNE_ATTN_PRUNED[@]}"); fi
CENSUS_ATTN=${CENSUS_ATTN:-$WORK/census-attention.parquet}
[ -f "$CENSUS_ATTN" ] || CENSUS_ATTN=$REPO/.carry/census-attention.parquet

sweep() {  # $1 = part, $2 = census, $3 = output stem, then the candidate arguments
    local part=$1 census=$2 stem=$3
    shift 3
    # the sweep resumes from its journal in $WORK across calls; it is done when a call finishes it in time
    local left=$(( DEADLINE - $(date +%s) - 45 ))
    [ -n "${TUNE_SECONDS:-}" ] && [ "$TUNE_SECONDS" -lt "$left" ] && left=$TUNE_SECONDS
    dispatch tune run "$census" --llama-cpp "$SRC" --build-dir "$BUILD" -o "$WORK/$stem.parquet" \
        --journal "$WORK/$stem.journal.jsonl" --max-seconds "$left" --case-timeout 90 "$@" >>"$LOG" 2>&1
    local rc=$?
    cp "$WORK/$stem.parquet" "$WORK/$stem.journal.jsonl" "$OUT/" 2>/dev/null
    if tail -5 "$LOG" | grep -q "stopped by --max-seconds"; then
        log "$part: time limit, resumes next call"
    elif [ "$rc" = 0 ]; then
        done_part "$part"
    else
        log "$part failed (rc $rc)"; tail -20 "$LOG"
    fi
}
if has_part tune && fits tune 90; then sweep tune "$CENSUS" tuning "${TUNE_CANDIDATES[@]}"; fi
if has_part tune-attn && fits tune-attn 90; then
    sweep tune-attn "$CENSUS_ATTN" tuning-attention "${TUNE_ATTN_CANDIDATES[@]}"
fi

if has_part table && fits table 60; then
    if [ -n "${TABLE:-}" ]; then  # a committed table (tables/<gpu>/table.json) instead of this run's sweep
        mkdir -p "$OUT/table" && cp "$TABLE" "$OUT/table/table.json"
    else
        TUNING=${TUNING:-$WORK/tuning.parquet}
        [ -f "$TUNING" ] || TUNING=$REPO/.carry/tuning.parquet
        inputs=("$TUNING" --census "$CENSUS")
        if [ -f "$WORK/tuning-attention.parquet" ]; then  # the attention sweep's rules join the matmul ones
            inputs=("$TUNING" "$WORK/tuning-attention.parquet" --census "$CENSUS" --census "$CENSUS_ATTN")
        fi
        # the KV shadow's budget: what one of the seed's 16 GB cards has left beside its quarter of the
        # model (about 4.7 GB), of the Q8_0 cache (0.4 GB) and compute buffers
        dispatch codegen "${inputs[@]}" --vram-budget "${VRAM_BUDGET_MIB:-2048}" -o "$OUT/table" \
            ${CODEGEN_ARGS:-} >>"$LOG" 2>&1 || { log "codegen failed"; tail -20 "$LOG"; exit 1; }
    fi
    dispatch install --llama-cpp "$SRC" --table "$OUT/table/table.json" >>"$LOG" 2>&1 ||
        { log "install failed"; tail -20 "$LOG"; exit 1; }
    cmake --build "$BUILD" --target llama-server -j "$JOBS" >>"$LOG" 2>&1 || { log "rebuild failed"; exit 1; }
    log "table built: $(python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); print(len(t["rules"]), "rules")' "$OUT/table/table.json")"
    done_part table
fi

if has_part ab && fits ab 210; then
    serve ab --pairs "${AB_PAIRS:-3}" -o "$WORK/ab" ${AB_ARGS:-} >>"$LOG" 2>&1 || log "ab failed"
    cp "$WORK"/ab/*.jsonl "$OUT/" 2>/dev/null
    tar -czf "$OUT/ab-logs.tar.gz" -C "$WORK/ab" . 2>/dev/null
    ls "$OUT"/ab-*-serve.jsonl >/dev/null 2>&1 && done_part ab
fi
if has_part tbo && fits tbo 200; then
    # upstream's MUL_MAT cases at M <= 8 (the vector kernels' range) with each compiled mmvq candidate and
    # each mmvf block size forced (issue #51's correctness bar), TBO_JOBS at a time
    mkdir -p "$WORK/tbo"
    printf 'mode\trc\tpassed\tFAIL_lines\tseconds\n' >"$OUT/tbo-summary.tsv"
    modes=(stock off)
    # the candidates a default install compiles: each pair uncapped and under each default register cap
    for c in $(python3 -c 'from ggml_dispatch import registry as r; b = r.MmvqBuild(); print(" ".join(
            f"mmvq/nwarps={w},rows={x}" + (f",regs={g}" if g else "") for w, x, g in r.MMVQ_CANDIDATES
            if (w, x) in b.configs and (g == 0 or g in b.regs)))'); do
        modes+=("force:$c")
    done
    if [ "${TBO_MMVF:-1}" = 1 ]; then
        for b in $(python3 -c 'from ggml_dispatch import registry as r; print(" ".join(map(str, r.MMVF_BLOCKS)))'); do
            modes+=("force:mmvf/block=$b")
        done
    fi
    run_tbo() {
        local mode=$1 env=table name t rc
        [ "$mode" = off ] && env=off
        [[ "$mode" == force:* ]] && env=$mode
        name=${mode//[^A-Za-z0-9_=.-]/_}
        t=$(date +%s)
        GGML_CUDA_DISPATCH=$env GGML_CUDA_ROUTE_TRACE=$WORK/tbo/trace-$name.jsonl timeout 240 \
            "$BUILD/bin/test-backend-ops" test -o MUL_MAT -b CUDA0 -p ',n=[1-8],' >"$WORK/tbo/log-$name.txt" 2>&1
        rc=$?
        printf '%s\t%s\t%s\t%s\t%s\n' "$mode" "$rc" \
            "$(grep -Eo '[0-9]+/[0-9]+ tests passed' "$WORK/tbo/log-$name.txt" | tail -1)" \
            "$(grep -c FAIL "$WORK/tbo/log-$name.txt")" "$(( $(date +%s) - t ))" >>"$OUT/tbo-summary.tsv"
    }
    running=0
    for m in "${modes[@]}"; do
        if [ "$running" -ge "${TBO_JOBS:-8}" ]; then wait -n; running=$((running - 1)); fi
        run_tbo "$m" &
        running=$((running + 1))
    done
    wait
    tar -czf "$OUT/tbo-logs.tar.gz" -C "$WORK/tbo" . 2>/dev/null
    done_part tbo
fi

missing=""
for p in $PARTS; do [ -f "$WORK/done-$p" ] || missing="$missing $p"; done
if [ -z "$missing" ]; then log "all done"; else log "not done yet:$missing"; fi
