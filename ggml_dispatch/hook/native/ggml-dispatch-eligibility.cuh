// ggml-dispatch: the one eligibility check (hard limits only) for MUL_MAT routes.
//
// Upstream's ggml_cuda_should_use_{mmvf,mmf,mmvq,mmq} mix hard limits (alignment, row multiples,
// compiled template ranges, shared memory, device code for the compiled arch, asserts inside the
// kernel wrappers) with soft preferences (batch thresholds "tuned on RTX 4090"). A table or a forced
// route replaces only the soft part; this check is the hard part. It is shared by the runtime hook and
// the tuner, and a test holds it against the tree's own functions on a grid of shapes, types and cc.
//
// Device code is chosen by __CUDA_ARCH__, the host sees the runtime cc: every arch test below goes
// through ggml_cuda_highest_compiled_arch, as upstream's helpers do.
//
// Only NVIDIA devices are covered; on AMD/MUSA every requested route is refused (stock runs).
#pragma once

#include "common.cuh"
#include "mmvf.cuh"
#include "mmvq.cuh"
#include "mmf.cuh"
#include "mmq.cuh"
#include "convert.cuh"
#include "ggml-dispatch.h"
#include "ggml-dispatch-params.h"
#include "ggml-dispatch-core.h"
#include "ggml-dispatch-mmvq.h"
#if defined(__has_include)
#if __has_include("ggml-dispatch-build.h")
#include "ggml-dispatch-build.h"
#endif
#endif
#ifndef GGML_DISPATCH_FEATURES
#define GGML_DISPATCH_FEATURES 0xffffffffu  // stamped by install; without its stamp (unit builds) every feature
#endif
// Code that reads what a feature's edits put into upstream files compiles only where install applied it.
#define GGML_DISPATCH_HAS_FEATURE(f) ((GGML_DISPATCH_FEATURES & (f)) != 0u)

#include <cstddef>
#include <cstdint>
#include <cstdlib>

// Everything the check needs about one MUL_MAT node, taken from the tensors (or built by a test).
struct ggml_dispatch_mm_desc {
    ggml_type src0_type;
    ggml_type src1_type;
    ggml_type dst_type;
    int64_t   src0_ne[4];
    size_t    src0_nb[4];
    int64_t   src1_ne[4];
    size_t    src1_nb[4];
    size_t    dst_nb0;
    bool      dst_contiguous;
    bool      src0_contiguously_allocated;
    bool      src0_contiguous;
    bool      src1_contiguous;
    bool      src0_bad_padding;  // padded compute-buffer view: padding cannot be cleared (ggml_cuda_mul_mat)
    bool      fwht_hint;         // src0 is a Hadamard matrix and the FWHT path takes the node
};

struct ggml_dispatch_dev_desc {
    int    cc;         // as ggml encodes it (700, 900, ...)
    int    warp_size;
    size_t smpbo;      // max. shared memory per block with opt-in
};

// enum ggml_dispatch_why (GGML_DISPATCH_OK, GGML_DISPATCH_WHY_*) and ggml_dispatch_why_name() come from
// ggml-dispatch-codes.h (the registry's INELIGIBLE list).

static inline bool ggml_dispatch_mmvq_type(ggml_type t) {
    switch (t) {  // the type switch of mul_mat_vec_q_switch_type (mmvq.cu)
        case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_MXFP4: case GGML_TYPE_NVFP4:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS:
        case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: case GGML_TYPE_IQ3_S:
            return true;
        default:
            return false;
    }
}

static inline bool ggml_dispatch_mmq_type(ggml_type t) {
    switch (t) {  // the type switch of ggml_cuda_mul_mat_q_switch_type (mmq.cu)
        case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
        case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ4_XS: case GGML_TYPE_IQ4_NL:
        case GGML_TYPE_MXFP4: case GGML_TYPE_NVFP4:
            return true;
        default:
            return false;
    }
}

// Types cuBLAS's strided (non-contiguously allocated src0) conversion handles: ggml_get_to_{fp16,bf16,fp32}_nc_cuda.
static inline bool ggml_dispatch_cublas_nc_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q1_0: case GGML_TYPE_Q2_0:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
            return true;
        default:
            return false;
    }
}

static inline bool ggml_dispatch_nb_multiple(const size_t * nb, size_t m) {
    for (int i = 1; i < 4; ++i) {
        if (nb[i] % m != 0) {
            return false;
        }
    }
    return true;
}

