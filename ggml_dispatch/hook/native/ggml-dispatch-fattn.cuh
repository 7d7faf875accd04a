// ggml-dispatch-fattn.cuh: FLASH_ATTN_EXT kernel choice: the table's or a forced configuration over the tree's own best_fattn_kernel
// Included by the hook at one place of an upstream file (ggml_dispatch/hook/native/fattn.cu.hook, hunk 'dispatch_kernel'): it reads
// that file's own functions defined above that place, so it is not a self-contained header.
#pragma once

// Tree functions this file reads that older trees lack. Overload resolution takes the form that compiles
// (`int` beats `long`); where a tree has none, the answer its absence means: no sparse-gather variant, and a
// VEC launch of unknown instances sized with the f16 copies (more scratch, never less).
template <typename T>
static constexpr auto ggml_dispatch_may_use_sparse_form(int, T DKQ, int DV, int n1, int n2)
        -> decltype(ggml_cuda_flash_attn_ext_mma_f16_may_use_sparse(DKQ, DV, n1, n2)) {
    return ggml_cuda_flash_attn_ext_mma_f16_may_use_sparse(DKQ, DV, n1, n2);
}
template <typename T>
static constexpr bool ggml_dispatch_may_use_sparse_form(long, T, int, int, int) {
    return false;
}
static constexpr bool ggml_dispatch_may_use_sparse(int DKQ, int DV, int n1, int n2) {
    return ggml_dispatch_may_use_sparse_form(0, DKQ, DV, n1, n2);
}
template <typename T>
static auto ggml_dispatch_shall_use_sparse_form(int, int cc, T dst, int n1, int n2)
        -> decltype(ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse(cc, dst, n1, n2)) {
    return ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse(cc, dst, n1, n2);
}
template <typename T>
static bool ggml_dispatch_shall_use_sparse_form(long, int, T, int, int) {
    return false;
}
static bool ggml_dispatch_shall_use_sparse(int cc, const ggml_tensor * dst, int n1, int n2) {
    return ggml_dispatch_shall_use_sparse_form(0, cc, dst, n1, n2);
}
template <typename T>
static auto ggml_dispatch_vec_needs_f16_form(int, T head, ggml_type k, ggml_type v)
        -> decltype(ggml_cuda_get_fattn_vec_case(head, k, v) == nullptr) {
    return ggml_cuda_get_fattn_vec_case(head, k, v) == nullptr;
}
template <typename T>
static bool ggml_dispatch_vec_needs_f16_form(long, T, ggml_type, ggml_type) {
    return true;
}

// ggml-dispatch: the hard limits of each kernel on a node stock can run (stock != NONE), as the tree's
// kernels take them: VEC needs a head dim <= 256, a multiple of 64 but not 192, a KV length that is a
// multiple of FATTN_KQ_STRIDE and at most GGML_DISPATCH_FA_VEC_MAX_COLS Q columns (1-2 per block); a K/V
// type pair without its own instance (GGML_CUDA_FA_QUANTS) runs the f16 one after converting, as stock's
// VEC does, and get_alloc_size sizes the copies for it;
// MMA_F16 needs tensor cores the MMA kernel is compiled for and a head dim other than 40/72; TILE takes
// every head dim stock takes. Bit (1 << route code) set = eligible.
#define GGML_DISPATCH_FA_VEC_MAX_COLS 8
static unsigned ggml_cuda_fattn_dispatch_eligible(const int device, const ggml_tensor * dst) {
    const ggml_tensor * Q  = dst->src[0];
    const ggml_tensor * K  = dst->src[1];
    const int           cc = ggml_cuda_info().devices[device].cc;
    unsigned            ok = 1u << GGML_DISPATCH_ROUTE_FA_TILE;
    if (Q->ne[0] <= 256 && Q->ne[0] % 64 == 0 && Q->ne[0] != 192 && K->ne[1] % FATTN_KQ_STRIDE == 0 &&
            Q->ne[1] <= GGML_DISPATCH_FA_VEC_MAX_COLS) {
        ok |= 1u << GGML_DISPATCH_ROUTE_FA_VEC;
    }
    if ((turing_mma_available(cc) || volta_mma_available(cc) || amd_mfma_available(cc) || amd_wmma_available(cc)) &&
            Q->ne[0] != 40 && Q->ne[0] != 72) {
        ok |= 1u << GGML_DISPATCH_ROUTE_FA_MMA;
    }
    return ok;
}

