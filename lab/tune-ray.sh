#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# The census swept on every GPU of the machine with `tune run --executor ray`, then the same cases on
# one GPU (the serial executor), on the GPU machine; then how the two agree and what each cost.
#
# Run from the repository root on the device machine (carry .carry/ with llama.cpp.tar.xz and, where
# Ray is not installed there, .carry/ray-site.tar.xz made here by `lab/tune-ray.sh pack`):
#   OUT=<dir> [CENSUS=tables/cuda-sm90-nvidia-h200/census.parquet] [COVERAGE=0.95] [TRIALS=7]
#   [BUDGET_S=560] [BUILD_DIR=...] [RAY_SITE=.carry/ray-site.tar.xz] [ONE_GPU=0] [TUNE_ARGS=...]
#   lab/tune-ray.sh
# Both sweeps are resumable: the build (lab/tune-common.sh) and the sweeps share BUDGET_S seconds,
# each sweep stops between cases when the budget is spent (exit 3); run the same command again on
# the warm machine to continue (the journals stay in $WORK). Each call's wall time per sweep goes to
# $WORK/phases.jsonl, so the wall and device seconds add up over calls.
# Writes under $OUT: tuning-multi.parquet, tuning-single.parquet (and their journals), run.log, and
# once both sweeps are complete summary.json (python -m ggml_dispatch.tuner.executor_spread: per-case per-GPU
# timing spread, wall and device seconds against the target wall <= 1.2 x one-GPU / n) and
# decisions.txt (ggml-dispatch diff of the tables codegen makes from each: expect no change; GPU only).
# DEVICE=CPU runs the same steps on ggml's CPU backend with Ray tasks of CPU=1 (RAY_CPUS of them at a
# time; RAY_ADDRESS joins an existing cluster), which is how CI tests this script.
#
# `lab/tune-ray.sh pack` (here, with pip and the network): .carry/ray-site.tar.xz, Ray and what it
# needs beyond the GPU machine's image for its Python (PY_VERSION, default 3.12), without Ray's Java
# jars and dashboard source maps (the Ray wheel alone is larger than what one call carries).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}

