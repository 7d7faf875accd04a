#!/usr/bin/env bash
# Harness vs test-backend-ops on the GPU machine (tuner proof, points 1-3):
#   1. agreement: reference shapes with M >= 64, harness medians vs test-backend-ops perf (--output sql,
#      cases through --test-file), within 10% where the weights do not fit in L2;
#   2. cost: device-seconds to a +-1% CI of the route/stock ratio, harness vs test-backend-ops;
#   3. L2: M = 1 shapes with and without weight rotation.
#
# Run from the repository root on the device machine:
#   OUT=<dir> [BUILD_DIR=<llama.cpp build with bin/libggml-cuda.so>] [LLAMA_CPP_DIR=<patched tree> |
#   LLAMA_TARBALL=.carry/llama.cpp.tar.xz] [REFERENCE_TSV=...] [PARTS=1,2,3] device/tune-agreement.sh
#
# The tree must carry `ggml-dispatch install` (the route override; without it only stock is compared).
# BUILD_DIR: a CUDA build of that tree (shared libs): nothing of ggml-cuda is recompiled; the harness and
# test-backend-ops.cpp are built against it (~1.5 min). Without BUILD_DIR, ggml-cuda is built here
# (sm_90, FlashAttention off: ~4 min on 16 cores); then split the parts over two calls on the warm
# machine (PARTS=1 first, then PARTS=2,3: the build in build/tuner-device is kept while it stays warm).
# Writes under $OUT (8 files): harness-agreement.jsonl tbo-agreement.sql harness-cost.jsonl
# tbo-cost.sql harness-l2.jsonl summary.json summary.md run.log; prints summary.md last.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
WORK=${WORK:-$REPO/build/tuner-device}
mkdir -p "$WORK"
LOG=$OUT/run.log
: >"$LOG"
log() { echo "tune-agreement: $*" | tee -a "$LOG" >&2; }
PARTS=${PARTS:-1,2,3}
JOBS=${JOBS:-$(nproc)}
PY=${PYTHON:-python3}
T0=$(date +%s)

# --- the llama.cpp tree ------------------------------------------------------------------------
TREE=${LLAMA_CPP_DIR:-}
if [ -z "$TREE" ]; then
    TARBALL=${LLAMA_TARBALL:-$REPO/.carry/llama.cpp.tar.xz}
    if [ ! -f "$WORK/llama.cpp/ggml/include/ggml.h" ]; then
        [ -f "$TARBALL" ] || { log "no LLAMA_CPP_DIR and no tarball at $TARBALL"; exit 2; }
        log "unpacking $TARBALL"
        tar -xJf "$TARBALL" -C "$WORK"
    fi
    TREE=$WORK/llama.cpp
fi
[ -f "$TREE/ggml/include/ggml.h" ] || { log "$TREE is not a llama.cpp tree"; exit 2; }
if [ -f "$TREE/ggml/src/ggml-cuda/ggml-dispatch-build.h" ]; then
    log "tree $TREE: $(grep -h 'define GGML_DISPATCH_PATCH_HASH' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-build.h")"
else
    log "WARNING: $TREE carries no ggml-dispatch install: routes other than stock will be ineligible"
fi

TSV=${REFERENCE_TSV:-}
for cand in "$TSV" shared/reference/h200-mul-mat-routes.tsv ../shared/reference/h200-mul-mat-routes.tsv \
    device/h200-mul-mat-routes.tsv; do
    if [ -n "$cand" ] && [ -f "$cand" ]; then TSV=$cand; break; fi
done
[ -f "$TSV" ] || { log "reference TSV not found (set REFERENCE_TSV)"; exit 2; }

# --- build: harness + test-backend-ops against the same ggml -----------------------------------
VERSION=$(PYTHONPATH=$REPO $PY -c 'from tuner.build import harness_version; print(harness_version())')
HB=$WORK/harness
ARGS=(-DLLAMA_CPP_DIR="$TREE" -DTUNER_HARNESS_VERSION="$VERSION" -DTUNER_TEST_BACKEND_OPS=ON)
if [ -n "${BUILD_DIR:-}" ]; then
    ls "$BUILD_DIR"/bin/libggml-cuda.so* >/dev/null 2>&1 || { log "$BUILD_DIR/bin has no libggml-cuda.so"; exit 2; }
    ARGS+=(-DGGML_BUILD_DIR="$BUILD_DIR")
    export LD_LIBRARY_PATH=$BUILD_DIR/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    log "linking the prebuilt ggml of $BUILD_DIR"
else
    ARGS+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_CUDA_FA=OFF)
    log "building ggml-cuda from $TREE (sm_90, FA off)"
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S tuner/harness -B "$HB" "${GEN[@]}" "${ARGS[@]}" >>"$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cmake --build "$HB" -j "$JOBS" >>"$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
log "build done in $(( $(date +%s) - T0 )) s"
HARNESS=$HB/bin/ggml-dispatch-harness
TBO=$HB/bin/test-backend-ops
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >>"$LOG" 2>&1 || true
"$HARNESS" --info >>"$LOG" 2>&1

# --- the three parts ---------------------------------------------------------------------------
PYTHONPATH=$REPO $PY -m tuner.agreement --harness "$HARNESS" --tbo "$TBO" --tsv "$TSV" --out "$OUT" \
    --work "$WORK/agreement-work" --parts "$PARTS" --device "${DEVICE:-CUDA0}" ${AGREEMENT_ARGS:-} \
    2> >(tee -a "$LOG" >&2) >"$WORK/summary.txt"
log "done in $(( $(date +%s) - T0 )) s"
cat "$WORK/summary.txt"