static int ggml_cuda_fattn_dispatch_route(const best_fattn_kernel kernel) {
    switch (kernel) {
        case BEST_FATTN_KERNEL_VEC:     return GGML_DISPATCH_ROUTE_FA_VEC;
        case BEST_FATTN_KERNEL_TILE:    return GGML_DISPATCH_ROUTE_FA_TILE;
        case BEST_FATTN_KERNEL_MMA_F16: return GGML_DISPATCH_ROUTE_FA_MMA;
        default:                        return 0;
    }
}

// The parameters a FlashAttention configuration code sets, as the readers take them (ggml-dispatch-params.h).
static ggml_dispatch_params ggml_cuda_fattn_dispatch_params_of(const int config) {
    ggml_dispatch_params p;
    auto number = [config](int param) {
        const int v = ggml_dispatch_config_param(config, param);
        return v == 0 ? 0 : std::atoi(ggml_dispatch_param_descs[param].values[v - 1]);
    };
    auto on_off = [config](int param, int on, int off) {
        const int v = ggml_dispatch_config_param(config, param);
        return v == 1 ? on : v == 2 ? off : 0;  // the registry declares ("on", "off")
    };
    // kv=shadow, or kv=reuse: the dispatch resolves the latter before a launch (to kv=shadow or stock's kernel,
    // fattn_kv_reuse_resolve), so launches, the check and the scratch sizing take it as the shadow it reads
    auto shadow = [config](int param) {
        return ggml_dispatch_config_param(config, param) != 0 ? GGML_DISPATCH_FA_KV_SHADOW : GGML_DISPATCH_FA_KV_STOCK;
    };
    switch (ggml_dispatch_config_route(config)) {
        case GGML_DISPATCH_ROUTE_FA_VEC:
            p.fa_blocks = number(GGML_DISPATCH_PARAM_FA_VEC_BLOCKS_INDEX);
            p.fa_kv     = shadow(GGML_DISPATCH_PARAM_FA_VEC_KV_INDEX);
            break;
        case GGML_DISPATCH_ROUTE_FA_TILE:
            p.fa_kv = shadow(GGML_DISPATCH_PARAM_FA_TILE_KV_INDEX);
            break;
        case GGML_DISPATCH_ROUTE_FA_MMA:
            p.fa_ncols1   = number(GGML_DISPATCH_PARAM_FA_MMA_NCOLS1_INDEX);
            p.fa_ncols2   = number(GGML_DISPATCH_PARAM_FA_MMA_NCOLS2_INDEX);
            p.fa_sparse   = on_off(GGML_DISPATCH_PARAM_FA_MMA_SPARSE_INDEX, GGML_DISPATCH_FA_SPARSE_ON, GGML_DISPATCH_FA_SPARSE_OFF);
            p.fa_stream_k = on_off(GGML_DISPATCH_PARAM_FA_MMA_STREAM_K_INDEX, GGML_DISPATCH_FA_STREAM_K_ON, GGML_DISPATCH_FA_STREAM_K_OFF);
            p.fa_kv       = shadow(GGML_DISPATCH_PARAM_FA_MMA_KV_INDEX);
            break;
        default:
            break;
    }
    return p;
}
static_assert(GGML_DISPATCH_PARAM_FA_MMA_SPARSE_V_ON == 1 && GGML_DISPATCH_PARAM_FA_MMA_SPARSE_V_OFF == 2, "on, off");
static_assert(GGML_DISPATCH_PARAM_FA_MMA_STREAM_K_V_ON == 1 && GGML_DISPATCH_PARAM_FA_MMA_STREAM_K_V_OFF == 2, "on, off");

// The MMA_F16 instance a launch runs: ncols1 x ncols2 and the sparse-gather variant.
struct ggml_cuda_fattn_mma_pick {
    int  ncols1 = 0;
    int  ncols2 = 0;
    bool sparse = false;
};