// Returns GGML_DISPATCH_OK when table route `route` may run the MUL_MAT node, else why not.
static inline ggml_dispatch_why ggml_dispatch_check(int route, const ggml_dispatch_mm_desc & d,
                                                    const ggml_dispatch_dev_desc & dev) {
    if (!ggml_dispatch_route_allows_op(route, GGML_DISPATCH_OP_MUL_MAT)) {
        return GGML_DISPATCH_WHY_ROUTE;
    }
    if (!GGML_CUDA_CC_IS_NVIDIA(dev.cc)) {
        return GGML_DISPATCH_WHY_VENDOR;
    }
    const int arch = ggml_cuda_highest_compiled_arch(dev.cc);
    if (arch < 0) {
        return GGML_DISPATCH_WHY_NO_DEVICE_CODE;  // nothing of ggml-cuda runs here, cuBLAS included (conversions)
    }
    if (d.fwht_hint) {
        return GGML_DISPATCH_WHY_FWHT;
    }
    const size_t ts0 = ggml_type_size(d.src0_type);
    if (d.src0_nb[0] != ts0 || d.src1_nb[0] != ggml_type_size(d.src1_type) || d.dst_nb0 != ggml_type_size(d.dst_type)) {
        return GGML_DISPATCH_WHY_ELEMENT_STRIDE;
    }
    const int64_t ne11 = d.src1_ne[1];

    if (route == GGML_DISPATCH_ROUTE_CUBLAS) {
        if (!d.dst_contiguous) {
            return GGML_DISPATCH_WHY_DST_LAYOUT;
        }
        if (!d.src0_contiguously_allocated && !ggml_dispatch_cublas_nc_type(d.src0_type)) {
            return GGML_DISPATCH_WHY_CONVERT;
        }
        return GGML_DISPATCH_OK;
    }

    // The four ggml kernels: ggml_cuda_mul_mat_{vec_f,f,vec_q,q} assert F32 src1 and dst.
    if (d.src1_type != GGML_TYPE_F32) {
        return GGML_DISPATCH_WHY_SRC1_TYPE;
    }
    if (d.dst_type != GGML_TYPE_F32) {
        return GGML_DISPATCH_WHY_DST_TYPE;
    }

    switch (route) {
        case GGML_DISPATCH_ROUTE_MMVF: {
            if (d.src0_type != GGML_TYPE_F32 && d.src0_type != GGML_TYPE_F16 && d.src0_type != GGML_TYPE_BF16) {
                return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (ne11 < 1 || ne11 > MMVF_MAX_BATCH_SIZE) {  // ncols_dst switch 1..8
                return GGML_DISPATCH_WHY_BATCH;
            }
            if (d.src0_ne[0] % 2 != 0) {
                return GGML_DISPATCH_WHY_COLS;
            }
            // half2/nv_bfloat162/float2 loads of src0 rows and float2 loads of src1 columns
            if (!ggml_dispatch_nb_multiple(d.src0_nb, 2*ts0) || !ggml_dispatch_nb_multiple(d.src1_nb, 2*sizeof(float))) {
                return GGML_DISPATCH_WHY_ALIGN;
            }
            return GGML_DISPATCH_OK;
        }
        case GGML_DISPATCH_ROUTE_MMF: {
            bool device_code;
            switch (d.src0_type) {  // mul_mat_f has tensor-core code only for these (mmf.cuh)
                case GGML_TYPE_F32:  device_code = ampere_mma_available(dev.cc); break;
                case GGML_TYPE_F16:  device_code = volta_mma_available(dev.cc) || turing_mma_available(dev.cc); break;
                case GGML_TYPE_BF16: device_code = ampere_mma_available(dev.cc); break;
                default: return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (!device_code) {
                return GGML_DISPATCH_WHY_NO_DEVICE_CODE;
            }
            if (ne11 < 1 || ne11 > 16) {  // mul_mat_f_switch_cols_per_block: cols_per_block 1..16
                return GGML_DISPATCH_WHY_BATCH;
            }
            if (d.src0_ne[0] % (dev.warp_size * (4/(int64_t) ts0)) != 0) {
                return GGML_DISPATCH_WHY_COLS;
            }
            if (d.src0_ne[1] % MMF_ROWS_PER_BLOCK != 0) {
                return GGML_DISPATCH_WHY_ROWS;
            }
            if (!ggml_dispatch_nb_multiple(d.src0_nb, 2*ts0) || !ggml_dispatch_nb_multiple(d.src1_nb, 2*sizeof(float))) {
                return GGML_DISPATCH_WHY_ALIGN;
            }
            return GGML_DISPATCH_OK;
        }
        case GGML_DISPATCH_ROUTE_MMVQ: {
            if (!ggml_dispatch_mmvq_type(d.src0_type)) {
                return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (ne11 < 1 || ne11 > MMVQ_MAX_BATCH_SIZE) {  // ncols_dst <= MMVQ_MAX_BATCH_SIZE is asserted
                return GGML_DISPATCH_WHY_BATCH;
            }
            if (d.src0_bad_padding) {
                return GGML_DISPATCH_WHY_PADDING;
            }
            return GGML_DISPATCH_OK;
        }
        case GGML_DISPATCH_ROUTE_MMQ: {
            if (!ggml_dispatch_mmq_type(d.src0_type)) {
                return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (dev.smpbo < 48 * 1024) {
                return GGML_DISPATCH_WHY_SMEM;
            }
            if (d.src0_bad_padding) {
                return GGML_DISPATCH_WHY_PADDING;
            }
            return GGML_DISPATCH_OK;
        }
        default:
            return GGML_DISPATCH_WHY_ROUTE;
    }
}

// The parameters a configuration code sets, as the readers in ggml-cuda.cu and mmq.cuh take them
// (ggml-dispatch-params.h). A code without parameters (or another route's) gives all-stock values.
static inline ggml_dispatch_params ggml_dispatch_params_of_config(int config) {
    ggml_dispatch_params p;
    const int route = ggml_dispatch_config_route(config);
    if (route == GGML_DISPATCH_ROUTE_CUBLAS) {
        switch (ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_CUBLAS_OUT_INDEX)) {
            case GGML_DISPATCH_PARAM_CUBLAS_OUT_V_F16: p.cublas_out = GGML_DISPATCH_CUBLAS_OUT_COMPUTE; break;
            case GGML_DISPATCH_PARAM_CUBLAS_OUT_V_F32: p.cublas_out = GGML_DISPATCH_CUBLAS_OUT_F32; break;
            default: break;
        }
        switch (ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_INDEX)) {
            case GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_V_F16:  p.cublas_compute = GGML_DISPATCH_CUBLAS_COMPUTE_F16; break;
            case GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_V_F32:  p.cublas_compute = GGML_DISPATCH_CUBLAS_COMPUTE_F32; break;
            case GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_V_BF16: p.cublas_compute = GGML_DISPATCH_CUBLAS_COMPUTE_BF16; break;
            default: break;
        }
        if (ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_CUBLAS_WEIGHT_INDEX) == GGML_DISPATCH_PARAM_CUBLAS_WEIGHT_V_CACHED) {
            p.cublas_weight = GGML_DISPATCH_CUBLAS_WEIGHT_CACHED;
        }
    } else if (route == GGML_DISPATCH_ROUTE_MMQ) {
        const int j = ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMQ_J_INDEX);
        if (j != 0) {
            p.mmq_J = std::atoi(ggml_dispatch_param_descs[GGML_DISPATCH_PARAM_MMQ_J_INDEX].values[j - 1]);
        }
        switch (ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMQ_STREAM_K_INDEX)) {
            case GGML_DISPATCH_PARAM_MMQ_STREAM_K_V_ON:  p.mmq_stream_k = GGML_DISPATCH_MMQ_STREAM_K_ON; break;
            case GGML_DISPATCH_PARAM_MMQ_STREAM_K_V_OFF: p.mmq_stream_k = GGML_DISPATCH_MMQ_STREAM_K_TILES; break;
            default: break;
        }
        switch (ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMQ_SPLIT_INDEX)) {
            case GGML_DISPATCH_PARAM_MMQ_SPLIT_V_2J:      p.mmq_split = 2; break;
            case GGML_DISPATCH_PARAM_MMQ_SPLIT_V_2J_WAVE: p.mmq_split = 2; p.mmq_split_wave = 1; break;
            case GGML_DISPATCH_PARAM_MMQ_SPLIT_V_2J_FUSED: p.mmq_split = 2; p.mmq_split_fused = 1; break;
            case GGML_DISPATCH_PARAM_MMQ_SPLIT_V_FIT:      p.mmq_split_fused = 1; break;  // no J: one per expert
            case GGML_DISPATCH_PARAM_MMQ_SPLIT_V_FIT64:    p.mmq_split_fused = 2; break;  // fit over 64-column slots
            default: break;
        }
    } else if (route == GGML_DISPATCH_ROUTE_MMVQ) {
        const int w = ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMVQ_NWARPS_INDEX);
        const int r = ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMVQ_ROWS_INDEX);
        if (w != 0) {
            p.mmvq_nwarps = std::atoi(ggml_dispatch_param_descs[GGML_DISPATCH_PARAM_MMVQ_NWARPS_INDEX].values[w - 1]);
        }
        if (r != 0) {
            p.mmvq_rows = std::atoi(ggml_dispatch_param_descs[GGML_DISPATCH_PARAM_MMVQ_ROWS_INDEX].values[r - 1]);
        }
        const int g = ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMVQ_REGS_INDEX);
        if (g != 0) {
            p.mmvq_regs = std::atoi(ggml_dispatch_param_descs[GGML_DISPATCH_PARAM_MMVQ_REGS_INDEX].values[g - 1]);
        }
    } else if (route == GGML_DISPATCH_ROUTE_MMVF) {
        const int b = ggml_dispatch_config_param(config, GGML_DISPATCH_PARAM_MMVF_BLOCK_INDEX);
        if (b != 0) {
            p.mmvf_block = std::atoi(ggml_dispatch_param_descs[GGML_DISPATCH_PARAM_MMVF_BLOCK_INDEX].values[b - 1]);
        }
    }
    return p;
}

