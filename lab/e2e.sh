#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# End-to-end on the GPU machine, with the project's own commands only:
#   models  real-dimension models: SmolLM2 rebuilt from its metadata; llama at Llama-3-8B dimensions,
#           4 and 16 layers, Q4_K_M; qwen3 at the seed workload's dense shapes (hidden 5120, FFN 17408,
#           head dim 256, 24/4 heads), 4 layers, a Q5_K/Q6_K/Q8_0 mix (random weights, llama-quantize);
#   trace   llama-bench with GGML_CUDA_ROUTE_TRACE, FlashAttention on: decode (tg), M = 2,3,4,8,16,
#           prefill micro-batches M = 128..2048 (pp2048 at -ub 128..2048);
#   census  ggml-dispatch census ingest (per model and all together);
#   tune    ggml-dispatch tune run on the census (prebuilt ggml, --max-seconds TUNE_SECONDS);
#   ab      llama-bench A/B, interleaved pairs: stock (GGML_CUDA_DISPATCH=off), the measured table,
#           the crude rule (a one-rule table compiled into a second build); AB_PAIRS pairs of AB_REPS
#           llama-bench repetitions each, run by `ggml-dispatch ab` (ggml-dispatch-ab/1 records with
#           each run's command, start-up line, library sha256, GPU and time);
#   profile kernel timelines (CUPTI, ggml_dispatch/report/native/kernel_timeline.cpp, carried prebuilt as
#           .carry/libkernel_timeline.so with .carry/libcupti.so.13) of PROFILE_MODEL for each arm:
#           pp2048 at every ubatch and tg128, one llama-bench process per test, PROFILE_REPS repetitions;
#           read by `ggml-dispatch report --profile` (matmul share, other kernels, idle gaps).
#
# Run from the repository root on the device machine:
#   OUT=<dir> PARTS=models,trace,census,tune [TUNE_SECONDS=240] lab/e2e.sh
#   OUT=<dir> PARTS=models,ab,profile [AB_PAIRS=5] [AB_REPS=1] [E2E_MODELS="llama8b-L4 llama8b-L16"] lab/e2e.sh
#   (A/B knobs: AB_MODELS, AB_PP=1 with AB_PROMPTS=512,2048 and AB_UBATCH=128,256,512,2048, AB_TG=1 for tg128)
# Inputs in .carry/ (make device-carry): llama.cpp.tar.xz (trimmed pinned tree) or gguf-py.tar.xz,
# smollm2.meta.gguf, bin-patched.tar.xz (patched build: no table), and for ab/profile table.delta and
# crude.delta (the same tree with the measured table / `ggml-dispatch codegen-crude`'s table compiled
# in, as binary deltas: lab/prebuild.sh, lab/prebuilt.sh).
# Writes under $OUT (<= 8 files) and prints summary.md last.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
WORK=${WORK:-$REPO/build/e2e}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
LOG=$OUT/run.log
: >>"$LOG"
PARTS=${PARTS:-models,trace,census,tune}
PY=${PYTHON:-python3}
T0=$(date +%s)
log() { echo "e2e [$(( $(date +%s) - T0 ))s]: $*" | tee -a "$LOG" >&2; }
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }
SUMMARY=$OUT/summary.md
: >"$SUMMARY"

SRC=$WORK/llama.cpp
if [ ! -f "$SRC/ggml/include/ggml.h" ]; then
    if [ -f .carry/llama.cpp.tar.xz ]; then
        tar -xJf .carry/llama.cpp.tar.xz -C "$WORK"
    elif [ -f .carry/gguf-py.tar.xz ]; then  # models, ab and profile need only the tree's gguf-py (make device-gguf-py-carry)
        mkdir -p "$SRC" && tar -xJf .carry/gguf-py.tar.xz -C "$SRC"
    fi
fi
export PYTHONPATH=$REPO:$SRC/gguf-py
dispatch() { $PY -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }

source "$REPO/lab/cuda-env.sh"
unpack_bin() {  # $1 = patched | table | crude -> $WORK/bin-$1 (lab/prebuild.sh's builds)
    bash "$REPO/lab/prebuilt.sh" "$1" "$WORK/bin-$1" >&2
    echo "$WORK/bin-$1"
}
PATCHED=$(unpack_bin patched)
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
    >>"$LOG" 2>&1 || true