// switch_ncols2's use_gqa_opt (the template specializations with GQA packing need it).
static bool ggml_cuda_fattn_dispatch_gqa_opt(const ggml_tensor * dst) {
    const ggml_tensor * Q    = dst->src[0];
    const ggml_tensor * K    = dst->src[1];
    const ggml_tensor * V    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    float max_bias = 0.0f;
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    bool use_gqa_opt = mask && max_bias == 0.0f && K->ne[1] % FATTN_KQ_STRIDE == 0;
    for (const ggml_tensor * t : {Q, K, V, mask}) {
        if (t == nullptr || ggml_is_quantized(t->type)) {
            continue;
        }
        for (size_t i = 1; i < GGML_MAX_DIMS; ++i) {
            if (t->nb[i] % 16 != 0) {
                use_gqa_opt = false;
                break;
            }
        }
    }
    return use_gqa_opt;
}

// switch_ncols2's own ncols2 (0: none, the tree aborts) for the head dims that go through it.
static int ggml_cuda_fattn_dispatch_stock_ncols2(const int cc, const int DKQ, const bool use_gqa_opt, const int gqa_ratio) {
    if (cc == GGML_CUDA_CC_VOLTA) {
        if (use_gqa_opt && gqa_ratio % 8 == 0) {
            return 8;
        }
        if (use_gqa_opt && gqa_ratio % 4 == 0) {
            return 4;
        }
        return DKQ > 256 ? 0 : use_gqa_opt && gqa_ratio % 2 == 0 ? 2 : 1;
    }
    if (amd_wmma_available(cc)) {
        for (const int n2 : {8, 4, 2}) {
            if (use_gqa_opt && gqa_ratio % n2 == 0) {
                return n2;
            }
        }
    }
    if (use_gqa_opt && gqa_ratio > 4) {
        return 8;
    }
    if (use_gqa_opt && gqa_ratio > 2) {
        return 4;
    }
    if (use_gqa_opt && gqa_ratio > 1) {
        return 2;
    }
    return DKQ <= 256 ? 1 : 0;
}

