#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# The GPU proof of the weight cache (cublas/weight=cached, `codegen --vram-budget`). Reuses the tree and
# build of lab/autotune-verify.sh (build/at/llama.cpp, build/at/build-sys) when present, else unpacks
# .carry/llama.cpp.tar.xz and configures the build as autotune does. Each part is bounded by DEADLINE
# seconds from the script's start (default 540), leaves its state under build/at/cache/ for a next call
# on the still-warm machine, and fails loudly (exit != 0, the failing step's log tail on stderr).
#
#   PART=probe  install the hook (no table), build; lab/cache_probe.cpp (bit-equality, one copy for a
#               tensor used twice, adapter refused, set_tensor invalidation, buffer lifetime, a failed
#               allocation runs uncached); test-backend-ops -o MUL_MAT forced to the cached configuration
#               (GGML_CUDA_DISPATCH_CACHE_BUFFERS=any: its weights are not in WEIGHTS buffers) and to the
#               per-call one, and the cache's own log lines
#   PART=tune   tune run --configs cache on the committed census (tables/cuda-sm90-nvidia-h200), resumable
#               (journal); CENSUS_SHAPES="NxK ..." keeps only those weight shapes (e.g. the 8B-dimension
#               model's, which PART=ab runs); then codegen without a budget, with CACHE_BUDGET MiB (default
#               8192) and with 0 (must equal the first), and the crude rule's table
#   PART=ab     the 16-layer 8B-dimension Q4_K_M model (made here with lab.models + llama-quantize; AB_MODELS=
#               "llama8b-L16 qwen27b-L4" adds the qwen3 seed-shape model, whose shapes CENSUS_SHAPES must hold);
#               three builds (table without cache, table with cache, crude); llama-bench pp2048 at
#               ubatch AB_UBATCH (default 128,256,512) and tg128, arms stock / table / cached / crude through `ggml-dispatch
#               ab` (peak VRAM of each run from nvidia-smi, recorded per record), AB_PAIRS pairs
#               (default 3) of -r AB_REPS (default 2); then the A/B with GGML_CUDA_DISPATCH_CACHE=0 on
#               the cached build against the table build (budget 0 at run time = the table without cache;
#               AB_BUDGET0=0 skips it). AB_PREP_ONLY=1 stops after the models and builds. TABLE=a committed
#               table.json (tables/cuda-sm90-nvidia-h200/table.json) A/Bs that table instead, without PART=tune:
#               one build of it, arms stock (its build, dispatch off) / table / crude, no budget-0 A/B
#   PART=sanitize one case that the H200 sweeps lost to GGML_ASSERT(stat == cudaSuccess) after cudaGraphExecUpdate
#               (SANITIZE_CASE="type N K M", default "q4_K 4096 4096 128"; SANITIZE_ROUTES, default cuBLAS f32
#               and f16 output per call and from the cached copy; SANITIZE_TRIALS, default 3) run by the
#               harness alone, then under compute-sanitizer memcheck:
#               whether an earlier kernel faults (an error cudaGraphExecUpdate would then return) or not
#   PART=profile CUPTI kernel timelines (.carry/libkernel_timeline.so) of stock / table / cached at pp2048
#               ubatch 128/256/512 and tg128: where the time went (`ggml-dispatch report --profile`)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${PART:?set PART=probe|tune|ab|sanitize|profile}"
DEADLINE=${DEADLINE:-540}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
die() { echo "cache.sh: $*" >&2; exit 1; }
source lab/cuda-env.sh
W=$REPO/build/at
TREE=$W/llama.cpp
B=$W/build-sys
C=$W/cache
T=tables/cuda-sm90-nvidia-h200
unset CC CXX CUDAHOSTCXX  # see lab/autotune-verify.sh: the system compiler links libstdc++ shared
mkdir -p "$W" "$C"
if [ ! -f "$TREE/ggml/include/ggml.h" ]; then
    tar -xJf .carry/llama.cpp.tar.xz -C "$W" || die "no tree: .carry/llama.cpp.tar.xz"
fi
for d in pocs app; do [ -d "$TREE/$d" ] || { mkdir -p "$TREE/$d" && touch "$TREE/$d/CMakeLists.txt"; }; done
export PYTHONPATH=$REPO:$TREE/gguf-py PYTHONUNBUFFERED=1
gd() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version,memory.used,memory.total --format=csv >"$OUT/gpu-cache-$PART.csv" 2>&1

