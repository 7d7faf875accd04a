#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# The MoE model on the lent GPU: the qwen3moe-a3b preset (Qwen3-30B-A3B dimensions, LAYERS layers, random
# weights, Q4_K_M), its MUL_MAT_ID route trace with tokens-per-expert statistics, the census, and the
# MUL_MAT_ID harness cases under every routing kind. Reuses lab/autotune-verify.sh's tree build/at/llama.cpp
# and build dir build/at/build-sys when present (configures that build dir if it is not). Each part is
# bounded by DEADLINE seconds after the script starts (default 540) and resumable on a warm machine; each
# packs what it has into $OUT. Needs .carry/llama.cpp.tar.xz and .carry/smollm2.meta.gguf.
#
#   PART=model    build llama-quantize + llama-bench (stock: no table), write the F16 model, quantize
#   PART=trace    llama-bench pp2048 at ubatch 128 and 512 and tg128 (FA on) with GGML_CUDA_ROUTE_TRACE,
#                 then census ingest (MUL_MAT_ID rows keyed by routing bucket)
#   PART=tune     harness cases for the census' MUL_MAT_ID shapes (uniform, skewed, few) with every
#                 MUL_MAT_ID configuration as a candidate; the harness' JSON Lines and the decisions per
#                 routing bucket (lab/moe_decide.py) go to $OUT
#   PART=ab       not available: codegen has no MUL_MAT_ID rules yet, so there is no table to A/B
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${PART:?set PART=model|trace|tune|ab}"
DEADLINE=${DEADLINE:-540}
LAYERS=${LAYERS:-8}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
die() { echo "moe.sh: $*" >&2; exit 1; }
source lab/cuda-env.sh
W=$REPO/build/at
TREE=$W/llama.cpp
B=$W/build-sys
NAME=qwen3moe-a3b-L$LAYERS
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
        python3 -m lab.models dense --preset qwen3moe-a3b --layers "$LAYERS" --tokenizer-from "$W/smollm2.gguf" \
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
    gd tune build --llama-cpp "$TREE" --build-dir "$B" >"$W/moe/harness-build.log" 2>&1 || { tail -20 "$W/moe/harness-build.log"; die "harness build failed"; }
    H=$(ls -t .cache/tuner-harness/*/bin/ggml-dispatch-harness 2>/dev/null | head -1)
    [ -x "$H" ] || die "no harness binary"
    python3 -m lab.moe_cases "$W/moe/census.parquet" -o "$W/moe/cases.json" --top "${TOP:-6}" || die "no cases"
    LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-} timeout "$(left)" "$H" --cases "$W/moe/cases.json" \
        >"$W/moe/harness.jsonl" 2>"$W/moe/harness.log"
    rc=$?
    tail -5 "$W/moe/harness.log"
    python3 - "$W/moe/harness.jsonl" <<'PY' | tee "$OUT/moe-tune-summary.txt"
import json, sys, statistics
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
best = {}
for r in rows:
    if r.get("kind") == "trial" and r.get("status") == "ok" and r.get("us") and r.get("anchor_us"):
        best.setdefault(r["case"], {}).setdefault(r["route"], []).append(r["anchor_us"] / r["us"])
for case, by in best.items():
    med = sorted(((statistics.median(v), k) for k, v in by.items()), reverse=True)
    print(case, "stock/config, best first:", " ".join(f"{k}={m:.3f}" for m, k in med[:4]))
PY
    python3 -m lab.moe_decide "$W/moe/cases.json" "$W/moe/harness.jsonl" -o "$W/moe/decisions.json" |
        tee "$OUT/moe-decisions.txt"
    cp "$W/moe/harness.jsonl" "$W/moe/cases.json" "$W/moe/decisions.json" "$OUT/" 2>/dev/null
    echo "harness rc=$rc"
    [ "$rc" -eq 0 ] || die "harness failed (rc $rc)"
    ;;
ab)
    die "no A/B: codegen does not emit MUL_MAT_ID rules yet, so there is no table to compare with stock"
    ;;
*)
    echo "unknown PART $PART" >&2
    exit 2
    ;;
esac
echo "part $PART done in $(($(date +%s) - START)) s"
