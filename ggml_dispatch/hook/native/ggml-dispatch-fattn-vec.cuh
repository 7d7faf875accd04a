// ggml-dispatch-fattn-vec.cuh: which VEC instance a kv=shadow launch runs
// Included by the hook at one place of an upstream file (ggml_dispatch/hook/native/fattn.cu.hook, hunk 'include'): it reads
// that file's own functions defined above that place, so it is not a self-contained header.
#pragma once

#include "ggml-dispatch-hook.cuh"
#include "ggml-dispatch-kv.cuh"
#include "ggml-dispatch-params.h"

// VEC under `kv=shadow` on a K/V type a shadow is kept for runs the f16 instance (ggml_cuda_flash_attn_ext_vec),
// which reads the shadow or, where none can be had, converts K and V into the node's scratch as the other
// kernels do.
static bool ggml_cuda_fattn_dispatch_vec_f16(const ggml_tensor * dst, const ggml_dispatch_params & p) {
    return p.fa_kv == GGML_DISPATCH_FA_KV_SHADOW &&
           (ggml_cuda_dispatch_kv_shadow_serves(dst->src[1]) || ggml_cuda_dispatch_kv_shadow_serves(dst->src[2]));
}

// The same under the parameters of the launch in progress.
static bool ggml_cuda_fattn_dispatch_vec_f16(const ggml_tensor * dst) {
    return ggml_cuda_fattn_dispatch_vec_f16(dst, ggml_dispatch_params_current());
}
