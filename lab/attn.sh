#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# FLASH_ATTN_EXT at real context depths: stock's kernel choice traced, the attention census, and
# llama-bench -fa on for every FlashAttention kernel forced (GGML_CUDA_DISPATCH=force:fa_vec|fa_tile|fa_mma)
# against stock (GGML_CUDA_DISPATCH=off) on the qwen3 seed-shape model (head dim 256, 24/4 heads) and the
# 8B-dimension llama (head dim 128, 32/8 heads), 4 layers each, Q4_K_M weights, with a q8_0 and an f16 KV
# cache: tg32, pp2, pp3, pp4 at depths 4096, 16384, 49152 and pp512 at depth 16384. Tests are named with
# their depth (tg32@d16384). Reuses lab/autotune-verify.sh's tree build/at/llama.cpp and build dir
# build/at/build-sys when present (needs .carry/llama.cpp.tar.xz and .carry/smollm2.meta.gguf otherwise).
# Each part is bounded by DEADLINE seconds (default 540) from the script's start.
#
#   PART=build    install the hook (no table), build llama-bench and llama-quantize, write the two models
#   PART=trace    route traces of stock runs at every depth and KV type -> attention census (census attention)
#   PART=ab-qwen3 the A/B on the qwen3 seed-shape model (stock and each forced kernel, both KV types)
#   PART=ab-8b    the same on the 8B-dimension model
#   PART=tune     tune run on the combined attention census (FLASH_ATTN_EXT cases, VEC/TILE/MMA_F16 timed
#                 against stock with the CPU reference check), codegen -> table.json (attention rules)
#   PART=configs  tune run --configs all on the same points: every FlashAttention configuration (fa_vec
#                 parallel blocks, fa_mma ncols1 x ncols2 tiles, sparse gather, stream-k) checked against the
#                 CPU reference and timed against stock; a summary per point (lab/attn_configs_summary.py,
#                 fails on a wrong or failed configuration) and codegen -> attn-configs/table/table.json
#                 (rules carrying configurations); resumable from its journal (call again);
#                 RESUME_FROM=an earlier call's attn-configs.tar.gz continues that sweep on a fresh machine,
#                 REMEASURE=1 measures its failed cases and those with wrong trials again (tune run --remeasure)
#   PART=table    install that table, rebuild, and the A/B stock (GGML_CUDA_DISPATCH=off) vs table on both
#                 models and KV types with `ggml-dispatch ab` (interleaved pairs, ggml-dispatch-ab/1 records
#                 whose tests carry the depth: "tg32 @ d16384"); AB_MODELS=qwen3-seed (default) or llama8b,
#                 one per call; TUNE=attn-configs takes PART=configs' table instead of PART=tune's,
#                 TABLE=path a committed one (tables/cuda-sm90-nvidia-h200/table.json); AB_KV
#                 (default "q8_0 f16"), AB_DEPTHS (default 4096,16384,49152) and AB_NO_PP512=1 split
#                 the A/B over calls; AB_NOWARM=1 runs the table arm without the first-use warm-up
#                 (GGML_CUDA_DISPATCH_WARMUP=off, which its records' environment names; file ab-<model>-nowarm-*):
#                 against the same call's A/B with it, each paired with its own stock runs;
#                 HOOK_ARM=1 adds the arm `hook`: a copy of PART=build's llama-bench (the hook, no table)
#                 run with the dispatch on, so hook/stock is the hook's own cost and table/hook the rules';
#                 AB_BENCH="llama-bench args" replaces every bench above with that one (one focused test set,
#                 e.g. the depth fill's ubatch varied: "-ngl 99 -fa on -ctk f16 -ctv f16 -p 2,3 -n 0 -d 49152 -ub 256,512")
#
#   PART=profile  after PART=table, or TABLE=a committed table.json installed first: CUPTI kernel timelines
#                 of stock and that table, tg32 and tg96 at AB_DEPTHS
#                 (default 16384) for each AB_KV, one process each (<arm>.tg32@d16384-kvq8_0.ktl + .jsonl),
#                 packed as attn-profile-<model>.tar.gz; lab/attn_profile_summary.py turns the tg96 - tg32
#                 difference into ms per decode token by kernel category (no depth fill); AB_MODELS=llama8b;
#                 PROFILE_PP="3 4" (or 3,4: lab/chain.sh splits a step at spaces) adds pp3/pp4 processes; lab/first_use_gaps.py lists each process's
#                 GPU idle before first launches (appended to the summary); HOOK_ARM=1 adds the arm `hook`
#                 (PART=build's llama-bench, kept before the table goes in); PROFILE_REPS (default 2) llama-bench -r
#   PART=shadow-probe  the f16 KV shadow (fa_mma/kv=shadow, fa_tile/kv=shadow, fa_vec/kv=shadow) checked end
#                 to end: test-backend-ops FLASH_ATTN_EXT on q8_0 K/V against the CPU backend with each shadow
#                 configuration forced; llama-perplexity on the qwen3 model with a q8_0 KV cache, the same
#                 configuration converting per call (GGML_CUDA_DISPATCH_KV_SHADOW=off) and reading the shadow
#                 (ubatch 128: batched cache writes; ubatch 1: one row per step, VEC too; chunks cleared between:
#                 the refill after an outside write) must print the same PPL; and llama-bench tg32 and
#                 pp2 at depth 49152 (q8_0, -r 3, one run each: indicative, not an A/B) stock, fa_mma, and
#                 fa_mma/kv=shadow and fa_vec/kv=shadow forced
#   PART=autotune `ggml-dispatch autotune` on the qwen3 seed-shape model with --depth (after PART=build, whose
#                 tree, build dir and model it reuses): decode workloads and verify at AT_DEPTHS (default
#                 16384,49152) with an AT_KV (default q8_0) cache, every FlashAttention configuration tuned,
#                 table, rebuild, stock-vs-table A/B and REPORT.md into build/at/autotune-attn; resumable
#                 (call again on the warm machine); AT_TUNE_S (default 120) per sweep, AT_PAIRS (default 5);
#                 AT_VRAM_MIB=N (AT_SHADOW_MIB, its older name, too) passes --vram-budget N, the one VRAM
#                 budget the KV shadow shares with the weight cache (on a finished run: codegen onward again,
#                 same sweep; the folder's table and A/B are replaced, so pack the earlier call's first); AT_FILL=1
#                 passes --depth-fill (each depth's last KV-fill point tuned too: census onward again), AT_FILL=0
#                 --no-depth-fill (autotune's default: the fill with a budget, without it not;
#                 AT_FILL=0 reproduces the run of evidence/h100-2026-12-06-s23, made without the fill);
#                 AT_DIR (default autotune-attn) names the folder under build/at
#   PART=shadow   tune run on the committed attention census' q8_0 points (tables/cuda-sm90-nvidia-h200-attn/
#                 census.attn.parquet) with SHADOW_ROUTES (default: below) as the candidates (--configs routes: the plain kernels,
#                 the committed table's configurations, each also with kv=shadow); then merged with the
#                 committed sweep's f16 points (lab/attn_shadow_merge.py) and codegen --vram-budget
#                 ${KV_SHADOW_MIB:-16384} -> attn-shadow/table/table.json; resumable from its journal (call again)
#
# The forced arms bound what a table keyed by the attention shape can win end to end.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${PART:?set PART=build|trace|ab-qwen3|ab-8b|tune|configs|shadow-probe|shadow|table|profile|autotune}"
DEADLINE=${DEADLINE:-540}
AT_VRAM_MIB=${AT_VRAM_MIB:-${AT_SHADOW_MIB:-}}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
die() { echo "attn.sh: $*" >&2; exit 1; }
source lab/cuda-env.sh
W=$REPO/build/at
TREE=$W/llama.cpp
B=$W/build-sys
M=$W/models
unset CC CXX CUDAHOSTCXX  # see lab/autotune-verify.sh: the system compiler links libstdc++ shared
mkdir -p "$W" "$M"
if [ ! -f "$TREE/ggml/include/ggml.h" ]; then
    tar -xJf .carry/llama.cpp.tar.xz -C "$W" || die "no tree and no .carry/llama.cpp.tar.xz"
