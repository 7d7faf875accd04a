#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# Real runs of `ggml-dispatch autotune` and `ggml-dispatch tune verify` on the lent GPU, building
# llama.cpp there (no prebuilt carry). Needs .carry/llama.cpp.tar.xz and .carry/smollm2.meta.gguf
# (`make llama-tarball device-integration-carry`). Each part is resumable: a part stopped by its
# deadline (DEADLINE seconds after the script starts, default 540) leaves its state under build/at/,
# which a next call on the still-warm machine continues; every part packs what it has into $OUT.
#
#   PART=smollm2  autotune on SmolLM2-135M (rebuilt from the real file's metadata): all stages
#   PART=verify   tune verify of the committed H200 table on points its census lacks (odd M on the
#                 census shapes; 70B-class shapes of the census types); needs a build without a table
#   PART=dense8b  autotune on the 4-layer llama at 8B dimensions (Q4_K_M, random weights)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}" "${PART:?set PART=smollm2|verify|dense8b}"
DEADLINE=${DEADLINE:-540}
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
source lab/cuda-env.sh
W=$REPO/build/at
TREE=$W/llama.cpp
B=$W/build-sys
# the image's CC/CXX/CUDAHOSTCXX name a g++ that links libstdc++ statically: a harness and a libggml-cuda
# built with it each carry their own copy and the process aborts at start-up (free(): invalid pointer
# in std::locale); the system compiler links libstdc++ shared, as llama.cpp builds normally do
unset CC CXX CUDAHOSTCXX
mkdir -p "$W"
if [ ! -f "$TREE/ggml/include/ggml.h" ]; then
    tar -xJf .carry/llama.cpp.tar.xz -C "$W"
fi
# the carried tarball leaves out pocs/ and app/ (ggml_dispatch.fetch TRIM); llama.cpp's CMakeLists
# adds them with the examples and the app: empty stand-ins let the whole tree configure
for d in pocs app; do [ -d "$TREE/$d" ] || { mkdir -p "$TREE/$d" && touch "$TREE/$d/CMakeLists.txt"; }; done
export PYTHONPATH=$REPO:$TREE/gguf-py PYTHONUNBUFFERED=1
gd() { python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' "$@"; }
nvidia-smi --query-gpu=name,uuid,driver_version,memory.used --format=csv >"$OUT/gpu-$PART.csv" 2>&1

case $PART in
smollm2)
    [ -f "$W/smollm2.gguf" ] || python3 -m lab.models clone .carry/smollm2.meta.gguf -o "$W/smollm2.gguf"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        autotune --llama-cpp "$TREE" --model "$W/smollm2.gguf" --build-dir "$B" \
        --workload decode,prefill --ubatch 512,2048 --trials 5 --tune-seconds 150 --pairs 4 --reps 3 \
        -o "$W/at-smollm2" 2>&1 | tee "$OUT/autotune-smollm2.log"
    echo "autotune rc=${PIPESTATUS[0]}" | tee -a "$OUT/autotune-smollm2.log"
    tar -czf "$OUT/autotune-smollm2.tar.gz" -C "$W" at-smollm2
    ;;
verify)
    # the harness' stock anchor must be stock: no table compiled in
    gd install --llama-cpp "$TREE" >&2 && cmake --build "$B" -j "$(nproc)" --target llama-bench test-backend-ops >"$W/rebuild-verify.log" 2>&1 ||
        { tail -20 "$W/rebuild-verify.log"; exit 1; }
    T=tables/cuda-sm90-nvidia-h200
    mkdir -p "$W/verify"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        tune verify $T/table.json --shape q4_K:28672x8192 --shape q4_K:8192x28672 --shape q6_K:8192x28672 \
        --shape q5_K:28672x8192 --m 1,5,6,7,8,256,384,488,512,2048 --trials 5 \
        --llama-cpp "$TREE" --build-dir "$B" -o "$W/verify/verify-70b.parquet" 2>&1 | tail -40 | tee "$OUT/verify-70b.log"
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        tune verify $T/table.json --census $T/census.parquet --m 5,6,7,384,488 --trials 5 \
        --llama-cpp "$TREE" --build-dir "$B" -o "$W/verify/verify-odd.parquet" 2>&1 | tail -40 | tee "$OUT/verify-odd.log"
    tar -czf "$OUT/verify.tar.gz" -C "$W" verify
    ;;
