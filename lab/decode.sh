#!/usr/bin/env bash
# Lab script (GPU machine): decode and speculative-verify launch shapes (issue #51), features mmvq_params and
# mmvf_params. Carry: .carry/llama.cpp.tar.xz and .carry/smollm2.meta.gguf (make device-integration-carry).
# Two calls on one warm machine (WORK under build/, kept between calls while the machine is warm; $OUT is the
# device tool's output folder, empty at each call):
#   OUT=$OUT PARTS="build tbo" bash lab/decode.sh
#   OUT=$OUT PARTS="tbo models census tune table ab" bash lab/decode.sh
# Parts:
#   build   the pinned tree with the hook, every mmvq candidate compiled for the models' weight types
#           (MMVQ_TYPES) and q4_0; cmake + build test-backend-ops, llama-bench, llama-quantize for sm_90
#   tbo     upstream test-backend-ops for MUL_MAT at M <= 8 (-p ',n=[1-8],': the cases the vector kernels
#           run) with the hook's stock, GGML_CUDA_DISPATCH=off, force:mmvq, each mmvq candidate and each
#           mmvf block size forced; a route trace each; $OUT/tbo-summary.tsv (op, mode, exit code,
#           passed/total, FAIL lines, seconds). Resumes: modes already in the summary are not run again
#   models  the 16-layer Llama-3-8B-dimension Q4_K_M model and the 4-layer seed-shape qwen3 model (Q5_K
#           with q8_0 attention, q6_K ffn_down and output), random weights (lab/models.py, llama-quantize)
#   census  the declared decode workload of each model (census from-gguf --m 1,2,3,4,8)
#   tune    tune run on each census, merged: candidates mmvq and mmvf (stock is every point's anchor), every
#           census M of a shape, screened after the first trial at 1.3 x the best (--race-screen),
#           TUNE_SECONDS per model
#   table   codegen -> table.json, installed into the tree and rebuilt (ggml-dispatch.cu only, when warm)
#   ab      tg128 on both models, stock (GGML_CUDA_DISPATCH=off) vs the table, AB_PAIRS interleaved pairs
#           (ggml-dispatch ab: ggml-dispatch-ab/1 records with 95% CIs in the report)
# Writes under $OUT: run.log, gpu.txt, install-check.json, tbo-summary.tsv, tbo-routes.tsv, tbo-logs.tar.gz,
# census-<model>.parquet, tuning-<model>.parquet (+ journals), tuning.parquet, table/, ab.jsonl, summary.md.
# Then, here:
#   ggml-dispatch report --tuning OUT/tuning.parquet --table OUT/table/table.json --ab OUT/ab.jsonl -o OUT/report
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/out/decode}
WORK=${WORK:-$REPO/build/decode}
PARTS=${PARTS:-build tbo}
JOBS=${JOBS:-$(nproc)}
MMVQ_TYPES=${MMVQ_TYPES:-q4_0,q4_K,q5_K,q6_K,q8_0}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/run.log
T0=$(date +%s)
log() { echo "decode [$(( $(date +%s) - T0 ))s]: $*" | tee -a "$LOG" >&2; }
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
PY=${PYTHON:-python3}
SRC=$WORK/llama.cpp
BUILD=$WORK/build
BIN=$BUILD/bin
M=$WORK/models
export PYTHONPATH=$REPO:$SRC/gguf-py
dispatch() { $PY -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
# shellcheck source=lab/cuda-env.sh
source "$REPO/lab/cuda-env.sh"
SUMMARY=$OUT/summary.md
touch "$SUMMARY"

build_tree() {  # cmake configure (once) + build; incremental where $BUILD is still there
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
        cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF >>"$LOG" 2>&1 || { log "configure failed"; tail -30 "$LOG"; exit 1; }
    fi
    cmake --build "$BUILD" --target test-backend-ops llama-bench llama-quantize -j "$JOBS" >>"$LOG" 2>&1 ||
        { log "build failed"; grep -m20 -B2 -A8 "error" "$LOG" | tail -60; exit 1; }
}

if has_part build; then
    if [ ! -f "$SRC/ggml/include/ggml.h" ]; then
        tar -xJf "$REPO/.carry/llama.cpp.tar.xz" -C "$WORK" || { log "no .carry/llama.cpp.tar.xz"; exit 1; }
    fi
    dispatch install --llama-cpp "$SRC" --mmvq-configs all --mmvq-types "$MMVQ_TYPES" >>"$LOG" 2>&1 ||
        { log "install failed"; tail -20 "$LOG"; exit 1; }
    dispatch install --llama-cpp "$SRC" --check --json >"$OUT/install-check.json" 2>>"$LOG"
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
    log "build (mmvq candidates: all x $MMVQ_TYPES)"
    build_tree
    log "build done"
    # each ggml-cuda unit's compile time (ninja's log: start and end ms) and object size: what the candidates
    # cost against the whole ggml-cuda build on this machine
    $PY - "$BUILD" >"$OUT/build-times.tsv" 2>>"$LOG" <<'EOF'
import pathlib, sys

build = pathlib.Path(sys.argv[1])
rows = {}
for line in (build / ".ninja_log").read_text().splitlines()[1:]:
    start, end, _, target, _ = line.split("\t")
    if "ggml-cuda" in target and target.endswith(".o"):
        rows[target] = (int(end) - int(start)) / 1000, (build / target).stat().st_size if (build / target).exists() else 0
total_s = sum(s for s, _ in rows.values())
total_b = sum(b for _, b in rows.values())
print("unit\tseconds\tbytes\tshare_s\tshare_bytes")
ranked = sorted(rows.items(), key=lambda kv: -kv[1][0])
for t, (sec, b) in [kv for i, kv in enumerate(ranked) if i < 12 or "/mmvq.cu" in kv[0] or "/mmvf.cu" in kv[0]]:
    print(f"{t}\t{sec:.1f}\t{b}\t{sec / total_s:.3f}\t{b / max(total_b, 1):.3f}")
print(f"all {len(rows)} ggml-cuda units\t{total_s:.1f}\t{total_b}\t1\t1")
EOF
    { echo "## ggml-cuda units by compile time"; echo '```'; column -t -s $'\t' "$OUT/build-times.tsv"; echo '```'; } >>"$SUMMARY"
fi

if has_part tbo; then
    TBO=$WORK/tbo
    mkdir -p "$TBO"
    TSUM=$WORK/tbo-summary.tsv  # in WORK: a later call on the warm machine resumes from it ($OUT starts empty)
    [ -f "$TSUM" ] || printf 'op\tmode\trc\tpassed\tFAIL_lines\tseconds\n' >"$TSUM"
    run_tbo() {  # $1 = stock | off | force:<config>, $2 = seconds it may take
        local mode=$1 limit=$2 env=table
        [ "$mode" = off ] && env=off
        [[ "$mode" == force:* ]] && env=$mode
        local name="MUL_MAT-${mode//[^A-Za-z0-9_=.-]/_}"
        local t
        t=$(date +%s)
        GGML_CUDA_DISPATCH=$env GGML_CUDA_ROUTE_TRACE=$TBO/trace-$name.jsonl \
            timeout "$limit" "$BIN/test-backend-ops" test -o MUL_MAT -b CUDA0 -p ',n=[1-8],' \
            >"$TBO/log-$name.txt" 2>&1
        local rc=$?
        if [ "$rc" = 124 ]; then  # out of time: not recorded, so the next call runs it again
            log "tbo: $mode ran out of its ${limit} s"
            return
        fi
        local pass fails
        pass=$(grep -Eo '[0-9]+/[0-9]+ tests passed' "$TBO/log-$name.txt" | tail -1)
        fails=$(grep -c 'FAIL' "$TBO/log-$name.txt")
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' MUL_MAT "$mode" "$rc" "${pass:-none}" "$fails" "$(( $(date +%s) - t ))" \
            >>"$TSUM"
    }
    modes=(stock off force:mmvq force:mmvf)
    for c in $($PY -c 'from ggml_dispatch import registry as r; print(" ".join(
            f"mmvq/nwarps={w},rows={x}" + (f",regs={g}" if g else "") for w, x, g in r.MMVQ_CANDIDATES))'); do
        modes+=("force:$c")
    done
    for b in $($PY -c 'from ggml_dispatch import registry as r; print(" ".join(map(str, r.MMVF_BLOCKS)))'); do
        modes+=("force:mmvf/block=$b")
    done
    running=0
    for m in "${modes[@]}"; do
        cut -f2 "$TSUM" | grep -qxF -- "$m" && continue  # done in an earlier call
        if [ "$running" -ge "${TBO_JOBS:-8}" ]; then wait -n; running=$((running - 1)); fi
        # within the call's time (TBO_UNTIL s after the script started): a run that cannot finish is left to
        # the next call rather than killed with the call
        left=$(( ${TBO_UNTIL:-540} - ($(date +%s) - T0) ))
        [ "$left" -lt 60 ] && { log "tbo: $m and later modes left for the next call"; break; }
        run_tbo "$m" "$(( left < ${TBO_TIMEOUT:-300} ? left : ${TBO_TIMEOUT:-300} ))" &
        running=$((running + 1))
    done
    wait
    cp "$TSUM" "$OUT/tbo-summary.tsv"
    tar -czf "$OUT/tbo-logs.tar.gz" -C "$TBO" .
    # every candidate ran where eligible: the nodes each forced run's trace counts per route and reason
    $PY - "$TBO" >"$OUT/tbo-routes.tsv" 2>>"$LOG" <<'EOF'
