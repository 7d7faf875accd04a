// ggml-dispatch: the KV shadows as fattn-common.cuh, fattn.cu and ggml-cuda.cu call them (implementation:
// ggml-dispatch-kv-impl.cuh, compiled into ggml-dispatch.cu; bookkeeping: ggml-dispatch-cache.h with
// follow_writes).
//
// TILE and MMA_F16 read f16 K/V; on a quantized KV cache the tree converts the whole K/V view into the
// node's scratch on every call, which at depth costs more than the kernel itself. A `kv=shadow`
// configuration reads instead a persistent f16 copy of the cache tensor (the shadow), made once by the
// tree's own to-f16 converter and kept equal to it: every node that writes into the cache writes the
// shadow too (SET_ROWS: the rows it set, dequantized as the converter does; any other write: all of it
// again), and a write from outside the graph (set_tensor, state restore, clear) marks it stale, so its
// next direct use fills it again. Stock never sets the parameter and never makes a shadow.
#pragma once

#include "common.cuh"

// Is `t`'s type one a shadow is kept for (q8_0)? The check of a kv=shadow configuration asks it.
bool ggml_cuda_dispatch_kv_shadow_serves(const ggml_tensor * t);

// Points *data and the byte strides at the shadow of the cache tensor `t` views (as f16), made or
// refreshed now if need be. False: run the per-call conversion (not a shadowable cache view, under
// capture with no fresh shadow, over the budget, the allocation failed).
bool ggml_cuda_dispatch_kv_shadow_view(int device, cudaStream_t stream, const ggml_tensor * t, const char ** data,
                                       size_t * nb1, size_t * nb2, size_t * nb3);


// After a node ran (or was captured): if it wrote into a cache tensor that has a shadow, the same write
// into the shadow, on the node's stream.
void ggml_cuda_dispatch_kv_shadow_mirror(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);
