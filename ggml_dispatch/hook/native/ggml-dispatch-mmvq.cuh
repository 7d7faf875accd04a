// ggml-dispatch-mmvq.cuh: mul_mat_vec_q at a configuration's warps and rows per block (feature mmvq_params).
// Included by the hook at one place of mmvq.cu (ggml_dispatch/hook/native/mmvq.cu.hook, hunk mmvq_launcher):
// it launches that file's kernel template, whose last template argument (the hook's) is the candidate index
// its nwarps and rows_per_cuda_block are taken from, so it is not a self-contained header.
#pragma once

#include "ggml-dispatch-mmvq.h"
#include "ggml-dispatch-params.h"

// One candidate instance: the grid as calc_launch_params makes it, with the candidate's rows per block.
template <ggml_type type, int ncols_dst, int cfg>
static void ggml_dispatch_mmvq_launch_cfg(
        const void * vx, const void * vy, const int32_t * ids, const ggml_cuda_mm_fusion_args_device & fusion, float * dst,
        const uint32_t ncols_x, const int nrows_x, const uint3 nchannels_y, const uint32_t stride_row_x,
        const uint32_t stride_col_y, const uint32_t stride_col_dst, const uint3 channel_ratio,
        const uint32_t stride_channel_x, const uint32_t stride_channel_y, const uint32_t stride_channel_dst,
        const uint3 sample_ratio, const uint32_t stride_sample_x, const uint32_t stride_sample_y,
        const uint32_t stride_sample_dst, const int nchannels_dst, const int nsamples_dst, const int warp_size,
        const uint32_t ids_stride, cudaStream_t stream) {
    constexpr int nwarps = ggml_dispatch_mmvq_nwarps_or(cfg, 0);
    constexpr int rows   = ggml_dispatch_mmvq_rows_or(cfg, 0);
    static_assert(nwarps > 0 && rows > 0, "not a candidate index");
    const int64_t nblocks = (nrows_x + rows - 1) / rows;
    const dim3    block_nums(nblocks, nchannels_dst, nsamples_dst);
    const dim3    block_dims(warp_size, nwarps, 1);
    const ggml_cuda_kernel_launch_params launch_params = ggml_cuda_kernel_launch_params(block_nums, block_dims, 0, stream);
    ggml_cuda_kernel_launch(mul_mat_vec_q<type, ncols_dst, false, false, false, cfg>, launch_params,
        vx, vy, ids, fusion, dst, ncols_x, nchannels_y, stride_row_x, stride_col_y, stride_col_dst,
        channel_ratio, stride_channel_x, stride_channel_y, stride_channel_dst,
        sample_ratio, stride_sample_x, stride_sample_y, stride_sample_dst, ids_stride);
}

template <ggml_type type, int ncols_dst>
static bool ggml_dispatch_mmvq_launch_ncols(
        const int cfg, const void * vx, const void * vy, const int32_t * ids, const ggml_cuda_mm_fusion_args_device & fusion,
        float * dst, const int ncols_x, const int nrows_x, const uint3 nchannels_y, const int stride_row_x,
        const int stride_col_y, const int stride_col_dst, const uint3 channel_ratio, const int stride_channel_x,
        const int stride_channel_y, const int stride_channel_dst, const uint3 sample_ratio, const int stride_sample_x,
        const int stride_sample_y, const int stride_sample_dst, const int nchannels_dst, const int nsamples_dst,
        const int warp_size, const int ids_stride, cudaStream_t stream) {
    switch (cfg) {
#define GGML_DISPATCH_MMVQ_CASE(i, w, r, g)                                                                              \
        case (i):                                                                                                       \
            if constexpr (ggml_dispatch_mmvq_compiled(type, (i))) {                                                    \
                ggml_dispatch_mmvq_launch_cfg<type, ncols_dst, (i)>(vx, vy, ids, fusion, dst, ncols_x, nrows_x,        \
                    nchannels_y, stride_row_x, stride_col_y, stride_col_dst, channel_ratio, stride_channel_x,           \
                    stride_channel_y, stride_channel_dst, sample_ratio, stride_sample_x, stride_sample_y,               \
                    stride_sample_dst, nchannels_dst, nsamples_dst, warp_size, ids_stride, stream);                     \
                return true;                                                                                            \
            } else {                                                                                                    \
                return false;                                                                                           \
            }
        GGML_DISPATCH_MMVQ_CONFIG_LIST(GGML_DISPATCH_MMVQ_CASE)
#undef GGML_DISPATCH_MMVQ_CASE
        default:
            return false;
    }
}