if [ "${1:-}" = pack ]; then
    SITE=$(mktemp -d)
    trap 'rm -rf "$SITE" "$SITE.whl"' EXIT
    mkdir -p "$SITE.whl" .carry
    PLAT=(--only-binary=:all: --implementation cp --python-version "${PY_VERSION:-3.12}"
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
    $PY -m pip download -q --no-deps "${PLAT[@]}" -d "$SITE.whl" "ray==${RAY_VERSION:-2.60.0}" \
        jsonschema jsonschema-specifications referencing rpds-py
    $PY -m pip install -q --no-deps --no-compile --target "$SITE" "${PLAT[@]}" "$SITE.whl"/*.whl
    rm -rf "$SITE/ray/jars" "$SITE/bin" "$SITE"/ray/dashboard/client/build/static/js/*.map
    tar -C "$SITE" -cf - . | xz -6 -T0 >.carry/ray-site.tar.xz
    ls -l .carry/ray-site.tar.xz
    exit 0
fi

: "${OUT:?set OUT to the output folder}"
CENSUS=${CENSUS:-$REPO/tables/cuda-sm90-nvidia-h200/census.parquet}
[ -f "$CENSUS" ] || { echo "tune-ray: $CENSUS: no such file" >&2; exit 2; }
CENSUS=$(cd "$(dirname "$CENSUS")" && pwd)/$(basename "$CENSUS")
mkdir -p "$OUT"
WORK=${WORK:-$REPO/build/tuner-ray}
mkdir -p "$WORK"
LOG=$OUT/run.log
: >"$LOG"
log() { echo "tune-ray: $*" | tee -a "$LOG" >&2; }
JOBS=${JOBS:-$(nproc)}
DEVICE=${DEVICE:-CUDA0}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}

# --- Ray: installed, or the carried site folder ------------------------------------------------
if ! $PY -c 'import ray' 2>/dev/null; then
    RAY_SITE=${RAY_SITE:-$REPO/.carry/ray-site.tar.xz}
    if [ ! -f "$WORK/ray-site/ray/__init__.py" ]; then
        [ -f "$RAY_SITE" ] || { log "Ray is not importable and there is no $RAY_SITE (lab/tune-ray.sh pack)"; exit 2; }
        mkdir -p "$WORK/ray-site"
        tar -xJf "$RAY_SITE" -C "$WORK/ray-site"
    fi
    export PYTHONPATH=$WORK/ray-site${PYTHONPATH:+:$PYTHONPATH}
    $PY -c 'import ray' || { log "Ray from $RAY_SITE does not import with $($PY --version)"; exit 2; }
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}  # the Ray workers import the tuner from here too
log "ray $($PY -c 'import ray; print(ray.__version__)')"

NEED_TBO=0
# shellcheck source=lab/tune-common.sh
source "$REPO/lab/tune-common.sh"

if [ "$DEVICE" = CPU ]; then
    GPUS=${RAY_CPUS:-$(nproc)}  # Ray's local cluster takes every CPU; RAY_ADDRESS another cluster
    RES=CPU=1
    ONE=()
else
    GPUS=$(nvidia-smi -L | grep -c '^GPU')
    RES=GPU=1
    ONE=(env "CUDA_VISIBLE_DEVICES=${ONE_GPU:-0}")
    nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv >>"$LOG" 2>&1 || true
fi
log "$GPUS $( [ "$DEVICE" = CPU ] && echo "CPU slots" || echo GPUs) for the Ray sweep"

# phase NAME ARGS...: one `tune run` of the census (resumed from its journal), its wall time logged
phase() {
    local name=$1
    shift
    [ -f "$WORK/$name.complete" ] && { log "$name sweep: complete in an earlier call"; return 0; }
    local left=$(( BUDGET_S - ($(date +%s) - T0) - 15 ))
    [ "$left" -gt 30 ] || { log "only ${left} s left: run again on the warm machine"; exit 3; }
    log "$name sweep: at most ${left} s"
    local t0 ms rc=0
    t0=$(date +%s%N)
    : >"$WORK/$name.err"
    "$@" "$PY" -c 'from ggml_dispatch.cli import main; main()' tune run "$CENSUS" --llama-cpp "$TREE" \
        --harness "$HARNESS" -o "$WORK/tuning-$name.parquet" --journal "$WORK/tuning-$name.journal.jsonl" \
        --coverage "${COVERAGE:-0.95}" --trials "${TRIALS:-7}" --max-seconds "$left" ${TUNE_ARGS:-} \
        "${EXTRA[@]}" 2>&1 | tee -a "$LOG" "$WORK/$name.err" >&2 || rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '{"phase": "%s", "wall_s": %d.%03d, "rc": %d}\n' "$name" $((ms / 1000)) $((ms % 1000)) "$rc" \
        >>"$WORK/phases.jsonl"
    cp "$WORK/tuning-$name.journal.jsonl" "$WORK/tuning-$name.parquet" "$OUT/" 2>/dev/null || true
    [ "$rc" -eq 0 ] || { log "$name sweep: tune run exit $rc"; exit "$rc"; }
    if grep -q "stopped by --max-seconds" "$WORK/$name.err"; then
        log "$name sweep stopped by the budget: run again on the warm machine"
        exit 3
    fi
    touch "$WORK/$name.complete"
}

EXTRA=(--executor ray --ray-resources "$RES")
[ -z "${RAY_ADDRESS:-}" ] || EXTRA+=(--address "$RAY_ADDRESS")
phase multi
EXTRA=(--device "$DEVICE")
[ "$DEVICE" = CPU ] || EXTRA=(--device CUDA0)
phase single "${ONE[@]}"

"$PY" -m ggml_dispatch.tuner.executor_spread "$WORK/tuning-multi.parquet" "$WORK/tuning-single.parquet" \
    --multi-journal "$WORK/tuning-multi.journal.jsonl" --single-journal "$WORK/tuning-single.journal.jsonl" \
    --phases "$WORK/phases.jsonl" --gpus "$GPUS" >"$OUT/summary.json"
GD=("$PY" -c 'from ggml_dispatch.cli import main; main()')
if [ "$DEVICE" = CPU ]; then
    log "decisions: not compared (codegen takes a GPU's rows; the CPU backend measures stock only)"
else
    for name in multi single; do
        "${GD[@]}" codegen "$WORK/tuning-$name.parquet" --census "$CENSUS" -o "$WORK/table-$name" >>"$LOG" 2>&1
    done
    rc=0
    "${GD[@]}" diff "$WORK/table-single/table.json" "$WORK/table-multi/table.json" --exit-code \
        >"$OUT/decisions.txt" 2>&1 || rc=$?
    log "decisions: $( [ "$rc" -eq 0 ] && echo identical || echo "DIFFER (diff exit $rc, $OUT/decisions.txt)")"
fi
"$PY" - "$OUT/summary.json" <<'EOF' | tee -a "$LOG"
import json, sys
s = json.load(open(sys.argv[1]))
c = s["cost"]
print(f"multi: {c['multi_wall_s']:.0f} s wall on {c['gpus']} GPUs ({c['multi_device_s']:.0f} device-s); "
      f"single: {c['single_wall_s']:.0f} s; wall / (single / n) = {c['wall_over_ideal']:.2f} "
      f"(target <= {c['target']}: {'met' if c['target_met'] else 'NOT met'})")
for gpu, g in s["spread"]["per_gpu"].items():
    print(f"  {gpu or '(no uuid)'}: {g['cases']} timings, ratio to one GPU median {g['median_ratio']:.3f} "
          f"[{g['min_ratio']:.3f}, {g['max_ratio']:.3f}], {g['agree_within_noise']} within their trial noise")
EOF
log "done in $(( $(date +%s) - T0 )) s"
