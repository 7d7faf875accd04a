#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# The MoE model on the lent GPU: the qwen3moe-a3b preset (Qwen3-30B-A3B dimensions, LAYERS layers, random
# weights with the INIT scales (default scaled: routing that stays spread, see lab/models.py), Q4_K_M),
# its MUL_MAT_ID route trace with tokens-per-expert statistics, the census, and the
# MUL_MAT_ID harness cases under every routing kind. Reuses lab/autotune-verify.sh's tree build/at/llama.cpp
# and build dir build/at/build-sys when present (configures that build dir if it is not). Each part is
# bounded by DEADLINE seconds after the script starts (default 540) and resumable on a warm machine; each
# packs what it has into $OUT. Needs .carry/llama.cpp.tar.xz and .carry/smollm2.meta.gguf.
#
#   PART=model    build llama-quantize + llama-bench (stock: no table), write the F16 model, quantize
#   PART=trace    llama-bench pp2048 at ubatch 128 and 512 and tg128 (FA on) with GGML_CUDA_ROUTE_TRACE,
#                 then census ingest (MUL_MAT_ID rows keyed by routing bucket)
#   PART=tune     `tune run` on the census' MUL_MAT_ID rows: each point under the routing kinds trace,
#                 uniform, skewed, few, every MUL_MAT_ID configuration a candidate; rows with E, U, routing kind and
#                 the measured bucket (resumable: the journal stays under build/at/moe; TRIALS, COVERAGE;
#                 ONLY: `;`-separated `tune run --only` patterns for a focused sweep, e.g. '*split=2j_fused')
#   PART=table    `codegen` on that tuning file: routing-0 MUL_MAT_ID rules where a configuration is
#                 harmless in every bucket and passes in one, the per-bucket winners (table.json routing_buckets) printed and packed, and
#                 the in-sample check (codegen.loo: table time vs the per-point best at every bucket's point)
#   PART=ab       install that table, rebuild llama-bench (only the dispatch source changes), and the A/B
#                 stock (GGML_CUDA_DISPATCH=off) vs table with `ggml-dispatch ab`: pp2048 at ubatch 128 and
#                 512 and tg128, FA on, AB_PAIRS (default 8) interleaved pairs of -r AB_REPS (default 3),
#                 each record carrying its applied table hash (--expect-table: the table arm must apply
#                 exactly this table); the other parts reinstall the tree without a table
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${PART:?set PART=model|trace|tune|table|ab}"
DEADLINE=${DEADLINE:-540}
LAYERS=${LAYERS:-8}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
die() { echo "moe.sh: $*" >&2; exit 1; }
source lab/cuda-env.sh
W=$REPO/build/at
TREE=$W/llama.cpp
B=$W/build-sys
INIT=${INIT:-scaled}  # lab/models.py Dims.init; "flat": random weights whose routing concentrates on a few experts
NAME=qwen3moe-a3b-L$LAYERS
[ "$INIT" = flat ] || NAME=$NAME-$INIT
MODEL=$W/models/$NAME.gguf
unset CC CXX CUDAHOSTCXX  # see lab/autotune-verify.sh: the image's static-libstdc++ g++ breaks the harness
mkdir -p "$W/models" "$W/moe"
if [ ! -f "$TREE/ggml/include/ggml.h" ]; then
    [ -f .carry/llama.cpp.tar.xz ] || die "no .carry/llama.cpp.tar.xz (make llama-tarball)"
    tar -xJf .carry/llama.cpp.tar.xz -C "$W" || die "cannot unpack the tree"
fi
for d in pocs app; do [ -d "$TREE/$d" ] || { mkdir -p "$TREE/$d" && touch "$TREE/$d/CMakeLists.txt"; }; done
export PYTHONPATH=$REPO:$TREE/gguf-py PYTHONUNBUFFERED=1
gd() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version,memory.used --format=csv >"$OUT/gpu-moe-$PART.csv" 2>&1

stock_build() {  # the hooked tree without a table, llama-bench and llama-quantize built
    gd install --llama-cpp "$TREE" >&2 || die "install failed"
    if [ ! -f "$B/CMakeCache.txt" ]; then
        cmake -S "$TREE" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=OFF \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
            >"$W/moe/configure.log" 2>&1 || { tail -20 "$W/moe/configure.log"; die "configure failed"; }
    fi
    timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target llama-bench llama-quantize >"$W/moe/build.log" 2>&1 ||
        { tail -20 "$W/moe/build.log"; die "build failed or ran out of time (run the part again on the warm machine)"; }
}

