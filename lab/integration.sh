#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# ggml-cuda integration proof on the GPU machine:
#   probe  the harness interface: proc-address functions, counts incl. CUDA-graph replays, override
#          with graph invalidation, ineligible override -> stock (lab/dispatch_probe.cpp);
#   tbo    test-backend-ops test -o MUL_MAT with stock and with each GGML_CUDA_DISPATCH=force:<route>,
#          a route trace each: per route how many cases really ran forced; -o MUL_MAT_ID traced (stock);
#   bench  llama-bench (pp512 + tg128, warm-up and 5 repetitions) on SmolLM2 with a route trace:
#          census ingest accepts it; per weight tensor sum(count x M) = tokens processed; LM head rows =
#          outputs; attention matmuls once per ubatch;
#   ab     GGML_CUDA_DISPATCH=off on the patched build vs the unpatched build (and the patched build's
#          default mode), interleaved llama-bench runs, both reported.
#
# Run from the repository root on the device machine (`make device-integration-carry` here
# first, then run this with carry [".carry"]):
#   OUT=<dir> [PARTS=probe,tbo,bench,ab] [TBO_MODES="stock force:mmq ..."] [TBO_JOBS=4] \
#   [WORK=build/integration] lab/integration.sh
# Inputs: .carry/llama.cpp.tar.xz (pinned tree, trimmed), .carry/smollm2.meta.gguf (SmolLM2's metadata
# and tensor list: the 98 MB file cannot travel, the model is rebuilt there with the same names, types
# and shapes, random weights). The build (patched, then unpatched by reverting the hook and rebuilding
# ggml-cuda.cu only) is skipped when $WORK already holds both (a warm machine).
# With .carry/bin-patched.tar.xz and .carry/stock.delta (lab/prebuild.sh, made on the development
# machine) the builds are unpacked instead (PREBUILT=auto|0|1).
# Writes under $OUT (8 files): summary.md summary.json trace-smollm2.jsonl traces-tbo.tar.gz
# bench.jsonl probe.json run.log census.txt; prints summary.md last.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
WORK=${WORK:-$REPO/build/integration}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
LOG=$OUT/run.log
: >"$LOG"
log() { echo "integration: $*" | tee -a "$LOG" >&2; }
PARTS=${PARTS:-probe,tbo,bench,ab}
JOBS=${JOBS:-$(nproc)}
PY=${PYTHON:-python3}
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))s"; }
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }

TARBALL=${LLAMA_TARBALL:-$REPO/.carry/llama.cpp.tar.xz}
META=${SMOLLM2_META:-$REPO/.carry/smollm2.meta.gguf}
SRC=$WORK/llama.cpp
BUILD=$WORK/build
PATCHED=$WORK/patched   # binaries + shared libs of the patched build
STOCK=$WORK/stock       # the same configure, ggml-cuda.cu without the hook
PHASH_WANT=$(cd "$REPO" && PYTHONPATH=$REPO $PY -c 'from ggml_dispatch.hook import install as i; print(i.patch_hash(i.native_sources(), i.load_specs()))')

install_hook() {  # $1 = install|uninstall
    local flag=""
    [ "$1" = uninstall ] && flag="--uninstall"
    PYTHONPATH=$REPO $PY -c 'import sys; from ggml_dispatch.hook.cli import install_cmd; install_cmd(sys.argv[1:])' \
        --llama-cpp "$SRC" $flag 2>&1 | tee -a "$LOG" >&2
}

