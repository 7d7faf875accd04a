// Holds ggml-dispatch's eligibility check (ggml-dispatch-eligibility.cuh, hard limits only) against the
// tree's own ggml_cuda_should_use_{mmvf,mmf,mmvq,mmq} on a grid of shapes, types and cc values.
//
// Built by tests/test_native_build.py with nvcc (host code; no GPU needed). The tree's functions are
// taken verbatim out of mmvf.cu, mmf.cu, mmvq.cu and mmq.cu into tree_should_use.inc; ggml_cuda_info()
// and ggml_cuda_get_device() are stubbed so the device properties (cc, smpbo) come from the grid.
//
// grid_config.h (written by the test) may define GGML_DISPATCH_TEST_ARCH_LIST, which replaces nvcc's __CUDA_ARCH_LIST__ for the host code, i.e. the checks see
// the compiled-arch list of a build for those archs (device code is chosen per arch by __CUDA_ARCH__,
// the host only sees this list through ggml_cuda_highest_compiled_arch).
//
// Properties, for every grid point (src1/dst F32, no padded compute view, as in the stock cascade):
//  C1 containment: the tree would run route R  =>  the check allows R (never stricter than stock),
//     except documented upstream hazards where stock itself would abort (listed, counted, not allowed).
//  C2 hard limits: where upstream's soft preference is neutral (M = 1 for mmvf/mmvq, M <= 16 for mmf,
//     M = 1 with experts for mmq), the check allows R exactly when the tree's should_use_R says yes.
//  C3 no device code (no compiled arch <= cc): every route is refused.
//  C4 other vendors: every route is refused.
//  C5 the stock cascade's own choice is allowed (forcing what stock runs is always possible).
//  C6 configurations: parameters never loosen a route's check; mmq's J exactly where the tree compiled
//     code that fits; cuBLAS f16 output of an f32 GEMM refused; converters present => allowed.
#include "grid_config.h"

#ifdef GGML_DISPATCH_TEST_ARCH_LIST
#    undef __CUDA_ARCH_LIST__
#    define __CUDA_ARCH_LIST__ GGML_DISPATCH_TEST_ARCH_LIST
#endif

#include "ggml-dispatch-eligibility-id.cuh"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

static ggml_cuda_device_info g_info;

const ggml_cuda_device_info & ggml_cuda_info() {
    return g_info;
}

int ggml_cuda_get_device() {
    return 0;
}

#include "tree_should_use.inc"

struct stats {
    long points = 0, violations = 0, hazards = 0, configs = 0, config_ok = 0, fused_ok = 0, fit_ok = 0, sorted_ok = 0;
    long eligible[GGML_DISPATCH_ROUTE_COUNT]    = {};
    long tree_yes[GGML_DISPATCH_ROUTE_COUNT]    = {};
    long c2_checked[GGML_DISPATCH_ROUTE_COUNT]  = {};
    long why[GGML_DISPATCH_WHY_COUNT]           = {};
    long stock[ggml_dispatch::TRACE_ROUTE_COUNT] = {};
    std::vector<std::string> messages;
    std::map<std::string, int> kinds;
};

static std::string where(const ggml_dispatch_mm_desc & d, const ggml_dispatch_dev_desc & dev, int route) {
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  "route %s type %s cc %d smpbo %zu K %lld N %lld M %lld B %lld nb [%zu %zu %zu %zu] contig_alloc %d",
                  ggml_dispatch::route_name(route), ggml_type_name(d.src0_type), dev.cc, dev.smpbo,
                  (long long) d.src0_ne[0], (long long) d.src0_ne[1], (long long) d.src1_ne[1],
                  (long long) (d.src1_ne[2] * d.src1_ne[3]), d.src0_nb[0], d.src0_nb[1], d.src0_nb[2], d.src0_nb[3],
                  (int) d.src0_contiguously_allocated);
    return buf;
}

// The first 25 messages of each kind (the text before its first '(' or ':'), so that one frequent kind
// does not hide another.
static void fail(stats & s, const std::string & what) {
    s.violations++;
    const std::string kind = what.substr(0, what.find_first_of("(:"));
    if (s.kinds[kind]++ < 25) {
        s.messages.push_back(what);
    }
}

