// Drives the hooked FlashAttention kernel choice of fattn.cu (as installed into the tree) without a GPU.
//
// The patched fattn.cu is compiled into this program (#include), so the tree's own stock choice
// (ggml_cuda_get_best_fattn_kernel_stock), the hook's wrapper and eligibility and the tree's scratch
// sizing (ggml_cuda_flash_attn_ext_get_alloc_size) run as they do in ggml-cuda; the real ggml-dispatch.cu
// is linked. What needs a GPU is replaced, and only that: ggml_cuda_info() (an H200-like device, cc 900,
// 132 SMs), cudaGetDeviceProperties / cublasGetProperty (--wrap). The kernels themselves are never
// launched: the program is linked with the vector-kernel instances the test compiles (so VEC's
// compiled K/V pairs are real); every other symbol it lacks (tile/MMA instances, converters) traps if called.
//
// Nodes are built as llama.cpp builds them: a K/V cache tensor [head dim x KV heads, cells] viewed per
// layer as [D, KV heads, n_kv] and permuted to [D, n_kv, KV heads], Q [D, Q heads, tokens] permuted, an
// f16 mask [n_kv, tokens]. Prints one JSON line per case: the kernel that would run (the `run` call that
// the launch makes: counted and traced) and the scratch beyond the output that allocation asks for.
//
// MMA_F16 nodes go through the tree's whole launch path (ggml_cuda_flash_attn_ext: the hook's choice, the
// configuration's parameters in scope, the tree's switch_ncols2 / switch_ncols1) down to
// ggml_cuda_flash_attn_ext_mma_f16_case<DKQ, DV, ncols1, ncols2>: the test links a stub per compiled
// instance that calls glue_mma_case, which records the instance and the sparse choice the instance makes
// (the case function's own test, written out here because its kernel is not compiled).
#include "fattn.cu"


#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static ggml_cuda_device_info g_info;

const ggml_cuda_device_info & ggml_cuda_info() {
    return g_info;
}

int ggml_cuda_get_device() {
    return 0;
}

extern "C" cudaError_t __wrap_cudaGetDeviceProperties(cudaDeviceProp * prop, int device) {
    std::memset(prop, 0, sizeof(*prop));
    std::snprintf(prop->name, sizeof(prop->name), "%s", "NVIDIA H200");
    for (int i = 0; i < 16; ++i) {
        prop->uuid.bytes[i] = (char) (i + 1);
    }
    prop->totalGlobalMem = (size_t) 143771 << 20;
    (void) device;
    return cudaSuccess;
}

extern "C" cublasStatus_t __wrap_cublasGetProperty(libraryPropertyType type, int * value) {
    *value = type == MAJOR_VERSION ? 13 : type == MINOR_VERSION ? 0 : 2;
    return CUBLAS_STATUS_SUCCESS;
}

void ggml_cuda_set_device(int device) {
    (void) device;
}

// The MMA_F16 instance the last launch reached (the stubs of the instances call this).
static struct {
    int  DKQ = 0, DV = 0, ncols1 = 0, ncols2 = 0;
    bool sparse = false, refused = false;
    long calls  = 0;
    std::string launches;  // every instance reached, in order: "16x2,1x8"
} g_mma;

extern "C" void glue_mma_case(int DKQ, int DV, int ncols1, int ncols2, void * ctx, ggml_tensor * dst) {
    (void) ctx;
    float logit_softcap = 0.0f;
    std::memcpy(&logit_softcap, (const float *) dst->op_params + 2, sizeof(float));
    const int cc = ggml_cuda_info().devices[ggml_cuda_get_device()].cc;
    g_mma.DKQ     = DKQ;
    g_mma.DV      = DV;
    g_mma.ncols1  = ncols1;
    g_mma.ncols2  = ncols2;
    // as ggml_cuda_flash_attn_ext_mma_f16_case<DKQ, DV, ncols1, ncols2> picks its kernel
    g_mma.sparse  = logit_softcap == 0.0f && ggml_cuda_flash_attn_ext_mma_f16_may_use_sparse(DKQ, DV, ncols1, ncols2) &&
                    ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse(cc, dst, ncols1, ncols2);
    g_mma.refused = ggml_dispatch_params_current().refused != 0;
    g_mma.calls++;
    // "s": launch_fattn would read the KV cache's shadow (kv=shadow / kv=reuse outside the warm-up)
    g_mma.launches += (g_mma.launches.empty() ? "" : ",") + std::to_string(ncols1) + "x" + std::to_string(ncols2) +
                      (ggml_dispatch_fa_reads_shadow() ? "s" : "");
}

