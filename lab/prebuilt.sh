#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# On the GPU machine: unpack a build made by lab/prebuild.sh into DEST and print nothing else.
#   lab/prebuilt.sh NAME DEST      NAME = patched | stock | table | crude
# The base (.carry/bin-patched.tar.xz) is unpacked whole; another variant is the base with its
# libggml-cuda.so rebuilt from .carry/NAME.delta (checked against the sha256 the delta carries).
# Source this file's sibling lab/cuda-env.sh first so the CUDA and cuBLAS libraries are found.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
NAME=${1:?usage: lab/prebuilt.sh NAME DEST}
DEST=${2:?usage: lab/prebuilt.sh NAME DEST}
LIB=libggml-cuda.so.0.25.3
if [ ! -x "$DEST/llama-bench" ]; then
    mkdir -p "$DEST"
    tar -xJf "$REPO/.carry/bin-patched.tar.xz" -C "$DEST"
    if [ "$NAME" != patched ]; then
        PYTHONPATH=$REPO python3 -m lab.bindelta apply "$DEST/$LIB" "$REPO/.carry/$NAME.delta" "$DEST/$LIB.new"
        mv "$DEST/$LIB.new" "$DEST/$LIB"
        chmod +x "$DEST/$LIB"
        rm -f "$DEST/ggml-dispatch-build.h" "$DEST/ggml-dispatch-table.h"
    fi
fi