copy_build() {  # $1 = destination: binaries and shared libraries of $BUILD/bin
    rm -rf "$1"
    mkdir -p "$1"
    cp -a "$BUILD"/bin/llama-bench "$BUILD"/bin/test-backend-ops "$1"/
    cp -a "$BUILD"/bin/*.so* "$1"/
    command -v ldd >/dev/null || { log "no ldd: cannot check which libggml-cuda $1/llama-bench loads"; return; }
    local lib
    lib=$(LD_LIBRARY_PATH=$1 ldd "$1/llama-bench" | awk '/libggml-cuda/ {print $3}')
    log "$1/llama-bench loads $lib"
    [ "$(dirname "$lib")" = "$1" ] || { log "llama-bench in $1 does not load its own libggml-cuda"; exit 1; }
}

# --- build (or the builds carried from the development machine) -----------------------------------
if [ ! -f "$SRC/ggml/include/ggml.h" ]; then
    [ -f "$TARBALL" ] || { log "no tarball at $TARBALL (make device-integration-carry)"; exit 2; }
    log "unpacking $TARBALL"
    tar -xJf "$TARBALL" -C "$WORK"
fi
PREBUILT=${PREBUILT:-auto}
if [ "$PREBUILT" = auto ]; then
    PREBUILT=0
    [ -f "$REPO/.carry/bin-patched.tar.xz" ] && [ -f "$REPO/.carry/stock.delta" ] && PREBUILT=1
fi
if [ -x "$PATCHED/llama-bench" ] && [ -x "$STOCK/llama-bench" ] && [ "$(cat "$PATCHED/PATCH_HASH" 2>/dev/null)" = "$PHASH_WANT" ]; then
    log "build: reusing $PATCHED and $STOCK (patch $PHASH_WANT)"
elif [ "$PREBUILT" = 1 ]; then
    # lab/prebuild.sh's builds (made on the development machine): patched base + stock delta
    log "build: the carried prebuilt patched and stock builds (lab/prebuilt.sh)"
    # shellcheck disable=SC1091
    source "$REPO/lab/cuda-env.sh"
    rm -rf "$PATCHED" "$STOCK"
    bash "$REPO/lab/prebuilt.sh" patched "$PATCHED"
    bash "$REPO/lab/prebuilt.sh" stock "$STOCK"
    ph=$(sed -n 's/^#define GGML_DISPATCH_PATCH_HASH "\(.*\)"/\1/p' "$PATCHED/ggml-dispatch-build.h" 2>/dev/null || true)
    log "prebuilt patched: patch hash ${ph:-unknown} (these sources: $PHASH_WANT)"
    [ "$ph" = "$PHASH_WANT" ] && echo "$ph" >"$PATCHED/PATCH_HASH"
else
    install_hook install  # idempotent: on a warm machine only changed files are rewritten
    log "configure ($(elapsed))"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >>"$LOG" 2>&1
    # (the trimmed tarball has no examples/model-conversion, pocs/ or app/: their CMake options stay off;
    #  $ORIGIN rpaths make the copied binaries load the libraries copied beside them)
    log "build patched ($(elapsed))"
    cmake --build "$BUILD" --target test-backend-ops llama-bench -j "$JOBS" >>"$LOG" 2>&1 || { log "build failed"; tail -40 "$LOG" >&2; exit 1; }
    copy_build "$PATCHED"
    echo "$PHASH_WANT" >"$PATCHED/PATCH_HASH"
    log "build unpatched: revert the hook, reconfigure (the glob drops ggml-dispatch.cu), rebuild ($(elapsed))"
    install_hook uninstall
    cmake -S "$SRC" -B "$BUILD" >>"$LOG" 2>&1
    cmake --build "$BUILD" --target test-backend-ops llama-bench -j "$JOBS" >>"$LOG" 2>&1 || { log "stock build failed"; exit 1; }
    copy_build "$STOCK"
    install_hook install  # leave the tree patched (a later call rebuilds incrementally)
    log "builds done ($(elapsed))"
fi

# --- probe: the harness interface ----------------------------------------------------------------
probe_build() {  # $1 = lib dir
    g++ -std=c++17 -O2 -I"$SRC/ggml/include" -I"$REPO/hook/native" -I"$SRC/ggml/src/ggml-cuda" "$REPO/lab/dispatch_probe.cpp" \
        -o "$1/dispatch_probe" -L"$1" -lggml -lggml-base -lggml-cuda -Wl,-rpath,"$1" -Wl,--allow-shlib-undefined
}
if has_part probe; then
    log "probe ($(elapsed))"
    probe_build "$PATCHED" 2>>"$LOG"
    probe_build "$STOCK" 2>>"$LOG"
    set +e
    LD_LIBRARY_PATH=$PATCHED${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$PATCHED/dispatch_probe" >"$OUT/probe.json" 2>>"$LOG"
    echo "probe_rc=$?" >>"$LOG"
    # the unpatched libraries must not have the functions: proves which library each A/B binary loads
    LD_LIBRARY_PATH=$STOCK${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$STOCK/dispatch_probe" >"$WORK/probe-stock.json" 2>>"$LOG"
    set -e
    log "probe stock build: $(cat "$WORK/probe-stock.json")"
fi

# --- test-backend-ops -o MUL_MAT: stock and each forced route ------------------------------------
TBO_DIR=$WORK/tbo
if has_part tbo; then
    log "test-backend-ops ($(elapsed))"
    rm -rf "$TBO_DIR"
    mkdir -p "$TBO_DIR"
    run_tbo() {  # $1 = mode (stock | stock-id | force:<route>)
        local name=${1/force:/force-}
        local env_mode=table op=MUL_MAT
        [[ "$1" == force:* ]] && env_mode=$1
        [ "$1" = stock-id ] && op=MUL_MAT_ID  # MUL_MAT_ID: traced, never overridden
        local t0=$(date +%s)
        set +e
        GGML_CUDA_DISPATCH=$env_mode GGML_CUDA_ROUTE_TRACE=$TBO_DIR/trace-$name.jsonl LD_LIBRARY_PATH=$PATCHED${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            timeout "${TBO_TIMEOUT:-560}" "$PATCHED/test-backend-ops" test -o $op -b CUDA0 >"$TBO_DIR/log-$name.txt" 2>&1
        echo $? >"$TBO_DIR/rc-$name"
        set -e
        echo $(( $(date +%s) - t0 )) >"$TBO_DIR/sec-$name"
    }
    # TBO_JOBS at a time: each uses the GPU and half the cores for its CPU reference
    running=0
    for m in ${TBO_MODES:-stock stock-id force:mmvf force:mmf force:mmvq force:mmq force:cublas}; do
        if [ "$running" -ge "${TBO_JOBS:-4}" ]; then
            wait -n || true
            running=$((running - 1))
        fi
        run_tbo "$m" &
        running=$((running + 1))
        log "  started $m ($(elapsed))"
    done
    wait
    log "  test-backend-ops done ($(elapsed))"
    tar -czf "$OUT/traces-tbo.tar.gz" -C "$TBO_DIR" .
fi

# --- llama-bench on SmolLM2 with a route trace ----------------------------------------------------
MODEL=$WORK/smollm2.gguf
BENCH_ARGS=(-p 512 -n 128 -r 5 -b 2048 -ub 512 -fa off -ngl 99)
if has_part bench || has_part ab; then
    if [ ! -f "$MODEL" ]; then
        [ -f "$META" ] || { log "no SmolLM2 metadata at $META (make device-integration-carry)"; exit 2; }
        log "rebuild SmolLM2 from its metadata ($(elapsed))"
        PYTHONPATH=$REPO:$SRC/gguf-py $PY -m lab.models clone "$META" -o "$MODEL.tmp" >>"$LOG" 2>&1
        mv "$MODEL.tmp" "$MODEL"
    fi
fi
if has_part bench; then
    log "llama-bench with route trace ($(elapsed))"
    rm -f "$OUT/trace-smollm2.jsonl"
    GGML_CUDA_ROUTE_TRACE=$OUT/trace-smollm2.jsonl LD_LIBRARY_PATH=$PATCHED${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        "$PATCHED/llama-bench" -m "$MODEL" "${BENCH_ARGS[@]}" -o jsonl >"$WORK/bench-traced.jsonl" 2>>"$LOG"
    set +e
    PYTHONPATH=$REPO:$SRC/gguf-py $PY -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        census ingest "$OUT/trace-smollm2.jsonl" -o "$WORK/census.parquet" >"$OUT/census.txt" 2>&1
    echo "census_ingest_rc=$?" >>"$OUT/census.txt"
    PYTHONPATH=$REPO:$SRC/gguf-py $PY -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        census show "$WORK/census.parquet" >>"$OUT/census.txt" 2>&1
    set -e
fi

# --- A/B: GGML_CUDA_DISPATCH=off (patched) vs unpatched, interleaved -------------------------------
if has_part ab; then
    log "A/B interleaved ($(elapsed))"
    : >"$WORK/ab.jsonl"
    ROUNDS=${AB_ROUNDS:-4}
    for r in $(seq 1 "$ROUNDS"); do
        order="stock patched-off patched-default"
        [ $((r % 2)) = 0 ] && order="patched-default patched-off stock"
        for v in $order; do
            case $v in
                stock) dir=$STOCK; mode=off ;;
                patched-off) dir=$PATCHED; mode=off ;;
                patched-default) dir=$PATCHED; mode=table ;;
            esac
            GGML_CUDA_DISPATCH=$mode LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$dir/llama-bench" -m "$MODEL" "${BENCH_ARGS[@]}" -o jsonl 2>>"$LOG" |
                $PY -c 'import json,sys
for line in sys.stdin:
    if line.strip():
        d = json.loads(line); d["variant"] = sys.argv[1]; d["round"] = int(sys.argv[2]); print(json.dumps(d))' "$v" "$r" >>"$WORK/ab.jsonl"
        done
        log "  round $r done ($(elapsed))"
    done
fi

$PY "$REPO/lab/integration_summary.py" --out "$OUT" --work "$WORK" --parts "$PARTS" \
    --n-prompt 512 --n-gen 128 --reps 5 --n-batch 2048 --n-ubatch 512 >>"$LOG" 2>&1 || log "summary: see run.log"
log "done ($(elapsed))"
cat "$OUT/summary.md"