alignas(64) static unsigned char g_ctx_bytes[sizeof(ggml_backend_cuda_context)];  // never constructed: no GPU

static ggml_backend_cuda_context & glue_ctx() {
    return *reinterpret_cast<ggml_backend_cuda_context *>(g_ctx_bytes);
}

static ggml_tensor * attention(ggml_context * ctx, ggml_type type, int D, int kv_heads, int q_heads, int n_kv,
                               int tokens, int layer) {
    const int     cells = 65536;
    ggml_tensor * kc    = ggml_new_tensor_2d(ctx, type, (int64_t) D * kv_heads, cells);
    ggml_tensor * vc    = ggml_new_tensor_2d(ctx, type, (int64_t) D * kv_heads, cells);
    char          name[64];
    std::snprintf(name, sizeof(name), "cache_k_l%d", layer);
    ggml_set_name(kc, name);
    std::snprintf(name, sizeof(name), "cache_v_l%d", layer);
    ggml_set_name(vc, name);
    ggml_tensor * k = ggml_view_3d(ctx, kc, D, kv_heads, n_kv, ggml_row_size(type, D), kc->nb[1], 0);
    ggml_tensor * v = ggml_view_3d(ctx, vc, D, kv_heads, n_kv, ggml_row_size(type, D), vc->nb[1], 0);
    k               = ggml_permute(ctx, k, 0, 2, 1, 3);
    v               = ggml_permute(ctx, v, 0, 2, 1, 3);
    ggml_format_name(k, "cache_k_l%d (view) (permuted)", layer);
    ggml_tensor * q    = ggml_permute(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, q_heads, tokens), 0, 2, 1, 3);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, tokens);
    return ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / 16.0f, 0.0f, 0.0f);
}

static const char * route_name(int code) {
    return ggml_dispatch_route_name(code);
}

