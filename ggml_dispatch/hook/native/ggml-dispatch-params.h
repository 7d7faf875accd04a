// ggml-dispatch: parameters of the configuration that runs the current MUL_MAT node.
//
// A configuration is a route plus parameter values (the registry names both). The dispatch sets the
// values around the route's call (ggml_dispatch_params_scope); the kernels' host code reads them at
// the few places where the tree itself chooses: cuBLAS compute and output type (ggml-cuda.cu), mmq's
// column tile width J and stream-k grid (mmq.cuh). All fields 0 ("stock") make every reader do exactly
// what the tree does, so stock stays stock. A value a reader cannot apply (a J without compiled code
// for the type, a stream-k request for a config without stream-k) is not applied: the reader sets
// `refused` and the caller counts the node as ineligible.
#pragma once

#include "ggml.h"
#include "ggml-dispatch-codes.h"

enum ggml_dispatch_cublas_out {
    GGML_DISPATCH_CUBLAS_OUT_STOCK = 0,
    GGML_DISPATCH_CUBLAS_OUT_COMPUTE = 1,  // output in the compute type, then converted to f32
    GGML_DISPATCH_CUBLAS_OUT_F32 = 2,      // f32 output, f32 accumulation (the tree's prefer_f32_output)
};

enum ggml_dispatch_cublas_compute {
    GGML_DISPATCH_CUBLAS_COMPUTE_STOCK = 0,
    GGML_DISPATCH_CUBLAS_COMPUTE_F16 = 1,   // weights and activations converted to f16
    GGML_DISPATCH_CUBLAS_COMPUTE_F32 = 2,
    GGML_DISPATCH_CUBLAS_COMPUTE_BF16 = 3,
};

enum ggml_dispatch_cublas_weight {
    GGML_DISPATCH_CUBLAS_WEIGHT_STOCK  = 0,  // the weight converted on every call
    GGML_DISPATCH_CUBLAS_WEIGHT_CACHED = 1,  // its persistent f16 copy (ggml-dispatch-cache.cuh)
};

enum ggml_dispatch_mmq_stream_k {
    GGML_DISPATCH_MMQ_STREAM_K_STOCK = 0,
    GGML_DISPATCH_MMQ_STREAM_K_ON = 1,     // one block per SM, partial tiles fixed up
    GGML_DISPATCH_MMQ_STREAM_K_TILES = 2,  // one block per output tile, no fixup
    GGML_DISPATCH_MMQ_STREAM_K_WAVE = 3,   // a split's first launch under 2j_wave: about one wave of blocks, each
                                           // running the same number of whole tiles in turn, no fixup
};

enum ggml_dispatch_fa_sparse {
    GGML_DISPATCH_FA_SPARSE_STOCK = 0,
    GGML_DISPATCH_FA_SPARSE_ON    = 1,  // the sparse gather wherever its hard limits hold
    GGML_DISPATCH_FA_SPARSE_OFF   = 2,
};

enum ggml_dispatch_fa_stream_k {
    GGML_DISPATCH_FA_STREAM_K_STOCK = 0,
    GGML_DISPATCH_FA_STREAM_K_ON    = 1,
    GGML_DISPATCH_FA_STREAM_K_OFF   = 2,  // one block per output tile
};

enum ggml_dispatch_fa_kv {
    GGML_DISPATCH_FA_KV_STOCK  = 0,  // a quantized K/V view converted to f16 on every call (TILE, MMA_F16)
    GGML_DISPATCH_FA_KV_SHADOW = 1,  // read its cache's persistent f16 shadow (ggml-dispatch-kv.cuh), made if need be
};

