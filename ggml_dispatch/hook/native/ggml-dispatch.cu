// ggml-dispatch: route selection, counts and route trace for ggml-cuda matmuls.
//
// Installed into ggml/src/ggml-cuda/ by `ggml-dispatch install` (the CMakeLists there globs *.cu).
// Selection per MUL_MAT node = override / force / table lookup -> eligibility check -> else the
// stock cascade. An ineligible route never runs. See ggml-dispatch.h for the harness interface.

#include "ggml-dispatch-hook.cuh"
#include "ggml-dispatch-eligibility.cuh"
#include "ggml-dispatch-core.h"
#include "ggml-dispatch-moe.cuh"
#include "ggml-dispatch-eligibility-id.cuh"
#define GGML_DISPATCH_TABLE_EXPECTED_LAYOUT_VERSION 3
#include "ggml-dispatch-table.h"
#include "ggml-dispatch-build.h"
#ifndef GGML_DISPATCH_FEATURES
#define GGML_DISPATCH_FEATURES 0xffffffffu  // stamped by install; a build header without it predates features
#endif
#if __has_include("fwht.cuh")
#include "fwht.cuh"
#endif
#include "ggml-dispatch-cache-impl.cuh"
#include "ggml-dispatch-kv-impl.cuh"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <array>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#if defined(_WIN32)
#    include <process.h>
#    define GGML_DISPATCH_GETPID _getpid
#else
#    include <unistd.h>
#    define GGML_DISPATCH_GETPID getpid
#endif

#ifndef GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES  // a table rendered without a weight-cache budget
#    define GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES 0
#endif
#ifndef GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES  // a table rendered without a KV-shadow budget
#    define GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES 0
#endif

#if GGML_DISPATCH_TABLE_LAYOUT_VERSION != 3
#    error "ggml-dispatch-table.h has another layout version than this hook reads (3): run ggml-dispatch install again"
#endif
#if GGML_DISPATCH_TABLE_KEY_SLOTS != GGML_DISPATCH_KEY_SLOTS || GGML_DISPATCH_TABLE_OP_COUNT != GGML_DISPATCH_OP_COUNT
#    error "ggml-dispatch-table.h and ggml-dispatch-codes.h come from different registries: run ggml-dispatch install again"
#endif

bool ggml_cuda_dispatch_active = false;

ggml_dispatch_params & ggml_dispatch_params_current() {
    thread_local ggml_dispatch_params p;  // one compute thread per backend context
    return p;
}

ggml_dispatch_params ggml_cuda_dispatch_params_of(int config) {
    return ggml_dispatch_params_of_config(config);
}

namespace {

using namespace ggml_dispatch;

struct dispatch_state {
    recorder    rec;
    mode        m            = MODE_OFF;
    int         force_config = 0;
    bool        table_applies[GGML_CUDA_MAX_DEVICES] = {};
    bool        warm_up      = true;  // GGML_CUDA_DISPATCH_WARMUP=off: no first-use warm-up
    moe_stats   moe;  // MUL_MAT_ID tokens per expert, while the trace is on
};

static dispatch_state & state() {
    static dispatch_state * s = new dispatch_state();  // never destroyed: the exit flush may run late
    return *s;
}

static std::once_flag g_init_once;

static const char * env_or_null(const char * name) {
    const char * v = std::getenv(name);
    return v;
}

static std::string json_or_null(const char * v) {
    return v ? json_string(v) : std::string("null");
}

static std::string uuid_string(const cudaDeviceProp & prop) {
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)
    const unsigned char * b = reinterpret_cast<const unsigned char *>(prop.uuid.bytes);
    char buf[64];
    std::snprintf(buf, sizeof(buf), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return buf;
#else
    GGML_UNUSED(prop);
    return "";
#endif
}

struct device_ident {
    std::string name;
    std::string uuid;
    size_t      vram = 0;  // ggml_cuda_info() leaves total_vram unset in the pinned tree
};

static device_ident device_identity(int device) {
    device_ident   id;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, ggml_cuda_info().devices[device].physical_device) == cudaSuccess) {
        id.name = prop.name;
        id.uuid = uuid_string(prop);
        id.vram = prop.totalGlobalMem;
    } else {
        (void) cudaGetLastError();
    }
    return id;
}

static std::string build_json() {
    std::string s = "{\"cuda_arch_list\":";
#ifdef __CUDA_ARCH_LIST__
    s += json_string(STRINGIZE(__CUDA_ARCH_LIST__));
#else
    s += "null";
#endif
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA)
    int rt = 0, drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        rt = 0;
    }
    if (cudaDriverGetVersion(&drv) != cudaSuccess) {
        drv = 0;
    }
    (void) cudaGetLastError();
    s += ",\"cuda_version_compiled\":" + std::to_string(CUDART_VERSION);
    s += ",\"cuda_runtime_version\":" + std::to_string(rt);
    s += ",\"cuda_driver_version\":" + std::to_string(drv);
    int maj = 0, min = 0, pat = 0;
    if (cublasGetProperty(MAJOR_VERSION, &maj) == CUBLAS_STATUS_SUCCESS &&
            cublasGetProperty(MINOR_VERSION, &min) == CUBLAS_STATUS_SUCCESS &&
            cublasGetProperty(PATCH_LEVEL, &pat) == CUBLAS_STATUS_SUCCESS) {
        s += ",\"cublas_version\":\"" + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(pat) + "\"";
    } else {
        s += ",\"cublas_version\":null";
    }
#endif
    s += ",\"options\":{";
    auto opt = [&s](const char * name, bool on, bool first = false) {
        s += first ? "\"" : ",\"";
        s += name;
        s += on ? "\":true" : "\":false";
    };
#ifdef GGML_CUDA_FORCE_MMQ
    opt("GGML_CUDA_FORCE_MMQ", true, true);
#else
    opt("GGML_CUDA_FORCE_MMQ", false, true);
#endif
#ifdef GGML_CUDA_FORCE_CUBLAS
    opt("GGML_CUDA_FORCE_CUBLAS", true);
#else
    opt("GGML_CUDA_FORCE_CUBLAS", false);
#endif
#ifdef USE_CUDA_GRAPH
    opt("GGML_CUDA_GRAPHS", true);
#else
    opt("GGML_CUDA_GRAPHS", false);
