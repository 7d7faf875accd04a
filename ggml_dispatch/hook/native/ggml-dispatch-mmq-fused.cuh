// ggml-dispatch-mmq-fused.cuh: the fused MUL_MAT_ID mmq splits (2j_fused, fit, fit64), and the tile widths
// every split runs (for the trees that pass J in mmq_args and size their buffers by it).
// Included by the hook at one place of an upstream file (ggml_dispatch/hook/native/mmq.cuh.hook, hunk 'mmq_split_fused'): it reads
// that file's own functions defined above that place, so it is not a self-contained header. Every call of
// the tree's ggml_cuda_mmq_get_config names the activations' precision: some trees have no default for it.
#pragma once

// ggml-dispatch: split=2j_fused (MUL_MAT_ID), the split in one launch. The grid is the tree's one block per
// tile at J = 128 (ntx = ncols_max / 128 column slots per expert); each block reads its expert's token count
// and an expert with at most min(2, ntx) x Jn tokens runs column tiles of Jn in its first slots, the others
// J = 128 as the tree does. Both tile widths share the block size, row tile and shared memory of J = 128
// (ggml_dispatch_mmq_fused_fits), so under concentrated routing the launch is the tree's, and under spread
// routing it runs narrow tiles without a second launch or a block beyond the tree's grid. split=fit (Jn = 0)
// fits the width to each expert instead: one tile of the narrowest width of GGML_DISPATCH_MMQ_FUSED_J_LIST that
// holds all its tokens, J = 128 beyond the widest. split=fit64 (Jn = -1) is fit over a grid of 64-column slots
// (twice the tree's): an expert with 65-128 tokens runs two J = 64 tiles instead of one J = 128 tile, so
// where a few experts hold all tokens (one J = 128 tile each, under one wave of blocks) twice the blocks
// share the work; beyond 128 tokens J = 128 tiles in every second slot.
template <ggml_type type, int Jx, bool fallback, ggml_prec prec_src1>
static __device__ __forceinline__ void ggml_dispatch_mmq_id_tile(
        const char * __restrict__ x, const int offset_x, const int * __restrict__ y, const int32_t * __restrict__ ids_dst,
        float * __restrict__ dst, const float * __restrict__ y_scale, const int nrows_x, const int stride_row_x,
        const int ncols_y, const int stride_col_dst, const int it, const int jt, const int col_low, const int col_diff,
        const int kb0_stop) {
    constexpr int warp_size = ggml_cuda_get_physical_warp_size();
    constexpr int nwarps    = ggml_cuda_mmq_get_nthreads(type, Jx, fallback, prec_src1) / warp_size;
    constexpr int I         = ggml_cuda_mmq_get_I(type, Jx, fallback, prec_src1);

    extern __shared__ int ids_dst_shared[]; // the tree's layout: Jx ids, then the y and x tiles of Jx
#pragma unroll
    for (int j0 = 0; j0 < Jx; j0 += nwarps*warp_size) {
        const int j = j0 + threadIdx.y*warp_size + threadIdx.x;

        if (j0 + nwarps*warp_size > Jx && j >= Jx) {
            break;
        }

        ids_dst_shared[j] = ids_dst[col_low + jt*Jx + j];
    }
    __syncthreads();

    const int offset_y = (col_low + jt*Jx)*(sizeof(block_q8_1_mmq)/sizeof(int));
    const float * y_scale_tile = nullptr;
    if constexpr (type == GGML_TYPE_NVFP4) {
        y_scale_tile = y_scale ? y_scale + col_low + jt*Jx : nullptr;
    } else {
        GGML_UNUSED(y_scale);
    }

    constexpr bool fixup = false;
    mul_mat_q_process_tile<type, Jx, fallback, fixup, prec_src1>
        (x, offset_x, y + offset_y, ids_dst_shared, dst + it*I, nullptr, y_scale_tile,
         stride_row_x, ncols_y, stride_col_dst,
         nrows_x - it*I - 1, col_diff - jt*Jx - 1, 0, kb0_stop);
}

static constexpr int GGML_DISPATCH_MMQ_FUSED_JW = 128;