# install TABLE (or none) and build the targets; $1 = table.json or "", $2 = log name
build() {
    local table=$1 log=$C/build-$2.log
    if [ -n "$table" ]; then gd install --llama-cpp "$TREE" --table "$table" >"$log" 2>&1; else gd install --llama-cpp "$TREE" >"$log" 2>&1; fi ||
        { tail -20 "$log" >&2; die "install failed ($2)"; }
    if [ ! -f "$B/CMakeCache.txt" ]; then
        cmake -S "$TREE" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_FA=ON -DGGML_NATIVE=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >>"$log" 2>&1 ||
            { tail -20 "$log" >&2; die "cmake configure failed"; }
    fi
    timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target llama-bench test-backend-ops llama-quantize >>"$log" 2>&1 ||
        { tail -30 "$log" >&2; die "build failed ($2; a deadline stop resumes on the next call)"; }
}

# a copy of the build's binaries and libraries: $1 = name
keep_bin() {
    rm -rf "$C/bin-$1" && mkdir -p "$C/bin-$1" && cp -a "$B"/bin/llama-bench "$B"/bin/lib*.so* "$C/bin-$1/" || die "copy bin-$1"
}

case $PART in
probe)
    build "" probe
    g++ -std=c++17 -O2 -I"$TREE/ggml/include" -I"$TREE/ggml/src/ggml-cuda" lab/cache_probe.cpp -o "$C/cache_probe" \
        -L"$B/bin" -lggml -lggml-base -lggml-cuda -Wl,-rpath,"$B/bin" -Wl,--allow-shlib-undefined >"$C/probe-build.log" 2>&1 ||
        { tail -20 "$C/probe-build.log" >&2; die "cache_probe does not build"; }
    rc=0
    LD_LIBRARY_PATH=$B/bin:$LD_LIBRARY_PATH timeout "$(left)" "$C/cache_probe" >"$OUT/cache-probe.json" 2>"$OUT/cache-probe.log" || rc=$?
    cat "$OUT/cache-probe.json"
    for mode in cached per-call; do
        cfg="cublas/out=f16,compute=f16"; [ $mode = cached ] && cfg="$cfg,weight=cached"
        GGML_CUDA_DISPATCH="force:$cfg" GGML_CUDA_DISPATCH_CACHE_BUFFERS=any LD_LIBRARY_PATH=$B/bin:$LD_LIBRARY_PATH \
            timeout "$(left)" "$B/bin/test-backend-ops" -o MUL_MAT -b CUDA0 >"$OUT/tbo-mul-mat-$mode.log" 2>&1
        echo "test-backend-ops MUL_MAT $mode rc=$?" | tee -a "$OUT/cache-summary.txt"
        grep -E "tests passed|Backend CUDA0: " "$OUT/tbo-mul-mat-$mode.log" | tee -a "$OUT/cache-summary.txt"
        grep -c "FAIL" "$OUT/tbo-mul-mat-$mode.log" | sed "s/^/FAIL lines ($mode): /" | tee -a "$OUT/cache-summary.txt"
        grep -m3 "ggml_cuda_dispatch: weight cache" "$OUT/tbo-mul-mat-$mode.log" | tee -a "$OUT/cache-summary.txt"
    done
    [ $rc = 0 ] || die "cache_probe failed (rc $rc): $OUT/cache-probe.json"
    grep -q "Backend CUDA0: .*OK" "$OUT/tbo-mul-mat-cached.log" || die "test-backend-ops MUL_MAT with the cache forced did not pass"
    grep -q "ggml_cuda_dispatch: weight cache:" "$OUT/tbo-mul-mat-cached.log" || die "the cache made no copy under test-backend-ops"
    ;;
tune)
    build "" tune
    # resumable: a second call re-reads the journal and measures only the cases left
    [ "$(left)" -gt 120 ] || die "no time left for the sweep: call PART=tune again"
    rm -f "$C/tuning.parquet"
    CENSUS=$T/census.parquet
    if [ -n "${CENSUS_SHAPES:-}" ]; then
        # the rows of the named (N, K) only; the file's metadata (trace hashes, versions) is kept
        python3 - "$CENSUS" "$C/census.parquet" $CENSUS_SHAPES <<'EOF' || die "CENSUS_SHAPES filter failed"
import sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
keep = {tuple(int(x) for x in s.split("x")) for s in sys.argv[3:]}
out = t.filter([(n, k) in keep for n, k in zip(t["N"].to_pylist(), t["K"].to_pylist())])
pq.write_table(out, sys.argv[2])
print(f"census: {out.num_rows} of {t.num_rows} rows kept for {len(keep)} shapes", file=sys.stderr)
EOF
        CENSUS=$C/census.parquet
    fi
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        tune run "$CENSUS" --llama-cpp "$TREE" --build-dir "$B" --configs cache --routes mmq,cublas \
        --trials "${TUNE_TRIALS:-5}" --case-timeout 120 --journal "$C/tuning.journal.jsonl" \
        --max-seconds "$(( $(left) - 90 ))" -o "$C/tuning.parquet" 2>&1 | tail -30 | tee "$OUT/cache-tune.log"
    [ "${PIPESTATUS[0]}" = 0 ] || die "tune run failed or was killed: call PART=tune again to resume from its journal"
    cp "$C/tuning.journal.jsonl" "$OUT/cache-tuning.journal.jsonl"
    ! grep -q "stopped by --max-seconds" "$OUT/cache-tune.log" || die "the sweep is not finished: call PART=tune again (it resumes)"
    cp "$C/tuning.parquet" "$OUT/cache-tuning.parquet"
    BUDGET=${CACHE_BUDGET:-8192}
    for v in plain cached zero; do
        case $v in plain) extra=() ;; cached) extra=(--vram-budget "$BUDGET") ;; zero) extra=(--vram-budget 0) ;; esac
        rm -rf "$C/table-$v"
        gd codegen "$C/tuning.parquet" --census "$CENSUS" "${extra[@]}" -o "$C/table-$v" >"$OUT/codegen-$v.log" 2>&1 ||
            { tail -20 "$OUT/codegen-$v.log" >&2; die "codegen $v failed"; }
        cp "$C/table-$v/table.json" "$OUT/table-$v.json"
    done
    python3 - "$C/table-plain/table.json" "$C/table-zero/table.json" <<'EOF' || die "the budget-0 table differs from the table without the cache"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
sys.exit(0 if a["rules"] == b["rules"] and b.get("cache", {}).get("bytes", 0) == 0 else 1)  # budget 0: no cache section
EOF
    rm -rf "$C/table-crude"
    gd codegen-crude -o "$C/table-crude" >"$OUT/codegen-crude.log" 2>&1 || { tail -20 "$OUT/codegen-crude.log" >&2; die "codegen-crude failed"; }
    grep -E "weight cache|not cached" "$OUT/codegen-cached.log" | tee "$OUT/cache-plan.txt"
    ;;