#endif
#ifdef GGML_CUDA_NO_FA
    opt("GGML_CUDA_FA", false);
#else
    opt("GGML_CUDA_FA", true);
#endif
#ifdef GGML_CUDA_NO_VMM
    opt("GGML_CUDA_NO_VMM", true);
#else
    opt("GGML_CUDA_NO_VMM", false);
#endif
#ifdef GGML_CUDA_NO_PEER_COPY
    opt("GGML_CUDA_NO_PEER_COPY", true);
#else
    opt("GGML_CUDA_NO_PEER_COPY", false);
#endif
#ifdef GGML_USE_HIP
    opt("GGML_USE_HIP", true);
#else
    opt("GGML_USE_HIP", false);
#endif
#ifdef GGML_USE_MUSA
    opt("GGML_USE_MUSA", true);
#else
    opt("GGML_USE_MUSA", false);
#endif
    s += "}}";
    return s;
}

static std::string header_json(const std::vector<device_ident> & idents) {
    const dispatch_state & st   = state();
    const auto &           info = ggml_cuda_info();

    std::string s = "{\"kind\":\"header\",\"schema\":\"ggml-route-trace/1\"";
    // a tree installed on its content alone has no id: null, as the trace schema says
    s += ",\"upstream_commit\":" + (GGML_DISPATCH_UPSTREAM_COMMIT[0] != '\0' ? json_string(GGML_DISPATCH_UPSTREAM_COMMIT)
                                                                            : std::string("null"));
    s += ",\"patch_hash\":" + json_string(GGML_DISPATCH_PATCH_HASH);
    s += ",\"table_hash\":";
    s += GGML_DISPATCH_TABLE_RULE_COUNT > 0 ? json_string(ggml_dispatch_table_hash) : std::string("null");
    s += ",\"build\":" + build_json();
    s += ",\"env\":{";
    const char * vars[] = {
        "GGML_CUDA_DISPATCH", "GGML_CUDA_CUBLAS_COMPUTE_TYPE", "GGML_CUDA_MMQ_PREC",
        "GGML_CUDA_DISABLE_FUSION", "GGML_CUDA_DISABLE_GRAPHS", "GGML_CUDA_DISPATCH_CACHE",
        "GGML_CUDA_DISPATCH_KV_SHADOW",
    };
    for (size_t i = 0; i < sizeof(vars)/sizeof(vars[0]); ++i) {
        s += i ? ",\"" : "\"";
        s += vars[i];
        s += "\":" + json_or_null(env_or_null(vars[i]));
    }
    s += "},\"devices\":[";
    for (int i = 0; i < info.device_count; ++i) {
        const auto & d = info.devices[i];
        s += i ? ",{" : "{";
        s += "\"id\":" + std::to_string(i);
        s += ",\"name\":" + json_string(idents[i].name.c_str());
        s += ",\"uuid\":" + json_string(idents[i].uuid.c_str());
        s += ",\"cc\":" + std::to_string(d.cc);
        s += ",\"sm_count\":" + std::to_string(d.nsm);
        s += ",\"smpbo\":" + std::to_string(d.smpbo);
        s += ",\"vram_mib\":" + std::to_string(idents[i].vram / (1024*1024));
        s += "}";
    }
    s += "],\"pid\":" + std::to_string((long long) GGML_DISPATCH_GETPID());
    s += ",\"started\":\"" + iso_time_utc() + "\"";
    // extra keys (readers accept unknown keys): how this process dispatches
    s += ",\"dispatch\":{\"mode\":";
    s += st.m == MODE_OFF ? "\"off\"" : st.m == MODE_FORCE ? "\"force\"" : "\"table\"";
    s += ",\"force_route\":";
    s += st.m == MODE_FORCE ? json_string(route_name(ggml_dispatch_config_route(st.force_config))) : std::string("null");
    s += ",\"force_config\":";
    s += st.m == MODE_FORCE ? json_string(config_text(st.force_config).c_str()) : std::string("null");
    s += ",\"table_rules\":" + std::to_string((long long) GGML_DISPATCH_TABLE_RULE_COUNT);
    s += ",\"table_gpu\":" + json_string(ggml_dispatch_table_gpu_name);
    s += ",\"table_applied\":[";
    for (int i = 0; i < info.device_count; ++i) {
        s += i ? "," : "";
        s += st.table_applies[i] ? "true" : "false";
    }
    s += "]}}";
    return s;
}

static void flush_at_exit() {
    state().rec.finish();
}