// What switch_ncols2 -> switch_ncols1 -> ggml_cuda_flash_attn_ext_mma_f16_case launch for the node under the
// parameters `p` (a parameter left at 0 takes the switch's own rule). False when `p` names what they cannot
// launch: an ncols2 above 1 without the GQA optimization (or 1 at a head dim above 256), an ncols1 x ncols2
// that is not one of the tiles switch_ncols1<ncols2> launches (8: Turing tensor cores, ncols2 <= 8; 16:
// ncols2 <= 16; 32; 64), a tile the compiled arch has no device code for (Volta: >= 32 columns, Turing:
// <= 32), or tile parameters at a head dim that bypasses switch_ncols2 (192, 320, 576: their packing is fixed).
static bool ggml_cuda_fattn_dispatch_mma_pick(const int cc, const ggml_tensor * dst, const ggml_dispatch_params & p,
                                              ggml_cuda_fattn_mma_pick * out) {
    const ggml_tensor * Q   = dst->src[0];
    const ggml_tensor * K   = dst->src[1];
    const ggml_tensor * V   = dst->src[2];
    const int           DKQ = (int) Q->ne[0];
    const int           DV  = (int) V->ne[0];
    const int64_t       M   = Q->ne[1];
    const bool steer = p.fa_ncols1 != 0 || p.fa_ncols2 != 0 || p.fa_sparse != GGML_DISPATCH_FA_SPARSE_STOCK;
    switch (DKQ) {
        case 64: case 80: case 96: case 112: case 128: case 256: case 512:
            break;
        default:
            return !steer;
    }
    if (steer && !GGML_CUDA_CC_IS_NVIDIA(cc)) {
        return false;
    }
    const bool use_gqa_opt = ggml_cuda_fattn_dispatch_gqa_opt(dst);
    const int  gqa_ratio   = (int) (Q->ne[2] / K->ne[2]);
    int        n2          = p.fa_ncols2;
    if (n2 == 0) {
        n2 = ggml_cuda_fattn_dispatch_stock_ncols2(cc, DKQ, use_gqa_opt, gqa_ratio);
        if (n2 == 0) {
            return false;
        }
    } else if ((n2 != 1 && n2 != 2 && n2 != 4 && n2 != 8) || (n2 == 1 && DKQ > 256) || (n2 > 1 && !use_gqa_opt)) {
        return false;
    }
    const int  arch = ggml_cuda_highest_compiled_arch(cc);
    // shall_use_sparse as the launch answers it (the configuration's sparse choice in scope)
    ggml_dispatch_params sp;
    sp.fa_sparse = p.fa_sparse;
    const ggml_dispatch_params_scope scope(sp);
    int n1 = p.fa_ncols1;
    if (n1 != 0) {
        const int ncols = n1 * n2;
        const bool launched = (ncols == 8 && n2 <= 8 && turing_mma_available(cc)) || (ncols == 16 && n2 <= 16) ||
                              ncols == 32 || ncols == 64;
        if (!launched) {
            return false;
        }
    } else if (ggml_dispatch_may_use_sparse(DKQ, DV, 1, n2) &&
               !(ggml_dispatch_may_use_sparse(DKQ, DV, 64/n2, n2) && M > 32/n2) &&
               ggml_dispatch_shall_use_sparse(cc, dst, 1, n2)) {
        n1 = 1;
    } else if (n2 <= 8 && turing_mma_available(cc) && M <= 8/n2) {
        n1 = 8/n2;
    } else if (n2 <= 16 && M <= 16/n2) {
        n1 = 16/n2;
    } else if (M <= 32/n2 || (GGML_CUDA_CC_IS_NVIDIA(cc) && arch == GGML_CUDA_CC_TURING) ||
               (GGML_CUDA_CC_IS_AMD(cc) && DKQ > 256)) {
        n1 = 32/n2;
    } else {
        n1 = 64/n2;
    }
    if (steer && ((arch == GGML_CUDA_CC_VOLTA && n1*n2 < 32) || (arch == GGML_CUDA_CC_TURING && n1*n2 > 32))) {
        return false;
    }
    float logit_softcap = 0.0f;
    memcpy(&logit_softcap, (const float *) dst->op_params + 2, sizeof(float));
    out->ncols1 = n1;
    out->ncols2 = n2;
    out->sparse = logit_softcap == 0.0f && ggml_dispatch_may_use_sparse(DKQ, DV, n1, n2) &&
                  ggml_dispatch_shall_use_sparse(cc, dst, n1, n2);
    return true;
}

// The one check of a FlashAttention configuration on a node (the runtime's, and the harness's through the
// override): its kernel's hard limits above, then its parameters': VEC's parallel blocks at most one per KV
// tile (launch_fattn clamps to it), MMA_F16's tile as ggml_cuda_fattn_dispatch_mma_pick finds it and the
// sparse gather on only where that instance runs it; TILE has no parameters. GGML_DISPATCH_OK or why not.
static int ggml_cuda_fattn_dispatch_check(const int device, const ggml_tensor * dst, const int config) {
    const int route = ggml_dispatch_config_route(config);
    if (((ggml_cuda_fattn_dispatch_eligible(device, dst) >> route) & 1u) == 0) {
        return GGML_DISPATCH_WHY_ATTN;
    }
    if (!ggml_dispatch_config_has_params(config)) {
        return GGML_DISPATCH_OK;
    }
    const ggml_dispatch_params p = ggml_cuda_fattn_dispatch_params_of(config);
    const ggml_tensor *        Q = dst->src[0];
    const ggml_tensor *        K = dst->src[1];
    if (p.fa_kv == GGML_DISPATCH_FA_KV_SHADOW &&
            !ggml_cuda_dispatch_kv_shadow_serves(K) && !ggml_cuda_dispatch_kv_shadow_serves(dst->src[2])) {
        return GGML_DISPATCH_WHY_PARAMS;  // no K/V type a shadow is kept for: the switch would change nothing
    }
    if (route == GGML_DISPATCH_ROUTE_FA_TILE) {
        return GGML_DISPATCH_OK;
    }
    if (route == GGML_DISPATCH_ROUTE_FA_VEC) {
        const int64_t ntiles_KV = (K->ne[1] + Q->ne[0] - 1) / Q->ne[0];  // the VEC launch's nbatch_fa is D
        return p.fa_blocks <= ntiles_KV ? GGML_DISPATCH_OK : GGML_DISPATCH_WHY_PARAMS;
    }
    if (route == GGML_DISPATCH_ROUTE_FA_MMA) {
        ggml_cuda_fattn_mma_pick pick;
        const bool ok = ggml_cuda_fattn_dispatch_mma_pick(ggml_cuda_info().devices[device].cc, dst, p, &pick) &&
                        (p.fa_sparse != GGML_DISPATCH_FA_SPARSE_ON || pick.sparse);
        return ok ? GGML_DISPATCH_OK : GGML_DISPATCH_WHY_PARAMS;
    }
    return GGML_DISPATCH_WHY_PARAMS;
}