ab)
    if [ -n "${TABLE:-}" ]; then
        # TABLE=a committed table.json (tables/cuda-sm90-nvidia-h200/table.json: every rule of the GPU, its
        # weight-cache rules under its own VRAM budget): its build is the arm `table` and, with the dispatch
        # off, `stock`; `crude` as below; no PART=tune needed
        [ -f "$TABLE" ] || die "no $TABLE"
        if [ ! -f "$C/table-crude/table.json" ]; then
            gd codegen-crude -o "$C/table-crude" >"$OUT/codegen-crude.log" 2>&1 || { tail -20 "$OUT/codegen-crude.log" >&2; die "codegen-crude failed"; }
        fi
        mkdir -p "$C/table-given" && cp "$TABLE" "$C/table-given/table.json"
        builds=(given crude)
        arms=(--arm "stock=$C/bin-given/llama-bench:off" --arm "table=$C/bin-given/llama-bench:table"
            --arm "crude=$C/bin-crude/llama-bench:table")
    else
        [ -f "$C/table-cached/table.json" ] || die "run PART=tune first (or TABLE=a committed table.json)"
        builds=(plain cached crude)
        arms=(--arm "stock=$C/bin-plain/llama-bench:off" --arm "table=$C/bin-plain/llama-bench:table"
            --arm "cached=$C/bin-cached/llama-bench:table" --arm "crude=$C/bin-crude/llama-bench:table")
    fi
    M=$W/models
    mkdir -p "$M"
    quant() {  # name preset layers type [llama-quantize options]; as lab/configs.sh makes them
        local name=$1 preset=$2 layers=$3 qtype=$4
        shift 4
        [ -f "$M/$name.gguf" ] && return 0
        [ -f "$W/smollm2.gguf" ] || python3 -m lab.models clone .carry/smollm2.meta.gguf -o "$W/smollm2.gguf" || die "smollm2 clone"
        [ -x "$B/bin/llama-quantize" ] || build "" quantize
        python3 -m lab.models dense --preset "$preset" --layers "$layers" --tokenizer-from "$W/smollm2.gguf" -o "$M/$name.f16.gguf" &&
            "$B/bin/llama-quantize" "$@" "$M/$name.f16.gguf" "$M/$name.gguf" "$qtype" "$(nproc)" >"$C/quantize.log" 2>&1 &&
            rm -f "$M/$name.f16.gguf" || { tail -20 "$C/quantize.log" >&2; die "model $name"; }
    }
    models=()
    AB_MODELS=${AB_MODELS:-llama8b-L16}
    for name in ${AB_MODELS//,/ }; do  # AB_MODELS="llama8b-L16 qwen27b-L4" (or with commas, for lab/chain.sh): the census needs both's shapes
        case $name in
        llama8b-L16) quant llama8b-L16 llama8b 16 Q4_K_M ;;
        qwen27b-L4) quant qwen27b-L4 qwen27b 4 Q5_K_M --tensor-type attn_q=q8_0 --tensor-type attn_k=q8_0 \
            --tensor-type attn_v=q8_0 --tensor-type attn_output=q8_0 --tensor-type ffn_down=q6_K --output-tensor-type q6_K ;;
        *) die "AB_MODELS: llama8b-L16 or qwen27b-L4, not $name" ;;
        esac
        models+=(--model "$name=$M/$name.gguf")
    done
    for v in "${builds[@]}"; do
        # a given table is built again each call (another TABLE= may have been built before)
        [ -x "$C/bin-$v/llama-bench" ] && [ "$v" != given ] || { build "$C/table-$v/table.json" "$v" && keep_bin "$v"; }
    done
    # AB_PREP_ONLY=1: models and builds only, so that a later call on the warm machine spends its time on the A/B
    [ -z "${AB_PREP_ONLY:-}" ] || { echo "part ab: models and builds ready (AB_PREP_ONLY) in $(($(date +%s) - START)) s"; exit 0; }
    AB=$OUT/ab-cache.jsonl
    bench=(--bench "-ngl 99 -fa on -b 2048 -p 2048 -ub ${AB_UBATCH:-128,256,512} -n 0" --bench "-ngl 99 -fa on -p 0 -n 128")
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        ab "${arms[@]}" "${models[@]}" "${bench[@]}" --pairs "${AB_PAIRS:-3}" --reps "${AB_REPS:-2}" \
        --vram --log "$C/ab-runs.log" -o "$AB" 2>&1 | tail -40 | tee "$OUT/ab-cache.log"
    [ "${PIPESTATUS[0]}" = 0 ] || die "A/B stopped (deadline or error); records so far in $AB"
    grep -h "ggml_cuda_dispatch: weight cache" "$C/ab-runs.log" | sort | uniq -c | tee "$OUT/ab-cache-lines.txt"
    # budget 0 at run time: the cached build must run what the table without the cache runs (AB_BUDGET0=0 skips it)
    [ "${AB_BUDGET0:-1}" = 0 ] || [ -n "${TABLE:-}" ] || timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        ab --arm "table=$C/bin-plain/llama-bench:table" --arm "cached=$C/bin-cached/llama-bench:table" \
        --arm-env "cached=GGML_CUDA_DISPATCH_CACHE=0" "${models[@]}" \
        --bench "-ngl 99 -fa on -b 2048 -p 2048 -ub 128,512 -n 0" --pairs 2 --reps 2 --vram -o "$OUT/ab-cache-budget0.jsonl" \
        2>&1 | tail -10 | tee "$OUT/ab-cache-budget0.log"
    python3 - "$AB" <<'EOF' | tee "$OUT/ab-cache-summary.txt"
import json, sys, statistics
from collections import defaultdict
acc = defaultdict(list); vram = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    acc[(r["test"], r["ubatch"], r["arm"])].append(r["tps"])
    if r.get("peak_vram_mib") is not None:
        vram[(r["test"], r["ubatch"], r["arm"])].append(r["peak_vram_mib"])
for k in sorted(acc):
    v = vram.get(k)
    print(*k, f"median {statistics.median(acc[k]):.1f} t/s", f"peak VRAM {max(v):.0f} MiB" if v else "peak VRAM n/a")
