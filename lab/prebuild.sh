#!/usr/bin/env bash
# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# Build ggml-cuda (sm_90, FlashAttention on, what users run) HERE, on a machine without a GPU, and pack
# the builds for the GPU machine, which starts bare on every call and would spend ~4 of its minutes
# rebuilding. One base build travels whole (.carry/bin-patched.tar.xz, ~42 MB); every other variant
# travels as a binary delta of libggml-cuda.so against it (lab.bindelta, 1-3 MB each).
#
#   lab/prebuild.sh stock               unpatched tree (the A/B's "unpatched" arm)
#   lab/prebuild.sh patched             hook, no table (the base)
#   lab/prebuild.sh table  TABLE.json   hook + a table compiled in
#   lab/prebuild.sh crude  TABLE.json   hook + the crude one-rule table (a second build of the same tree)
#
# The tree is .cache/llama.cpp-gpu (a copy of the pinned tree), the build .cache/build-gpu; a cold build
# takes about an hour on 2 cores, a variant about a minute. Linking needs cuBLAS (PyPI nvidia-cublas,
# unpacked in .cache/cublas) and a link-time stub of libcuda.so.1 (the real driver library is loaded
# on the GPU machine). Each variant's bin/ is kept in .cache/bin-<name>.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
NAME=${1:?usage: lab/prebuild.sh stock|patched|table|crude [TABLE.json]}
TABLE=${2:-}
PY=${PYTHON:-.venv/bin/python}
CACHE=$REPO/.cache
TREE=$CACHE/llama.cpp-gpu
BUILD=$CACHE/build-gpu
CUBLAS=$CACHE/cublas
CARRY=$REPO/.carry
JOBS=${JOBS:-$(nproc)}
mkdir -p "$CARRY"

if [ ! -f "$TREE/ggml/include/ggml.h" ]; then
    cp -a "$($PY -m ggml_dispatch.fetch llama-src)" "$TREE"
fi
if [ ! -f "$CUBLAS/lib/libcublas.so" ]; then
    $PY - <<'EOF'
import zipfile
from ggml_dispatch import fetch
wheel = fetch._download(fetch.CUBLAS_PROJECT, fetch.CUBLAS_VERSION, ".whl", fetch.CUBLAS_WHEEL_SHA256, fetch.CACHE / "dl")
out = fetch.CACHE / "cublas"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        for part in ("include", "lib"):
            prefix = f"nvidia/cu13/{part}/"
            if name.startswith(prefix) and name != prefix:
                (out / part).mkdir(parents=True, exist_ok=True)
                (out / part / name[len(prefix):]).write_bytes(z.read(name))
EOF
    (cd "$CUBLAS/lib" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
fi
if [ ! -f "$CUBLAS/lib/libcuda.so.1" ]; then
    # link-time stand-in for the driver library: the driver API calls ggml-cuda makes (VMM pool)
    for s in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate \
        cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
        echo "int $s(void) { return 0; }"
    done >"$CUBLAS/stub_cuda.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUBLAS/lib/libcuda.so" "$CUBLAS/stub_cuda.c"
    ln -sf libcuda.so "$CUBLAS/lib/libcuda.so.1"
fi

case $NAME in
    stock) [ -f "$TREE/ggml/src/ggml-cuda/ggml-dispatch.install.json" ] &&
        .venv/bin/ggml-dispatch install --llama-cpp "$TREE" --uninstall >&2 ;;
    patched) .venv/bin/ggml-dispatch install --llama-cpp "$TREE" >&2 ;;
    table | crude) .venv/bin/ggml-dispatch install --llama-cpp "$TREE" --table "${TABLE:?a table.json}" >&2 ;;
    *) echo "unknown variant $NAME" >&2; exit 2 ;;
esac

cmake -S "$TREE" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_CUDA_FA=ON -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_OPENSSL=OFF -DCUDA_cublas_LIBRARY="$CUBLAS/lib/libcublas.so" \
    -DCUDA_cublasLt_LIBRARY="$CUBLAS/lib/libcublasLt.so" -DCUDA_cuda_driver_LIBRARY="$CUBLAS/lib/libcuda.so" \
    "-DCMAKE_CUDA_FLAGS=-I$CUBLAS/include" "-DCMAKE_CXX_FLAGS=-I$CUBLAS/include" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$CUBLAS/lib" -DCMAKE_SKIP_BUILD_RPATH=ON >"$BUILD.configure.log"
ninja -C "$BUILD" -j "$JOBS" llama-bench test-backend-ops llama-quantize llama-completion >"$BUILD.$NAME.log" 2>&1 ||
    { tail -30 "$BUILD.$NAME.log" >&2; exit 1; }
rm -rf "$CACHE/bin-$NAME"
cp -a "$BUILD/bin" "$CACHE/bin-$NAME"
stamp=$TREE/ggml/src/ggml-cuda/ggml-dispatch-build.h
[ -f "$stamp" ] && cp "$stamp" "$CACHE/bin-$NAME/"
[ -f "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" ] && [ "$NAME" != stock ] &&
    cp "$TREE/ggml/src/ggml-cuda/ggml-dispatch-table.h" "$CACHE/bin-$NAME/"

LIB=libggml-cuda.so.0.25.3
if [ "$NAME" = patched ]; then
    tar -C "$CACHE/bin-patched" -cf - . | xz -T"$JOBS" -6 >"$CARRY/bin-patched.tar.xz.tmp"
    mv "$CARRY/bin-patched.tar.xz.tmp" "$CARRY/bin-patched.tar.xz"
    echo "packed $CARRY/bin-patched.tar.xz ($(du -m "$CARRY/bin-patched.tar.xz" | cut -f1) MB)" >&2
else
    [ -f "$CACHE/bin-patched/$LIB" ] || { echo "build the base first: lab/prebuild.sh patched" >&2; exit 2; }
    $PY -m lab.bindelta make "$CACHE/bin-patched/$LIB" "$CACHE/bin-$NAME/$LIB" "$CARRY/$NAME.delta"
    echo "packed $CARRY/$NAME.delta ($(du -k "$CARRY/$NAME.delta" | cut -f1) kB)" >&2
fi
