// ggml-dispatch: the KV shadows' CUDA side (included once, by ggml-dispatch.cu, after the weight cache's,
// whose allocator, budget rules and texts it shares).
//
// A shadow is the f16 image of a whole quantized cache tensor (the view's root: llama.cpp's cache_k_l<i> /
// cache_v_l<i>), cudaMalloc'd within its own budget (the table's GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES,
// unlimited under force: and harness overrides, lowered by GGML_CUDA_DISPATCH_KV_SHADOW=off|<MiB>), of a
// CUDA buffer that is not a compute buffer, keyed like a weight copy. Made only outside capture; when made,
// captured graphs go stale, since they lack the mirror of this cache's writes. Writes from inside the graph
// are mirrored after their node (ggml_cuda_dispatch_kv_shadow_mirror); writes from outside it (a state
// restore: set_tensor, memset, copy, clear) are refilled right after the write, on the writer's stream,
// so a restore costs one conversion of what it wrote and leaves captured graphs valid.
#pragma once

#include "ggml-dispatch-kv.cuh"
#include "ggml-dispatch-cache-impl.cuh"

namespace {

static copy_store & kv_st() {
    static copy_store * s = new copy_store("GGML_CUDA_DISPATCH_KV_SHADOW", "KV shadow", /*follow_writes =*/ true);
    return *s;  // never destroyed: buffers may be freed at exit
}

static const ggml_tensor * kv_root(const ggml_tensor * t) {
    return t->view_src != nullptr ? t->view_src : t;
}

static ggml_dispatch::cache_key kv_key(int device, const ggml_tensor * root) {
    return ggml_dispatch::cache_key{device, root->data, (int) root->type, ggml_nelements(root)};
}

// A view `t` of a cache tensor a shadow may be kept for: a served type, the root contiguous in a CUDA buffer
// of this device that is not a compute buffer (its tensors live as long as the graph), the view starting on
// a block and striding in whole blocks (so its f16 image is the same view of the shadow).
static bool kv_shadowable(int device, const ggml_tensor * t) {
    const ggml_tensor * root = kv_root(t);
    if (!ggml_cuda_dispatch_kv_shadow_serves(t) || root->type != t->type || root->buffer == nullptr ||
            root->data == nullptr || ggml_backend_buffer_get_type(root->buffer) != ggml_backend_cuda_buffer_type(device) ||
            ggml_backend_buffer_get_usage(root->buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE || !ggml_is_contiguous(root)) {
        return false;
    }
    const size_t ts  = ggml_type_size(t->type);
    const size_t off = (size_t) ((const char *) t->data - (const char *) root->data);
    return off % ts == 0 && t->nb[0] == ts && t->nb[1] % ts == 0 && t->nb[2] % ts == 0 && t->nb[3] % ts == 0;
}

static void kv_fill(const ggml_tensor * root, half * shadow, cudaStream_t stream) {
    ggml_get_to_fp16_cuda(root->type)(root->data, shadow, ggml_nelements(root), stream);
}

// The rows a q8_0 SET_ROWS node just wrote into the cache, dequantized into the shadow as the tree's
// contiguous q8_0 -> f16 converter does (int8 to half exactly, one rounding of the product by the scale).
// One thread per q8_0 block of the source rows; the index math is set_rows.cu's.
template <typename idx_t>
static __global__ void k_kv_shadow_set_rows_q8_0(const char * __restrict__ root, half * __restrict__ shadow,
                                                 const char * __restrict__ idx, const int64_t dst_off,
                                                 const int64_t nblk0, const int64_t ne01, const int64_t ne02,
                                                 const int64_t ne11, const int64_t ne12, const size_t nb10,
                                                 const size_t nb11, const size_t nb12, const size_t nb1,
                                                 const size_t nb2, const size_t nb3, const int64_t total) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    int64_t       t   = i;
    const int64_t ib  = t % nblk0;
    t /= nblk0;
    const int64_t i01 = t % ne01;
    t /= ne01;
    const int64_t i02 = t % ne02;
    const int64_t i03 = t / ne02;
    const int64_t row = (int64_t) *(const idx_t *) (idx + i01*nb10 + (i02 % ne11)*nb11 + (i03 % ne12)*nb12);
    const int64_t byte = dst_off + row*(int64_t) nb1 + i02*(int64_t) nb2 + i03*(int64_t) nb3 + ib*(int64_t) sizeof(block_q8_0);
    const block_q8_0 * b = (const block_q8_0 *) (root + byte);
    half *             y = shadow + byte / (int64_t) sizeof(block_q8_0) * QK8_0;
    const half         d = b->d;
#pragma unroll
    for (int j = 0; j < QK8_0; ++j) {
        y[j] = __hmul(__int2half_rn(b->qs[j]), d);
    }
}

// Blocks [first, first + n) of a q8_0 tensor dequantized into its shadow as the tree's converter does.
static __global__ void k_kv_shadow_fill_q8_0(const block_q8_0 * __restrict__ x, half * __restrict__ shadow,
                                             const int64_t first, const int64_t n) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const block_q8_0 * b = x + first + i;
    half *             y = shadow + (first + i) * QK8_0;
    const half         d = b->d;
#pragma unroll
    for (int j = 0; j < QK8_0; ++j) {
        y[j] = __hmul(__int2half_rn(b->qs[j]), d);
    }
}

}  // namespace

