#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# A tuning sweep on the GPU machine: census -> tuning.parquet with `ggml-dispatch tune run`, resumable
# over several calls (the journal stays in $WORK on a warm machine; carry it to resume on a new one).
#
# Run from the repository root on the device machine (carry .carry/ with llama.cpp.tar.xz and the
# census, e.g. `ggml-dispatch census from-gguf model.gguf --m 1,2,3,4,8,512 -o .carry/census.parquet`):
#   OUT=<dir> CENSUS=.carry/census.parquet [BUILD_DIR=...] [BUDGET_S=560] [COVERAGE=0.95] [TRIALS=7]
#   [RESUME_JOURNAL=<tuning.journal.jsonl of an earlier call>] [TUNE_ARGS=...] lab/tune-sweep.sh
# The build (lab/tune-common.sh) and the sweep share BUDGET_S seconds: the sweep gets what the build
# left (tune run --max-seconds) and stops between cases; run the same command again to continue.
# Writes under $OUT: tuning.parquet, tuning.journal.jsonl, run.log; prints the sweep's summary last.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT to the output folder}"
: "${CENSUS:?set CENSUS to a census.parquet}"
[ -f "$CENSUS" ] || { echo "tune-sweep: $CENSUS: no such file" >&2; exit 2; }
CENSUS=$(cd "$(dirname "$CENSUS")" && pwd)/$(basename "$CENSUS")
mkdir -p "$OUT"
WORK=${WORK:-$REPO/build/tuner-device}
mkdir -p "$WORK"
LOG=$OUT/run.log
: >"$LOG"
log() { echo "tune-sweep: $*" | tee -a "$LOG" >&2; }
JOBS=${JOBS:-$(nproc)}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-CUDA0}  # CPU runs the same steps on ggml's CPU backend (how CI tests this script)
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}

NEED_TBO=0
# shellcheck source=lab/tune-common.sh
source "$REPO/lab/tune-common.sh"

JOURNAL=$WORK/tuning.journal.jsonl
if [ -n "${RESUME_JOURNAL:-}" ] && [ ! -f "$JOURNAL" ]; then
    cp "$RESUME_JOURNAL" "$JOURNAL"
    log "resuming from $RESUME_JOURNAL"
fi
LEFT=$(( BUDGET_S - ($(date +%s) - T0) - 15 ))
[ "$LEFT" -gt 30 ] || { log "only ${LEFT} s left after the build: run again on the warm machine"; exit 3; }
log "sweeping for at most ${LEFT} s"
rc=0
PYTHONPATH=$REPO $PY -c 'from ggml_dispatch.cli import main; main()' tune run "$CENSUS" --llama-cpp "$TREE" \
    --harness "$HARNESS" -o "$WORK/tuning.parquet" --journal "$JOURNAL" --device "$DEVICE" \
    --coverage "${COVERAGE:-0.95}" --trials "${TRIALS:-7}" --max-seconds "$LEFT" ${TUNE_ARGS:-} \
    2> >(tee -a "$LOG" >&2) || rc=$?
cp "$JOURNAL" "$OUT/tuning.journal.jsonl" 2>/dev/null || true
cp "$WORK/tuning.parquet" "$OUT/tuning.parquet" 2>/dev/null || true
log "done in $(( $(date +%s) - T0 )) s (tune run exit $rc)"
grep -E "^tune: .*(cases measured|stopped by|covering)" "$LOG" || true
exit "$rc"