M=$WORK/models
mkdir -p "$M"
MODELS=(smollm2 llama8b-L4 llama8b-L16 qwen27b-L4)
if has_part models; then
    if [ ! -f "$M/smollm2.gguf" ]; then
        $PY -m lab.models clone .carry/smollm2.meta.gguf -o "$M/smollm2.gguf" >>"$LOG" 2>&1
        log "smollm2 rebuilt"
    fi
    quant() {  # $1 = name, $2 = preset, $3 = layers, $4 = llama-quantize type, rest = llama-quantize options
        local name=$1 preset=$2 layers=$3 qtype=$4
        shift 4
        [ -f "$M/$name.gguf" ] && return 0
        $PY -m lab.models dense --preset "$preset" --layers "$layers" \
            --tokenizer-from .carry/smollm2.meta.gguf -o "$M/$name.f16.gguf" >>"$LOG" 2>&1
        LD_LIBRARY_PATH=$PATCHED:$LD_LIBRARY_PATH "$PATCHED/llama-quantize" "$@" "$M/$name.f16.gguf" "$M/$name.gguf" \
            "$qtype" "$(nproc)" >>"$LOG" 2>&1
        rm -f "$M/$name.f16.gguf"
        log "$name: $(du -m "$M/$name.gguf" | cut -f1) MiB"
    }
    wanted() { [[ " ${E2E_MODELS:-${MODELS[*]}} " == *" $1 "* ]]; }
    wanted llama8b-L4 && quant llama8b-L4 llama8b 4 Q4_K_M &
    wanted qwen27b-L4 && quant qwen27b-L4 qwen27b 4 Q5_K_M --tensor-type attn_q=q8_0 --tensor-type attn_k=q8_0 \
        --tensor-type attn_v=q8_0 --tensor-type attn_output=q8_0 --tensor-type ffn_down=q6_K --output-tensor-type q6_K &
    wait
    if wanted llama8b-L16; then quant llama8b-L16 llama8b 16 Q4_K_M; fi
fi

# TRACE_FA=off: a second census without FlashAttention (attention runs as MUL_MATs there)
BENCH=(-ngl 99 -fa "${TRACE_FA:-on}" -r 1 -b 2048 -o jsonl)
if has_part trace; then
    mkdir -p "$WORK/traces"
    for name in "${MODELS[@]}"; do
        t=$WORK/traces/$name
        # decode, speculative verify and small batches, prefill micro-batches: one process each
        GGML_CUDA_ROUTE_TRACE=$t.tg.jsonl LD_LIBRARY_PATH=$PATCHED:$LD_LIBRARY_PATH "$PATCHED/llama-bench" -m "$M/$name.gguf" \
            "${BENCH[@]}" -p 0 -n 128 >>"$WORK/bench-trace.jsonl" 2>>"$LOG"
        GGML_CUDA_ROUTE_TRACE=$t.small.jsonl LD_LIBRARY_PATH=$PATCHED:$LD_LIBRARY_PATH "$PATCHED/llama-bench" -m "$M/$name.gguf" \
            "${BENCH[@]}" -p 2,3,4,8,16 -n 0 -ub 512 >>"$WORK/bench-trace.jsonl" 2>>"$LOG"
        GGML_CUDA_ROUTE_TRACE=$t.pp.jsonl LD_LIBRARY_PATH=$PATCHED:$LD_LIBRARY_PATH "$PATCHED/llama-bench" -m "$M/$name.gguf" \
            "${BENCH[@]}" -p 2048 -n 0 -ub 128,256,512,1024,2048 >>"$WORK/bench-trace.jsonl" 2>>"$LOG"
        log "traced $name"
    done
    tar -czf "$OUT/traces.tar.gz" -C "$WORK/traces" .
fi

if has_part census; then
    all=()
    for name in "${MODELS[@]}"; do
        dispatch census ingest "$WORK"/traces/"$name".*.jsonl --gguf "$M/$name.gguf" \
            -o "$WORK/census-$name.parquet" >>"$LOG" 2>&1
        all+=("$WORK"/traces/"$name".*.jsonl)
    done
    # the table's census: every model's shapes together (the gguf join is per model above)
    dispatch census ingest "${all[@]}" -o "$OUT/census.parquet" >>"$LOG" 2>&1
    {
        echo "## census (all models)"
        echo '```'
        dispatch census show "$OUT/census.parquet" 2>&1 | head -60
        echo '```'
    } >>"$SUMMARY"
    log "census done"
fi

