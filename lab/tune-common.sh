# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# Shared by lab/tune-*.sh (sourced, not run): the patched llama.cpp tree, the ggml build to measure,
# and the harness (+ test-backend-ops) built against it. Expects REPO, WORK, LOG, PY, DEVICE, JOBS, T0
# and log(); sets TREE, BUILD_DIR (if prebuilt), HARNESS, TBO.
#
# Which ggml is measured: BUILD_DIR if given; else lab/integration.sh's patched build if this warm
# machine has it (build/integration/patched, same patch hash); else the tarball's tree
# (LLAMA_TARBALL, default .carry/llama.cpp.tar.xz), patched here with `ggml-dispatch install`, its
# ggml-cuda built by the harness' CMake (sm_90, FlashAttention off, ~4 min on 16 cores; kept in
# $WORK while the machine stays warm). test-backend-ops is the prebuilt one next to the libraries,
# else tests/test-backend-ops.cpp built against the same ggml (NEED_TBO=1 only).

# --- the llama.cpp tree (patched) and the ggml build to measure -----------------------------------
PY_INSTALL='import sys; from ggml_dispatch.hook.cli import install_cmd; install_cmd(sys.argv[1:])'
PHASH_WANT=$(PYTHONPATH=$REPO $PY -c 'from ggml_dispatch.hook import install as i; print(i.patch_hash(i.native_sources(), i.load_specs()))' 2>/dev/null || echo "")
INTEGRATION=$REPO/build/integration/patched
if [ -z "${BUILD_DIR:-}" ] && ls "$INTEGRATION"/libggml-cuda.so* >/dev/null 2>&1 \
    && [ -n "$PHASH_WANT" ] && [ "$(cat "$INTEGRATION/PATCH_HASH" 2>/dev/null)" = "$PHASH_WANT" ]; then
    BUILD_DIR=$INTEGRATION  # lab/integration.sh's patched build on this (warm) machine
    log "reusing the patched build in $BUILD_DIR"
fi
TREE=${LLAMA_CPP_DIR:-}
if [ -z "$TREE" ] && [ -f "$REPO/build/integration/llama.cpp/ggml/include/ggml.h" ] && [ "${BUILD_DIR:-}" = "$INTEGRATION" ]; then
    TREE=$REPO/build/integration/llama.cpp
fi
if [ -z "$TREE" ]; then
    TARBALL=${LLAMA_TARBALL:-$REPO/.carry/llama.cpp.tar.xz}
    if [ ! -f "$WORK/llama.cpp/ggml/include/ggml.h" ]; then
        [ -f "$TARBALL" ] || { log "no LLAMA_CPP_DIR and no tarball at $TARBALL (make llama-tarball)"; exit 2; }
        log "unpacking $TARBALL"
        tar -xJf "$TARBALL" -C "$WORK"
    fi
    TREE=$WORK/llama.cpp
    # idempotent; a tree that already carries this hook is left as it is
    PYTHONPATH=$REPO $PY -c "$PY_INSTALL" --llama-cpp "$TREE" >>"$LOG" 2>&1 || { tail -20 "$LOG"; exit 1; }
fi
[ -f "$TREE/ggml/include/ggml.h" ] || { log "$TREE is not a llama.cpp tree"; exit 2; }
if [ -f "$TREE/ggml/src/ggml-cuda/ggml-dispatch-build.h" ]; then
    log "tree $TREE: $(grep -h 'define GGML_DISPATCH_PATCH_HASH' "$TREE/ggml/src/ggml-cuda/ggml-dispatch-build.h")"
else
    log "WARNING: $TREE carries no ggml-dispatch install: routes other than stock will be ineligible"
fi

# --- build: harness + test-backend-ops against the same ggml -----------------------------------
VERSION=$(PYTHONPATH=$REPO $PY -c 'from ggml_dispatch.tuner.build import harness_version; print(harness_version())')
HB=$WORK/harness
ARGS=(-DLLAMA_CPP_DIR="$TREE" -DTUNER_HARNESS_VERSION="$VERSION")
TBO=""
if [ -n "${BUILD_DIR:-}" ]; then
    LIBDIR=$BUILD_DIR/bin
    [ -d "$LIBDIR" ] || LIBDIR=$BUILD_DIR
    if [ "$DEVICE" != CPU ] && ! ls "$LIBDIR"/libggml-cuda.so* >/dev/null 2>&1; then
        log "$BUILD_DIR has no libggml-cuda.so (bin/ or the folder)"
        exit 2
    fi
    ARGS+=(-DGGML_BUILD_DIR="$BUILD_DIR")
    export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    [ -x "$LIBDIR/test-backend-ops" ] && TBO=$LIBDIR/test-backend-ops
    log "linking the prebuilt ggml of $BUILD_DIR"
else
    ARGS+=(-DGGML_BUILD_DIR= -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_CUDA_FA=OFF)
    log "building ggml-cuda from $TREE (sm_90, FA off)"
fi
if [ -n "$TBO" ] || [ "${NEED_TBO:-0}" != 1 ]; then ARGS+=(-DTUNER_TEST_BACKEND_OPS=OFF); else ARGS+=(-DTUNER_TEST_BACKEND_OPS=ON); fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S ggml_dispatch/tuner/harness -B "$HB" "${GEN[@]}" "${ARGS[@]}" >>"$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cmake --build "$HB" -j "$JOBS" >>"$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
log "build done in $(( $(date +%s) - T0 )) s"
HARNESS=$HB/bin/ggml-dispatch-harness
[ -n "$TBO" ] || [ "${NEED_TBO:-0}" != 1 ] || TBO=$HB/bin/test-backend-ops
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >>"$LOG" 2>&1 || true
"$HARNESS" --info --device "$DEVICE" >>"$LOG" 2>&1