// cuBLAS in compute type `t` needs a conversion of a `type` operand unless it already is `t`:
// the converter ggml_cuda_mul_mat_cublas_impl takes (contiguously allocated or strided).
static inline bool ggml_dispatch_cublas_converts(ggml_type type, ggml_type t, bool contiguously_allocated) {
    if (type == t) {
        return true;
    }
    switch (t) {
        case GGML_TYPE_F16:
            return contiguously_allocated ? ggml_get_to_fp16_cuda(type) != nullptr : ggml_get_to_fp16_nc_cuda(type) != nullptr;
        case GGML_TYPE_BF16:
            return contiguously_allocated ? ggml_get_to_bf16_cuda(type) != nullptr : ggml_get_to_bf16_nc_cuda(type) != nullptr;
        case GGML_TYPE_F32:
            return contiguously_allocated ? ggml_get_to_fp32_cuda(type) != nullptr : ggml_get_to_fp32_nc_cuda(type) != nullptr;
        default:
            return false;
    }
}

#if GGML_DISPATCH_HAS_FEATURE(GGML_DISPATCH_FEATURE_MMQ_TILES)
// mmq precision of src1 as ggml_cuda_mmq_get_prec_src1 picks it without GGML_CUDA_MMQ_PREC: Q8_1 but
// for the FP4 types where Blackwell has W4A4 instructions (both are then required to hold).
static inline bool ggml_dispatch_mmq_J_compiled(ggml_type type, int J, bool fallback, const ggml_dispatch_dev_desc & dev,
                                                bool stream_k) {
    const bool q4 = (type == GGML_TYPE_NVFP4 || type == GGML_TYPE_MXFP4) && blackwell_mma_available(dev.cc);
    for (int i = 0; i < (q4 ? 2 : 1); ++i) {
        const ggml_cuda_mmq_config c = ggml_cuda_mmq_get_config(type, J, fallback, dev.cc, i ? GGML_PREC_Q4 : GGML_PREC_Q8);
        if (c.type == GGML_TYPE_COUNT || mmq_get_nbytes_shared(c, dev.cc) > dev.smpbo || (stream_k && !c.stream_k)) {
            return false;
        }
    }
    return true;
}
#endif

