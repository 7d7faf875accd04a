// ggml-dispatch: the eligibility check (hard limits only) for MUL_MAT_ID routes, beside the MUL_MAT
// check of ggml-dispatch-eligibility.cuh whose type and arch helpers it reuses.
//
// What the kernel wrappers assert with ids (pinned tree: mmvq.cu, mmvf.cu, mmq.cu, mmf.cu) and what has
// device code: mmvq and mmvf take at most MMVQ/MMVF_MAX_BATCH_SIZE tokens; mmq needs ne13 == 1 and
// row strides dividing the token strides; mmf has tensor-core code for f32/f16/bf16 only. Stock's soft
// limits (get_mmvq_mmid_max_batch, mmq's batch threshold, mmf's 512/128-token cut) are not checked:
// the tuner measures across them and verifies every candidate's numerics. The per-expert fallback
// (id_sorted: host sync, so the node's graph runs without CUDA graphs) needs what its own asserts do
// (ggml_cuda_mul_mat_id: token and output strides whole rows); each expert's slice runs stock's
// MUL_MAT cascade, which serves every type.
#pragma once

#include "ggml-dispatch-eligibility.cuh"

// `ids_ok`: ids is I32 with contiguous elements (ids->nb[0] == 4, asserted by every wrapper).
static inline ggml_dispatch_why ggml_dispatch_check_id(int route, const ggml_dispatch_mm_desc & d,
                                                       const ggml_dispatch_dev_desc & dev, bool ids_ok) {
    if (!ggml_dispatch_route_allows_op(route, GGML_DISPATCH_OP_MUL_MAT_ID)) {
        return GGML_DISPATCH_WHY_OP;
    }
    if (!GGML_CUDA_CC_IS_NVIDIA(dev.cc)) {
        return GGML_DISPATCH_WHY_VENDOR;
    }
    if (ggml_cuda_highest_compiled_arch(dev.cc) < 0) {
        return GGML_DISPATCH_WHY_NO_DEVICE_CODE;
    }
    if (d.src1_type != GGML_TYPE_F32) {
        return GGML_DISPATCH_WHY_SRC1_TYPE;
    }
    if (d.dst_type != GGML_TYPE_F32) {
        return GGML_DISPATCH_WHY_DST_TYPE;
    }
    const size_t ts0 = ggml_type_size(d.src0_type);
    if (!ids_ok || d.src0_nb[0] != ts0 || d.src1_nb[0] != sizeof(float) || d.dst_nb0 != sizeof(float)) {
        return GGML_DISPATCH_WHY_ELEMENT_STRIDE;
    }
    const int64_t tokens = d.src1_ne[2];
    switch (route) {
        case GGML_DISPATCH_ROUTE_MMVQ:
            if (!ggml_dispatch_mmvq_type(d.src0_type)) {
                return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (tokens < 1 || tokens > MMVQ_MAX_BATCH_SIZE) {  // GGML_ASSERT(!ids || ne12 <= MMVQ_MAX_BATCH_SIZE)
                return GGML_DISPATCH_WHY_BATCH;
            }
            return d.src0_bad_padding ? GGML_DISPATCH_WHY_PADDING : GGML_DISPATCH_OK;
        case GGML_DISPATCH_ROUTE_MMVF:
            if (d.src0_type != GGML_TYPE_F32 && d.src0_type != GGML_TYPE_F16 && d.src0_type != GGML_TYPE_BF16) {
                return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (tokens < 1 || tokens > MMVF_MAX_BATCH_SIZE || d.src1_ne[3] != 1) {
                return GGML_DISPATCH_WHY_BATCH;
            }
            if (d.src0_ne[0] % 2 != 0) {
                return GGML_DISPATCH_WHY_COLS;
            }
            if (!ggml_dispatch_nb_multiple(d.src0_nb, 2*ts0) || !ggml_dispatch_nb_multiple(d.src1_nb, 2*sizeof(float))) {
                return GGML_DISPATCH_WHY_ALIGN;
            }
            return GGML_DISPATCH_OK;
        case GGML_DISPATCH_ROUTE_MMQ:
            if (!ggml_dispatch_mmq_type(d.src0_type)) {
                return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (dev.smpbo < 48 * 1024) {
                return GGML_DISPATCH_WHY_SMEM;
            }
            if (d.src1_ne[3] != 1 || d.src1_nb[1] == 0 || d.src1_nb[2] % d.src1_nb[1] != 0) {
                return GGML_DISPATCH_WHY_ALIGN;  // GGML_ASSERT(ne13 == 1), (nb12 % nb11 == 0)
            }
            return d.src0_bad_padding ? GGML_DISPATCH_WHY_PADDING : GGML_DISPATCH_OK;
        case GGML_DISPATCH_ROUTE_MMF: {
            bool device_code;
            switch (d.src0_type) {
                case GGML_TYPE_F32:  device_code = ampere_mma_available(dev.cc); break;
                case GGML_TYPE_F16:  device_code = volta_mma_available(dev.cc) || turing_mma_available(dev.cc); break;
                case GGML_TYPE_BF16: device_code = ampere_mma_available(dev.cc); break;
                default: return GGML_DISPATCH_WHY_SRC0_TYPE;
            }
            if (!device_code) {
                return GGML_DISPATCH_WHY_NO_DEVICE_CODE;
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
        case GGML_DISPATCH_ROUTE_ID_SORTED:
            // GGML_ASSERT(nb12 % nb11 == 0) and (nb2 % nb1 == 0): a contiguous dst has whole rows
            if (d.src1_nb[1] == 0 || d.src1_nb[2] % d.src1_nb[1] != 0 || !d.dst_contiguous) {
                return GGML_DISPATCH_WHY_ALIGN;
            }
            return GGML_DISPATCH_OK;
        default:
            return GGML_DISPATCH_WHY_ROUTE;
    }
}

// A configuration code on a MUL_MAT_ID node: valid code, a route that serves MUL_MAT_ID and passes the
// check above, then the parameters' limits (mmq's J and stream-k: the MUL_MAT rules, which look at the
// type, N and the device only; its split needs a J).
static inline ggml_dispatch_why ggml_dispatch_check_config_id(int config, const ggml_dispatch_mm_desc & d,
                                                              const ggml_dispatch_dev_desc & dev, bool ids_ok) {
    if (config == 0 || !ggml_dispatch_config_valid(config)) {
        return GGML_DISPATCH_WHY_ROUTE;
    }
    const ggml_dispatch_why why = ggml_dispatch_check_id(ggml_dispatch_config_route(config), d, dev, ids_ok);
    if (why != GGML_DISPATCH_OK || !ggml_dispatch_config_has_params(config)) {
        return why;
    }
    return ggml_dispatch_check_params(GGML_DISPATCH_OP_MUL_MAT_ID, config, d, dev);
}