// Upstream hazards: the tree's cascade would pick a route whose kernel aborts for this node.
static bool hazard(int route, const ggml_dispatch_mm_desc & d) {
    if (route == GGML_DISPATCH_ROUTE_MMVQ && d.src0_type == GGML_TYPE_Q8_K) {
        return true;  // should_use_mmvq says yes for any quantized type; mul_mat_vec_q has no Q8_K kernel
    }
    if (route == GGML_DISPATCH_ROUTE_CUBLAS && !d.src0_contiguously_allocated &&
            !ggml_dispatch_cublas_nc_type(d.src0_type)) {
        return true;  // ggml_cuda_mul_mat_cublas asserts a strided conversion that does not exist
    }
    return false;
}

static bool tree_should_use(int route, const ggml_dispatch_mm_desc & d, const ggml_dispatch_dev_desc & dev,
                            int64_t n_experts) {
    const int64_t ne11 = d.src1_ne[1];
    switch (route) {
        case GGML_DISPATCH_ROUTE_MMVF: return ggml_cuda_should_use_mmvf(d.src0_type, dev.cc, d.src0_ne, d.src0_nb, ne11);
        case GGML_DISPATCH_ROUTE_MMF:
            return ggml_cuda_should_use_mmf(d.src0_type, dev.cc, dev.warp_size, d.src0_ne, d.src0_nb, (int) ne11, false);
        case GGML_DISPATCH_ROUTE_MMVQ: return ggml_cuda_should_use_mmvq(d.src0_type, dev.cc, ne11);
        case GGML_DISPATCH_ROUTE_MMQ:  return ggml_cuda_should_use_mmq(d.src0_type, dev.cc, ne11, n_experts);
        default: return false;
    }
}