// The hard limits of a configuration's parameter values on the node (its route is already eligible):
// cuBLAS compute f16/bf16/f32 needs the tree's converters for src0 and src1, f16 output (then a
// convert) has no meaning for f32 compute; mmq's J must have compiled code for the type on this cc
// (fallback when N % 128 != 0, as mul_mat_q_case picks it) whose tiles fit smpbo, and stream-k on
// needs a config with stream-k (at the given J, or at every J stock may pick).
static inline ggml_dispatch_why ggml_dispatch_check_params(int op, int config, const ggml_dispatch_mm_desc & d,
                                                           const ggml_dispatch_dev_desc & dev) {
    GGML_UNUSED(dev);  // the mmq checks read it; a tree without the mmq_tiles feature compiles them out
    if (!ggml_dispatch_config_allows_op(config, op)) {
        return GGML_DISPATCH_WHY_PARAMS;  // a parameter of another op (mmq's split: MUL_MAT_ID)
    }
    const ggml_dispatch_params p = ggml_dispatch_params_of_config(config);
    const int route = ggml_dispatch_config_route(config);
    if (route == GGML_DISPATCH_ROUTE_CUBLAS) {
        if (p.cublas_compute != GGML_DISPATCH_CUBLAS_COMPUTE_STOCK) {
            const ggml_type t = p.cublas_compute == GGML_DISPATCH_CUBLAS_COMPUTE_F16  ? GGML_TYPE_F16
                              : p.cublas_compute == GGML_DISPATCH_CUBLAS_COMPUTE_BF16 ? GGML_TYPE_BF16
                                                                                      : GGML_TYPE_F32;
            if (!ggml_dispatch_cublas_converts(d.src0_type, t, d.src0_contiguously_allocated) ||
                    !ggml_dispatch_cublas_converts(d.src1_type, t, d.src1_contiguous)) {
                return GGML_DISPATCH_WHY_PARAMS;
            }
            if (t == GGML_TYPE_F32 && p.cublas_out == GGML_DISPATCH_CUBLAS_OUT_COMPUTE) {
                return GGML_DISPATCH_WHY_PARAMS;
            }
        }
        // weight=cached: an f16 copy made by the contiguous to-f16 converter, read by an f16 GEMM (the
        // compute type stock picks at run time is checked again where the copy is asked for)
        if (p.cublas_weight == GGML_DISPATCH_CUBLAS_WEIGHT_CACHED &&
                ((p.cublas_compute != GGML_DISPATCH_CUBLAS_COMPUTE_STOCK && p.cublas_compute != GGML_DISPATCH_CUBLAS_COMPUTE_F16) ||
                 d.src0_type == GGML_TYPE_F16 || !d.src0_contiguously_allocated || ggml_get_to_fp16_cuda(d.src0_type) == nullptr)) {
            return GGML_DISPATCH_WHY_PARAMS;
        }
        return GGML_DISPATCH_OK;
    }
#if GGML_DISPATCH_HAS_FEATURE(GGML_DISPATCH_FEATURE_MMQ_TILES)
    if (route == GGML_DISPATCH_ROUTE_MMQ) {
        const bool fallback = d.src0_ne[1] % 128 != 0;
        const bool stream_k = p.mmq_stream_k == GGML_DISPATCH_MMQ_STREAM_K_ON;
        if (p.mmq_split != 0 && p.mmq_J == 0) {
            return GGML_DISPATCH_WHY_PARAMS;  // the split's light side runs the configuration's own J
        }
        if (p.mmq_split_wave != 0 && p.mmq_stream_k != GGML_DISPATCH_MMQ_STREAM_K_TILES) {
            return GGML_DISPATCH_WHY_PARAMS;  // one wave over whole tiles is the stream-k kernel without a fixup
        }
#if GGML_DISPATCH_HAS_FEATURE(GGML_DISPATCH_FEATURE_MOE_SPLIT)
        if (p.mmq_split_fused != 0) {
            // one block per tile at J = 128 with J's tiles beside: compiled for row counts of whole 128-row tiles
            // and Q8_1 activations, where both widths share the block size and row tile
            const bool q4 = (d.src0_type == GGML_TYPE_NVFP4 || d.src0_type == GGML_TYPE_MXFP4) && blackwell_mma_available(dev.cc);
            // (split=fit: no J of its own, every fused width beside J = 128)
            const bool fit = p.mmq_split == 0;
            return p.mmq_stream_k == GGML_DISPATCH_MMQ_STREAM_K_TILES && !fallback && !q4 &&
                           (fit ? p.mmq_J == 0 : ggml_dispatch_mmq_fused_J(p.mmq_J)) &&
                           ggml_dispatch_mmq_fused_fits(d.src0_type, fit ? 0 : p.mmq_J, fallback, dev.cc, dev.smpbo)
                       ? GGML_DISPATCH_OK
                       : GGML_DISPATCH_WHY_PARAMS;
        }
#endif
        if (p.mmq_J != 0) {
            return ggml_dispatch_mmq_J_compiled(d.src0_type, p.mmq_J, fallback, dev, stream_k || p.mmq_split_wave != 0) ? GGML_DISPATCH_OK
                                                                                                : GGML_DISPATCH_WHY_PARAMS;
        }
        if (stream_k) {
            for (int J = 8; J <= 128; J += 8) {
                const ggml_cuda_mmq_config c = ggml_cuda_mmq_get_config(d.src0_type, J, fallback, dev.cc, GGML_PREC_Q8);
                if (c.type != GGML_TYPE_COUNT && !c.stream_k) {
                    return GGML_DISPATCH_WHY_PARAMS;
                }
            }
        }
        return GGML_DISPATCH_OK;
    }
#endif
#if GGML_DISPATCH_HAS_FEATURE(GGML_DISPATCH_FEATURE_MMVQ_PARAMS)
    if (route == GGML_DISPATCH_ROUTE_MMVQ) {
        // both parameters (and the register cap, if any), naming a candidate this build compiled for the
        // weight type (ggml-dispatch-mmvq.h), at the warp size the candidates were checked for; a block of rows
        // never reads past the last row
        const int cfg = ggml_dispatch_mmvq_index(p.mmvq_nwarps, p.mmvq_rows, p.mmvq_regs);
        if (cfg == 0 || !ggml_dispatch_mmvq_compiled(d.src0_type, cfg) || dev.warp_size != GGML_DISPATCH_MMVQ_WARP_SIZE) {
            return GGML_DISPATCH_WHY_PARAMS;
        }
        return d.src0_ne[1] % p.mmvq_rows == 0 ? GGML_DISPATCH_OK : GGML_DISPATCH_WHY_ROWS;
    }
#endif
#if GGML_DISPATCH_HAS_FEATURE(GGML_DISPATCH_FEATURE_MMVF_PARAMS)
    if (route == GGML_DISPATCH_ROUTE_MMVF) {
        // the widths launch_mul_mat_vec_f_cuda compiles: warp size .. 256 threads in steps of a warp
        return p.mmvf_block % dev.warp_size == 0 && p.mmvf_block >= dev.warp_size && p.mmvf_block <= 256
                   ? GGML_DISPATCH_OK
                   : GGML_DISPATCH_WHY_PARAMS;
    }
#endif
    return ggml_dispatch_config_has_params(config) ? GGML_DISPATCH_WHY_PARAMS : GGML_DISPATCH_OK;
}