static void init_once() {
    dispatch_state & st = state();

    const env_choice choice = parse_dispatch_env(env_or_null("GGML_CUDA_DISPATCH"));
    st.m           = choice.m;
    st.force_config = choice.force_config;

    const auto &              info = ggml_cuda_info();
    std::vector<device_ident> idents(info.device_count);
    for (int i = 0; i < info.device_count; ++i) {
        idents[i] = device_identity(i);
    }

    std::string line;
    // a line the user must see: a GGML_CUDA_DISPATCH value that was not understood, or a compiled-in table
    // refused on a device. llama-server (and any tool with common's logger) prints ggml's INFO lines only
    // at -lv 4, so these go out as warnings; the normal start-up line stays INFO.
    bool must_see = !choice.error.empty();
    if (!choice.error.empty()) {
        line = choice.error;
    } else if (st.m == MODE_OFF) {
        line = "GGML_CUDA_DISPATCH=off: stock dispatch";
    } else if (st.m == MODE_FORCE) {
        line = std::string("GGML_CUDA_DISPATCH=force:") + config_text(st.force_config) + ": every eligible node runs " +
               config_text(st.force_config) + ", the others stock";
    } else if (GGML_DISPATCH_TABLE_RULE_COUNT == 0) {
        line = "no dispatch table compiled in: stock dispatch";
    } else {
        line = std::string("table ") + std::string(ggml_dispatch_table_hash).substr(0, 12) + " (" +
               ggml_dispatch_table_gpu_name + ", cc " + std::to_string(GGML_DISPATCH_TABLE_GPU_CC) + ", " +
               std::to_string(GGML_DISPATCH_TABLE_GPU_SM_COUNT) + " SMs, " +
               std::to_string((long long) GGML_DISPATCH_TABLE_RULE_COUNT) + " rules)";
        for (int i = 0; i < info.device_count; ++i) {
            const auto & d = info.devices[i];
            st.table_applies[i] = ggml_dispatch_table_gpu_matches(idents[i].name.c_str(), d.cc, d.nsm) != 0;
            line += std::string(i ? "; " : ": ") + (st.table_applies[i] ? "applied on " : "refused on ") +
                    GGML_CUDA_NAME + std::to_string(i);
            if (!st.table_applies[i]) {
                must_see = true;
                line += " (" + idents[i].name + ", cc " + std::to_string(d.cc) + ", " + std::to_string(d.nsm) +
                        " SMs: GPU mismatch, stock dispatch)";
            }
        }
        if (info.device_count == 0) {
            line += ": no device";
        }
    }

    if (const char * w = env_or_null("GGML_CUDA_DISPATCH_WARMUP"); w != nullptr && (std::strcmp(w, "off") == 0 || std::strcmp(w, "0") == 0)) {
        st.warm_up = false;
        if (st.m == MODE_TABLE) {
            line += "; no first-use warm-up (GGML_CUDA_DISPATCH_WARMUP=off)";
        }
    }

    if (st.m != MODE_OFF) {
        bool any_table = false;
        for (int i = 0; i < info.device_count; ++i) {
            any_table = any_table || st.table_applies[i];
        }
        line += cache_configure(st.m == MODE_FORCE, any_table ? (size_t) GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES : 0,
                                env_or_null("GGML_CUDA_DISPATCH_CACHE"));
        line += store_configure(kv_st(), st.m == MODE_FORCE,
                                any_table ? (size_t) GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES : 0,
                                env_or_null("GGML_CUDA_DISPATCH_KV_SHADOW"));
    }

    const char * trace_path = env_or_null("GGML_CUDA_ROUTE_TRACE");
    if (trace_path != nullptr && trace_path[0] != '\0') {
        if (st.rec.open_trace(trace_path, header_json(idents))) {
            std::atexit(flush_at_exit);
            line += std::string("; route trace -> ") + trace_path;
            if (st.moe.open(info.device_count)) {
                st.rec.set_extra(&st.moe);
            } else {
                line += " (no MUL_MAT_ID expert statistics: no device memory)";
            }
        } else {
            line += std::string("; cannot open route trace ") + trace_path + ": " + std::strerror(errno);
        }
    }
    if (must_see) {
        GGML_LOG_WARN("ggml_cuda_dispatch: %s\n", line.c_str());
    } else {
        GGML_LOG_INFO("ggml_cuda_dispatch: %s\n", line.c_str());
    }

    ggml_cuda_dispatch_active = st.m != MODE_OFF || st.rec.trace_on();
}

static bool bad_padding(const ggml_tensor * src0) {  // as ggml_cuda_mul_mat computes it
    return ggml_backend_buffer_get_usage(src0->buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE &&
           ggml_nbytes(src0) != ggml_backend_buffer_get_alloc_size(src0->buffer, src0) && src0->view_src;
}

// The tree's FWHT hint path (ggml_cuda_op_mul_mat_use_fwht) where it has one; none in older trees.
template <typename T>
static auto fwht_hint_form(int, T dst) -> decltype(ggml_cuda_op_mul_mat_use_fwht(dst)) {
    return ggml_cuda_op_mul_mat_use_fwht(dst);
}
template <typename T>
static bool fwht_hint_form(long, T) {
    return false;
}

static ggml_dispatch_mm_desc describe(const ggml_tensor * dst) {
    const ggml_tensor *   src0 = dst->src[0];
    const ggml_tensor *   src1 = dst->src[1];
    ggml_dispatch_mm_desc d;
    d.src0_type = src0->type;
    d.src1_type = src1->type;
    d.dst_type  = dst->type;
    for (int i = 0; i < 4; ++i) {
        d.src0_ne[i] = src0->ne[i];
        d.src0_nb[i] = src0->nb[i];
        d.src1_ne[i] = src1->ne[i];
        d.src1_nb[i] = src1->nb[i];
    }
    d.dst_nb0                     = dst->nb[0];
    d.dst_contiguous              = ggml_is_contiguous(dst);
    d.src0_contiguously_allocated = ggml_is_contiguously_allocated(src0);
    d.src0_contiguous             = ggml_is_contiguous(src0);
    d.src1_contiguous             = ggml_is_contiguous(src1);
    d.src0_bad_padding            = bad_padding(src0);
    // ggml_cuda_op_fwht takes the node only for these row lengths (fwht.cu)
    const int64_t n = src1->ne[0];
    d.fwht_hint = dst->op == GGML_OP_MUL_MAT && fwht_hint_form(0, dst) &&
                  (n == 64 || n == 128 || n == 256 || n == 512);
    return d;
}

static ggml_dispatch_dev_desc device_desc(int device) {
    const auto & di = ggml_cuda_info().devices[device];
    return ggml_dispatch_dev_desc{di.cc, di.warp_size, di.smpbo};
}

static int layout_of(const ggml_tensor * dst) {
    if (dst->op == GGML_OP_MUL_MAT_ID) {
        return GGML_DISPATCH_LAYOUT_EXPERT;
    }
    if (dst->op == GGML_OP_FLASH_ATTN_EXT) {
        return GGML_DISPATCH_LAYOUT_ATTENTION;
    }
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    return src1->ne[2]*src1->ne[3] == 1 && ggml_is_contiguous(src0) ? GGML_DISPATCH_LAYOUT_WEIGHT
                                                                     : GGML_DISPATCH_LAYOUT_ATTENTION;
}

// `src0` is the tensor the record is named after (the weight; K for attention), `src1` the other operand
// (the activations; Q for attention).
static record_key make_key_of(int op, int device, const ggml_tensor * src0, const ggml_tensor * src1, int layout,
                              int fused, int route, int stock_route, int reason, int why, int config) {
    record_key          k;
    k.op        = op;
    k.device    = device;
    k.tensor    = src0->name;
    k.src0_type = ggml_type_name(src0->type);
    k.src1_type = ggml_type_name(src1->type);
    for (int i = 0; i < 4; ++i) {
        k.src0_ne[i] = src0->ne[i];
        k.src0_nb[i] = src0->nb[i];
        k.src1_ne[i] = src1->ne[i];
    }
    k.layout      = layout;
    k.fused       = fused;
    k.route       = route;
    k.stock_route = stock_route;
    k.reason      = reason;
    // the configuration that ran: the given one, else the plain route (none for a trace-only path)
    k.config      = config >= 0 ? config : route >= 1 && route < GGML_DISPATCH_ROUTE_COUNT ? route : -1;
    if (reason == REASON_INELIGIBLE) {
        k.why = ggml_dispatch_why_name(why);
    }
    return k;
}

static record_key make_key(int device, const ggml_tensor * dst, int layout, int fused, int route, int stock_route, int reason,
                    int why, int config = -1) {
    return make_key_of(GGML_DISPATCH_OP_OF_GGML(dst->op), device, dst->src[0], dst->src[1], layout, fused, route,
                       stock_route, reason, why, config);
}

}  // namespace