// The configuration a launch under `config` runs (its route alone: stock's kernel), as the route trace
// records it: MMA_F16's tile and sparse gather filled in as the tree's switches resolve them
// (ggml_cuda_fattn_dispatch_mma_pick), every other code as given.
static int ggml_cuda_fattn_dispatch_resolve(const int device, const ggml_tensor * dst, const int config) {
    ggml_cuda_fattn_mma_pick pick;
    if (ggml_dispatch_config_route(config) != GGML_DISPATCH_ROUTE_FA_MMA ||
            !ggml_cuda_fattn_dispatch_mma_pick(ggml_cuda_info().devices[device].cc, dst,
                                               ggml_cuda_fattn_dispatch_params_of(config), &pick) ||
            pick.ncols1 == 0) {
        return config;
    }
    auto with = [](int code, int param, const std::string & value) {
        const ggml_dispatch_param_desc & d = ggml_dispatch_param_descs[param];
        for (int v = 0; v < d.n_values; ++v) {
            if (value == d.values[v]) {
                return (code & ~(((1 << d.bits) - 1) << d.shift)) | ((v + 1) << d.shift);
            }
        }
        return code;  // a value the registry does not list: left as the configuration gave it
    };
    int code = with(config, GGML_DISPATCH_PARAM_FA_MMA_NCOLS1_INDEX, std::to_string(pick.ncols1));
    code     = with(code, GGML_DISPATCH_PARAM_FA_MMA_NCOLS2_INDEX, std::to_string(pick.ncols2));
    return with(code, GGML_DISPATCH_PARAM_FA_MMA_SPARSE_INDEX, pick.sparse ? "on" : "off");
}

// `run`: the call that launches the kernel (counted and traced); false: scratch sizing, supports_op.
// `config` (if given): the configuration that runs, 0 for stock's kernel as the tree runs it.
static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(const int device, const ggml_tensor * dst, const bool run = false,
                                                         int * config = nullptr) {
    const best_fattn_kernel stock = ggml_cuda_get_best_fattn_kernel_stock(device, dst);
    if (config != nullptr) {
        *config = 0;
    }
    if (!ggml_cuda_dispatch_active || stock == BEST_FATTN_KERNEL_NONE) {
        return stock;
    }
    const int chosen = ggml_cuda_dispatch_select_flash_attn(device, dst, ggml_cuda_fattn_dispatch_route(stock),
                                                            ggml_cuda_fattn_dispatch_check, run,
                                                            ggml_cuda_fattn_dispatch_resolve);
    if (config != nullptr) {
        *config = chosen;
    }
    switch (ggml_dispatch_config_route(chosen)) {
        case GGML_DISPATCH_ROUTE_FA_VEC:  return BEST_FATTN_KERNEL_VEC;
        case GGML_DISPATCH_ROUTE_FA_TILE: return BEST_FATTN_KERNEL_TILE;
        case GGML_DISPATCH_ROUTE_FA_MMA:  return BEST_FATTN_KERNEL_MMA_F16;
        default:                          return stock;
    }
}