static void check_point(stats & s, const ggml_dispatch_mm_desc & d, const ggml_dispatch_dev_desc & dev) {
    s.points++;
    const int64_t M   = d.src1_ne[1];
    const bool    nv  = GGML_CUDA_CC_IS_NVIDIA(dev.cc);
    const bool    dc  = ggml_cuda_highest_compiled_arch(dev.cc) >= 0;
    ggml_dispatch_why why[GGML_DISPATCH_ROUTE_COUNT];
    for (int r = 1; r < GGML_DISPATCH_ROUTE_COUNT; ++r) {
        why[r] = ggml_dispatch_check(r, d, dev);
        if (!ggml_dispatch_route_allows_op(r, GGML_DISPATCH_OP_MUL_MAT)) {  // the FlashAttention kernels
            if (why[r] != GGML_DISPATCH_WHY_ROUTE) {
                fail(s, "a route that serves no MUL_MAT not refused: " + where(d, dev, r));
            }
            continue;
        }
        s.why[why[r]]++;
        if (why[r] == GGML_DISPATCH_OK) {
            s.eligible[r]++;
        }
        if (!nv && why[r] != GGML_DISPATCH_WHY_VENDOR) {  // C4
            fail(s, "C4 not refused on another vendor: " + where(d, dev, r));
        }
        if (nv && !dc && why[r] != GGML_DISPATCH_WHY_NO_DEVICE_CODE) {  // C3
            fail(s, "C3 not refused without device code: " + where(d, dev, r));
        }
    }
    // C7 the per-expert fallback serves MUL_MAT_ID alone; there it needs what ggml_cuda_mul_mat_id asserts
    // (f32 src1 and dst, whole-row token and output strides) besides vendor and device code
    {
        const ggml_dispatch_why w_sorted = ggml_dispatch_check_config_id(GGML_DISPATCH_ROUTE_ID_SORTED, d, dev, true);
        const bool sorted_ok = nv && dc && d.src1_type == GGML_TYPE_F32 && d.dst_type == GGML_TYPE_F32 &&
                               d.src0_nb[0] == ggml_type_size(d.src0_type) && d.src1_nb[0] == sizeof(float) &&
                               d.dst_nb0 == sizeof(float) && d.src1_nb[1] != 0 && d.src1_nb[2] % d.src1_nb[1] == 0 &&
                               d.dst_contiguous;
        if (sorted_ok != (w_sorted == GGML_DISPATCH_OK)) {
            fail(s, std::string("C7 id_sorted on MUL_MAT_ID (") + ggml_dispatch_why_name(w_sorted) + "): " +
                    where(d, dev, GGML_DISPATCH_ROUTE_ID_SORTED));
        }
        s.configs++;
        s.config_ok += w_sorted == GGML_DISPATCH_OK;
        s.sorted_ok += w_sorted == GGML_DISPATCH_OK;
    }
    if (!nv || !dc) {
        return;
    }
    for (int r = GGML_DISPATCH_ROUTE_MMVF; r <= GGML_DISPATCH_ROUTE_MMQ; ++r) {
        const bool yes = tree_should_use(r, d, dev, 0);
        s.tree_yes[r] += yes;
        if (yes && why[r] != GGML_DISPATCH_OK) {  // C1
            if (hazard(r, d)) {
                s.hazards++;
            } else {
                fail(s, std::string("C1 tree runs it, check refuses (") + ggml_dispatch_why_name(why[r]) + "): " +
                        where(d, dev, r));
            }
        }
    }
    // C2: the points where upstream's soft preference is neutral
    const bool unbatched = d.src1_ne[2] * d.src1_ne[3] == 1 && d.src0_ne[2] * d.src0_ne[3] == 1;
    struct {
        int     route;
        bool    applies;
        int64_t n_experts;
    } c2[] = {
        {GGML_DISPATCH_ROUTE_MMVF, M == 1 && unbatched, 0},
        {GGML_DISPATCH_ROUTE_MMF, true, 0},
        {GGML_DISPATCH_ROUTE_MMVQ, M == 1, 0},
        {GGML_DISPATCH_ROUTE_MMQ, M == 1, 1},
    };
    for (const auto & c : c2) {
        if (!c.applies) {
            continue;
        }
        s.c2_checked[c.route]++;
        const bool yes = tree_should_use(c.route, d, dev, c.n_experts);
        const bool ok  = why[c.route] == GGML_DISPATCH_OK;
        if (yes != ok && !(yes && hazard(c.route, d))) {
            fail(s, std::string("C2 hard limit differs (tree ") + (yes ? "yes" : "no") + ", check " +
                    ggml_dispatch_why_name(why[c.route]) + "): " + where(d, dev, c.route));
        }
    }
    // C6 configurations (at M = 1, every parameter value of cuBLAS and mmq): parameters never loosen the
    // route's check; mmq's J is allowed exactly where the tree compiled code for it that fits smpbo;
    // cuBLAS f16 output of an f32 GEMM is always refused.
    if (M == 1) {
        const bool fallback = d.src0_ne[1] % 128 != 0;
        for (int j = 0; j <= GGML_DISPATCH_PARAM_MMQ_J_COUNT; ++j) {
            for (int sk = 0; sk <= GGML_DISPATCH_PARAM_MMQ_STREAM_K_COUNT; ++sk) {
                const int config = GGML_DISPATCH_ROUTE_MMQ | (j << GGML_DISPATCH_PARAM_MMQ_J_SHIFT) |
                                   (sk << GGML_DISPATCH_PARAM_MMQ_STREAM_K_SHIFT);
                const ggml_dispatch_why w = ggml_dispatch_check_config(GGML_DISPATCH_OP_MUL_MAT, config, d, dev);
                s.configs++;
                s.config_ok += w == GGML_DISPATCH_OK;
                if (w == GGML_DISPATCH_OK && why[GGML_DISPATCH_ROUTE_MMQ] != GGML_DISPATCH_OK) {
                    fail(s, "C6 mmq parameters loosen the route's check: " + where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                // mmq's split is a MUL_MAT_ID parameter: refused on MUL_MAT; on MUL_MAT_ID it needs a J and
                // otherwise changes nothing the check looks at
                const int split = config | (GGML_DISPATCH_PARAM_MMQ_SPLIT_V_2J << GGML_DISPATCH_PARAM_MMQ_SPLIT_SHIFT);
                if (ggml_dispatch_check_config(GGML_DISPATCH_OP_MUL_MAT, split, d, dev) == GGML_DISPATCH_OK) {
                    fail(s, "C6 mmq split allowed on MUL_MAT: " + where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                const ggml_dispatch_why w_id = ggml_dispatch_check_config_id(config, d, dev, true);
                const ggml_dispatch_why w_split = ggml_dispatch_check_config_id(split, d, dev, true);
                if (j == 0 ? w_split == GGML_DISPATCH_OK : w_split != w_id) {
                    fail(s, std::string("C6 mmq split on MUL_MAT_ID (") + ggml_dispatch_why_name(w_split) + ", J=" +
                            std::to_string(8*j) + "): " + where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                s.configs += 2;
                s.config_ok += w_split == GGML_DISPATCH_OK;
                // 2j_wave: the split without stream-k only (its first launch is the stream-k kernel over whole
                // tiles), where that J's code has a stream-k config
                const int wave = config | (GGML_DISPATCH_PARAM_MMQ_SPLIT_V_2J_WAVE << GGML_DISPATCH_PARAM_MMQ_SPLIT_SHIFT);
                const ggml_dispatch_why w_wave = ggml_dispatch_check_config_id(wave, d, dev, true);
                bool wave_ok = false;
                if (j != 0 && sk == GGML_DISPATCH_PARAM_MMQ_STREAM_K_V_OFF && w_id == GGML_DISPATCH_OK) {
                    const ggml_cuda_mmq_config cw = ggml_cuda_mmq_get_config(d.src0_type, 8*j, fallback, dev.cc);
                    wave_ok = cw.stream_k;
                }
                if (wave_ok != (w_wave == GGML_DISPATCH_OK)) {
                    fail(s, std::string("C6 mmq split=2j_wave on MUL_MAT_ID (") + ggml_dispatch_why_name(w_wave) + ", J=" +
                            std::to_string(8*j) + ", stream_k " + std::to_string(sk) + "): " +
                            where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                s.configs++;
                s.config_ok += w_wave == GGML_DISPATCH_OK;
                // 2j_fused: one launch at J = 128 with J's tiles beside, stream_k=off, a J with fused code, rows
                // in whole 128-row tiles, Q8_1 activations, both widths with one block size and row tile, and
                // J = 128's shared memory within the opt-in limit
                const int fused = config | (GGML_DISPATCH_PARAM_MMQ_SPLIT_V_2J_FUSED << GGML_DISPATCH_PARAM_MMQ_SPLIT_SHIFT);
                const ggml_dispatch_why w_fused = ggml_dispatch_check_config_id(fused, d, dev, true);
                bool fused_ok = false;
                const bool fp4 = (d.src0_type == GGML_TYPE_NVFP4 || d.src0_type == GGML_TYPE_MXFP4) && blackwell_mma_available(dev.cc);
                bool fused_j = false;
#define FUSED_J_IS(v) fused_j = fused_j || 8*j == (v);
                GGML_DISPATCH_MMQ_FUSED_J_LIST(FUSED_J_IS)
#undef FUSED_J_IS
                if (fused_j && sk == GGML_DISPATCH_PARAM_MMQ_STREAM_K_V_OFF && w_id == GGML_DISPATCH_OK && !fallback && !fp4) {
                    const ggml_cuda_mmq_config c128 = ggml_cuda_mmq_get_config(d.src0_type, 128, false, dev.cc);
                    const ggml_cuda_mmq_config cj = ggml_cuda_mmq_get_config(d.src0_type, 8*j, false, dev.cc);
                    fused_ok = c128.type != GGML_TYPE_COUNT && cj.type != GGML_TYPE_COUNT && c128.nthreads == cj.nthreads &&
                               c128.I == cj.I && mmq_get_nbytes_shared(c128, dev.cc) <= dev.smpbo;
                }
                if (fused_ok != (w_fused == GGML_DISPATCH_OK)) {
                    fail(s, std::string("C6 mmq split=2j_fused on MUL_MAT_ID (") + ggml_dispatch_why_name(w_fused) + ", J=" +
                            std::to_string(8*j) + ", stream_k " + std::to_string(sk) + "): " +
                            where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                s.configs++;
                s.config_ok += w_fused == GGML_DISPATCH_OK;
                s.fused_ok += w_fused == GGML_DISPATCH_OK;
                // split=fit: the fused launch without a J of its own (J must be left out), every fused width
                const int fit = config | (GGML_DISPATCH_PARAM_MMQ_SPLIT_V_FIT << GGML_DISPATCH_PARAM_MMQ_SPLIT_SHIFT);
                const ggml_dispatch_why w_fit = ggml_dispatch_check_config_id(fit, d, dev, true);
                bool fit_ok = j == 0 && sk == GGML_DISPATCH_PARAM_MMQ_STREAM_K_V_OFF && w_id == GGML_DISPATCH_OK && !fallback && !fp4;
                const ggml_cuda_mmq_config c128 = ggml_cuda_mmq_get_config(d.src0_type, 128, false, dev.cc);
                fit_ok = fit_ok && c128.type != GGML_TYPE_COUNT && mmq_get_nbytes_shared(c128, dev.cc) <= dev.smpbo;
#define FIT_J_OK(v) { const ggml_cuda_mmq_config cv = ggml_cuda_mmq_get_config(d.src0_type, (v), false, dev.cc); \
                      fit_ok = fit_ok && cv.type != GGML_TYPE_COUNT && cv.nthreads == c128.nthreads && cv.I == c128.I; }
                GGML_DISPATCH_MMQ_FUSED_J_LIST(FIT_J_OK)
#undef FIT_J_OK
                if (fit_ok != (w_fit == GGML_DISPATCH_OK)) {
                    fail(s, std::string("C6 mmq split=fit on MUL_MAT_ID (") + ggml_dispatch_why_name(w_fit) + ", J=" +
                            std::to_string(8*j) + ", stream_k " + std::to_string(sk) + "): " +
                            where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                s.configs++;
                s.config_ok += w_fit == GGML_DISPATCH_OK;
                s.fit_ok += w_fit == GGML_DISPATCH_OK;
                // split=fit64: fit over 64-column slots, the same limits
                const int fit64 = config | (GGML_DISPATCH_PARAM_MMQ_SPLIT_V_FIT64 << GGML_DISPATCH_PARAM_MMQ_SPLIT_SHIFT);
                const ggml_dispatch_why w_fit64 = ggml_dispatch_check_config_id(fit64, d, dev, true);
                if (w_fit64 != w_fit) {
                    fail(s, std::string("C6 mmq split=fit64 on MUL_MAT_ID (") + ggml_dispatch_why_name(w_fit64) + ", fit " +
                            ggml_dispatch_why_name(w_fit) + ", J=" + std::to_string(8*j) + "): " +
                            where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
                s.configs++;
                s.config_ok += w_fit64 == GGML_DISPATCH_OK;
                if (why[GGML_DISPATCH_ROUTE_MMQ] != GGML_DISPATCH_OK || j == 0 || sk == GGML_DISPATCH_PARAM_MMQ_STREAM_K_V_ON) {
                    continue;
                }
                const ggml_cuda_mmq_config c = ggml_cuda_mmq_get_config(d.src0_type, 8*j, fallback, dev.cc);
                const bool tree = c.type != GGML_TYPE_COUNT && mmq_get_nbytes_shared(c, dev.cc) <= dev.smpbo;
                if (tree != (w == GGML_DISPATCH_OK)) {
                    fail(s, "C6 mmq J=" + std::to_string(8*j) + " compiled " + (tree ? "yes" : "no") + ", check " +
                            ggml_dispatch_why_name(w) + ": " + where(d, dev, GGML_DISPATCH_ROUTE_MMQ));
                }
            }
        }
        for (int out = 0; out <= GGML_DISPATCH_PARAM_CUBLAS_OUT_COUNT; ++out) {
            for (int ct = 0; ct <= GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_COUNT; ++ct) {
                const int config = GGML_DISPATCH_ROUTE_CUBLAS | (out << GGML_DISPATCH_PARAM_CUBLAS_OUT_SHIFT) |
                                   (ct << GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_SHIFT);
                const ggml_dispatch_why w = ggml_dispatch_check_config(GGML_DISPATCH_OP_MUL_MAT, config, d, dev);
                s.configs++;
                s.config_ok += w == GGML_DISPATCH_OK;
                if (w == GGML_DISPATCH_OK && why[GGML_DISPATCH_ROUTE_CUBLAS] != GGML_DISPATCH_OK) {
                    fail(s, "C6 cuBLAS parameters loosen the route's check: " + where(d, dev, GGML_DISPATCH_ROUTE_CUBLAS));
                }
                if (w == GGML_DISPATCH_OK && out == GGML_DISPATCH_PARAM_CUBLAS_OUT_V_F16 &&
                        ct == GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_V_F32) {
                    fail(s, "C6 cuBLAS f16 output of an f32 GEMM allowed: " + where(d, dev, GGML_DISPATCH_ROUTE_CUBLAS));
                }
                // contiguous weights of every type have a converter to f16 and f32 in the tree
                if (w != GGML_DISPATCH_OK && why[GGML_DISPATCH_ROUTE_CUBLAS] == GGML_DISPATCH_OK && d.src0_contiguously_allocated &&
                        ct != GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_V_BF16 &&
                        !(out == GGML_DISPATCH_PARAM_CUBLAS_OUT_V_F16 && ct == GGML_DISPATCH_PARAM_CUBLAS_COMPUTE_V_F32) &&
                        ggml_get_to_fp16_cuda(d.src0_type) != nullptr && ggml_get_to_fp32_cuda(d.src0_type) != nullptr) {
                    fail(s, std::string("C6 cuBLAS configuration refused (") + ggml_dispatch_why_name(w) + "): " +
                            where(d, dev, GGML_DISPATCH_ROUTE_CUBLAS));
                }
            }
        }
    }
    // C5
    const int st = ggml_dispatch_stock_route(d, dev);
    s.stock[st]++;
    if (st >= 1 && st < GGML_DISPATCH_ROUTE_COUNT && why[st] != GGML_DISPATCH_OK && !hazard(st, d)) {
        fail(s, std::string("C5 stock's own route refused (") + ggml_dispatch_why_name(why[st]) + "): " +
                where(d, dev, st));
    }
}

struct src0_layout {
    const char * name;
    int          kind;  // 0 contiguous, 1 padded rows, 2 KV-cache-like view (heads interleaved), 3 odd stride view
};

int main() {
    const ggml_type types[] = {  // the src0 types ggml-cuda's supports_op accepts for MUL_MAT
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q1_0, GGML_TYPE_Q2_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_NVFP4, GGML_TYPE_Q2_K,
        GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K, GGML_TYPE_IQ1_M,
        GGML_TYPE_IQ1_S, GGML_TYPE_IQ2_S, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ3_XXS,
        GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
    };
    const int     ccs[]    = {700, 750, 800, 890, 900, 1200, GGML_CUDA_CC_RDNA3};
    const size_t  smpbos[] = {48 * 1024, 47 * 1024, 227 * 1024};
    const int64_t Ns[]     = {1, 31, 64, 576, 768, 4097};  // 768: whole 128-row tiles (mmq split=2j_fused)
    const int64_t Ms[]     = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 64, 65, 256, 512};
    const int64_t Bs[]     = {1, 3};
    const src0_layout layouts[] = {{"contiguous", 0}, {"padded_rows", 1}, {"kv_view", 2}, {"odd_stride", 3}};

    stats s;
    for (ggml_type t : types) {
        const int64_t blk = ggml_blck_size(t);
        const size_t  ts  = ggml_type_size(t);
        std::vector<int64_t> Ks = {blk, 3*blk, 4096, 4096 + blk};
        if (blk == 1) {
            Ks.push_back(4097);
            Ks.push_back(96);
            Ks.push_back(100);
        }
        for (int cc : ccs) {
            for (size_t smpbo : smpbos) {
                g_info.device_count              = 1;
                g_info.devices[0].cc             = cc;
                g_info.devices[0].smpbo          = smpbo;
                g_info.devices[0].warp_size      = 32;
                const ggml_dispatch_dev_desc dev = {cc, 32, smpbo};
                for (int64_t K : Ks) {
                    for (int64_t N : Ns) {
                        for (int64_t B : Bs) {
                            for (const auto & lay : layouts) {
                                if (lay.kind == 2 && B == 1) {
                                    continue;
                                }
                                const size_t row = (size_t) (K / blk) * ts;
                                ggml_dispatch_mm_desc d = {};
                                d.src0_type = t;
                                d.src1_type = GGML_TYPE_F32;
                                d.dst_type  = GGML_TYPE_F32;
                                d.src0_ne[0] = K; d.src0_ne[1] = N; d.src0_ne[2] = B; d.src0_ne[3] = 1;
                                d.src0_nb[0] = ts;
                                switch (lay.kind) {
                                    case 0: d.src0_nb[1] = row;          d.src0_nb[2] = row*N; break;
                                    case 1: d.src0_nb[1] = row + 16*ts;  d.src0_nb[2] = (row + 16*ts)*N; break;
                                    case 2: d.src0_nb[1] = row*B;        d.src0_nb[2] = row; break;
                                    default: d.src0_nb[1] = row + ts;    d.src0_nb[2] = (row + ts)*N; break;
                                }
                                d.src0_nb[3] = d.src0_nb[2]*B;
                                d.src0_contiguously_allocated = lay.kind == 0;
                                d.src0_contiguous             = lay.kind == 0;
                                d.src1_contiguous             = true;
                                d.dst_contiguous              = true;
                                d.dst_nb0                     = sizeof(float);
                                d.src0_bad_padding            = false;
                                d.fwht_hint                   = false;
                                for (int64_t M : Ms) {
                                    d.src1_ne[0] = K; d.src1_ne[1] = M; d.src1_ne[2] = B; d.src1_ne[3] = 1;
                                    d.src1_nb[0] = sizeof(float);
                                    d.src1_nb[1] = sizeof(float)*K;
                                    d.src1_nb[2] = sizeof(float)*K*M;
                                    d.src1_nb[3] = sizeof(float)*K*M*B;
                                    check_point(s, d, dev);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    std::printf("{\"arch_list\":\"%s\",\"points\":%ld,\"violations\":%ld,\"hazards\":%ld", STRINGIZE(__CUDA_ARCH_LIST__),
                s.points, s.violations, s.hazards);
    std::printf(",\"configs\":%ld,\"configs_eligible\":%ld,\"fused_eligible\":%ld,\"fit_eligible\":%ld", s.configs,
                s.config_ok, s.fused_ok, s.fit_ok);
    std::printf(",\"sorted_eligible\":%ld", s.sorted_ok);
    std::printf(",\"eligible\":{");
    for (int r = 1; r < GGML_DISPATCH_ROUTE_COUNT; ++r) {
        std::printf("%s\"%s\":%ld", r > 1 ? "," : "", ggml_dispatch::route_name(r), s.eligible[r]);
    }
    std::printf("},\"tree_yes\":{");
    for (int r = 1; r <= GGML_DISPATCH_ROUTE_MMQ; ++r) {
        std::printf("%s\"%s\":%ld", r > 1 ? "," : "", ggml_dispatch::route_name(r), s.tree_yes[r]);
    }
    std::printf("},\"c2_checked\":{");
    for (int r = 1; r <= GGML_DISPATCH_ROUTE_MMQ; ++r) {
        std::printf("%s\"%s\":%ld", r > 1 ? "," : "", ggml_dispatch::route_name(r), s.c2_checked[r]);
    }
    std::printf("},\"why\":{");
    for (int w = 0; w < GGML_DISPATCH_WHY_COUNT; ++w) {
        std::printf("%s\"%s\":%ld", w ? "," : "", ggml_dispatch_why_name(w), s.why[w]);
    }
    std::printf("},\"stock\":{");
    for (int r = 0; r < ggml_dispatch::TRACE_ROUTE_COUNT; ++r) {
        std::printf("%s\"%s\":%ld", r ? "," : "", ggml_dispatch::route_name(r), s.stock[r]);
    }
    std::printf("},\"messages\":[");
    for (size_t i = 0; i < s.messages.size(); ++i) {
        std::printf("%s\"%s\"", i ? "," : "", s.messages[i].c_str());
    }
    std::printf("]}\n");
    return s.violations == 0 ? 0 : 1;
}