void ggml_cuda_dispatch_init() {
    std::call_once(g_init_once, init_once);
}

// Whether an override or GGML_CUDA_DISPATCH=force:<config> asks every node for `*config` (never under off).
static bool forced_config(const dispatch_state & st, int * config) {
    const int ov = st.m == MODE_OFF ? 0 : st.rec.override_config();
    *config      = ov != 0 ? ov : st.force_config;
    return ov != 0 || st.m == MODE_FORCE;
}

// GGML_DISPATCH_OK, or GGML_DISPATCH_WHY_FEATURE for a configuration whose route or parameters need a hook
// feature install skipped on this tree (install --check): its code would not run as it names, so the node
// runs stock. Table rules that need one are dropped at install; this holds forced and overridden ones.
static int feature_check(int config) {
    return (ggml_dispatch_config_features(config) & ~(unsigned) GGML_DISPATCH_FEATURES) != 0u ? GGML_DISPATCH_WHY_FEATURE
                                                                                            : GGML_DISPATCH_OK;
}

// The configuration a node of `op` is asked to run (override, force or table; 0 = none) and why.
static int requested_config(const dispatch_state & st, int device, int op, int layout, int type0, int type1,
                            const int64_t * key, int64_t M, int * reason) {
    *reason = REASON_STOCK;
    if (st.m == MODE_OFF) {
        return 0;
    }
    if (int forced; forced_config(st, &forced)) {
        *reason = REASON_FORCED;
        return forced;
    }
    if (!st.table_applies[device]) {
        return 0;
    }
    const int config = ggml_dispatch_table_lookup(op, layout, type0, type1, key, M);
    *reason          = config != 0 ? REASON_TABLE : REASON_STOCK;
    return config;
}

namespace {
// The node between begin and end of ggml_cuda_mul_mat_dispatch (one compute thread per context).
struct mm_pending {
    int                 device = 0;
    const ggml_tensor * dst    = nullptr;
    int                 layout = 0, stock = 0, reason = REASON_STOCK, why = GGML_DISPATCH_OK, run = 0;
};
thread_local mm_pending tl_pending;
}  // namespace

int ggml_cuda_dispatch_begin_mul_mat(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
    dispatch_state &              st  = state();
    const ggml_dispatch_mm_desc   d   = describe(dst);
    const ggml_dispatch_dev_desc  dev = device_desc(ctx.device);
    const int                     stock  = ggml_dispatch_stock_route(d, dev);
    const int                     layout = layout_of(dst);
    const ggml_tensor *           src0   = dst->src[0];
    const ggml_tensor *           src1   = dst->src[1];

    int64_t key[GGML_DISPATCH_KEY_SLOTS] = {};
    key[GGML_DISPATCH_KEY_MUL_MAT_N]     = src0->ne[1];
    key[GGML_DISPATCH_KEY_MUL_MAT_K]     = src0->ne[0];
    key[GGML_DISPATCH_KEY_MUL_MAT_B]     = src1->ne[2]*src1->ne[3];
    int reason    = REASON_STOCK;
    int requested = requested_config(st, ctx.device, GGML_DISPATCH_OP_MUL_MAT, layout, (int) src0->type,
                                     (int) src1->type, key, src1->ne[1], &reason);
    if (requested != 0 && ggml_dispatch_config_valid(requested) &&
            ggml_dispatch_route_allows_op(ggml_dispatch_config_route(requested), GGML_DISPATCH_OP_FLASH_ATTN_EXT) &&
            !ggml_dispatch_route_allows_op(ggml_dispatch_config_route(requested), GGML_DISPATCH_OP_MUL_MAT)) {
        requested = 0;  // a FlashAttention kernel forced or overridden: not asked of matmul nodes
        reason    = REASON_STOCK;
    }
    // a table rule that reads a cached weight copy which cannot be had runs the table's uncached choice
    if (reason == REASON_TABLE && ggml_dispatch_params_of_config(requested).cublas_weight != GGML_DISPATCH_CUBLAS_WEIGHT_STOCK &&
            !cache_can_serve(ctx.device, ctx.stream(), src0)) {
        requested = ggml_dispatch_table_cache_fallback(GGML_DISPATCH_OP_MUL_MAT, layout, (int) src0->type,
                                                       (int) src1->type, key, src1->ne[1]);
        reason    = requested != 0 ? REASON_TABLE : REASON_STOCK;
    }

    int run = 0;
    int why = GGML_DISPATCH_OK;
    if (requested != 0) {
        why = feature_check(requested);
        if (why == GGML_DISPATCH_OK) {
            why = ggml_dispatch_check_config(GGML_DISPATCH_OP_MUL_MAT, requested, d, dev);
        }
        if (why == GGML_DISPATCH_OK) {
            run = requested;
        } else {
            reason = REASON_INELIGIBLE;
        }
    }
    tl_pending = mm_pending{ctx.device, dst, layout, stock, reason, why, run};
    return run;
}

void ggml_cuda_dispatch_end_mul_mat(bool params_refused) {
    dispatch_state & st = state();
    mm_pending &     p  = tl_pending;
    if (p.dst == nullptr) {
        return;
    }
    int config = p.run;
    if (params_refused && p.run != 0) {  // the route ran, with stock's choice for the refused value
        p.reason = REASON_INELIGIBLE;
        p.why    = GGML_DISPATCH_WHY_PARAMS;
        config   = ggml_dispatch_config_route(p.run);
    }
    outcome o;
    o.route      = p.run != 0 ? ggml_dispatch_config_route(p.run) : p.stock;
    o.forced     = p.run != 0 && p.reason == REASON_FORCED;
    o.table      = p.run != 0 && p.reason == REASON_TABLE;
    o.ineligible = p.reason == REASON_INELIGIBLE;
    if (st.rec.trace_on()) {
        const record_key k = make_key(p.device, p.dst, p.layout, FUSED_NONE, o.route, p.stock, p.reason, p.why,
                                      config != 0 ? config : -1);
        st.rec.note(o, &k);
    } else {
        st.rec.note(o, nullptr);
    }
    p.dst = nullptr;
}

