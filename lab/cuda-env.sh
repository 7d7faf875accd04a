# Lab script: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
# Sourced on the GPU machine: put the CUDA runtime and cuBLAS 13 libraries that the carried builds link
# against on LD_LIBRARY_PATH (the image has them in the CUDA toolkit or in PyTorch's nvidia wheels).
_dirs="/usr/local/cuda/lib64 $(python3 -c 'import glob, site
print(" ".join(sorted({g for p in site.getsitepackages() for g in glob.glob(p + "/nvidia/*/lib")})))' 2>/dev/null)"
for d in $_dirs; do
    if [ -e "$d/libcublas.so.13" ] || [ -e "$d/libcudart.so.13" ]; then
        LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
done
unset _dirs d
export LD_LIBRARY_PATH