// The check for a configuration code (route + parameters) on a node of `op`: the code must be valid, its
// route must serve the op and be eligible, then the parameter values' own limits.
static inline ggml_dispatch_why ggml_dispatch_check_config(int op, int config, const ggml_dispatch_mm_desc & d,
                                                           const ggml_dispatch_dev_desc & dev) {
    const int route = ggml_dispatch_config_route(config);
    if (config == 0 || !ggml_dispatch_config_valid(config)) {
        return GGML_DISPATCH_WHY_ROUTE;
    }
    if (!ggml_dispatch_route_allows_op(route, op)) {
        return GGML_DISPATCH_WHY_OP;
    }
    const ggml_dispatch_why why = ggml_dispatch_check(route, d, dev);
    if (why != GGML_DISPATCH_OK || !ggml_dispatch_config_has_params(config)) {
        return why;
    }
    return ggml_dispatch_check_params(op, config, d, dev);
}

// Upstream's ggml_cuda_should_use_mmvf took a warp size from some build on: call the one this tree declares
// (overload resolution picks the form that compiles; `int` beats `long` where both would).
template <typename T>
static auto ggml_dispatch_should_use_mmvf_form(int, T type, int cc, int warp_size, const int64_t * ne, const size_t * nb,
                                               int64_t ne11) -> decltype(ggml_cuda_should_use_mmvf(type, cc, warp_size, ne, nb, ne11)) {
    return ggml_cuda_should_use_mmvf(type, cc, warp_size, ne, nb, ne11);
}
template <typename T>
static auto ggml_dispatch_should_use_mmvf_form(long, T type, int cc, int /*warp_size*/, const int64_t * ne, const size_t * nb,
                                               int64_t ne11) -> decltype(ggml_cuda_should_use_mmvf(type, cc, ne, nb, ne11)) {
    return ggml_cuda_should_use_mmvf(type, cc, ne, nb, ne11);
}
static inline bool ggml_dispatch_should_use_mmvf(ggml_type type, int cc, int warp_size, const int64_t * ne, const size_t * nb,
                                                 int64_t ne11) {
    return ggml_dispatch_should_use_mmvf_form(0, type, cc, warp_size, ne, nb, ne11);
}