case $PART in
model)
    stock_build
    if [ ! -f "$MODEL" ]; then
        [ -f "$W/smollm2.gguf" ] || python3 -m lab.models clone .carry/smollm2.meta.gguf -o "$W/smollm2.gguf" ||
            die "clone of the tokenizer model failed"
        python3 -m lab.models dense --preset qwen3moe-a3b --init "$INIT" --layers "$LAYERS" --tokenizer-from "$W/smollm2.gguf" \
            -o "$W/models/$NAME.f16.gguf" || die "writing the F16 model failed"
        timeout "$(left)" "$B/bin/llama-quantize" "$W/models/$NAME.f16.gguf" "$MODEL.part" Q4_K_M >"$W/moe/quantize.log" 2>&1 ||
            { tail -20 "$W/moe/quantize.log"; rm -f "$MODEL.part"; die "llama-quantize failed"; }
        mv "$MODEL.part" "$MODEL" && rm -f "$W/models/$NAME.f16.gguf"
    fi
    ls -l "$MODEL" | tee "$OUT/moe-model.txt"
    python3 -c "import gguf,sys; r=gguf.GGUFReader(sys.argv[1]); print({t.name: (list(map(int,t.shape)), t.tensor_type.name) for t in r.tensors if 'blk.0.ffn' in t.name})" "$MODEL" | tee -a "$OUT/moe-model.txt"
    ;;
trace)
    [ -f "$MODEL" ] || die "no model: run PART=model first"
    stock_build
    T=$W/moe/trace.jsonl
    rm -f "$T"
    for ub in 128 512; do
        GGML_CUDA_ROUTE_TRACE=$T.pp$ub timeout "$(left)" "$B/bin/llama-bench" -m "$MODEL" -p 2048 -n 0 -ub "$ub" -fa 1 -r 1 \
            -o jsonl >"$W/moe/bench-pp-ub$ub.jsonl" 2>"$W/moe/bench-pp-ub$ub.log" || { tail -20 "$W/moe/bench-pp-ub$ub.log"; die "llama-bench pp ub $ub failed"; }
    done
    GGML_CUDA_ROUTE_TRACE=$T.tg timeout "$(left)" "$B/bin/llama-bench" -m "$MODEL" -p 0 -n 128 -fa 1 -r 1 \
        -o jsonl >"$W/moe/bench-tg.jsonl" 2>"$W/moe/bench-tg.log" || { tail -20 "$W/moe/bench-tg.log"; die "llama-bench tg failed"; }
    gd census ingest "$T.pp128" "$T.pp512" "$T.tg" --gguf "$MODEL" -o "$W/moe/census.parquet" 2>&1 | tail -20 | tee "$OUT/moe-census.log"
    [ -f "$W/moe/census.parquet" ] || die "census ingest failed"
    grep -c '"experts"' "$T.pp512" | sed 's/^/MUL_MAT_ID records with statistics (pp ub 512): /' | tee -a "$OUT/moe-census.log"
    [ "$(grep -c '"experts"' "$T.pp512")" -gt 0 ] || die "the trace has no MUL_MAT_ID statistics"
    python3 -c "
import sys; from ggml_dispatch.artifacts import census
rows = [r for r in census.read(sys.argv[1]).rows() if r['op'] == 'MUL_MAT_ID']
for r in sorted(rows, key=lambda r: (r['M'], r['tensor']))[:60]:
    print(r['tensor'], r['src0_type'], 'M', r['M'], 'N', r['N'], 'K', r['K'], 'E', r['E'], 'U', r['U'], 'route', r['route'],
          'routing', r['routing'], 'nonempty %.1f max %.1f cv %.2f' % (r['experts_nonempty'] or 0, r['tokens_max'] or 0, r['tokens_cv'] or 0),
          'est_us %.0f' % r['est_us'])
" "$W/moe/census.parquet" | tee -a "$OUT/moe-census.log"
    tar -czf "$OUT/moe-trace.tar.gz" -C "$W/moe" trace.jsonl.pp128 trace.jsonl.pp512 trace.jsonl.tg census.parquet \
        bench-pp-ub128.jsonl bench-pp-ub512.jsonl bench-tg.jsonl
    ;;
tune)
    [ -f "$W/moe/census.parquet" ] || die "no census: run PART=trace first"
    stock_build
    # only the MUL_MAT_ID rows: the dense sweeps tune the MUL_MAT rows (written once: the journal of a
    # resumed sweep keys on this file's hash)
    [ -f "$W/moe/census-moe.parquet" ] ||
        python3 - "$W/moe/census.parquet" "$W/moe/census-moe.parquet" <<'PY' || die "no MUL_MAT_ID rows in the census"
import sys
import pyarrow.compute as pc
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
moe = t.filter(pc.equal(t.column("op"), "MUL_MAT_ID"))
if moe.num_rows == 0:
    sys.exit(1)
pq.write_table(moe, sys.argv[2])
print(f"{moe.num_rows} MUL_MAT_ID census rows of {t.num_rows}")
PY
    MS=$(($(left) - 30))
    [ "$MS" -gt 0 ] || die "no time left for the sweep (DEADLINE)"
    only=()
    IFS=';' read -r -a pats <<<"${ONLY:-}"
    for pat in "${pats[@]}"; do [ -n "$pat" ] && only+=(--only "$pat"); done
    gd tune run "$W/moe/census-moe.parquet" --llama-cpp "$TREE" --build-dir "$B" -o "$W/moe/tuning.parquet" \
        --coverage "${COVERAGE:-0.95}" --trials "${TRIALS:-5}" --max-seconds "$MS" "${only[@]}" >"$W/moe/tune.log" 2>&1
    rc=$?
    tail -40 "$W/moe/tune.log" | tee "$OUT/moe-tune.log"
    [ "$rc" -eq 0 ] || die "tune run failed (rc $rc)"
    [ -f "$W/moe/tuning.parquet" ] || die "tune run wrote no tuning file"
    grep -q "stopped by --max-seconds" "$OUT/moe-tune.log" && echo "moe.sh: sweep not finished: run PART=tune again" >&2
    python3 - "$W/moe/tuning.parquet" <<'PY' | tee "$OUT/moe-tune-summary.txt"