dense8b)
    M=$W/models
    mkdir -p "$M"
    if [ ! -f "$M/llama8b-L4.gguf" ]; then
        [ -f "$W/smollm2.gguf" ] || python3 -m lab.models clone .carry/smollm2.meta.gguf -o "$W/smollm2.gguf"
        gd install --llama-cpp "$TREE" >&2
        cmake --build "$B" -j "$(nproc)" --target llama-quantize >"$W/quantize-build.log" 2>&1 || { tail -20 "$W/quantize-build.log"; exit 1; }
        python3 -m lab.models dense --preset llama8b --layers 4 --tokenizer-from "$W/smollm2.gguf" -o "$M/llama8b-L4.f16.gguf" &&
            "$B/bin/llama-quantize" "$M/llama8b-L4.f16.gguf" "$M/llama8b-L4.gguf" Q4_K_M >"$W/quantize.log" 2>&1 &&
            rm -f "$M/llama8b-L4.f16.gguf" || { tail -20 "$W/quantize.log"; exit 1; }
    fi
    timeout "$(left)" python3 -c 'import sys; from ggml_dispatch.cli import main; main(sys.argv[1:])' \
        autotune --llama-cpp "$TREE" --model "$M/llama8b-L4.gguf" --build-dir "$B" \
        --workload decode,prefill --ubatch 512 --trials 5 --tune-seconds 200 --coverage 0.9 --pairs 4 --reps 3 \
        -o "$W/at-dense8b" 2>&1 | tee "$OUT/autotune-dense8b.log"
    echo "autotune rc=${PIPESTATUS[0]}" | tee -a "$OUT/autotune-dense8b.log"
    tar -czf "$OUT/autotune-dense8b.tar.gz" -C "$W" at-dense8b
    ;;
harness-info)
    # the harness linked against a build made here (tune's --build-dir mode), started under the debugger
    gd install --llama-cpp "$TREE" >&2
    cmake -S "$TREE" -B "$W/build-nofa" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGGML_CUDA=ON -DGGML_CUDA_FA=OFF \
        -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90 >"$W/nofa.log" 2>&1 &&
        cmake --build "$W/build-nofa" -j "$(nproc)" --target ggml >>"$W/nofa.log" 2>&1 || { tail -20 "$W/nofa.log"; exit 1; }
    gd tune build --llama-cpp "$TREE" --build-dir "$W/build-nofa" 2>&1 | tail -5
    H=$(ls .cache/tuner-harness/*/bin/ggml-dispatch-harness | head -1)
    echo "harness: $H"; ldd "$H" | head -20
    LD_LIBRARY_PATH=$W/build-nofa/bin:$LD_LIBRARY_PATH "$H" --info; echo "rc=$?"
    env | grep -E '^(LDFLAGS|CXXFLAGS|CFLAGS|CC|CXX|CUDAHOSTCXX)=' ; which c++ g++ cc; c++ --version | head -1
    cat "$(dirname "$(dirname "$H")")/CMakeFiles/ggml-dispatch-harness.dir/link.txt"; echo
    grep -E 'CMAKE_CXX_COMPILER:|CMAKE_EXE_LINKER_FLAGS:' "$(dirname "$(dirname "$H")")/CMakeCache.txt"
    nm -C "$H" | grep -c 'std::locale' ; nm -D "$W/build-nofa/bin/libggml-cuda.so.0" | grep -i ios_base_library
    strings "$W/build-nofa/bin/libggml-cuda.so.0" | grep -m3 'GCC: ('; strings "$H" | grep -m3 'GCC: ('
    ;;
*)
    echo "unknown PART $PART" >&2
    exit 2
    ;;
esac
echo "part $PART done in $(($(date +%s) - START)) s"