// What stock ggml_cuda_mul_mat runs for the node: its cascade, in its order, through the tree's own
// ggml_cuda_should_use_* functions. Where `install` finds the tree's ggml_cuda_mul_mat as mirrored here
// (feature stock_route) this is what stock runs; elsewhere it is the trace's prediction of it.
// MMQ's check reads smpbo of the current device (ggml_cuda_get_device()).
static inline int ggml_dispatch_stock_route(const ggml_dispatch_mm_desc & d, const ggml_dispatch_dev_desc & dev) {
    if (d.fwht_hint) {
        return ggml_dispatch::ROUTE_FWHT;
    }
    if (d.src0_bad_padding || d.src1_type != GGML_TYPE_F32 || d.dst_type != GGML_TYPE_F32) {
        return GGML_DISPATCH_ROUTE_CUBLAS;
    }
    const int64_t ne11 = d.src1_ne[1];
    if (ggml_dispatch_should_use_mmvf(d.src0_type, dev.cc, dev.warp_size, d.src0_ne, d.src0_nb, ne11)) {
        return GGML_DISPATCH_ROUTE_MMVF;
    }
    // dst->ne[2], dst->ne[3] of a MUL_MAT are src1's
    if (d.src0_ne[1] == 1 && ne11 > MMVF_MAX_BATCH_SIZE && d.src1_ne[2] == 1 && d.src1_ne[3] == 1 &&
            d.src0_type == GGML_TYPE_F32 && d.src0_contiguous && d.src1_contiguous && d.dst_contiguous &&
            ggml_dispatch_should_use_mmvf(d.src1_type, dev.cc, dev.warp_size, d.src1_ne, d.src1_nb, /*ne11 =*/ 1)) {
        return ggml_dispatch::ROUTE_MMVF_T;
    }
    if (ggml_cuda_should_use_mmf(d.src0_type, dev.cc, dev.warp_size, d.src0_ne, d.src0_nb, (int) ne11, /*mul_mat_id =*/ false)) {
        return GGML_DISPATCH_ROUTE_MMF;
    }
    if (ggml_cuda_should_use_mmvq(d.src0_type, dev.cc, ne11)) {
        return GGML_DISPATCH_ROUTE_MMVQ;
    }
    if (ggml_cuda_should_use_mmq(d.src0_type, dev.cc, ne11, /*n_experts =*/ 0)) {
        return GGML_DISPATCH_ROUTE_MMQ;
    }
    return GGML_DISPATCH_ROUTE_CUBLAS;
}

