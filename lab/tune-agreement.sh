#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# Harness vs test-backend-ops on the GPU machine (tuner proof, points 1-3):
#   1. agreement: reference shapes with M >= 64, harness medians vs test-backend-ops perf (--output sql,
#      cases through --test-file), within 10% where the weights do not fit in L2;
#   2. cost: device-seconds to a +-1% CI of the route/stock ratio, harness vs test-backend-ops;
#   3. L2: M = 1 shapes with and without weight rotation.
#
# Run from the repository root on the device machine (carry .carry/ with llama.cpp.tar.xz from
# `make llama-tarball` and a copy of samples/reference/h200-mul-mat-routes.tsv: make tune-agreement-carry):
#   OUT=<dir> [BUILD_DIR=<patched CUDA build: libggml*.so in bin/ or the folder>] [LLAMA_CPP_DIR=<tree>]
#   [LLAMA_TARBALL=.carry/llama.cpp.tar.xz] [REFERENCE_TSV=...] [PARTS=1,2,3] lab/tune-agreement.sh
#
# Which ggml is measured: see lab/tune-common.sh (BUILD_DIR, else the integration build of a warm
# machine, else the tarball's tree patched and built here, ~4 min).
# Expected on an H200 with a prebuilt BUILD_DIR (estimates): build ~1.5 min (harness + test-backend-ops.cpp),
# part 1 ~4 min (31 cases; test-backend-ops runs >= 1 s per case and config), part 2 ~3.5 min (3 cases,
# 40 harness trials, 8 test-backend-ops repetitions), part 3 ~0.5 min. Over two calls on the warm
# machine: PARTS=1, then PARTS=2,3 (part 2 reuses part 1's eligibility from $WORK).
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
DEVICE=${DEVICE:-CUDA0}  # CPU runs the same steps on ggml's CPU backend (how CI tests this script)
T0=$(date +%s)

TSV=${REFERENCE_TSV:-}
for cand in "$TSV" samples/reference/h200-mul-mat-routes.tsv .carry/h200-mul-mat-routes.tsv; do
    if [ -n "$cand" ] && [ -f "$cand" ]; then TSV=$cand; break; fi
done
[ -f "$TSV" ] || { log "reference TSV not found (set REFERENCE_TSV)"; exit 2; }

NEED_TBO=1
# shellcheck source=lab/tune-common.sh
source "$REPO/lab/tune-common.sh"

# --- the three parts ---------------------------------------------------------------------------
PYTHONPATH=$REPO $PY -m ggml_dispatch.tuner.agreement --harness "$HARNESS" --tbo "$TBO" --tsv "$TSV" --out "$OUT" \
    --work "$WORK/agreement-work" --parts "$PARTS" --device "$DEVICE" ${AGREEMENT_ARGS:-} \
    2> >(tee -a "$LOG" >&2) >"$WORK/summary.txt"
log "done in $(( $(date +%s) - T0 )) s"
cat "$WORK/summary.txt"
