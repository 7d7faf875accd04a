#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# The configurations sweep and its A/B on the lent GPU, building llama.cpp there (no prebuilt carry):
# the committed census swept with every configuration of every route (`tune run --whole-shapes
# --configs all`), a table decided from it, and llama-bench arms stock / table / crude rule.
# Needs .carry/llama.cpp.tar.xz and .carry/smollm2.meta.gguf (`make llama-tarball device-integration-carry`).
# State lives under build/cfg/ and every step skips what is already there, so a call stopped by its
# DEADLINE (seconds after the start, default 560) is continued by the next call on the still-warm machine.
# On a new machine, carry the last call's journal as build/cfg-carry/tuning.journal.jsonl.gz (gzip of
# result/tuning.journal.jsonl from its configs-result.tar.gz) and run STEPS="build tune": the sweep resumes.
#
#   OUT=<dir> STEPS="build models tune table ab" [DEADLINE=560] [AB_PAIRS=8] [AB_REPS=3] lab/configs.sh
#
#   build   hook without a table, cmake (autotune's CMake line), llama-bench llama-quantize test-backend-ops
#   models  llama8b-L16 (Q4_K_M) and qwen27b-L4 (the seed workload's dense shapes) with random weights
#   tune    tune run --whole-shapes --configs all on tables/cuda-sm90-nvidia-h200/census.parquet (resumes)
#   table   codegen of the sweep, the crude rule, one build per arm (bin-table, bin-crude)
#   ab      ggml-dispatch ab: stock (GGML_CUDA_DISPATCH=off) / table / crude, pp2048 at AB_UBATCH + tg128
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${STEPS:?set STEPS}"
DEADLINE=${DEADLINE:-560}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
log() { echo "[configs $(($(date +%s) - START)) s] $*" | tee -a "$OUT/configs.log" >&2; }
source lab/cuda-env.sh
W=$REPO/build/cfg
TREE=$W/llama.cpp
B=$W/build
M=$W/models
C=tables/cuda-sm90-nvidia-h200
R=$W/result  # the new table folder: sweep, table, A/B
unset CC CXX CUDAHOSTCXX  # the image's g++ links libstdc++ statically (see lab/autotune-verify.sh)
mkdir -p "$W" "$M" "$R"
if [ ! -f "$TREE/ggml/include/ggml.h" ]; then
    tar -xJf .carry/llama.cpp.tar.xz -C "$W"
fi
for d in pocs app; do [ -d "$TREE/$d" ] || { mkdir -p "$TREE/$d" && touch "$TREE/$d/CMakeLists.txt"; }; done
export PYTHONPATH=$REPO:$TREE/gguf-py PYTHONUNBUFFERED=1
gd() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv >>"$OUT/configs.log" 2>&1

build() {  # $1 = log name: the tree as installed now, incremental
    cmake --build "$B" -j "$(nproc)" --target llama-bench llama-quantize test-backend-ops >"$W/$1.log" 2>&1 ||
        { tail -30 "$W/$1.log" >&2; log "build $1 failed"; exit 1; }
}