int ggml_cuda_dispatch_select_mul_mat(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
    const int run = ggml_cuda_dispatch_begin_mul_mat(ctx, dst);
    ggml_cuda_dispatch_end_mul_mat(false);
    return run;
}

void ggml_cuda_dispatch_note_mul_mat_id(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
    dispatch_state &             st    = state();
    const ggml_dispatch_mm_desc  d     = describe(dst);
    const int                    stock = ggml_dispatch_stock_route_id(d, device_desc(ctx.device));
    outcome o;
    o.route = stock;
    if (st.rec.trace_on()) {
        const record_key k = make_key(ctx.device, dst, GGML_DISPATCH_LAYOUT_EXPERT, FUSED_NONE, stock, stock, REASON_STOCK,
                                      GGML_DISPATCH_OK);
        st.moe.note(ctx, dst, k);
        st.rec.note(o, &k);
    } else {
        st.rec.note(o, nullptr);
    }
}

namespace {
// The MUL_MAT_ID node between begin and end of ggml_cuda_mul_mat_id_dispatch.
struct id_pending {
    ggml_backend_cuda_context * ctx = nullptr;
    const ggml_tensor *         dst = nullptr;
    int                         stock = 0, reason = REASON_STOCK, why = GGML_DISPATCH_OK, run = 0;
};
thread_local id_pending tl_id_pending;
}  // namespace

// The configuration a MUL_MAT_ID node runs (0: stock) and why; no counting (begin and the graph check share it).
static int choose_mul_mat_id(int device, const ggml_tensor * dst, const ggml_dispatch_mm_desc & d,
                             const ggml_dispatch_dev_desc & dev, int * reason, int * why) {
    dispatch_state &             st   = state();
    const ggml_tensor *          src0 = dst->src[0];
    const ggml_tensor *          src1 = dst->src[1];
    const ggml_tensor *          ids  = dst->src[2];

    // the runtime cannot see the routing of a call without a host sync: it looks up routing 0, the rules
    // a configuration earned in every routing bucket the tuner measured (ARCHITECTURE.md)
    int64_t key[GGML_DISPATCH_KEY_SLOTS] = {};
    key[GGML_DISPATCH_KEY_MUL_MAT_ID_N]       = src0->ne[1];
    key[GGML_DISPATCH_KEY_MUL_MAT_ID_K]       = src0->ne[0];
    key[GGML_DISPATCH_KEY_MUL_MAT_ID_E]       = src0->ne[2];
    key[GGML_DISPATCH_KEY_MUL_MAT_ID_U]       = src1->ne[1];
    key[GGML_DISPATCH_KEY_MUL_MAT_ID_ROUTING] = GGML_DISPATCH_ROUTING_ANY;
    *reason             = REASON_STOCK;
    *why                = GGML_DISPATCH_OK;
    const int requested = requested_config(st, device, GGML_DISPATCH_OP_MUL_MAT_ID, GGML_DISPATCH_LAYOUT_EXPERT,
                                           (int) src0->type, (int) src1->type, key, src1->ne[2], reason);
    if (requested == 0) {
        return 0;
    }
    if (*reason == REASON_TABLE && ggml_dispatch_config_route(requested) == GGML_DISPATCH_ROUTE_ID_SORTED) {
        // codegen never writes one (it breaks CUDA graphs); refusing it here keeps the graph check below cheap
        *reason = REASON_INELIGIBLE;
        *why    = GGML_DISPATCH_WHY_ROUTE;
        return 0;
    }
    const bool ids_ok = ids != nullptr && ids->type == GGML_TYPE_I32 && ids->nb[0] == sizeof(int32_t);
    *why              = feature_check(requested);
    if (*why == GGML_DISPATCH_OK) {
        *why = ggml_dispatch_check_config_id(requested, d, dev, ids_ok);
    }
    if (*why != GGML_DISPATCH_OK) {
        *reason = REASON_INELIGIBLE;
        return 0;
    }
    return requested;
}

int ggml_cuda_dispatch_begin_mul_mat_id(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
    const ggml_dispatch_mm_desc  d      = describe(dst);
    const ggml_dispatch_dev_desc dev    = device_desc(ctx.device);
    int                          reason = REASON_STOCK;
    int                          why    = GGML_DISPATCH_OK;
    const int                    run    = choose_mul_mat_id(ctx.device, dst, d, dev, &reason, &why);
    tl_id_pending = id_pending{&ctx, dst, ggml_dispatch_stock_route_id(d, dev), reason, why, run};
    return run;
}

bool ggml_cuda_dispatch_mul_mat_id_sorted(const ggml_tensor * dst) {
    // asked of every MUL_MAT_ID node on every graph evaluation (replays too): only a forced or overridden
    // id_sorted can be run (a table's is refused above), so anything else answers after two loads
    int forced = 0;
    if (!forced_config(state(), &forced) || ggml_dispatch_config_route(forced) != GGML_DISPATCH_ROUTE_ID_SORTED) {
        return false;
    }
    const int device = ggml_cuda_get_device();
    int       reason = REASON_STOCK;
    int       why    = GGML_DISPATCH_OK;
    return ggml_dispatch_config_route(choose_mul_mat_id(device, dst, describe(dst), device_desc(device), &reason,
                                                        &why)) == GGML_DISPATCH_ROUTE_ID_SORTED;
}