import sys
import pyarrow.parquet as pq
rows = [r for r in pq.read_table(sys.argv[1]).to_pylist() if r["op"] == "MUL_MAT_ID"]
seen = {}
for r in rows:
    k = (r["src0_type"], r["N"], r["K"], r["E"], r["U"], r["M"], r["routing_kind"])
    seen.setdefault(k, [r["routing"], 0, 0])
    seen[k][1] += r["status"] == "ok"
    seen[k][2] += 1
for k, (b, ok, n) in sorted(seen.items()):
    print(*k, "bucket", b, f"ok {ok}/{n} rows")
PY
    cp "$W/moe/tuning.parquet" "$OUT/moe-tuning.parquet"
    ;;
table)
    [ -f "$W/moe/tuning.parquet" ] || die "no tuning file: run PART=tune first"
    rm -rf "$W/moe/table"
    gd codegen "$W/moe/tuning.parquet" --census "$W/moe/census.parquet" -o "$W/moe/table" >"$W/moe/codegen.log" 2>&1
    rc=$?
    tee "$OUT/moe-codegen.log" <"$W/moe/codegen.log"
    [ "$rc" -eq 0 ] && [ -f "$W/moe/table/table.json" ] || die "codegen failed (rc $rc)"
    python3 - "$W/moe/table/table.json" <<'PY' | tee "$OUT/moe-decisions.txt"
import json, sys
t = json.load(open(sys.argv[1]))
for p in t.get("routing_buckets", []):
    per = "; ".join(f"{b}: {v['winner']} {'passes' if v['passes'] else 'no'} {v['ratio'] or 0:.3f}x" for b, v in p["buckets"].items())
    print(p["src0_type"], "N", p["N"], "K", p["K"], "E", p["E"], "U", p["U"], "M", p["M"], "|", per, "| routing 0:", p["config"] or "stock", p["reason"])
rules = [r for r in t["rules"] if r["op"] == "MUL_MAT_ID"]
print(len(rules), "MUL_MAT_ID rules")
for r in rules:
    print(" ", r["src0_type"], "N", r["N"], "K", r["K"], "E", r["E"], "U", r["U"], "M", r["M_lo"], "..", r["M_hi"], "->", r["config"], r["buckets"])
PY
    # in-sample: the table's time at every MUL_MAT_ID point of every bucket against the per-point best
    python3 -m ggml_dispatch.codegen.loo "$W/moe/tuning.parquet" >"$W/moe/loo.txt" 2>&1 || { cat "$W/moe/loo.txt"; die "codegen.loo failed"; }
    grep -A 1000 '^in-sample' "$W/moe/loo.txt" | tee "$OUT/moe-in-sample.txt"
    cp -r "$W/moe/table" "$OUT/moe-table"
    ;;
ab)
    T=${TABLE:-$W/moe/table/table.json}  # TABLE=tables/cuda-sm90-nvidia-h200/table.json: the committed one
    [ -f "$T" ] || die "no table: run PART=table first (or TABLE=a committed table.json)"
    [ -f "$MODEL" ] || die "no model: run PART=model first"
    stock_build
    gd install --llama-cpp "$TREE" --table "$T" >&2 || die "install of the table failed"
    timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target llama-bench >"$W/moe/rebuild.log" 2>&1 ||
        { tail -20 "$W/moe/rebuild.log"; die "rebuild with the table failed or ran out of time"; }
    AB=$W/moe/ab-$NAME.jsonl
    rm -f "$AB"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        ab --arm "stock=$B/bin/llama-bench:off" --arm "table=$B/bin/llama-bench:table" --model "$NAME=$MODEL" \
        --bench "-ngl 99 -fa on -b 2048 -p 2048 -ub 128,512 -n 0" --bench "-ngl 99 -fa on -p 0 -n 128" \
        --pairs "${AB_PAIRS:-8}" --reps "${AB_REPS:-3}" --expect-table "$T" --log "$W/moe/ab-runs.log" \
        -o "$AB" 2>&1 | tail -30 | tee "$OUT/moe-ab.log"
    rc=${PIPESTATUS[0]}
    cp "$AB" "$OUT/" 2>/dev/null
    grep -h "ggml_cuda_dispatch:" "$W/moe/ab-runs.log" 2>/dev/null | sort | uniq -c | tee "$OUT/moe-ab-lines.txt"
    [ "$rc" -eq 0 ] || die "A/B failed or ran past the deadline (rc $rc; its records so far are in $OUT)"
    ;;
*)
    echo "unknown PART $PART" >&2
    exit 2
    ;;
esac
echo "part $PART done in $(($(date +%s) - START)) s"