bool ggml_cuda_dispatch_kv_shadow_serves(const ggml_tensor * t) {
    return t != nullptr && t->type == GGML_TYPE_Q8_0;
}

bool ggml_cuda_dispatch_kv_shadow_view(int device, cudaStream_t stream, const ggml_tensor * t, const char ** data,
                                       size_t * nb1, size_t * nb2, size_t * nb3) {
    if (!kv_shadowable(device, t)) {
        return false;
    }
    copy_store &            ks      = kv_st();
    const ggml_tensor *     root    = kv_root(t);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
        (void) cudaGetLastError();
        capture = cudaStreamCaptureStatusActive;  // unknown: do not fill
    }
    const int64_t n    = ggml_nelements(root);
    void *        copy = nullptr;
    const int     r    = ks.cache.acquire(kv_key(device, root), root->buffer, ggml_nbytes(root), (size_t) n * sizeof(half),
                                            capture != cudaStreamCaptureStatusNone,
                                            [&](void * dst) {
                                                kv_fill(root, (half *) dst, stream);
                                                if (cudaStreamSynchronize(stream) != cudaSuccess) {
                                                    (void) cudaGetLastError();
                                                    return false;
                                                }
                                                return true;
                                            },
                                            &copy);
    if (r == ggml_dispatch::CACHE_MADE || r == ggml_dispatch::CACHE_CAPTURING) {
        // made: graphs captured before it lack the mirror of this cache's writes; capturing: the next
        // direct evaluation makes or refreshes it
        ggml_cuda_dispatch_graphs_stale();
    } else if (r == ggml_dispatch::CACHE_ALLOC_FAIL && !ks.warned_alloc.exchange(true)) {
        GGML_LOG_WARN("ggml_cuda_dispatch: KV shadow: cannot allocate %zu bytes for %s on device %d; it and any later "
                      "failure convert per call\n", (size_t) n * sizeof(half), root->name, device);
    }
    if (copy == nullptr) {
        return false;
    }
    const size_t ts  = ggml_type_size(t->type);
    const size_t bs  = ggml_blck_size(t->type);
    const size_t off = (size_t) ((const char *) t->data - (const char *) root->data) / ts * bs;
    *data = (const char *) copy + off * sizeof(half);
    *nb1  = t->nb[1] / ts * bs * sizeof(half);
    *nb2  = t->nb[2] / ts * bs * sizeof(half);
    *nb3  = t->nb[3] / ts * bs * sizeof(half);
    return true;
}

namespace {

// kv=reuse (ggml_cuda_dispatch_select_flash_attn): has a shadow of the node's K or V cache been made (0), or,
// where none has, how many cells does the cache hold (the longest KV length a view of it can have; -1: no
// shadow can be kept for it)?
static int64_t kv_shadow_cells_unless_made(int device, const ggml_tensor * dst) {
    int64_t cells = -1;
    for (const ggml_tensor * t : {dst->src[1], dst->src[2]}) {
        if (t == nullptr || !kv_shadowable(device, t)) {
            continue;
        }
        const ggml_tensor * root = kv_root(t);
        if (kv_st().cache.lookup(kv_key(device, root)) != nullptr) {
            return 0;
        }
        const int64_t row = t->ne[0] * t->ne[2] * t->ne[3];  // a view [D, n_kv, KV heads, streams] of [D x heads, cells]
        cells = std::max(cells, row > 0 ? ggml_nelements(root) / row : 0);
    }
    return cells;
}

}  // namespace