template <ggml_type type, int Jn, bool fallback, ggml_prec prec_src1>
static constexpr __device__ bool ggml_dispatch_mmq_fused_compiled_J() {
    constexpr int Jw = GGML_DISPATCH_MMQ_FUSED_JW;
    return ggml_cuda_mmq_get_config(type, Jw, fallback, prec_src1).type != GGML_TYPE_COUNT &&
           ggml_cuda_mmq_get_config(type, Jn, fallback, prec_src1).type != GGML_TYPE_COUNT &&
           ggml_cuda_mmq_get_nthreads(type, Jn, fallback, prec_src1) == ggml_cuda_mmq_get_nthreads(type, Jw, fallback, prec_src1) &&
           ggml_cuda_mmq_get_I(type, Jn, fallback, prec_src1) == ggml_cuda_mmq_get_I(type, Jw, fallback, prec_src1);
}

// Jn = 0 is split=fit (-1: fit64): every width of GGML_DISPATCH_MMQ_FUSED_J_LIST beside J = 128
template <ggml_type type, int Jn, bool fallback, ggml_prec prec_src1>
static constexpr __device__ bool ggml_dispatch_mmq_fused_compiled() {
    if constexpr (Jn > 0) {
        return ggml_dispatch_mmq_fused_compiled_J<type, Jn, fallback, prec_src1>();
    } else {
#define GGML_DISPATCH_MMQ_FIT_COMPILED(J) ggml_dispatch_mmq_fused_compiled_J<type, J, fallback, prec_src1>() &&
        return GGML_DISPATCH_MMQ_FUSED_J_LIST(GGML_DISPATCH_MMQ_FIT_COMPILED) true;
#undef GGML_DISPATCH_MMQ_FIT_COMPILED
    }
}

template <ggml_type type, int Jn, bool fallback, ggml_prec prec_src1>
__launch_bounds__(ggml_cuda_mmq_get_nthreads(type, GGML_DISPATCH_MMQ_FUSED_JW, fallback, prec_src1),
                  ggml_cuda_mmq_get_occupancy(type, GGML_DISPATCH_MMQ_FUSED_JW, fallback, prec_src1))
static __global__ void ggml_dispatch_mul_mat_q_id_fused(
        const char * __restrict__ x, const int * __restrict__ y, const int32_t * __restrict__ ids_dst,
        const int32_t * __restrict__ expert_bounds, float * __restrict__ dst, const float * __restrict__ y_scale,
        const uint3 blocks_per_ne00, const int nrows_x, const int stride_row_x, const int ncols_y, const int stride_col_dst,
        const uint3 channel_ratio, const uint3 nchannels_y, const int stride_channel_x,
        const uint3 sample_ratio, const uint3 nsamples_y, const int stride_sample_x, const uint3 ntx) {
    if constexpr (!ggml_dispatch_mmq_fused_compiled<type, Jn, fallback, prec_src1>()) {
        NO_DEVICE_CODE;
    } else {
        constexpr int Jw = GGML_DISPATCH_MMQ_FUSED_JW;
        constexpr int I  = ggml_cuda_mmq_get_I(type, Jw, fallback, prec_src1);

        // the stream-k kernel's tile order with one block per tile: column slot fastest, then expert, sample, row tile
        uint2 tmp2 = fast_div_modulo(blockIdx.x, ntx);
        const int jt = tmp2.y;
        tmp2 = fast_div_modulo(tmp2.x, nchannels_y);
        const int zt = tmp2.y;
        tmp2 = fast_div_modulo(tmp2.x, nsamples_y);
        const int wt = tmp2.y;
        const int it = tmp2.x;

        const int col_low  = expert_bounds[zt + 0];
        const int col_diff = expert_bounds[zt + 1] - col_low;
        const int offset_x = fastdiv(wt, sample_ratio)*stride_sample_x + fastdiv(zt, channel_ratio)*stride_channel_x + it*I*stride_row_x;

        // column tile t of width J (t = this block's column slot, but for fit64's J = 128 tiles); a tile past
        // the expert's last token has none
        const auto tile_at = [&](auto J_c, const int t) {
            constexpr int J = decltype(J_c)::value;
            if (t*J < col_diff) {
                ggml_dispatch_mmq_id_tile<type, J, fallback, prec_src1>(x, offset_x, y, ids_dst, dst, y_scale, nrows_x,
                    stride_row_x, ncols_y, stride_col_dst, it, t, col_low, col_diff, blocks_per_ne00.z);
            }
        };
        const auto tile = [&](auto J_c) { tile_at(J_c, jt); };

        if constexpr (Jn <= 0) {
            // split=fit and fit64: an expert with at most the widest ladder width of tokens runs one tile of
            // the narrowest width that holds them all (its first slot)
#define GGML_DISPATCH_MMQ_FIT_TILE(J) if (col_diff <= (J)) { tile(std::integral_constant<int, (J)>{}); return; }
            GGML_DISPATCH_MMQ_FUSED_J_LIST(GGML_DISPATCH_MMQ_FIT_TILE)
#undef GGML_DISPATCH_MMQ_FIT_TILE
            if constexpr (Jn == -1) {
                // fit64 (64-column slots): two J = 64 tiles up to 128 tokens, then J = 128 tiles in the even slots
                if (col_diff <= 2*64) {
                    tile(std::integral_constant<int, 64>{});
                } else if (jt % 2 == 0) {
                    tile_at(std::integral_constant<int, Jw>{}, jt / 2);
                }
                return;
            }
        } else if (col_diff <= (ntx.z < 2 ? int(ntx.z) : 2)*Jn) {
            tile(std::integral_constant<int, Jn>{});
            return;
        }
        tile(std::integral_constant<int, Jw>{});
    }
}