for step in $STEPS; do
    [ "$(left)" -gt 20 ] || { log "deadline: stopping before $step"; break; }
    case $step in
    build)
        if [ ! -x "$B/bin/llama-bench" ]; then
            gd install --llama-cpp "$TREE" >&2
            cmake -S "$TREE" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_FA=ON \
                -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
                -DCMAKE_CUDA_ARCHITECTURES=90 >"$W/configure.log" 2>&1 || { tail -30 "$W/configure.log"; exit 1; }
            build build-notable
        fi
        log "build: $(ls "$B/bin" | wc -l) files in bin"
        ;;
    models)
        [ -f "$W/smollm2.gguf" ] || python3 -m lab.models clone .carry/smollm2.meta.gguf -o "$W/smollm2.gguf"
        quant() {  # name preset layers type [llama-quantize options]
            local name=$1 preset=$2 layers=$3 qtype=$4
            shift 4
            [ -f "$M/$name.gguf" ] && return 0
            python3 -m lab.models dense --preset "$preset" --layers "$layers" --tokenizer-from "$W/smollm2.gguf" \
                -o "$M/$name.f16.gguf" >>"$W/models.log" 2>&1 &&
                "$B/bin/llama-quantize" "$@" "$M/$name.f16.gguf" "$M/$name.gguf" "$qtype" "$(nproc)" \
                    >>"$W/models.log" 2>&1 && rm -f "$M/$name.f16.gguf" ||
                { tail -20 "$W/models.log" >&2; log "model $name failed"; exit 1; }
            log "$name: $(du -m "$M/$name.gguf" | cut -f1) MiB"
        }
        quant llama8b-L16 llama8b 16 Q4_K_M
        quant qwen27b-L4 qwen27b 4 Q5_K_M --tensor-type attn_q=q8_0 --tensor-type attn_k=q8_0 \
            --tensor-type attn_v=q8_0 --tensor-type attn_output=q8_0 --tensor-type ffn_down=q6_K \
            --output-tensor-type q6_K
        ;;
    tune)
        # a journal carried from an earlier machine (carry build/cfg-carry/): the sweep resumes from it
        if [ ! -f "$R/tuning.journal.jsonl" ] && [ -f build/cfg-carry/tuning.journal.jsonl.gz ]; then
            gunzip -c build/cfg-carry/tuning.journal.jsonl.gz >"$R/tuning.journal.jsonl"
            log "tune: resuming from the carried journal ($(wc -l <"$R/tuning.journal.jsonl") lines)"
        fi
        # the harness' stock anchor must be stock: the tree carries the hook without a table here
        t0=$(date +%s)
        timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
            tune run "$C/census.parquet" --whole-shapes --configs all --llama-cpp "$TREE" --build-dir "$B" \
            -o "$R/tuning.parquet" --journal "$R/tuning.journal.jsonl" --case-timeout 120 \
            --max-seconds "$(($(left) - 15))" 2>&1 | tail -25 | tee -a "$OUT/configs.log"
        echo "$(($(date +%s) - t0))" >>"$W/tune-seconds.txt"
        log "tune: $(wc -l <"$R/tuning.journal.jsonl") journal lines; wall so far $(($(paste -sd+ "$W/tune-seconds.txt"))) s"
        ;;
    table)
        [ -f "$R/tuning.parquet" ] || { log "table needs the finished sweep"; exit 1; }
        if [ ! -f "$R/table.json" ]; then
            gd codegen "$R/tuning.parquet" --census "$C/census.parquet" -o "$R" 2>&1 | tail -5 | tee -a "$OUT/configs.log"
        fi
        # issue #11: where no configuration is involved, the decisions should match the route-only table
        gd diff "$C/table.json" "$R/table.json" --json >"$R/diff-route-only-table.json" 2>&1 || true
        gd diff "$C/table.json" "$R/table.json" 2>&1 | tail -40 | tee -a "$OUT/configs.log"
        [ -f "$W/crude/table.json" ] || gd codegen-crude -o "$W/crude" 2>&1 | tail -2
        for arm in table crude; do
            [ -x "$W/bin-$arm/llama-bench" ] && continue
            src=$R/table.json
            [ $arm = crude ] && src=$W/crude/table.json
            gd install --llama-cpp "$TREE" --table "$src" >&2 && build "build-$arm"
            mkdir -p "$W/bin-$arm" && cp -a "$B"/bin/. "$W/bin-$arm/"
            log "built arm $arm"
        done
        gd install --llama-cpp "$TREE" >&2  # back to no table for any later sweep
        ;;
    ab)
        AB=$R/ab-configs-$(echo ${AB_MODELS:-llama8b-L16 qwen27b-L4} | tr " " +).jsonl
        rm -f "$AB"
        bench=(--bench "-ngl 99 -fa on -b 2048 -p 2048 -ub ${AB_UBATCH:-128,256,512,2048} -n 0")
        bench+=(--bench "-ngl 99 -fa on -p 0 -n 128")
        models=()
        for name in ${AB_MODELS:-llama8b-L16 qwen27b-L4}; do models+=(--model "$name=$M/$name.gguf"); done
        timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
            ab --arm "stock=$W/bin-table/llama-bench:off" --arm "table=$W/bin-table/llama-bench:table" \
            --arm "crude=$W/bin-crude/llama-bench:table" "${models[@]}" "${bench[@]}" \
            --expect-table "$R/table.json" --pairs "${AB_PAIRS:-8}" --reps "${AB_REPS:-3}" --log "$W/ab-runs.log" -o "$AB" 2>&1 | tail -30 |
            tee -a "$OUT/configs.log"
        log "ab: $(wc -l <"$AB" 2>/dev/null || echo 0) records"
        ;;
    *)
        log "unknown step $step"
        exit 2
        ;;
    esac
done
tar -czf "$OUT/configs-result.tar.gz" -C "$W" result crude
log "done; $(left) s left"