fi
for d in pocs app; do [ -d "$TREE/$d" ] || { mkdir -p "$TREE/$d" && touch "$TREE/$d/CMakeLists.txt"; }; done
export PYTHONPATH=$REPO:$TREE/gguf-py PYTHONUNBUFFERED=1
gd() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version,memory.used --format=csv >"$OUT/gpu-$PART.csv" 2>&1

# PART=shadow's candidates: the plain kernels, VEC's and MMA_F16's configurations the committed attention
# table picks, and each of them again with kv=shadow (configurations: --configs routes)
_MMA_PICKED="ncols1=1,ncols2=8,sparse=off,stream_k=off ncols1=1,ncols2=8,sparse=off,stream_k=on
ncols1=2,ncols2=4,sparse=off,stream_k=on ncols1=4,ncols2=2,sparse=off,stream_k=on ncols1=2,ncols2=8,sparse=off,stream_k=on
ncols1=4,ncols2=8,sparse=off,stream_k=on ncols1=16,ncols2=4,sparse=off,stream_k=on ncols1=32,ncols2=2,sparse=off,stream_k=on"
_routes=fa_vec,fa_vec/kv=shadow,fa_vec/blocks=2,fa_vec/blocks=2,kv=shadow,fa_tile,fa_tile/kv=shadow,fa_mma,fa_mma/kv=shadow
for c in $_MMA_PICKED; do _routes+=",fa_mma/$c,fa_mma/$c,kv=shadow"; done
SHADOW_ROUTES=${SHADOW_ROUTES:-$_routes}