if has_part tune; then
    CENSUS=${CENSUS:-$OUT/census.parquet}
    [ -f "$CENSUS" ] || { log "tune needs a census (the census part, or CENSUS=...)"; exit 2; }
    # the tree the prebuilt libraries came from: install the hook so the harness sees its stamp
    dispatch install --llama-cpp "$SRC" >>"$LOG" 2>&1
    mkdir -p "$WORK/prebuilt/bin"
    cp -a "$PATCHED"/*.so* "$WORK/prebuilt/bin/"
    # the carried libraries have no RUNPATH: the harness finds libggml-cpu/-cuda through the loader path
    export LD_LIBRARY_PATH=$WORK/prebuilt/bin:$LD_LIBRARY_PATH
    set +e
    dispatch tune run "$CENSUS" --llama-cpp "$SRC" --build-dir "$WORK/prebuilt" \
        -o "$OUT/tuning.parquet" --journal "$OUT/tuning.journal.jsonl" \
        --max-seconds "${TUNE_SECONDS:-240}" --case-timeout 90 ${TUNE_ARGS:-} >>"$LOG" 2>&1
    echo "tune_rc=$?" >>"$LOG"
    set -e
    {
        echo "## tuning"
        $PY - "$OUT/tuning.parquet" <<'EOF'
import sys

import pandas as pd

t = pd.read_parquet(sys.argv[1])
print(f"rows {len(t)}, shapes {t.groupby(['src0_type', 'N', 'K']).ngroups}, Ms {sorted(t.M.unique())}")
print(t.groupby("status").size().to_string())
ok = t[t.status == "ok"]
g = ok.groupby(["src0_type", "N", "K", "M", "route"]).us.median().unstack("route")
print(g.round(1).to_string())
EOF
    } >>"$SUMMARY" 2>>"$LOG" || true
    log "tune done"
fi

arm_env() {  # $1 = stock | table | crude -> "dir mode": the build and GGML_CUDA_DISPATCH of that arm
    case $1 in
        stock) echo "$TABLE off" ;;
        table) echo "$TABLE table" ;;
        crude) echo "$CRUDE table" ;;
    esac
}
if has_part ab || has_part profile; then
    TABLE=$(unpack_bin table)
    CRUDE=$(unpack_bin crude)
fi

if has_part ab; then
    # the package runner (ggml-dispatch ab, ggml_dispatch/report/abrun.py): interleaved pairs, one ggml-dispatch-ab/1
    # record per test of each run, with its command, GGML_* environment, start-up line, library, GPU, time
    AB=$OUT/ab.jsonl
    rm -f "$AB"
    bench=()
    if [ "${AB_PP:-1}" = 1 ]; then
        IFS=, read -r -a prompts <<<"${AB_PROMPTS:-512,2048}"
        for p in "${prompts[@]}"; do  # pp512 at ubatch 512 only, longer prompts at every AB_UBATCH
            ub=${AB_UBATCH:-128,256,512,2048}
            [ "$p" = 512 ] && ub=512
            bench+=(--bench "-ngl 99 -fa on -b 2048 -p $p -ub $ub -n 0")
        done
    fi
    [ "${AB_TG:-1}" = 1 ] && bench+=(--bench "-ngl 99 -fa on -p 0 -n 128")
    models=()
    for name in ${AB_MODELS:-llama8b-L4 llama8b-L16}; do models+=(--model "$name=$M/$name.gguf"); done
    dispatch ab --arm "stock=$TABLE/llama-bench:off" --arm "table=$TABLE/llama-bench:table" \
        --arm "crude=$CRUDE/llama-bench:table" "${models[@]}" "${bench[@]}" \
        --pairs "${AB_PAIRS:-5}" --reps "${AB_REPS:-1}" --log "$WORK/ab-runs.log" -o "$AB" 2>>"$LOG"
    log "ab: $(wc -l <"$AB") records"
fi

if has_part profile; then
    P=$WORK/profile
    mkdir -p "$P"
    KT=$REPO/.carry/libkernel_timeline.so
    name=${PROFILE_MODEL:-llama8b-L16}
    for arm in stock table crude; do
        read -r dir mode <<<"$(arm_env "$arm")"
        for test in 128 256 512 2048 tg128; do
            if [ "$test" = tg128 ]; then args=(-p 0 -n 128); else args=(-p 2048 -n 0 -b 2048 -ub "$test"); fi
            KERNEL_TIMELINE_OUT=$P/$arm.$test.ktl CUDA_INJECTION64_PATH=$KT GGML_CUDA_DISPATCH=$mode \
                LD_LIBRARY_PATH=$dir:$LD_LIBRARY_PATH:$REPO/.carry "$dir/llama-bench" -m "$M/$name.gguf" -ngl 99 -fa on \
                -r "${PROFILE_REPS:-3}" -o jsonl "${args[@]}" >"$P/$arm.$test.jsonl" 2>>"$LOG"
        done
        log "profiled $arm"
    done
    echo "model $name reps ${PROFILE_REPS:-3}" >"$P/README"
    tar -czf "$OUT/profile.tar.gz" -C "$P" .
    {
        echo "## profile"
        for f in "$P"/*.ktl; do echo "$(basename "$f") $(grep -c '^K' "$f") kernels, $(tail -1 "$f")"; done
    } >>"$SUMMARY"
fi

log "done"
cat "$SUMMARY"