void ggml_cuda_dispatch_end_mul_mat_id(bool params_refused) {
    dispatch_state & st = state();
    id_pending &     p  = tl_id_pending;
    if (p.dst == nullptr) {
        return;
    }
    int config = p.run;
    if (params_refused && p.run != 0) {
        p.reason = REASON_INELIGIBLE;
        p.why    = GGML_DISPATCH_WHY_PARAMS;
        config   = ggml_dispatch_config_route(p.run);
    }
    outcome o;
    o.route      = p.run != 0 ? ggml_dispatch_config_route(p.run) : p.stock;
    o.forced     = p.run != 0 && p.reason == REASON_FORCED;
    o.table      = p.run != 0 && p.reason == REASON_TABLE;
    o.ineligible = p.reason == REASON_INELIGIBLE;
    if (st.rec.trace_on()) {
        const record_key k = make_key(p.ctx->device, p.dst, GGML_DISPATCH_LAYOUT_EXPERT, FUSED_NONE, o.route, p.stock,
                                      p.reason, p.why, config != 0 ? config : -1);
        st.moe.note(*p.ctx, p.dst, k);
        st.rec.note(o, &k);
    } else {
        st.rec.note(o, nullptr);
    }
    p.dst = nullptr;
}

void ggml_cuda_dispatch_note_fused(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, int n_skip) {
    const ggml_op first = cgraph->nodes[i]->op;
    if (first != GGML_OP_MUL_MAT && first != GGML_OP_MUL_MAT_ID) {
        return;  // the matmul fusions of ggml_cuda_try_fuse all start at the matmul
    }
    bool has_glu = false, has_mul = false;
    for (int j = i; j <= i + n_skip && j < cgraph->n_nodes; ++j) {
        has_glu = has_glu || cgraph->nodes[j]->op == GGML_OP_GLU;
        has_mul = has_mul || cgraph->nodes[j]->op == GGML_OP_MUL;
    }
    const int        group = has_glu ? FUSED_GLU : has_mul ? FUSED_SCALE : FUSED_BIAS;
    dispatch_state & st    = state();
    for (int j = i; j <= i + n_skip && j < cgraph->n_nodes; ++j) {
        const ggml_tensor * node = cgraph->nodes[j];
        if (node->op != GGML_OP_MUL_MAT && node->op != GGML_OP_MUL_MAT_ID) {
            continue;
        }
        // the fused kernels are mul_mat_vec_q for quantized weights, mul_mat_vec_f otherwise
        const int route = ggml_is_quantized(node->src[0]->type) ? GGML_DISPATCH_ROUTE_MMVQ : GGML_DISPATCH_ROUTE_MMVF;
        outcome o;
        o.route = route;
        if (st.rec.trace_on()) {
            const record_key k = make_key(ctx.device, node, layout_of(node), group, route, route, REASON_FUSED,
                                          GGML_DISPATCH_OK);
            if (node->op == GGML_OP_MUL_MAT_ID) {
                st.moe.note(ctx, node, k);
            }
            st.rec.note(o, &k);
        } else {
            st.rec.note(o, nullptr);
        }
    }
}

void ggml_cuda_dispatch_eval_begin(const ggml_backend_cuda_context * ctx, const void * graph_key, bool use_cuda_graph,
                                   bool cuda_graph_update_required) {
    state().rec.eval_begin(ctx, graph_key, use_cuda_graph, cuda_graph_update_required);
}

void ggml_cuda_dispatch_eval_end() {
    state().rec.eval_end();
    store_log_growth(cache_st());
    store_log_growth(kv_st());
}

void ggml_cuda_dispatch_graphs_stale() {
    state().rec.invalidate_graphs();
}

bool ggml_cuda_dispatch_graph_stale(const ggml_backend_cuda_context * ctx, const void * graph_key) {
    if (state().m == MODE_OFF) {
        return false;
    }
    return state().rec.graph_stale(ctx, graph_key);
}

void ggml_cuda_dispatch_backend_free(const ggml_backend_cuda_context * ctx) {
    if (!ggml_cuda_dispatch_active) {
        return;
    }
    state().rec.forget_context(ctx);
    state().rec.flush();
}

void ggml_backend_cuda_dispatch_set_override(int config_code) {
    ggml_cuda_dispatch_init();
    if (!ggml_dispatch_config_valid(config_code)) {
        GGML_LOG_WARN("ggml_cuda_dispatch: override %d is not a configuration code (ggml-dispatch-codes.h); ignored\n",
                      config_code);
        return;
    }
    if (state().m != MODE_OFF) {
        store_forced(cache_st(), config_code != 0, state().m == MODE_FORCE);
        store_forced(kv_st(), config_code != 0, state().m == MODE_FORCE);
    }
    state().rec.set_override(config_code);
}

void ggml_backend_cuda_dispatch_get_counts(struct ggml_dispatch_counts * out, int reset) {
    ggml_cuda_dispatch_init();
    if (out != nullptr) {
        state().rec.get_counts(out, reset != 0);
    }
}

// ---------------------------------------------------------------------------------------------
// FLASH_ATTN_EXT (fattn.cu asks through its hook): Q = src[0], K = src[1], V = src[2], mask = src[3],
// sinks = src[4]; op_params: scale, max_bias, logit_softcap.

namespace {

static int64_t kv_bucket(int64_t n_kv) {  // registry.kv_bucket: the smallest power of two >= n_kv
    int64_t b = 1;
    while (b < n_kv) {
        b <<= 1;
    }
    return b;
}

static std::string attn_json(const ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    float params[3] = {0.0f, 0.0f, 0.0f};
    std::memcpy(params, dst->op_params, sizeof(params));
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  ",\"attn\":{\"d_k\":%" PRId64 ",\"d_v\":%" PRId64 ",\"q_heads\":%" PRId64 ",\"kv_heads\":%" PRId64
                  ",\"q_cols\":%" PRId64 ",\"n_kv\":%" PRId64 ",\"seqs\":%" PRId64
                  ",\"k_type\":\"%s\",\"v_type\":\"%s\",\"v_nb\":[%zu,%zu,%zu,%zu],\"mask\":%s,\"sinks\":%s"
                  ",\"softcap\":%.9g,\"max_bias\":%.9g,\"scale\":%.9g}",
                  K->ne[0], V->ne[0], Q->ne[2], K->ne[2], Q->ne[1], K->ne[1], Q->ne[3], ggml_type_name(K->type),
                  ggml_type_name(V->type), V->nb[0], V->nb[1], V->nb[2], V->nb[3],
                  dst->src[3] != nullptr ? "true" : "false", dst->src[4] != nullptr ? "true" : "false",
                  (double) params[2], (double) params[1], (double) params[0]);
    return buf;
}

}  // namespace