// Runs the node at the configuration's warps and rows per block (and register cap) and returns true; false (and the node
// refused, so the dispatch counts it ineligible) where this build has no such instance for the type, or the
// call is one the candidates do not serve (MUL_MAT_ID's ids, a fused gate or bias, more than
// GGML_DISPATCH_MMVQ_MAX_COLS columns): the caller then launches what the tree would. Without a configuration
// (every call outside the dispatch's scope) false at once, nothing refused.
template <ggml_type type>
static bool ggml_dispatch_mmvq_launch(
        const void * vx, const void * vy, const int32_t * ids, const ggml_cuda_mm_fusion_args_device & fusion, float * dst,
        const int ncols_x, const int nrows_x, const int ncols_dst, const uint3 nchannels_y, const int stride_row_x,
        const int stride_col_y, const int stride_col_dst, const uint3 channel_ratio, const int stride_channel_x,
        const int stride_channel_y, const int stride_channel_dst, const uint3 sample_ratio, const int stride_sample_x,
        const int stride_sample_y, const int stride_sample_dst, const int nchannels_dst, const int nsamples_dst,
        const int warp_size, const int ids_stride, cudaStream_t stream) {
    ggml_dispatch_params & p = ggml_dispatch_params_current();
    if (p.mmvq_nwarps == 0 && p.mmvq_rows == 0) {
        return false;
    }
    const int  cfg        = ggml_dispatch_mmvq_index(p.mmvq_nwarps, p.mmvq_rows, p.mmvq_regs);
    const bool has_fusion = fusion.gate != nullptr || fusion.x_bias != nullptr || fusion.gate_bias != nullptr ||
                            fusion.x_scale != nullptr || fusion.gate_scale != nullptr;
    bool launched = false;
    if (cfg != 0 && ids == nullptr && !has_fusion && warp_size == GGML_DISPATCH_MMVQ_WARP_SIZE) {
        switch (ncols_dst) {
#define GGML_DISPATCH_MMVQ_NCOLS(n)                                                                                     \
            case (n):                                                                                                   \
                launched = ggml_dispatch_mmvq_launch_ncols<type, (n)>(cfg, vx, vy, ids, fusion, dst, ncols_x, nrows_x,  \
                    nchannels_y, stride_row_x, stride_col_y, stride_col_dst, channel_ratio, stride_channel_x,           \
                    stride_channel_y, stride_channel_dst, sample_ratio, stride_sample_x, stride_sample_y,               \
                    stride_sample_dst, nchannels_dst, nsamples_dst, warp_size, ids_stride, stream);                     \
                break;
            GGML_DISPATCH_MMVQ_NCOLS(1) GGML_DISPATCH_MMVQ_NCOLS(2) GGML_DISPATCH_MMVQ_NCOLS(3) GGML_DISPATCH_MMVQ_NCOLS(4)
            GGML_DISPATCH_MMVQ_NCOLS(5) GGML_DISPATCH_MMVQ_NCOLS(6) GGML_DISPATCH_MMVQ_NCOLS(7) GGML_DISPATCH_MMVQ_NCOLS(8)
#undef GGML_DISPATCH_MMVQ_NCOLS
            default:
                break;
        }
    }
    static_assert(GGML_DISPATCH_MMVQ_MAX_COLS == 8, "the ncols_dst cases above are 1..8");
    if (!launched) {
        p.refused = 1;
    }
    return launched;
}
