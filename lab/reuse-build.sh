#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
#
# Points lab/attn.sh, lab/cache.sh and lab/moe.sh (build/at/) at the tree and CMake build that
# lab/configs.sh made in build/cfg/ on this still-warm machine: both use the same CMake line, so the
# second script's build step is incremental (about a minute) instead of cold (about five).
#
#   OUT=<dir> bash lab/reuse-build.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT}"
mkdir -p "$OUT" build/at
if [ -e build/at/llama.cpp ] || [ -e build/at/build-sys ]; then
    echo "reuse-build.sh: build/at already has a tree or build; left as it is" | tee -a "$OUT/reuse.log"
    exit 0
fi
[ -f build/cfg/build/CMakeCache.txt ] || { echo "reuse-build.sh: no build/cfg/build (run lab/configs.sh STEPS=build)" >&2; exit 1; }
ln -s ../cfg/llama.cpp build/at/llama.cpp
ln -s ../cfg/build build/at/build-sys
[ -f build/cfg/smollm2.gguf ] && [ ! -e build/at/smollm2.gguf ] && cp build/cfg/smollm2.gguf build/at/
echo "reuse-build.sh: build/at -> build/cfg" | tee -a "$OUT/reuse.log"