// Host side: the J = 128 config and Jn share block size and row tile, J = 128's shared memory fits (Jn = 0,
// split=fit, and -1, fit64: every ladder width does).
static inline bool ggml_dispatch_mmq_fused_fits(ggml_type type, int Jn, bool fallback, int cc, size_t smpbo) {
    if (Jn <= 0) {
#define GGML_DISPATCH_MMQ_FIT_FITS(J) ggml_dispatch_mmq_fused_fits(type, (J), fallback, cc, smpbo) &&
        return GGML_DISPATCH_MMQ_FUSED_J_LIST(GGML_DISPATCH_MMQ_FIT_FITS) true;
#undef GGML_DISPATCH_MMQ_FIT_FITS
    }
    const ggml_cuda_mmq_config cw = ggml_cuda_mmq_get_config(type, GGML_DISPATCH_MMQ_FUSED_JW, fallback, cc, GGML_PREC_Q8);
    const ggml_cuda_mmq_config cn = ggml_cuda_mmq_get_config(type, Jn, fallback, cc, GGML_PREC_Q8);
    return cw.type != GGML_TYPE_COUNT && cn.type != GGML_TYPE_COUNT && cw.nthreads == cn.nthreads && cw.I == cn.I &&
           mmq_get_nbytes_shared(cw, cc) <= smpbo;
}

template <ggml_type type, int Jn, bool fallback, ggml_prec prec_src1>
static void ggml_dispatch_launch_mmq_id_fused(ggml_backend_cuda_context & ctx, const mmq_args & args, cudaStream_t stream) {
    GGML_UNUSED(ctx);
    const int id        = ggml_cuda_get_device();
    const int cc        = ggml_cuda_info().devices[id].cc;
    const int warp_size = ggml_cuda_info().devices[id].warp_size;

    const ggml_cuda_mmq_config config = ggml_cuda_mmq_get_config(type, GGML_DISPATCH_MMQ_FUSED_JW, fallback, cc, prec_src1);
    const int nbytes_shared = mmq_get_nbytes_shared(config, cc);
    CUDA_SET_SHARED_MEMORY_LIMIT((ggml_dispatch_mul_mat_q_id_fused<type, Jn, fallback, prec_src1>), nbytes_shared);

    const int nty    = (args.nrows_x   + config.I - 1) / config.I;
    const int slot   = Jn == -1 ? 64 : GGML_DISPATCH_MMQ_FUSED_JW;  // fit64: 64-column slots
    const int ntx    = (args.ncols_max + slot - 1) / slot;
    const int ntiles = ntx * nty * args.nchannels_y * args.nsamples_y;

    ggml_dispatch_mul_mat_q_id_fused<type, Jn, fallback, prec_src1>
        <<<ntiles, dim3(warp_size, config.nthreads / warp_size, 1), nbytes_shared, stream>>>
        (args.x, args.y, args.ids_dst, args.expert_bounds, args.dst, args.y_scale,
         init_fastdiv_values(args.ncols_x / ggml_cuda_type_traits<type>::qk), args.nrows_x, args.stride_row_x,
         args.ncols_y, args.nrows_dst,
         init_fastdiv_values(args.nchannels_y / args.nchannels_x), init_fastdiv_values(args.nchannels_y), args.stride_channel_x,
         init_fastdiv_values(args.nsamples_y / args.nsamples_x), init_fastdiv_values(args.nsamples_y), args.stride_sample_x,
         init_fastdiv_values(ntx));
}