// What stock ggml_cuda_mul_mat_id runs (its cascade; src1 and dst are F32 there, asserted).
static inline int ggml_dispatch_stock_route_id(const ggml_dispatch_mm_desc & d, const ggml_dispatch_dev_desc & dev) {
    const int64_t ne2 = d.src1_ne[2];  // tokens; dst->ne[2] == src1->ne[2]
    if (d.src1_type == GGML_TYPE_F32 && d.dst_type == GGML_TYPE_F32) {
        if (ne2 <= MMVQ_MAX_BATCH_SIZE) {
            if (ggml_is_quantized(d.src0_type)) {
                if (ne2 <= get_mmvq_mmid_max_batch(d.src0_type, dev.cc)) {
                    return GGML_DISPATCH_ROUTE_MMVQ;
                }
            } else if (GGML_CUDA_CC_IS_AMD(dev.cc)) {
                return GGML_DISPATCH_ROUTE_MMVF;
            }
        }
        if (ggml_cuda_should_use_mmq(d.src0_type, dev.cc, d.src1_ne[2], /*n_experts =*/ d.src0_ne[2])) {
            return GGML_DISPATCH_ROUTE_MMQ;
        }
        if (ggml_cuda_should_use_mmf(d.src0_type, dev.cc, WARP_SIZE, d.src0_ne, d.src0_nb, (int) d.src1_ne[2], /*mul_mat_id =*/ true)) {
            return GGML_DISPATCH_ROUTE_MMF;
        }
    }
    return ggml_dispatch::ROUTE_ID_SORTED;
}