// The kv parameter's index of a FlashAttention configuration (-1: another route).
static int fattn_kv_param(int config) {
    switch (ggml_dispatch_config_route(config)) {
        case GGML_DISPATCH_ROUTE_FA_VEC:  return GGML_DISPATCH_PARAM_FA_VEC_KV_INDEX;
        case GGML_DISPATCH_ROUTE_FA_TILE: return GGML_DISPATCH_PARAM_FA_TILE_KV_INDEX;
        case GGML_DISPATCH_ROUTE_FA_MMA:  return GGML_DISPATCH_PARAM_FA_MMA_KV_INDEX;
        default:                          return -1;
    }
}
static_assert(GGML_DISPATCH_PARAM_FA_VEC_KV_V_SHADOW == 1 && GGML_DISPATCH_PARAM_FA_TILE_KV_V_SHADOW == 1 &&
              GGML_DISPATCH_PARAM_FA_MMA_KV_V_SHADOW == 1 && GGML_DISPATCH_PARAM_FA_VEC_KV_V_REUSE == 2 &&
              GGML_DISPATCH_PARAM_FA_TILE_KV_V_REUSE == 2 && GGML_DISPATCH_PARAM_FA_MMA_KV_V_REUSE == 2, "kv");

#if GGML_DISPATCH_TABLE_KEY_RULE_COUNT > 0
// Is `r` a FlashAttention rule of the node's kind (K/V types, head dims, GQA ratio; any KV bucket and M)?
static bool fattn_rule_of_kind(const ggml_dispatch_table_rule & r, const ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    return r.op == GGML_DISPATCH_OP_FLASH_ATTN_EXT && r.layout == GGML_DISPATCH_LAYOUT_ATTENTION &&
           r.type0 == (int32_t) K->type && r.type1 == (int32_t) V->type &&
           r.k[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_D_K] == K->ne[0] && r.k[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_D_V] == V->ne[0] &&
           r.k[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_GQA] == (K->ne[2] > 0 ? Q->ne[2] / K->ne[2] : 0);
}
#endif

// kv=reuse, codegen's choice for shadow rules shallower than the deepest run of KV buckets with shadow rules
// (ggml_dispatch/codegen/kv_shadow.py): where a shadow of the node's cache exists, the configuration reading it; where none
// does but the cache holds more cells than half the KV bucket of a rule of the node's kind that makes one
// (kv=shadow: some step of this context may run it), the configuration making it; else 0, stock's kernel,
// so a context that never gets that deep never pays the shadow's upkeep (a mirror kernel per cache write).
static int fattn_kv_reuse_resolve(int device, const ggml_tensor * dst, int config) {
    const int p = fattn_kv_param(config);
    if (p < 0 || ggml_dispatch_config_param(config, p) != 2) {
        return config;
    }
    const ggml_dispatch_param_desc & d = ggml_dispatch_param_descs[p];
    const int shadow = (config & ~(((1 << d.bits) - 1) << d.shift)) | (1 << d.shift);
    const int64_t cells = kv_shadow_cells_unless_made(device, dst);
    if (cells == 0) {
        return shadow;
    }
#if GGML_DISPATCH_TABLE_KEY_RULE_COUNT > 0
    for (int i = 0; cells > 0 && i < GGML_DISPATCH_TABLE_KEY_RULE_COUNT; ++i) {
        const ggml_dispatch_table_rule & r  = ggml_dispatch_table_rules[i];
        const int                        rp = fattn_kv_param(r.config);
        if (rp >= 0 && fattn_rule_of_kind(r, dst) && ggml_dispatch_config_param(r.config, rp) == 1 &&
                r.k[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_KV] / 2 < cells) {
            return shadow;
        }
    }
#endif
    return 0;
}

int ggml_cuda_dispatch_select_flash_attn(int device, const ggml_tensor * dst, int stock_route,
                                         ggml_cuda_dispatch_fattn_check_t check, bool run,
                                         ggml_cuda_dispatch_fattn_resolve_t resolve) {
    dispatch_state &    st = state();
    const ggml_tensor * Q  = dst->src[0];
    const ggml_tensor * K  = dst->src[1];
    const ggml_tensor * V  = dst->src[2];

    int64_t key[GGML_DISPATCH_KEY_SLOTS]      = {};
    key[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_D_K] = K->ne[0];
    key[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_D_V] = V->ne[0];
    key[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_GQA] = K->ne[2] > 0 ? Q->ne[2] / K->ne[2] : 0;
    key[GGML_DISPATCH_KEY_FLASH_ATTN_EXT_KV]  = kv_bucket(K->ne[1]);
    int       reason    = REASON_STOCK;
    const int requested = requested_config(st, device, GGML_DISPATCH_OP_FLASH_ATTN_EXT, GGML_DISPATCH_LAYOUT_ATTENTION,
                                           (int) K->type, (int) V->type, key, Q->ne[1], &reason);
    int run_config = 0;
    int why        = GGML_DISPATCH_OK;
    if (requested != 0 && !ggml_dispatch_route_allows_op(ggml_dispatch_config_route(requested),
                                                         GGML_DISPATCH_OP_FLASH_ATTN_EXT)) {
        reason = REASON_STOCK;  // a matmul route forced or overridden: not asked of attention nodes
    } else if (requested != 0) {
        why = !ggml_dispatch_config_valid(requested) ? GGML_DISPATCH_WHY_ROUTE : feature_check(requested);
        if (why == GGML_DISPATCH_OK) {
            why = check(device, dst, requested);
        }
        // kv=reuse is resolved at the launch only: the scratch is sized for the configuration, which needs at
        // least what stock's kernel does (the f16 copies of K and V)
        const int resolved = why == GGML_DISPATCH_OK && run ? fattn_kv_reuse_resolve(device, dst, requested) : requested;
        if (resolved == 0) {
            why = GGML_DISPATCH_WHY_NO_SHADOW;
        }
        if (why == GGML_DISPATCH_OK) {
            run_config = resolved;
        } else {
            reason = REASON_INELIGIBLE;
        }
    }
    const int route = run_config != 0 ? ggml_dispatch_config_route(run_config) : stock_route;
    if (!run) {
        return run_config;
    }
    outcome o;
    o.route      = route;
    o.forced     = run_config != 0 && reason == REASON_FORCED;
    o.table      = run_config != 0 && reason == REASON_TABLE;
    o.ineligible = reason == REASON_INELIGIBLE;
    if (st.rec.trace_on()) {
        const int ran = run_config != 0 ? run_config : route;
        record_key k = make_key_of(GGML_DISPATCH_OP_FLASH_ATTN_EXT, device, K, Q, GGML_DISPATCH_LAYOUT_ATTENTION, FUSED_NONE,
                                   route, stock_route, reason, why, resolve != nullptr ? resolve(device, dst, ran) : ran);
        k.extra = attn_json(dst);
        st.rec.note(o, &k);
    } else {
        st.rec.note(o, nullptr);
    }
    return run_config;
}