struct ggml_dispatch_params {
    int cublas_out     = GGML_DISPATCH_CUBLAS_OUT_STOCK;
    int cublas_compute = GGML_DISPATCH_CUBLAS_COMPUTE_STOCK;
    int mmq_J          = 0;  // 0: the tree's rule (fewest column tiles, then smallest J)
    int mmq_stream_k   = GGML_DISPATCH_MMQ_STREAM_K_STOCK;
    int mmq_split      = 0;  // MUL_MAT_ID: experts with at most mmq_split x J tokens run J and stream-k, the others stock's
    int mmq_split_wave = 0;  // the split's first launch as one wave of blocks over whole tiles (split=2j_wave)
    int mmq_split_fused = 0; // one launch over the tree's grid at J = 128 (split=2j_fused; with mmq_split 0: split=fit;
                             // 2: split=fit64, over 64-column slots)
    int mmq_expert_filter = 0;  // set by the split for each of its two launches (ggml_dispatch_mmq_expert_skipped)
    int cublas_weight  = GGML_DISPATCH_CUBLAS_WEIGHT_STOCK;
    int refused        = 0;  // set by a reader that could not apply a value
    // FLASH_ATTN_EXT (fattn.cu, fattn-common.cuh); 0: the tree's choice
    int fa_ncols1      = 0;  // MMA_F16 Q columns per tile (switch_ncols1)
    int fa_ncols2      = 0;  // MMA_F16 Q heads per tile (switch_ncols2, the GQA packing)
    int fa_sparse      = GGML_DISPATCH_FA_SPARSE_STOCK;
    int fa_stream_k    = GGML_DISPATCH_FA_STREAM_K_STOCK;
    int fa_blocks      = 0;  // VEC parallel blocks
    int fa_kv          = GGML_DISPATCH_FA_KV_STOCK;
    int fa_kv_warm     = 0;  // the first-use warm-up's launch: converts per call, never makes or reads a shadow
    // decode shapes (mmvq.cu, mmvf.cu); 0: the tree's choice
    int mmvq_nwarps    = 0;  // mmvq warps per block, with mmvq_rows: a compiled candidate (ggml-dispatch-mmvq.h)
    int mmvq_rows      = 0;  // mmvq rows per block
    int mmvq_regs      = 0;  // mmvq registers per thread at most (0: the compiler's choice, as upstream)
    int mmvf_block     = 0;  // mmvf threads per block
};

// The values for the node being computed (one compute thread per backend context). Defined in
// ggml-dispatch.cu; always all-stock outside a scope.
ggml_dispatch_params & ggml_dispatch_params_current();

struct ggml_dispatch_params_scope {
    ggml_dispatch_params saved;
    explicit ggml_dispatch_params_scope(const ggml_dispatch_params & p) : saved(ggml_dispatch_params_current()) {
        ggml_dispatch_params_current() = p;
        ggml_dispatch_params_current().refused = 0;
    }
    bool refused() const { return ggml_dispatch_params_current().refused != 0; }
    ~ggml_dispatch_params_scope() { ggml_dispatch_params_current() = saved; }
    ggml_dispatch_params_scope(const ggml_dispatch_params_scope &) = delete;
    ggml_dispatch_params_scope & operator=(const ggml_dispatch_params_scope &) = delete;
};

// launch_fattn under the launch's parameters: does it read its KV cache's f16 shadow, made now if need be
// (else it converts per call)?
static inline bool ggml_dispatch_fa_reads_shadow() {
    const ggml_dispatch_params & p = ggml_dispatch_params_current();
    return p.fa_kv == GGML_DISPATCH_FA_KV_SHADOW && p.fa_kv_warm == 0;
}

// cuBLAS: the ggml type the GEMM runs in (ggml_cuda_mul_mat_cublas' compute_type).
static inline ggml_type ggml_dispatch_cublas_compute_type(ggml_type stock) {
    switch (ggml_dispatch_params_current().cublas_compute) {
        case GGML_DISPATCH_CUBLAS_COMPUTE_F16:  return GGML_TYPE_F16;
        case GGML_DISPATCH_CUBLAS_COMPUTE_F32:  return GGML_TYPE_F32;
        case GGML_DISPATCH_CUBLAS_COMPUTE_BF16: return GGML_TYPE_BF16;
        default:                                return stock;
    }
}

// cuBLAS: whether a f16/bf16 GEMM writes f32 directly (the tree's prefer_f32_output). F32 compute has
// only one output type: asking it for another is refused.
static inline bool ggml_dispatch_cublas_f32_output(bool stock, ggml_type compute_type) {
    ggml_dispatch_params & p = ggml_dispatch_params_current();
    if (p.cublas_out == GGML_DISPATCH_CUBLAS_OUT_STOCK) {
        return stock;
    }
    if (compute_type == GGML_TYPE_F32) {
        if (p.cublas_out != GGML_DISPATCH_CUBLAS_OUT_F32) {
            p.refused = 1;
        }
        return stock;
    }
    return p.cublas_out == GGML_DISPATCH_CUBLAS_OUT_F32;
}