// The scratch beyond the output that `kernel` under configuration `config` needs on this node (the f16
// copies of a quantized K/V), as ggml_cuda_flash_attn_ext_get_alloc_size lays it out.
static size_t ggml_cuda_fattn_dispatch_scratch(const ggml_tensor * dst, const best_fattn_kernel kernel, const int config = 0) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    bool need_f16_K = kernel == BEST_FATTN_KERNEL_TILE || kernel == BEST_FATTN_KERNEL_MMA_F16;
    bool need_f16_V = need_f16_K;
    if (kernel == BEST_FATTN_KERNEL_VEC && ggml_cuda_fattn_dispatch_vec_f16(dst, ggml_cuda_fattn_dispatch_params_of(config))) {
        need_f16_K = true;
        need_f16_V = true;
    } else if (kernel == BEST_FATTN_KERNEL_VEC) {
        const bool f16_fallback = ggml_dispatch_vec_needs_f16_form(0, Q->ne[0], K->type, V->type);
        need_f16_K = K->type == GGML_TYPE_F32 || f16_fallback;
        need_f16_V = V->type == GGML_TYPE_F32 || f16_fallback;
    }
    return ggml_cuda_flash_attn_ext_get_f16_extra_data(dst, need_f16_K, need_f16_V).end - (uintptr_t) dst->data;
}

// The first-use warm-up (ggml_cuda_dispatch_warm_up_flash_attn): one of the table's configurations launched on
// this node before the node's own launch overwrites the output, if it is eligible here and the node's scratch
// (as ggml_cuda_flash_attn_ext_get_alloc_size sized it: for `runs`, the kernel that runs, and for every
// kernel on a short node, ggml_cuda_dispatch_fattn_warm_copies) holds what it needs.
struct ggml_cuda_fattn_warm_node {
    ggml_backend_cuda_context * ctx;
    ggml_tensor *               dst;
    best_fattn_kernel           runs;
};

static bool ggml_cuda_fattn_dispatch_warm_one(const int config, void * user) {
    const ggml_cuda_fattn_warm_node & w = *static_cast<const ggml_cuda_fattn_warm_node *>(user);
    best_fattn_kernel kernel = BEST_FATTN_KERNEL_NONE;
    if (config == 0) {  // stock's kernel on this node, as the tree picks and launches it
        kernel = ggml_cuda_get_best_fattn_kernel_stock(w.ctx->device, w.dst);
    } else if (ggml_cuda_fattn_dispatch_check(w.ctx->device, w.dst, config) != GGML_DISPATCH_OK) {
        return false;
    } else {
        switch (ggml_dispatch_config_route(config)) {
            case GGML_DISPATCH_ROUTE_FA_VEC:  kernel = BEST_FATTN_KERNEL_VEC;     break;
            case GGML_DISPATCH_ROUTE_FA_TILE: kernel = BEST_FATTN_KERNEL_TILE;    break;
            case GGML_DISPATCH_ROUTE_FA_MMA:  kernel = BEST_FATTN_KERNEL_MMA_F16; break;
            default:                          return false;
        }
    }
    if (kernel == BEST_FATTN_KERNEL_NONE) {
        return false;
    }
    if (ggml_cuda_fattn_dispatch_scratch(w.dst, kernel, config) > ggml_cuda_flash_attn_ext_get_alloc_size(w.ctx->device, w.dst)) {
        return false;
    }
    // a shadow made here would be kept equal to its cache at every later step, read there or not: the
    // warm-up only loads the kernel, so it converts into the node's scratch (sized for it above)
    ggml_dispatch_params p = ggml_cuda_fattn_dispatch_params_of(config);
    p.fa_kv_warm           = 1;
    const ggml_dispatch_params_scope scope(p);
    switch (kernel) {
        case BEST_FATTN_KERNEL_VEC:  ggml_cuda_flash_attn_ext_vec(*w.ctx, w.dst);     break;
        case BEST_FATTN_KERNEL_TILE: ggml_cuda_flash_attn_ext_tile(*w.ctx, w.dst);    break;
        default:                     ggml_cuda_flash_attn_ext_mma_f16(*w.ctx, w.dst); break;
    }
    return true;
}