#if GGML_DISPATCH_TABLE_KEY_RULE_COUNT > 0
namespace {
// (device, K type, V type, D_K, D_V, GQA ratio, configuration) that have run: warmed up or launched
using fa_warm_key = std::array<int64_t, 7>;
struct fa_warm_state {
    std::mutex            mu;
    std::set<fa_warm_key> ran;
};
static fa_warm_state & fa_warm() {
    static fa_warm_state * s = new fa_warm_state();
    return *s;
}
}  // namespace
#endif

// Table mode with the compiled table applying on `device` (its GPU matched at start-up).
static bool table_decides(const dispatch_state & st, int device) {
    return st.m == MODE_TABLE && device >= 0 && device < GGML_CUDA_MAX_DEVICES && st.table_applies[device];
}

// Whether the compiled table has FlashAttention rules (a property of the header: computed once).
static bool table_has_flash_attn_rules() {
    static const bool has = [] {
#if GGML_DISPATCH_TABLE_KEY_RULE_COUNT > 0
        for (int i = 0; i < GGML_DISPATCH_TABLE_KEY_RULE_COUNT; ++i) {
            if (ggml_dispatch_table_rules[i].op == GGML_DISPATCH_OP_FLASH_ATTN_EXT) {
                return true;
            }
        }
#endif
        return false;
    }();
    return has;
}

int ggml_cuda_dispatch_warm_up_flash_attn(int device, const ggml_tensor * dst, int chosen,
                                          ggml_cuda_dispatch_fattn_warm_t warm, void * user) {
    const dispatch_state & st = state();
    if (!table_decides(st, device) || !st.warm_up || recorder::capturing()) {
        return 0;  // a launch under capture would be replayed with every step
    }
#if GGML_DISPATCH_TABLE_KEY_RULE_COUNT > 0
    const ggml_tensor * Q   = dst->src[0];
    const ggml_tensor * K   = dst->src[1];
    const ggml_tensor * V   = dst->src[2];
    const int64_t       gqa = K->ne[2] > 0 ? Q->ne[2] / K->ne[2] : 0;
    auto key = [&](int config) {
        return fa_warm_key{device, (int64_t) K->type, (int64_t) V->type, K->ne[0], V->ne[0], gqa, config};
    };
    // stock's kernel at this Q width is warmed as "-M": where the table displaces it here (at the warm-up's
    // short KV length, say), a deeper node the table leaves to stock would otherwise load it mid-step
    const int        stock_at_m = (int) -std::min<int64_t>(Q->ne[1], INT32_MAX);
    std::vector<int> pending;
    {
        std::lock_guard<std::mutex> lock(fa_warm().mu);
        fa_warm().ran.insert(key(chosen != 0 ? chosen : stock_at_m));  // its own launch follows
        if (chosen != 0 && fa_warm().ran.count(key(stock_at_m)) == 0) {
            pending.push_back(0);
        }
        for (int i = 0; i < GGML_DISPATCH_TABLE_KEY_RULE_COUNT; ++i) {
            const ggml_dispatch_table_rule & r = ggml_dispatch_table_rules[i];
            if (!fattn_rule_of_kind(r, dst) || r.config == 0 ||
                    fa_warm().ran.count(key(r.config)) != 0 ||
                    std::find(pending.begin(), pending.end(), r.config) != pending.end()) {
                continue;
            }
            pending.push_back(r.config);
        }
    }
    int launched = 0;
    for (const int config : pending) {
        if (warm(config, user)) {
            launched++;
            std::lock_guard<std::mutex> lock(fa_warm().mu);
            fa_warm().ran.insert(key(config != 0 ? config : stock_at_m));
        }
    }
    if (launched > 0) {
        GGML_LOG_DEBUG("ggml_cuda_dispatch: first-use warm-up of %d FlashAttention configuration(s) on %s%d\n", launched,
                       GGML_CUDA_NAME, device);
    }
    return launched;
#else
    GGML_UNUSED(dst);
    GGML_UNUSED(chosen);
    GGML_UNUSED(warm);
    GGML_UNUSED(user);
    return 0;
#endif
}

bool ggml_cuda_dispatch_graph_update_error(int device, cudaError_t stat) {
    const dispatch_state & st = state();
    const bool table_here = table_decides(st, device) && GGML_DISPATCH_TABLE_RULE_COUNT > 0;
    if (stat == cudaSuccess || !(table_here || st.m == MODE_FORCE || st.rec.override_seen())) {
        return false;
    }
    static std::atomic<int> logged{0};
    if (logged.fetch_add(1) < 4) {
        GGML_LOG_WARN("ggml_cuda_dispatch: cudaGraphExecUpdate returned %s (%s) on %s%d: instantiating the graph again\n",
                      cudaGetErrorName(stat), cudaGetErrorString(stat), GGML_CUDA_NAME, device);
    }
    return true;
}

bool ggml_cuda_dispatch_fattn_warm_copies(int device, int64_t n_kv) {
    const dispatch_state & st = state();
    return table_decides(st, device) && st.warm_up && n_kv <= GGML_DISPATCH_FA_WARM_COPIES_MAX_KV &&
           table_has_flash_attn_rules();
}

bool ggml_cuda_dispatch_fattn_size_all() {
    const dispatch_state & st = state();
    if (st.m == MODE_OFF) {
        return false;
    }
    return st.rec.override_seen() ||
           (st.m == MODE_FORCE &&
            ggml_dispatch_route_allows_op(ggml_dispatch_config_route(st.force_config), GGML_DISPATCH_OP_FLASH_ATTN_EXT));
}