import collections, json, pathlib, sys

print("run\troute\treason\tnodes")
for f in sorted(pathlib.Path(sys.argv[1]).glob("trace-*.jsonl")):
    c = collections.Counter()
    for line in f.open(errors="replace"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "route":
            c[(r.get("config") or r.get("route"), r.get("reason"))] += int(r.get("count", 1))
    for (route, reason), n in sorted(c.items(), key=str):
        print(f"{f.stem[6:]}\t{route}\t{reason}\t{n}")
EOF
    { echo "## test-backend-ops MUL_MAT, M <= 8"; echo '```'; column -t -s $'\t' "$OUT/tbo-summary.tsv"; echo '```'; } >>"$SUMMARY"
    log "test-backend-ops: $(awk -F'\t' 'NR > 1 && ($3 != 0 || $5 != 0)' "$OUT/tbo-summary.tsv" | wc -l) run(s) not clean"
fi

MODELS=(llama8b-L16 qwen27b-L4)
if has_part models; then
    mkdir -p "$M"
    quant() {  # $1 = name, $2 = preset, $3 = layers, $4 = llama-quantize type, rest = llama-quantize options
        local name=$1 preset=$2 layers=$3 qtype=$4
        shift 4
        [ -f "$M/$name.gguf" ] && return 0
        $PY -m lab.models dense --preset "$preset" --layers "$layers" \
            --tokenizer-from .carry/smollm2.meta.gguf -o "$M/$name.f16.gguf" >>"$LOG" 2>&1
        "$BIN/llama-quantize" "$@" "$M/$name.f16.gguf" "$M/$name.gguf" "$qtype" "$JOBS" >>"$LOG" 2>&1
        rm -f "$M/$name.f16.gguf"
        log "$name: $(du -m "$M/$name.gguf" | cut -f1) MiB"
    }
    quant qwen27b-L4 qwen27b 4 Q5_K_M --tensor-type attn_q=q8_0 --tensor-type attn_k=q8_0 \
        --tensor-type attn_v=q8_0 --tensor-type attn_output=q8_0 --tensor-type ffn_down=q6_K --output-tensor-type q6_K &
    quant llama8b-L16 llama8b 16 Q4_K_M
    wait
fi

if has_part census; then
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    for name in "${MODELS[@]}"; do
        dispatch census from-gguf "$M/$name.gguf" --m 1,2,3,4,8 --gpu "$GPU" -o "$OUT/census-$name.parquet" >>"$LOG" 2>&1 ||
            { log "census of $name failed"; exit 1; }
        { echo "## census of $name (declared decode workload)"; echo '```'
          dispatch census show "$OUT/census-$name.parquet" 2>&1 | head -30; echo '```'; } >>"$SUMMARY"
    done
    log "census done"
fi

if has_part tune; then
    tunings=()
    for name in "${MODELS[@]}"; do  # one sweep per model's census, then merged
        dispatch tune run "$OUT/census-$name.parquet" --llama-cpp "$SRC" --build-dir "$BUILD" --routes mmvq,mmvf \
            --whole-shapes --coverage 1 -o "$OUT/tuning-$name.parquet" --journal "$OUT/tuning-$name.journal.jsonl" \
            --max-seconds "${TUNE_SECONDS:-100}" --case-timeout 60 --harness-arg=--race-screen=1.3 ${TUNE_ARGS:-} \
            >>"$LOG" 2>&1
        log "tune $name rc=$?"
        tunings+=("$OUT/tuning-$name.parquet")
    done
    dispatch tune merge "${tunings[@]}" -o "$OUT/tuning.parquet" >>"$LOG" 2>&1 || { log "tune merge failed"; exit 1; }
fi

if has_part table; then
    censuses=()
    for name in "${MODELS[@]}"; do censuses+=(--census "$OUT/census-$name.parquet"); done
    dispatch codegen "$OUT/tuning.parquet" "${censuses[@]}" -o "$OUT/table" >>"$LOG" 2>&1 ||
        { log "codegen failed"; tail -20 "$LOG"; exit 1; }
    dispatch install --llama-cpp "$SRC" --table "$OUT/table/table.json" >>"$LOG" 2>&1 ||
        { log "install of the table failed"; tail -20 "$LOG"; exit 1; }
    log "rebuild with the table ($(grep -c '"M_lo"' "$OUT/table/table.json") rules)"
    build_tree
    log "rebuild done"
fi

if has_part ab; then
    models=()
    for name in "${MODELS[@]}"; do models+=(--model "$name=$M/$name.gguf"); done
    dispatch ab --arm "stock=$BIN/llama-bench:off" --arm "table=$BIN/llama-bench:table" "${models[@]}" \
        --bench "-ngl 99 -fa on -p 0 -n 128" --pairs "${AB_PAIRS:-10}" --reps "${AB_REPS:-1}" \
        --log "$WORK/ab-runs.log" -o "$OUT/ab.jsonl" 2>>"$LOG"
    log "ab: $(wc -l <"$OUT/ab.jsonl") records"
fi

log "end"
cat "$SUMMARY"