// mmq under STREAM_K_WAVE: the largest divisor of the tile count within two blocks per SM, so that every
// block's range of the stream-k kernel is whole tiles (no fixup, no buffer from the pool). Without such a
// divisor down to half of that, one block per tile.
static inline int ggml_dispatch_mmq_wave_blocks(int ntiles_dst, int nsm) {
    const int cap = 2*nsm;
    if (ntiles_dst <= cap) {
        return ntiles_dst;
    }
    for (int blocks = cap; blocks >= cap/2; --blocks) {
        if (ntiles_dst % blocks == 0) {
            return blocks;
        }
    }
    return ntiles_dst;
}

// mmq: the grid of the stream-k kernel (stock: one block per tile when tiling is >= 90% efficient).
static inline int ggml_dispatch_mmq_stream_k_blocks(int stock, int ntiles_dst, int nsm) {
    switch (ggml_dispatch_params_current().mmq_stream_k) {
        case GGML_DISPATCH_MMQ_STREAM_K_ON:    return nsm;
        case GGML_DISPATCH_MMQ_STREAM_K_TILES: return ntiles_dst;
        case GGML_DISPATCH_MMQ_STREAM_K_WAVE:  return ggml_dispatch_mmq_wave_blocks(ntiles_dst, nsm);
        default:                               return stock;
    }
}

// mmq split=2j_fused: a narrow tile width compiled beside J = 128 (GGML_DISPATCH_MMQ_FUSED_J_LIST, from the
// registry; mmq.cuh ggml_dispatch_mmq_id_fused instantiates each)
static inline bool ggml_dispatch_mmq_fused_J(int J) {
#define GGML_DISPATCH_MMQ_FUSED_IS(v) J == (v) ||
    return GGML_DISPATCH_MMQ_FUSED_J_LIST(GGML_DISPATCH_MMQ_FUSED_IS) false;
#undef GGML_DISPATCH_MMQ_FUSED_IS
}

// mmq: a config without stream-k (xy tiling) runs one block per tile already; stream-k cannot be asked of it.
static inline void ggml_dispatch_mmq_no_stream_k() {
    ggml_dispatch_params & p = ggml_dispatch_params_current();
    if (p.mmq_stream_k == GGML_DISPATCH_MMQ_STREAM_K_ON) {
        p.refused = 1;
    }
}

// mmq split (MUL_MAT_ID): which experts a launch runs. > 0: those with at most that many tokens; < 0: those
// with more than -filter tokens; 0: all. A block of a skipped expert exits as for an expert without tokens,
// so the two launches of a split write disjoint experts' rows.
#ifdef __CUDACC__
static __device__ __forceinline__ bool ggml_dispatch_mmq_expert_skipped(int filter, int ntokens) {
    return filter > 0 ? ntokens > filter : filter < 0 && ntokens <= -filter;
}

// A tile with no work for the launch: its first column `col0` past its expert's `ntokens` (the tree's own
// test), or an expert the launch leaves to the other one.
static __device__ __forceinline__ bool ggml_dispatch_mmq_tile_idle(int filter, int col0, int ntokens) {
    return col0 >= ntokens || ggml_dispatch_mmq_expert_skipped(filter, ntokens);
}
#endif

// FlashAttention MMA_F16: the sparse gather (ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse): `hard` = the
// gather kernel can run the node, `soft` = stock's threshold that it pays off.
static inline bool ggml_dispatch_fa_sparse(bool hard, bool soft) {
    switch (ggml_dispatch_params_current().fa_sparse) {
        case GGML_DISPATCH_FA_SPARSE_ON:  return hard;
        case GGML_DISPATCH_FA_SPARSE_OFF: return false;
        default:                          return hard && soft;
    }
}

// FlashAttention with stream-k (MMA_F16, launch_fattn): stream-k or one block per output tile.
static inline bool ggml_dispatch_fa_stream_k(bool stock) {
    switch (ggml_dispatch_params_current().fa_stream_k) {
        case GGML_DISPATCH_FA_STREAM_K_ON:  return true;
        case GGML_DISPATCH_FA_STREAM_K_OFF: return false;
        default:                            return stock;
    }
}

// FlashAttention without stream-k (VEC, launch_fattn): parallel blocks per output tile, at most one per KV tile.
static inline int ggml_dispatch_fa_parallel_blocks(int stock, int ntiles_KV) {
    ggml_dispatch_params & p = ggml_dispatch_params_current();
    if (p.fa_blocks == 0) {
        return stock;
    }
    if (p.fa_blocks > ntiles_KV) {
        p.refused = 1;
        return stock;
    }
    return p.fa_blocks;
}
