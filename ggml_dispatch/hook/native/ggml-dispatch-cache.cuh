// ggml-dispatch: the weight cache as ggml-cuda.cu calls it (implementation: ggml-dispatch-cache-impl.cuh,
// compiled into ggml-dispatch.cu; bookkeeping: ggml-dispatch-cache.h).
//
// `cublas/weight=cached` makes ggml_cuda_mul_mat_cublas_impl read a persistent f16 copy of the weight,
// made once by the tree's own to-f16 converter (so the GEMM's input is bit-equal to the per-call
// conversion's) instead of converting on every call. Stock never sets the parameter, never creates a
// copy, and the buffer hooks return at once while nothing is cached.
#pragma once

#include "common.cuh"

// The f16 copy of src0 for the cuBLAS call in compute type `compute_type`, or null: run the per-call
// conversion. Refuses (the node counts ineligible:params) when the copy cannot apply at all: compute
// type not f16, src0 already f16, not contiguously allocated, no converter, not in a CUDA buffer of
// usage WEIGHTS (`cuda_buffer`: ggml_backend_buffer_is_cuda(src0->buffer)). Returns null without a
// refusal when the budget is spent, the allocation failed, the stream is capturing (the copy is made
// at the next direct evaluation) or the weight was written after it was cached.
const void * ggml_cuda_dispatch_cached_weight(int device, cudaStream_t stream, const ggml_tensor * src0,
                                              ggml_type compute_type, bool cuda_buffer);

// Lifetime hooks of the CUDA buffer: a write into [lo, lo + size) frees the weight copies it touches (and
// marks those weights mutable) before it, and refills the KV shadows it touches after it (written_after);
// freeing the buffer frees its copies.
void ggml_cuda_dispatch_cache_written(ggml_backend_buffer_t buffer, const void * lo, size_t size);
void ggml_cuda_dispatch_cache_written_after(ggml_backend_buffer_t buffer, const void * lo, size_t size);
void ggml_cuda_dispatch_cache_buffer_freed(ggml_backend_buffer_t buffer);

// Both write hooks around one buffer write: constructed first thing in the write function, destroyed
// after its write and sync.
struct ggml_cuda_dispatch_write_scope {
    ggml_backend_buffer_t buffer;
    const void *          lo;
    size_t                size;

    ggml_cuda_dispatch_write_scope(ggml_backend_buffer_t buffer, const void * lo, size_t size) :
        buffer(buffer), lo(lo), size(size) {
        ggml_cuda_dispatch_cache_written(buffer, lo, size);
    }
    ~ggml_cuda_dispatch_write_scope() { ggml_cuda_dispatch_cache_written_after(buffer, lo, size); }
    ggml_cuda_dispatch_write_scope(const ggml_cuda_dispatch_write_scope &) = delete;
    ggml_cuda_dispatch_write_scope & operator=(const ggml_cuda_dispatch_write_scope &) = delete;
};