void ggml_cuda_dispatch_kv_shadow_mirror(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
    copy_store & ks = kv_st();
    if (ks.cache.empty() || dst->view_src == nullptr || ggml_is_empty(dst) || dst->op == GGML_OP_NONE ||
            dst->op == GGML_OP_VIEW || dst->op == GGML_OP_RESHAPE || dst->op == GGML_OP_PERMUTE ||
            dst->op == GGML_OP_TRANSPOSE) {
        return;
    }
    const ggml_tensor * root   = dst->view_src;
    half *              shadow = (half *) ks.cache.lookup(kv_key(ctx.device, root));
    if (shadow == nullptr) {
        return;
    }
    cudaStream_t        stream = ctx.stream();
    const ggml_tensor * src0   = dst->src[0];
    const ggml_tensor * src1   = dst->src[1];
    if (dst->op == GGML_OP_SET_ROWS && dst->type == GGML_TYPE_Q8_0 && root->type == GGML_TYPE_Q8_0 &&
            (src1->type == GGML_TYPE_I64 || src1->type == GGML_TYPE_I32) && src0->ne[0] % QK8_0 == 0) {
        const int64_t nblk0 = src0->ne[0] / QK8_0;
        const int64_t total = nblk0 * src0->ne[1] * src0->ne[2] * src0->ne[3];
        if (total == 0) {
            return;
        }
        const int64_t dst_off = (int64_t) ((const char *) dst->data - (const char *) root->data);
        const int     threads = 128;
        const int64_t blocks  = (total + threads - 1) / threads;
        auto launch = [&](auto idx_zero) {
            using idx_t = decltype(idx_zero);
            k_kv_shadow_set_rows_q8_0<idx_t><<<(unsigned) blocks, threads, 0, stream>>>(
                (const char *) root->data, shadow, (const char *) src1->data, dst_off, nblk0, src0->ne[1], src0->ne[2],
                src1->ne[1], src1->ne[2], src1->nb[0], src1->nb[1], src1->nb[2], dst->nb[1], dst->nb[2], dst->nb[3], total);
        };
        if (src1->type == GGML_TYPE_I64) {
            launch(int64_t(0));
        } else {
            launch(int32_t(0));
        }
        return;
    }
    // any other write into the cache (a K shift, a defragmenting copy): all of the shadow again
    kv_fill(root, shadow, stream);
}

namespace {

// After a write from outside the graph (the buffer hooks: the write and its sync on cudaStreamPerThread are
// done, the device is the buffer's): the q8_0 blocks it touched, dequantized into each shadow it overlaps.
static int kv_shadow_refill_written(ggml_backend_buffer_t buffer, const void * lo, size_t size) {
    return kv_st().cache.refill_written(buffer, lo, size, [](const ggml_dispatch::cache_key & k, void * copy,
                                                             size_t from, size_t to) {
        if (k.type != GGML_TYPE_Q8_0) {
            return false;
        }
        const int64_t nblk  = k.nelements / QK8_0;
        const int64_t first = (int64_t) (from / sizeof(block_q8_0));
        const int64_t last  = std::min<int64_t>(nblk, (int64_t) ((to + sizeof(block_q8_0) - 1) / sizeof(block_q8_0)));
        if (last <= first) {
            return true;
        }
        const int threads = 128;
        k_kv_shadow_fill_q8_0<<<(unsigned) ((last - first + threads - 1) / threads), threads, 0, cudaStreamPerThread>>>(
            (const block_q8_0 *) k.data, (half *) copy, first, last - first);
        if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) {
            (void) cudaGetLastError();
            return false;
        }
        return true;
    });
}

static int kv_shadow_buffer_freed(ggml_backend_buffer_t buffer) {
    return kv_st().cache.buffer_freed(buffer);
}

}  // namespace