// Every fa_mma configuration (each parameter left out or set to each value) on a grid of nodes: the check's
// answer, and for the eligible ones (and stock) the instance the tree's switches reach against the one
// ggml_cuda_fattn_dispatch_mma_pick predicts; a configuration's set parameters must be what ran.
static void mma_grid() {
    std::vector<int> configs = {0};
    for (int p = 0; p < GGML_DISPATCH_PARAM_COUNT; ++p) {
        if (ggml_dispatch_param_descs[p].route != GGML_DISPATCH_ROUTE_FA_MMA) {
            continue;
        }
        std::vector<int> more;
        for (int c : configs) {
            for (int v = 0; v <= ggml_dispatch_param_descs[p].n_values; ++v) {
                more.push_back((c == 0 ? GGML_DISPATCH_ROUTE_FA_MMA : c) | (v << ggml_dispatch_param_descs[p].shift));
            }
        }
        configs = more;
    }
    configs.insert(configs.begin(), 0);  // stock: the tree's own switches against the mirror
    long points = 0, checked = 0, eligible = 0, mismatch = 0, refused = 0, stock_checked = 0, sparse_ran = 0;
    long by_pair[65][9] = {};
    const int       Ds[]   = {64, 80, 128, 256, 512};
    const ggml_type ts[]   = {GGML_TYPE_F16, GGML_TYPE_Q8_0};
    const int       gqas[] = {1, 2, 4, 6, 8};
    const int       nkvs[] = {4000, 4096, 16384};
    const int       Ms[]   = {1, 2, 3, 8, 16, 33, 512};
    for (int D : Ds) for (ggml_type t : ts) for (int g : gqas) for (int n_kv : nkvs) for (int M : Ms) for (int kvmax : {0, 1}) {
        ggml_init_params gp   = {ggml_tensor_overhead() * 16, nullptr, true};
        ggml_context *   gctx = ggml_init(gp);
        ggml_tensor *    node = attention(gctx, t, D, 2, 2 * g, n_kv, M, 0);
        if (kvmax) {
            ggml_flash_attn_ext_set_n_kv_max(node, 256);  // a sparse graph: at most 256 visible cells per query
        }
        if (ggml_cuda_get_best_fattn_kernel_stock(0, node) == BEST_FATTN_KERNEL_NONE ||
                ((ggml_cuda_fattn_dispatch_eligible(0, node) >> GGML_DISPATCH_ROUTE_FA_MMA) & 1u) == 0) {
            ggml_free(gctx);
            continue;
        }
        points++;
        for (int config : configs) {
            const ggml_dispatch_params p = ggml_cuda_fattn_dispatch_params_of(config);
            if (config != 0) {
                checked++;
                if (ggml_cuda_fattn_dispatch_check(0, node, config) != GGML_DISPATCH_OK) {
                    continue;
                }
                eligible++;
            } else {
                stock_checked++;
            }
            ggml_cuda_fattn_mma_pick want;
            const bool               known = ggml_cuda_fattn_dispatch_mma_pick(900, node, p, &want);
            g_mma = {};
            {
                const ggml_dispatch_params_scope s(p);
                ggml_cuda_flash_attn_ext_mma_f16(glue_ctx(), node);
            }
            const bool bad = !known || g_mma.calls != 1 || g_mma.ncols1 != want.ncols1 || g_mma.ncols2 != want.ncols2 ||
                             g_mma.sparse != want.sparse || g_mma.refused ||
                             (p.fa_ncols1 != 0 && g_mma.ncols1 != p.fa_ncols1) ||
                             (p.fa_ncols2 != 0 && g_mma.ncols2 != p.fa_ncols2) ||
                             (p.fa_sparse == GGML_DISPATCH_FA_SPARSE_ON && !g_mma.sparse) ||
                             (p.fa_sparse == GGML_DISPATCH_FA_SPARSE_OFF && g_mma.sparse);
            refused += g_mma.refused;
            sparse_ran += g_mma.sparse;
            if (g_mma.ncols1 >= 1 && g_mma.ncols1 <= 64 && g_mma.ncols2 >= 1 && g_mma.ncols2 <= 8) {
                by_pair[g_mma.ncols1][g_mma.ncols2]++;
            }
            if (bad) {
                if (++mismatch <= 5) {
                    char text[128];
                    ggml_dispatch_config_format(config, text, sizeof(text));
                    std::fprintf(stderr, "mma mismatch %s: D %d %s gqa %d n_kv %d M %d kvmax %d: ran %dx%d%s%s, pick %s %dx%d%s\n",
                                 text, D, ggml_type_name(t), g, n_kv, M, kvmax, g_mma.ncols1, g_mma.ncols2,
                                 g_mma.sparse ? " sparse" : "", g_mma.refused ? " refused" : "", known ? "" : "(none)",
                                 want.ncols1, want.ncols2, want.sparse ? " sparse" : "");
                }
            }
        }
        ggml_free(gctx);
    }
    std::string pairs;
    for (int n1 = 1; n1 <= 64; ++n1) {
        for (int n2 = 1; n2 <= 8; ++n2) {
            if (by_pair[n1][n2] > 0) {
                pairs += (pairs.empty() ? "\"" : ",\"") + std::to_string(n1) + "x" + std::to_string(n2) + "\":" +
                         std::to_string(by_pair[n1][n2]);
            }
        }
    }
    std::printf("{\"mma_grid\":{\"configs\":%zu,\"points\":%ld,\"checked\":%ld,\"eligible\":%ld,\"stock\":%ld,"
                "\"mismatch\":%ld,\"refused\":%ld,\"sparse\":%ld,\"pairs\":{%s}}}\n",
                configs.size(), points, checked, eligible, stock_checked, mismatch, refused, sparse_ran, pairs.c_str());
}