QWEN=$M/qwen3-seed-L4.gguf
L8B=$M/llama8b-L4.gguf
DEPTHS=4096,16384,49152
BENCH=$B/bin/llama-bench

need_build() {
    [ -x "$BENCH" ] || die "no $BENCH: run PART=build first"
    grep -q ggml_cuda_get_best_fattn_kernel_stock "$TREE/ggml/src/ggml-cuda/fattn.cu" ||
        die "the tree's fattn.cu lacks the hook: run PART=build"
    [ -f "$QWEN" ] && [ -f "$L8B" ] || die "models missing: run PART=build"
    # the configuration hook (fattn.cu tiles, fattn-common.cuh grids), not an older install
    grep -q ggml_dispatch_fa_parallel_blocks "$TREE/ggml/src/ggml-cuda/fattn-common.cuh" &&
        grep -q "ggml_dispatch_params_current().fa_ncols2" "$TREE/ggml/src/ggml-cuda/fattn.cu" ||
        die "the tree lacks the FlashAttention configuration hook: run PART=build"
}

# HOOK_ARM=1: keep PART=build's llama-bench (the hook, no table compiled in) as $W/hook-bin before a
# table goes in, for the arm `hook` (dispatch on, no table: what the hook itself costs)
keep_hook_bin() {
    [ -n "${HOOK_ARM:-}" ] && [ ! -x "$W/hook-bin/llama-bench" ] || return 0
    grep -q '#define GGML_DISPATCH_TABLE_RULE_COUNT 0' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" ||
        die "HOOK_ARM=1: a table is installed in $TREE already (PART=build installs none)"
    rm -rf "$W/hook-bin.part" && cp -a "$B/bin" "$W/hook-bin.part" && mv "$W/hook-bin.part" "$W/hook-bin" ||
        die "HOOK_ARM=1: copying the no-table build"
}

# the measured tests' points: decode and verify (M <= 8) at every depth and pp512 at depth 16384
# (n_kv 16384..17152); llama-bench's depth fill (M = 512 at every KV length on the way) is left out
filtered_census() {  # out
    local src=$W/attn-trace/all.attn.parquet
    [ -f "$src" ] || die "no $src: run PART=trace first"
    python3 - "$src" "$1" <<'PY' || die "filtering the attention census"
import sys
from pathlib import Path
from ggml_dispatch.census import attention
from ggml_dispatch.tuner.attention import read_attention_census
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
rows = [r for r in read_attention_census(src) if r["M"] <= 8 or (r["M"] == 512 and 16384 <= r["n_kv"] <= 17152)]
attention.write(rows, dst, {str(src): "filtered"}, src)
print(f"{len(rows)} attention points to tune")
PY
}

# llama-bench over the attention tests, one arm (GGML_CUDA_DISPATCH value), one KV type; JSON Lines out
bench() {  # model kv arm out
    local model=$1 kv=$2 arm=$3 out=$4 dispatch
    case $arm in
    stock) dispatch=off ;;
    *) dispatch=force:$arm ;;
    esac
    local t
    t=$(left)
    [ "$t" -gt 20 ] || { echo "attn.sh: deadline reached before $arm $kv $(basename "$model")" >&2; return 1; }
    GGML_CUDA_DISPATCH=$dispatch timeout "$t" "$BENCH" -m "$model" -fa on -ctk "$kv" -ctv "$kv" -ngl 99 \
        -r "${REPS:-3}" -o jsonl -v -p 2,3,4 -n 32 -d "$DEPTHS" >"$out" 2>"$out.log" &&
        GGML_CUDA_DISPATCH=$dispatch timeout "$(left)" "$BENCH" -m "$model" -fa on -ctk "$kv" -ctv "$kv" \
            -ngl 99 -r "${REPS:-3}" -o jsonl -v -p 512 -n 0 -d 16384 >>"$out" 2>>"$out.log" ||
        { echo "attn.sh: llama-bench failed ($arm $kv $(basename "$model")):" >&2; tail -5 "$out.log" >&2; return 1; }
    grep -q "ggml_cuda_dispatch: " "$out.log" ||  # llama-bench -v: the hook's start-up line
        { echo "attn.sh: no dispatch line in $out.log (not the hooked build?)" >&2; return 1; }
}