EOF
    ;;
sanitize)
    build "" sanitize
    H=$(gd tune build --llama-cpp "$TREE" --build-dir "$B" 2>"$C/harness-build.log" | tail -1)
    [ -x "$H" ] || { tail -20 "$C/harness-build.log" >&2; die "no harness"; }
    read -r ST SN SK SM <<<"${SANITIZE_CASE:-q4_K 4096 4096 128}"
    routes=${SANITIZE_ROUTES:-cublas/out=f32,compute=f16 cublas/out=f16,compute=f16 cublas/out=f32,compute=f16,weight=cached}
    routes_json=$(printf '"%s", ' $routes)
    printf '[{"case": "MUL_MAT:weight:%s:f32:N%s:K%s:B1:M%s", "op": "MUL_MAT", "layout": "weight", "src0_type": "%s", "src1_type": "f32", "M": %s, "N": %s, "K": %s, "B": 1, "trials": %s, "nmse_max": 0.0005, "routes": [%s]}]\n' \
        "$ST" "$SN" "$SK" "$SM" "$ST" "$SM" "$SN" "$SK" "${SANITIZE_TRIALS:-3}" "${routes_json%, }" >"$C/sanitize-case.json"
    cp "$C/sanitize-case.json" "$OUT/"
    LD_LIBRARY_PATH=$B/bin:$LD_LIBRARY_PATH timeout "$(left)" "$H" --cases "$C/sanitize-case.json" \
        >"$OUT/sanitize-plain.jsonl" 2>"$OUT/sanitize-plain.log"
    echo "harness alone: rc=$?" | tee "$OUT/sanitize-summary.txt"
    tail -5 "$OUT/sanitize-plain.log" | tee -a "$OUT/sanitize-summary.txt"
    LD_LIBRARY_PATH=$B/bin:$LD_LIBRARY_PATH timeout "$(left)" compute-sanitizer --tool memcheck --print-limit 20 \
        "$H" --cases "$C/sanitize-case.json" >"$OUT/sanitize-memcheck.jsonl" 2>"$OUT/sanitize-memcheck.log"
    echo "under memcheck: rc=$?" | tee -a "$OUT/sanitize-summary.txt"
    grep -E "Invalid|ERROR SUMMARY|GGML_ASSERT|Address" "$OUT/sanitize-memcheck.log" | head -20 | tee -a "$OUT/sanitize-summary.txt"
    ;;
profile)
    # CUPTI kernel timelines (ggml_dispatch/report/native/kernel_timeline.cpp) of one llama-bench process per arm and test,
    # read by `ggml-dispatch report --profile`: where the time goes with and without the cache
    KT=$REPO/.carry/libkernel_timeline.so
    [ -f "$KT" ] || die "no $KT (make device-carry builds it)"
    [ -x "$C/bin-cached/llama-bench" ] && [ -x "$C/bin-plain/llama-bench" ] || die "run PART=ab first (builds)"
    P=$C/profile
    rm -rf "$P" && mkdir -p "$P"
    for arm in stock table cached; do
        dir=$C/bin-plain mode=table
        [ $arm = stock ] && mode=off
        [ $arm = cached ] && dir=$C/bin-cached
        for test in 128 256 512 tg128; do
            [ "$(left)" -gt 30 ] || die "deadline: profile incomplete"
            if [ "$test" = tg128 ]; then args=(-p 0 -n 128); else args=(-p 2048 -n 0 -b 2048 -ub "$test"); fi
            KERNEL_TIMELINE_OUT=$P/$arm.$test.ktl CUDA_INJECTION64_PATH=$KT GGML_CUDA_DISPATCH=$mode \
                LD_LIBRARY_PATH=$dir:$LD_LIBRARY_PATH:$REPO/.carry "$dir/llama-bench" -m "$W/models/llama8b-L16.gguf" \
                -ngl 99 -fa on -r "${PROFILE_REPS:-2}" -o jsonl "${args[@]}" >"$P/$arm.$test.jsonl" 2>>"$C/profile.log" ||
                die "profile $arm $test failed"
        done
    done
    tar -czf "$OUT/profile-cache.tar.gz" -C "$P" .
    ;;
*)
    echo "unknown PART $PART" >&2
    exit 2
    ;;
esac
echo "part $PART done in $(($(date +%s) - START)) s"