// The first-use warm-up (GLUE_WARM): which of the table's configurations launch before a node's own, on a node
// whose scratch cannot hold their f16 copies (none), under a CUDA-graph capture (none), on the first MMA node
// of the rules' kind (stock's kernel it displaces, the other rules', then its own) and on the same node again.
// Prints {"warm":{...}}.
static void warm_up_cases(ggml_context * ctx) {
    ggml_tensor * vec_node = attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 4096, 1, 20);  // stock VEC: no f16 scratch
    // a rule at KV bucket 32768 displaces stock's MMA (4x8 for 3 Q columns) with 16x2
    ggml_tensor * mma_node = attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 32768, 3, 21);
    g_mma = {};
    ggml_cuda_fattn_warm_node vec = {&glue_ctx(), vec_node, BEST_FATTN_KERNEL_VEC};
    const int on_vec = ggml_cuda_dispatch_warm_up_flash_attn(0, vec_node, 0, ggml_cuda_fattn_dispatch_warm_one, &vec);
    const std::string vec_launches = g_mma.launches;
    ggml_cuda_dispatch_eval_begin(&glue_ctx(), mma_node, /*use_cuda_graph =*/ true, /*update_required =*/ true);
    ggml_cuda_fattn_warm_node cap = {&glue_ctx(), mma_node, BEST_FATTN_KERNEL_MMA_F16};
    const int in_capture = ggml_cuda_dispatch_warm_up_flash_attn(0, mma_node, 0, ggml_cuda_fattn_dispatch_warm_one, &cap);
    ggml_cuda_dispatch_eval_end();
    g_mma = {};
    ggml_cuda_flash_attn_ext(glue_ctx(), mma_node);
    const std::string first = g_mma.launches;
    g_mma = {};
    ggml_cuda_flash_attn_ext(glue_ctx(), mma_node);
    std::printf("{\"warm\":{\"vec_node\":%d,\"vec_launches\":\"%s\",\"in_capture\":%d,\"first\":\"%s\",\"again\":\"%s\","
                "\"vec_scratch\":%zu,\"mma_scratch\":%zu}}\n",
                on_vec, vec_launches.c_str(), in_capture, first.c_str(), g_mma.launches.c_str(),
                ggml_cuda_fattn_dispatch_scratch(vec_node, vec.runs), ggml_cuda_fattn_dispatch_scratch(mma_node, cap.runs));
}

// The warm-up on a short node (GLUE_WARM=short, a fresh process): at KV length 256 (llama-bench's warm-up, a
// server's first short request) stock runs VEC and the table has no rule, yet in table mode the allocation holds
// the f16 copies, so the table's MMA configurations of the kind launch there; a deep VEC node's allocation does
// not grow. Prints {"short":{...}}.
static void warm_up_short(ggml_context * ctx) {
    ggml_tensor * short_node = attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 256, 1, 22);
    ggml_tensor * deep_node  = attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 4096, 1, 23);
    g_mma = {};
    ggml_cuda_fattn_warm_node w = {&glue_ctx(), short_node, BEST_FATTN_KERNEL_VEC};  // stock's VEC runs there
    ggml_cuda_dispatch_warm_up_flash_attn(0, short_node, 0, ggml_cuda_fattn_dispatch_warm_one, &w);
    // VEC under kv=shadow runs the f16 instance, which converts where no shadow can be had: sized for the copies
    const int vec_shadow = GGML_DISPATCH_ROUTE_FA_VEC | (1 << ggml_dispatch_param_descs[GGML_DISPATCH_PARAM_FA_VEC_KV_INDEX].shift);
    std::printf("{\"short\":{\"launches\":\"%s\",\"alloc\":%zu,\"vec_scratch\":%zu,\"mma_scratch\":%zu,"
                "\"deep_alloc\":%zu,\"deep_vec_scratch\":%zu,\"deep_vec_shadow_scratch\":%zu,\"deep_mma_scratch\":%zu}}\n",
                g_mma.launches.c_str(), ggml_cuda_flash_attn_ext_get_alloc_size(0, short_node),
                ggml_cuda_fattn_dispatch_scratch(short_node, BEST_FATTN_KERNEL_VEC),
                ggml_cuda_fattn_dispatch_scratch(short_node, BEST_FATTN_KERNEL_MMA_F16),
                ggml_cuda_flash_attn_ext_get_alloc_size(0, deep_node),
                ggml_cuda_fattn_dispatch_scratch(deep_node, BEST_FATTN_KERNEL_VEC),
                ggml_cuda_fattn_dispatch_scratch(deep_node, BEST_FATTN_KERNEL_VEC, vec_shadow),
                ggml_cuda_fattn_dispatch_scratch(deep_node, BEST_FATTN_KERNEL_MMA_F16));
}