case $PART in
build)
    gd install --llama-cpp "$TREE" >&2 || die "install failed"
    if [ ! -f "$B/CMakeCache.txt" ]; then
        cmake -S "$TREE" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_FA=ON \
            -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DCMAKE_CUDA_ARCHITECTURES=90 >"$W/attn-cmake.log" 2>&1 || { tail -20 "$W/attn-cmake.log"; die "cmake"; }
    fi
    timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target llama-bench llama-quantize >"$W/attn-build.log" 2>&1 ||
        { tail -20 "$W/attn-build.log"; die "build failed or ran past the deadline (call again to continue)"; }
    [ -f "$W/smollm2.gguf" ] || python3 -m lab.models clone .carry/smollm2.meta.gguf -o "$W/smollm2.gguf" || die clone
    for spec in "qwen27b:$QWEN" "llama8b:$L8B"; do
        preset=${spec%%:*} dst=${spec#*:}
        [ -f "$dst" ] && continue
        python3 -m lab.models dense --preset "$preset" --layers 4 --tokenizer-from "$W/smollm2.gguf" -o "$dst.f16" &&
            "$B/bin/llama-quantize" "$dst.f16" "$dst" Q4_K_M >"$W/attn-quantize.log" 2>&1 &&
            rm -f "$dst.f16" || { tail -20 "$W/attn-quantize.log"; die "model $preset"; }
    done
    ls -la "$M" | tee "$OUT/models.txt"
    ;;
trace)
    need_build
    mkdir -p "$W/attn-trace"
    for model in "$QWEN" "$L8B"; do
        for kv in q8_0 f16; do
            name=$(basename "$model" .gguf)-$kv
            GGML_CUDA_ROUTE_TRACE=$W/attn-trace/$name.jsonl timeout "$(left)" "$BENCH" -m "$model" -fa on \
                -ctk "$kv" -ctv "$kv" -ngl 99 -r 1 -o jsonl -p 2,3,4,512 -n 32 -d "$DEPTHS" \
                >"$W/attn-trace/$name.bench.jsonl" 2>"$W/attn-trace/$name.log" ||
                { tail -5 "$W/attn-trace/$name.log"; die "traced run $name"; }
            grep -q '"op":"FLASH_ATTN_EXT"' "$W/attn-trace/$name.jsonl" || die "$name: no FLASH_ATTN_EXT records in the trace"
            gd census attention "$W/attn-trace/$name.jsonl" -o "$W/attn-trace/$name.attn.parquet" 2>&1 |
                tee "$OUT/attn-census-$name.txt"
            [ "${PIPESTATUS[0]}" -eq 0 ] || die "census attention $name"
        done
    done
    gd census attention "$W"/attn-trace/*-L4-{q8_0,f16}.jsonl -o "$W/attn-trace/all.attn.parquet" 2>&1 |
        tail -30 | tee "$OUT/attn-census-all.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die "combined census attention"
    tar -czf "$OUT/attn-trace.tar.gz" -C "$W" attn-trace
    ;;
tune)
    need_build
    mkdir -p "$W/attn-tune"
    [ "$(left)" -gt 180 ] || die "too little time left for a sweep"
    filtered_census "$W/attn-tune/census.attn.parquet"
    C=$W/attn-tune/census.attn.parquet
    # the harness' stock anchor must be stock: no table compiled in
    grep -q '#define GGML_DISPATCH_TABLE_RULE_COUNT 0' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" ||
        die "a table is installed in $TREE: PART=build installs none"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        tune run "$C" --llama-cpp "$TREE" --build-dir "$B" -o "$W/attn-tune/tuning.parquet" --configs routes \
        --coverage "${COVERAGE:-0.99}" --trials "${TRIALS:-7}" --max-seconds "$(( $(left) - 60 ))" 2>&1 |
        tail -40 | tee "$OUT/attn-tune.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die "tune run (call again to resume from the journal)"
    gd codegen "$W/attn-tune/tuning.parquet" -o "$W/attn-tune/table" -v 2>&1 | tail -60 | tee "$OUT/attn-codegen.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die codegen
    tar -czf "$OUT/attn-tune.tar.gz" -C "$W" attn-tune
    ;;
configs)
    need_build
    D=$W/attn-configs
    mkdir -p "$D"
    if [ -n "${RESUME_FROM:-}" ] && [ ! -f "$D/tuning.parquet.journal.jsonl" ]; then
        # an earlier call's census and journal (its tarball): the sweep goes on from there
        tar -xzf "$RESUME_FROM" -C "$W" attn-configs/census.attn.parquet attn-configs/tuning.parquet.journal.jsonl ||
            die "RESUME_FROM $RESUME_FROM: no attn-configs census and journal in it"
    fi
    [ -f "$D/census.attn.parquet" ] || filtered_census "$D/census.attn.parquet"
    grep -q '#define GGML_DISPATCH_TABLE_RULE_COUNT 0' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" ||
        die "a table is installed in $TREE: PART=build installs none (the anchor must be stock)"
    [ "$(left)" -gt 180 ] || die "too little time left for a sweep"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        tune run "$D/census.attn.parquet" --llama-cpp "$TREE" --build-dir "$B" -o "$D/tuning.parquet" \
        --configs all --coverage "${COVERAGE:-0.99}" --trials "${TRIALS:-5}" --max-seconds "$(( $(left) - 60 ))" \
        ${REMEASURE:+--remeasure} 2>&1 |
        tail -40 | tee "$OUT/attn-configs.log"
    rc=${PIPESTATUS[0]}
    if [ -f "$D/tuning.parquet" ]; then
        python3 lab/attn_configs_summary.py "$D/tuning.parquet" | tee "$OUT/attn-configs.md"
        src=${PIPESTATUS[0]}
    else
        src=1
    fi
    tar -czf "$OUT/attn-configs.tar.gz" -C "$W" attn-configs
    [ "$rc" -eq 0 ] || die "tune run --configs all (rc $rc; call again to resume from the journal)"
    # codegen decides on the measured (ok) rows only; a wrong or failed configuration still fails the part
    rm -rf "$D/table"
    gd codegen "$D/tuning.parquet" -o "$D/table" -v 2>&1 | tail -60 | tee "$OUT/attn-configs-codegen.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die codegen
    tar -czf "$OUT/attn-configs.tar.gz" -C "$W" attn-configs
    [ "$src" -eq 0 ] || die "a configuration was wrong or failed, or none ran (see attn-configs.md)"
    ;;
shadow-probe)
    need_build
    timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target test-backend-ops llama-perplexity \
        >"$W/attn-probe-build.log" 2>&1 || { tail -20 "$W/attn-probe-build.log"; die "build of the probe tools"; }
    D=$W/attn-shadow-probe
    mkdir -p "$D"
    rc=0
    for cfg in fa_mma/kv=shadow fa_tile/kv=shadow fa_vec/kv=shadow; do
        log=$D/tbo-${cfg//[\/=]/_}.log
        GGML_CUDA_DISPATCH=force:$cfg timeout "$(left)" "$B/bin/test-backend-ops" test -o FLASH_ATTN_EXT -b CUDA0 \
            -p "type_K=q8_0" >"$log" 2>&1 || rc=1
        echo "test-backend-ops force:$cfg: $(grep -c ' OK$' "$log") OK, $(grep -c 'FAIL' "$log") FAIL; $(grep -m1 'tests passed' "$log")" |
            tee -a "$OUT/attn-shadow-probe.md"
        grep -m1 "ggml_cuda_dispatch: " "$log" >>"$OUT/attn-shadow-probe.md"
    done
    python3 -c 'import random; r = random.Random(7); w = "the of and to in is was for on that with as by at from it".split()
print(" ".join(r.choice(w) + ("." if r.random() < 0.1 else "") for _ in range(6000)))' >"$D/text.txt"
    # each kv=shadow configuration converting per call (GGML_CUDA_DISPATCH_KV_SHADOW=off: no shadow, the
    # conversion runs as the tree runs it) and reading the shadow; VEC only at ubatch 1 (<= 8 Q columns)
    for ub in 128 1; do
        cfgs="fa_mma/kv=shadow@off fa_mma/kv=shadow"
        [ "$ub" = 1 ] && cfgs+=" fa_vec/kv=shadow@off fa_vec/kv=shadow"
        for arm in $cfgs; do
            cfg=${arm%@off}
            shadow_env=$([ "$arm" = "$cfg" ] && echo "" || echo off)
            log=$D/ppl-ub$ub-${arm//[\/=@]/_}.log
            GGML_CUDA_DISPATCH_KV_SHADOW=$shadow_env GGML_CUDA_DISPATCH=force:$cfg timeout "$(left)" "$B/bin/llama-perplexity" -m "$QWEN" -f "$D/text.txt" -c 512 \
                -b 512 -ub "$ub" -fa on -ctk q8_0 -ctv q8_0 -ngl 99 --chunks 3 >"$log" 2>&1 || rc=1
            echo "perplexity ub $ub force:$cfg${shadow_env:+ KV_SHADOW=off}: $(grep -m1 'Final estimate' "$log"); $(grep -m1 'KV shadow:' "$log")" |
                tee -a "$OUT/attn-shadow-probe.md"
        done
    done
    for arm in stock fa_mma fa_mma/kv=shadow fa_vec/kv=shadow; do
        dispatch=$([ "$arm" = stock ] && echo off || echo "force:$arm")
        log=$D/bench-${arm//[\/=]/_}
        GGML_CUDA_DISPATCH=$dispatch timeout "$(left)" "$BENCH" -m "$QWEN" -fa on -ctk q8_0 -ctv q8_0 -ngl 99 -r 3 \
            -o jsonl -p 2 -n 32 -d 49152 >"$log.jsonl" 2>"$log.log" || rc=1
        python3 - "$arm" "$log.jsonl" <<'PY' | tee -a "$OUT/attn-shadow-probe.md"
import json, sys
for line in open(sys.argv[2]):
    r = json.loads(line)
    print(f"llama-bench {sys.argv[1]}: {'tg' if r['n_gen'] else 'pp'}{r['n_gen'] or r['n_prompt']} @ d{r['n_depth']}: "
          f"{r['avg_ts']:.1f} t/s (sd {r['stddev_ts']:.1f})")
PY
    done
    tar -czf "$OUT/attn-shadow-probe.tar.gz" -C "$W" attn-shadow-probe
    [ "$rc" -eq 0 ] || die "a probe step failed (see attn-shadow-probe.md and the logs)"
    ;;
shadow)
    need_build
    D=$W/attn-shadow
    mkdir -p "$D"
    grep -q '#define GGML_DISPATCH_TABLE_RULE_COUNT 0' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" ||
        die "a table is installed in $TREE: PART=build installs none (the anchor must be stock)"
    grep -q ggml_dispatch_shadow_K "$TREE/ggml/src/ggml-cuda/fattn-common.cuh" || die "the tree lacks the KV shadow hook"
    COMMITTED=tables/cuda-sm90-nvidia-h200-attn
    if [ ! -f "$D/census.attn.parquet" ]; then
        python3 - "$COMMITTED/census.attn.parquet" "$D/census.attn.parquet" <<'PY' || die "filtering the census"
import sys
from pathlib import Path
from ggml_dispatch.census import attention
from ggml_dispatch.tuner.attention import read_attention_census
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
rows = [r for r in read_attention_census(src) if r["k_type"] == "q8_0" and r["v_type"] == "q8_0"]
attention.write(rows, dst, {str(src): "q8_0 points"}, src)
print(f"{len(rows)} q8_0 attention points")
PY
    fi
    [ "$(left)" -gt 120 ] || die "too little time left for a sweep"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        tune run "$D/census.attn.parquet" --llama-cpp "$TREE" --build-dir "$B" -o "$D/tuning.parquet" \
        --configs routes --routes "$SHADOW_ROUTES" --coverage 1 --trials "${TRIALS:-5}" \
        --max-seconds "$(( $(left) - 45 ))" 2>&1 | tail -30 | tee "$OUT/attn-shadow.log"
    rc=${PIPESTATUS[0]}
    tar -czf "$OUT/attn-shadow.tar.gz" -C "$W" attn-shadow
    [ "$rc" -eq 0 ] || die "tune run (rc $rc; call again to resume from the journal)"
    python3 lab/attn_shadow_merge.py "$COMMITTED/tuning.parquet" "$D/tuning.parquet" -o "$D/merged.parquet" ||
        die "merging with the committed f16 points"
    rm -rf "$D/table"
    gd codegen "$D/merged.parquet" -o "$D/table" --vram-budget "${KV_SHADOW_MIB:-16384}" -v 2>&1 | tail -60 |
        tee "$OUT/attn-shadow-codegen.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die codegen
    python3 lab/attn_configs_summary.py "$D/tuning.parquet" | tee "$OUT/attn-shadow.md"
    tar -czf "$OUT/attn-shadow.tar.gz" -C "$W" attn-shadow
    ;;
table)
    need_build
    T=${TABLE:-$W/${TUNE:-attn-tune}/table/table.json}
    [ -f "$T" ] || die "no $T: run PART=tune first (or TABLE=a committed table.json)"
    keep_hook_bin
    gd install --llama-cpp "$TREE" --table "$T" >&2 || die "install of the table"  # same table: no change
    timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target llama-bench >"$W/attn-rebuild.log" 2>&1 ||
        { tail -20 "$W/attn-rebuild.log"; die "rebuild with the table"; }
    D=$W/attn-table
    mkdir -p "$D"
    # interleaved stock/table pairs with provenance (ggml-dispatch-ab/1 records, `ggml-dispatch ab`);
    # the table arm must apply exactly this table
    bench=()
    for kv in ${AB_KV:-q8_0 f16}; do  # AB_KV / AB_DEPTHS split the A/B over calls
        bench+=(--bench "-ngl 99 -fa on -ctk $kv -ctv $kv -p 2,3,4 -n 32 -d ${AB_DEPTHS:-$DEPTHS}")
        [ -n "${AB_NO_PP512:-}" ] || bench+=(--bench "-ngl 99 -fa on -ctk $kv -ctv $kv -p 512 -n 0 -d 16384")
    done
    [ -n "${AB_BENCH:-}" ] && bench=(--bench "$AB_BENCH")
    models=()
    for m in ${AB_MODELS:-qwen3-seed}; do  # one model per call fits a call's budget: AB_MODELS=llama8b next
        case $m in qwen3-seed) models+=(--model "qwen3-seed=$QWEN") ;; llama8b) models+=(--model "llama8b=$L8B") ;;
        *) die "AB_MODELS: qwen3-seed or llama8b, not $m" ;; esac
    done
    AB=$D/ab-${AB_MODELS:-qwen3-seed}${AB_NOWARM:+-nowarm}${HOOK_ARM:+-hook}-$(date +%s).jsonl
    AB=${AB// /+}
    arms=(--arm "stock=$BENCH:off" --arm "table=$BENCH:table")
    # HOOK_ARM=1: a third arm, the same hook with no table (what the hook itself costs against stock)
    [ -n "${HOOK_ARM:-}" ] && arms+=(--arm "hook=$W/hook-bin/llama-bench:table")
    # AB_NOWARM=1: the table arm without the first-use warm-up (the A/B's arms are stock/table/crude/cached)
    [ -n "${AB_NOWARM:-}" ] && arms+=(--arm-env "table=GGML_CUDA_DISPATCH_WARMUP=off")
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        ab "${arms[@]}" "${models[@]}" \
        "${bench[@]}" --pairs "${AB_PAIRS:-3}" --reps "${AB_REPS:-2}" --expect-table "$T" \
        --log "$D/ab-runs.log" -o "$AB" 2>&1 | tail -20 | tee "$OUT/attn-table-ab.log"
    rc=${PIPESTATUS[0]}
    cp "$AB" "$OUT/" 2>/dev/null
    packed=(attn-table)
    [ -d "$W/${TUNE:-attn-tune}" ] && packed+=("${TUNE:-attn-tune}")  # none with TABLE=
    tar -czf "$OUT/attn-table.tar.gz" -C "$W" "${packed[@]}"
    [ "$rc" -eq 0 ] || die "table A/B failed or ran past the deadline (rc $rc; its records so far are in $OUT)"
    ;;
profile)
    # CUPTI kernel timelines (.carry/libkernel_timeline.so) of stock and the table installed by PART=table,
    # one llama-bench process per arm, test and depth (tg32, tg96), summed up by lab/attn_profile_summary.py
    need_build
    KT=$REPO/.carry/libkernel_timeline.so
    [ -f "$KT" ] || die "no $KT (make device-carry builds it)"
    keep_hook_bin
    if [ -n "${TABLE:-}" ]; then  # a committed table, installed here (PART=table installs its own otherwise)
        gd install --llama-cpp "$TREE" --table "$TABLE" >&2 || die "install of $TABLE"
        timeout "$(left)" cmake --build "$B" -j "$(nproc)" --target llama-bench >"$W/attn-rebuild.log" 2>&1 ||
            { tail -20 "$W/attn-rebuild.log"; die "rebuild with $TABLE"; }
    fi
    grep -q '#define GGML_DISPATCH_TABLE_RULE_COUNT 0' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" &&
        die "no table installed in $TREE: run PART=table first or give TABLE= (the table arm needs one)"
    model=$QWEN
    [ "${AB_MODELS:-qwen3-seed}" = llama8b ] && model=$L8B
    P=$W/attn-profile/${AB_MODELS:-qwen3-seed}
    rm -rf "$P" && mkdir -p "$P"
    grep -m1 "GGML_DISPATCH_TABLE_TUNING_SHA256" "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" >"$P/README"
    echo "model ${AB_MODELS:-qwen3-seed} $(basename "$model"), llama-bench -r ${PROFILE_REPS:-2} -fa on" >>"$P/README"
    for kv in ${AB_KV:-q8_0 f16}; do
        suffix=$([ "$kv" = f16 ] || echo "-kv$kv")
        for d in ${AB_DEPTHS:-16384}; do
            d=${d//,/ }
            for depth in $d; do
                # tg32 and tg96: their difference is 64 decode tokens without the depth fill
                # (lab/attn_profile_summary.py)
                # PROFILE_PP="3 4": pp3 and pp4 processes too, for lab/first_use_gaps.py (not in the summary)
                for t in tg32 tg96 ${PROFILE_PP:+$(printf 'pp%s ' ${PROFILE_PP//,/ })}; do
                    if [ "${t#pp}" != "$t" ]; then args=(-p "${t#pp}" -n 0); else args=(-p 0 -n "${t#tg}"); fi
                    for arm in stock table ${HOOK_ARM:+hook}; do
                        [ "$(left)" -gt 20 ] || die "deadline: profile incomplete"
                        mode=table
                        [ "$arm" = stock ] && mode=off
                        bin=$B/bin
                        [ "$arm" = hook ] && bin=$W/hook-bin
                        f=$P/$arm.$t@d$depth$suffix
                        KERNEL_TIMELINE_OUT=$f.ktl CUDA_INJECTION64_PATH=$KT GGML_CUDA_DISPATCH=$mode \
                            LD_LIBRARY_PATH=$bin:$LD_LIBRARY_PATH:$REPO/.carry timeout "$(left)" "$bin/llama-bench" -m "$model" \
                            -fa on -ctk "$kv" -ctv "$kv" -ngl 99 -r "${PROFILE_REPS:-2}" -o jsonl -d "$depth" "${args[@]}" \
                            >"$f.jsonl" 2>>"$P/profile.log" ||
                            { tar -czf "$OUT/attn-profile-${AB_MODELS:-qwen3-seed}.tar.gz" -C "$P" .  # what ran so far
                              die "profile $arm $t@d$depth $kv failed"; }
                    done
                done
            done
        done
    done
    tar -czf "$OUT/attn-profile-${AB_MODELS:-qwen3-seed}.tar.gz" -C "$P" .
    python3 lab/attn_profile_summary.py "$P" | tee "$OUT/attn-profile-${AB_MODELS:-qwen3-seed}.md"
    # the GPU idle before kernels' first launches in each process (CUDA's lazy loading)
    python3 lab/first_use_gaps.py "$P" >>"$OUT/attn-profile-${AB_MODELS:-qwen3-seed}.md"
    ;;
autotune)
    need_build
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        autotune --llama-cpp "$TREE" --model "$QWEN" --build-dir "$B" --cuda-arch 90 --workload decode \
        --depth "${AT_DEPTHS:-16384,49152}" --kv-type "${AT_KV:-q8_0}" --trials 5 --tune-seconds "${AT_TUNE_S:-120}" \
        --pairs "${AT_PAIRS:-5}" --reps 3 ${AT_VRAM_MIB:+--vram-budget "$AT_VRAM_MIB"} \
        ${AT_FILL:+$([ "$AT_FILL" = 0 ] && echo --no-depth-fill || echo --depth-fill)} -o "$W/${AT_DIR:-autotune-attn}" 2>&1 | tee "$OUT/autotune-attn.log"
    rc=${PIPESTATUS[0]}
    echo "autotune rc=$rc" | tee -a "$OUT/autotune-attn.log"
    [ -f "$W/${AT_DIR:-autotune-attn}/REPORT.md" ] && cp "$W/${AT_DIR:-autotune-attn}/REPORT.md" "$OUT/autotune-attn-REPORT.md"
    tar -czf "$OUT/autotune-attn.tar.gz" -C "$W" "${AT_DIR:-autotune-attn}"
    [ "$rc" -eq 0 ] || die "autotune (rc $rc; call again on the warm machine to resume)"
    ;;
ab-qwen3 | ab-8b)
    need_build
    model=$([ "$PART" = ab-qwen3 ] && echo "$QWEN" || echo "$L8B")
    D=$W/attn-$PART
    mkdir -p "$D"
    rc=0
    for kv in q8_0 f16; do
        for arm in stock fa_vec fa_mma fa_tile; do
            f=$D/$kv.$arm.jsonl
            [ -s "$f" ] && continue  # done by an earlier call on this machine
            bench "$model" "$kv" "$arm" "$f.part" && mv "$f.part" "$f" || { rc=1; break 2; }
        done
    done
    python3 lab/attn_summary.py "$D" | tee "$OUT/attn-$PART.md"
    tar -czf "$OUT/attn-$PART.tar.gz" -C "$W" "attn-$PART"
    [ "$rc" -eq 0 ] || die "$PART incomplete (call again on the warm machine to continue)"
    ;;
*)
    echo "unknown PART $PART" >&2
    exit 2
    ;;
esac
echo "part $PART done in $(($(date +%s) - START)) s"