// The fused split (Jn from GGML_DISPATCH_MMQ_FUSED_J_LIST; 0: split=fit; -1: fit64) where it is compiled (rows a
// multiple of 128, Q8_1 activations) and fits; false (nothing launched) otherwise.
template <ggml_type type, bool fallback, ggml_prec prec_src1>
static bool ggml_dispatch_mmq_id_fused(ggml_backend_cuda_context & ctx, const mmq_args & args, cudaStream_t stream, int Jn) {
    if constexpr (fallback || prec_src1 != GGML_PREC_Q8) {
        GGML_UNUSED_VARS(ctx, args, stream, Jn);
        return false;
    } else {
        const int id = ggml_cuda_get_device();
        if (args.ids_dst == nullptr ||
                !ggml_dispatch_mmq_fused_fits(type, Jn, fallback, ggml_cuda_info().devices[id].cc, ggml_cuda_info().devices[id].smpbo)) {
            return false;
        }
        switch (Jn) {
#define GGML_DISPATCH_MMQ_FUSED_CASE(J) \
            case J: ggml_dispatch_launch_mmq_id_fused<type, J, fallback, prec_src1>(ctx, args, stream); return true;
            GGML_DISPATCH_MMQ_FUSED_J_LIST(GGML_DISPATCH_MMQ_FUSED_CASE)
            GGML_DISPATCH_MMQ_FUSED_CASE(0)  // split=fit
            GGML_DISPATCH_MMQ_FUSED_CASE(-1)  // split=fit64
#undef GGML_DISPATCH_MMQ_FUSED_CASE
            default: return false;
        }
    }
}

// The widest column tile a launch of the current configuration's split runs beside the tree's J_best: 2j and
// 2j_wave their J (the first launch's), the fused splits J = 128 (their narrow widths share its block size,
// ggml_dispatch_mmq_fused_fits); 0 outside a split.
static inline int ggml_dispatch_mmq_split_J() {
    const ggml_dispatch_params & p = ggml_dispatch_params_current();
    return p.mmq_split_fused != 0 ? GGML_DISPATCH_MMQ_FUSED_JW : p.mmq_split != 0 ? p.mmq_J : 0;
}

// ids_dst's padding (mmq.cu): the widest tile that reads it, the tree's J_best or a split's.
static inline int ggml_dispatch_mmq_split_J_max(const int J_best) {
    const int J = ggml_dispatch_mmq_split_J();
    return J > J_best ? J : J_best;
}

// The activations' padding (mmq.cu): the tree's for J_best (`padding`), or the tree's rule for the widest
// tile a split runs where that is more (J columns of block_q8_1_mmq, rounded up to what the tile's block of
// threads loads at once). A J without compiled code is never launched (the split refuses it).
static inline size_t ggml_dispatch_mmq_split_padding(const ggml_type type, const bool fallback, const int cc,
                                                     const ggml_prec prec_src1, const size_t padding) {
    const int J = ggml_dispatch_mmq_split_J();
    if (J < 8 || J > 128 || J % 8 != 0) {
        return padding;
    }
    const ggml_cuda_mmq_config config = ggml_cuda_mmq_get_config(type, J, fallback, cc, prec_src1);
    if (config.type == GGML_TYPE_COUNT) {
        return padding;
    }
    const size_t chunk     = config.nthreads * sizeof(int);
    const size_t J_padding = (J * sizeof(block_q8_1_mmq) + chunk - 1) / chunk * chunk;
    return J_padding > padding ? J_padding : padding;
}

// The J that mul_mat_q_switch_J launches where the tree passes its J in mmq_args: a split's first launch
// (expert filter > 0) runs the configuration's J where code for it is compiled and its tiles fit (else the
// launch is refused and runs the tree's), every other launch the tree's J_best.
static inline int ggml_dispatch_mmq_split_launch_J(const ggml_type type, const bool fallback, const ggml_prec prec_src1,
                                                   const int J_best) {
    ggml_dispatch_params & p = ggml_dispatch_params_current();
    const int J = p.mmq_J;
    if (p.mmq_expert_filter <= 0 || J == 0) {
        return J_best;
    }
    bool J_ok = J % 8 == 0 && J >= 8 && J <= 128;
    if (J_ok) {
        const int                  id     = ggml_cuda_get_device();
        const int                  cc     = ggml_cuda_info().devices[id].cc;
        const ggml_cuda_mmq_config config = ggml_cuda_mmq_get_config(type, J, fallback, cc, prec_src1);
        J_ok = config.type != GGML_TYPE_COUNT && mmq_get_nbytes_shared(config, cc) <= ggml_cuda_info().devices[id].smpbo;
    }
    if (!J_ok) {
        p.refused = 1;
        return J_best;
    }
    return J;
}