int main() {
    g_info.device_count               = 1;
    g_info.physical_device_count      = 1;
    g_info.devices[0].cc              = 900;
    g_info.devices[0].nsm             = 132;
    g_info.devices[0].smpbo           = 232448;
    g_info.devices[0].smpb            = 49152;
    g_info.devices[0].warp_size       = 32;
    g_info.devices[0].total_vram      = (size_t) 143771 * 1024 * 1024;
    g_info.devices[0].physical_device = 0;

    if (const char * ov = std::getenv("GLUE_OVERRIDE")) {
        ggml_backend_cuda_dispatch_set_override(std::atoi(ov));  // as a harness does, before allocating
    }
    ggml_cuda_dispatch_init();
    std::printf("{\"active\":%s}\n", ggml_cuda_dispatch_active ? "true" : "false");

    ggml_init_params params = {ggml_tensor_overhead() * 256, nullptr, true};
    ggml_context *   ctx    = ggml_init(params);
    if (const char * warm = std::getenv("GLUE_WARM")) {
        if (std::strcmp(warm, "short") == 0) {
            warm_up_short(ctx);
        } else {
            warm_up_cases(ctx);
        }
        ggml_free(ctx);
        return 0;
    }
    struct {
        const char *  name;
        ggml_tensor * node;
    } cases[] = {
        // the qwen3 seed shape: head dim 256, 24 Q heads over 4 KV heads (GQA 6)
        {"q8_0 D256 gqa6 M1 kv4096", attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 4096, 1, 0)},
        {"q8_0 D256 gqa6 M2 kv49152", attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 49152, 2, 1)},
        {"q8_0 D256 gqa6 M3 kv16384", attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 16384, 3, 2)},
        {"f16 D256 gqa6 M1 kv16384", attention(ctx, GGML_TYPE_F16, 256, 4, 24, 16384, 1, 3)},
        // the 8B shape: head dim 128, 32 Q heads over 8 KV heads (GQA 4)
        {"f16 D128 gqa4 M1 kv4096", attention(ctx, GGML_TYPE_F16, 128, 8, 32, 4096, 1, 4)},
        {"q8_0 D256 gqa6 M1 kv4000", attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 4000, 1, 5)},
        {"q8_0 D256 gqa6 M512 kv16384", attention(ctx, GGML_TYPE_Q8_0, 256, 4, 24, 16384, 512, 6)},
    };
    for (const auto & c : cases) {
        // allocation first (as ggml-alloc sizes the node), then the launch's question
        const size_t            scratch = ggml_cuda_flash_attn_ext_get_alloc_size(0, c.node) - ggml_nbytes(c.node);
        const best_fattn_kernel kernel  = ggml_cuda_get_best_fattn_kernel(0, c.node);
        const best_fattn_kernel stock   = ggml_cuda_get_best_fattn_kernel_stock(0, c.node);
        std::string mma = "null";
        if (kernel == BEST_FATTN_KERNEL_MMA_F16) {
            // the tree's launch path, down to the instance (counted and traced there)
            g_mma = {};
            ggml_cuda_flash_attn_ext(glue_ctx(), c.node);
            mma = "{\"ncols1\":" + std::to_string(g_mma.ncols1) + ",\"ncols2\":" + std::to_string(g_mma.ncols2) +
                  ",\"sparse\":" + (g_mma.sparse ? "true" : "false") + ",\"refused\":" + (g_mma.refused ? "true" : "false") +
                  ",\"calls\":" + std::to_string(g_mma.calls) + "}";
        } else {
            (void) ggml_cuda_get_best_fattn_kernel(0, c.node, /*run =*/ true);
        }
        std::printf("{\"case\":\"%s\",\"run\":\"%s\",\"stock\":\"%s\",\"scratch\":%zu,\"k_elems\":%lld,\"out\":%zu,\"mma\":%s}\n",
                    c.name, route_name(ggml_cuda_fattn_dispatch_route(kernel)),
                    route_name(ggml_cuda_fattn_dispatch_route(stock)), scratch,
                    (long long) ggml_nelements(c.node->src[1]), ggml_nbytes(c.node), mma.c_str());
    }
    // the launch grid's readers (fattn-common.cuh.hook) under a configuration's parameters
    {
        ggml_dispatch_params p;
        p.fa_blocks = 8;
        std::string r = "{\"readers\":{";
        {
            const ggml_dispatch_params_scope s(p);
            r += "\"blocks8_of16\":" + std::to_string(ggml_dispatch_fa_parallel_blocks(22, 16));
            const int blocks8_of4 = ggml_dispatch_fa_parallel_blocks(3, 4);  // then the refusal it sets
            r += ",\"blocks8_of4\":" + std::to_string(blocks8_of4) +
                 ",\"refused\":" + std::to_string(ggml_dispatch_params_current().refused);
        }
        r += ",\"blocks_stock\":" + std::to_string(ggml_dispatch_fa_parallel_blocks(22, 16));
        p = {};
        p.fa_stream_k = GGML_DISPATCH_FA_STREAM_K_OFF;
        {
            const ggml_dispatch_params_scope s(p);
            r += std::string(",\"stream_k_off\":") + (ggml_dispatch_fa_stream_k(true) ? "true" : "false");
        }
        p.fa_stream_k = GGML_DISPATCH_FA_STREAM_K_ON;
        {
            const ggml_dispatch_params_scope s(p);
            r += std::string(",\"stream_k_on\":") + (ggml_dispatch_fa_stream_k(false) ? "true" : "false");
        }
        r += std::string(",\"stream_k_stock\":") + (ggml_dispatch_fa_stream_k(false) ? "true" : "false") + "}}";
        std::printf("%s\n", r.c_str());
    }
    if (std::getenv("GLUE_MMA_GRID")) {
        mma_grid();
    }
    // the eligibility held against the tree: on a grid of shapes, types and cc values the kernel stock
    // picks is one the hook's check allows (else the table could never hand a node back to stock's kernel)
    if (std::getenv("GLUE_GRID")) {
        long          points = 0, none = 0, refused = 0, stock_by[GGML_DISPATCH_ROUTE_COUNT] = {};
        const int     ccs[]  = {700, 750, 800, 890, 900};
        const int     Ds[]   = {40, 64, 72, 80, 96, 112, 128, 256, 512};
        const ggml_type ts[] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_1};
        const int     gqas[] = {1, 2, 4, 6, 8};
        const int     nkvs[] = {256, 4000, 4096, 16384};
        const int     Ms[]   = {1, 2, 3, 4, 8, 16, 512};
        for (int cc : ccs) {
            g_info.devices[0].cc = cc;
            for (int D : Ds) for (ggml_type t : ts) for (int g : gqas) for (int n_kv : nkvs) for (int M : Ms) {
                ggml_init_params gp  = {ggml_tensor_overhead() * 16, nullptr, true};
                ggml_context *   gctx = ggml_init(gp);
                ggml_tensor *    node = attention(gctx, t, D, 2, 2 * g, n_kv, M, 0);
                const best_fattn_kernel st = ggml_cuda_get_best_fattn_kernel_stock(0, node);
                points++;
                if (st == BEST_FATTN_KERNEL_NONE) {
                    none++;
                } else {
                    const int r = ggml_cuda_fattn_dispatch_route(st);
                    stock_by[r]++;
                    if (((ggml_cuda_fattn_dispatch_eligible(0, node) >> r) & 1u) == 0) {
                        refused++;
                        if (std::getenv("GLUE_GRID_ALL") || refused <= 5) {
                            std::fprintf(stderr, "refused stock %s: cc %d D %d %s gqa %d n_kv %d M %d\n", route_name(r),
                                         cc, D, ggml_type_name(t), g, n_kv, M);
                        }
                    }
                }
                ggml_free(gctx);
            }
        }
        g_info.devices[0].cc = 900;
        std::printf("{\"grid\":{\"points\":%ld,\"none\":%ld,\"refused\":%ld,\"fa_vec\":%ld,\"fa_tile\":%ld,\"fa_mma\":%ld}}\n",
                    points, none, refused, stock_by[GGML_DISPATCH_ROUTE_FA_VEC], stock_by[GGML_DISPATCH_ROUTE_FA_TILE],
                    stock_by[GGML_DISPATCH_ROUTE_FA_MMA]);
    }

    ggml_dispatch_counts counts;
    ggml_backend_cuda_dispatch_get_counts(&counts, 0);
    std::string s = "{\"counts\":{\"ran\":[";
    for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
        s += (i ? "," : "") + std::to_string(counts.ran[i]);
    }
    s += "],\"forced\":" + std::to_string(counts.forced) + ",\"table\":" + std::to_string(counts.table) +
         ",\"ineligible\":" + std::to_string(counts.ineligible) + "}}";
    std::printf("%s\n", s.c_str());
    ggml_free(ctx);
    return 0;
}
