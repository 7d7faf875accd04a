// Drives the real ggml-dispatch.cu (as installed into the tree) on a machine without a GPU.
//
// The hook's entry points are called the way the edited ggml-cuda.cu calls them, on real ggml tensors
// (allocated in CPU buffers): MUL_MAT and MUL_MAT_ID selection, fused-group notes, CUDA-graph capture /
// replay / staleness, backend free, exit. What needs a GPU is replaced, and only that:
//   - ggml_cuda_info() / ggml_cuda_get_device(): an H200-like device (cc 900, 132 SMs, 227 KiB smpbo);
//     ggml_cuda_set_device() does nothing, ggml_cuda_error() aborts and ggml_backend_cuda_buffer_type()
//     is null (the weight cache's allocator and buffer check call them; no case here makes a copy);
//   - cudaGetDeviceProperties, cublasGetProperty: linked with --wrap (name from GLUE_GPU_NAME);
//   - the tree's ggml_cuda_should_use_* and ggml_cuda_op_mul_mat_use_fwht: taken verbatim from the tree
//     (tree_should_use.inc, written by the test).
// GLUE_OVERRIDE=<code>: call the exported override setter first. Prints one JSON line per case and a
// final line with the counts; the route trace (GGML_CUDA_ROUTE_TRACE) is the hook's own.
#include "ggml-dispatch-eligibility.cuh"
#include "ggml-dispatch-hook.cuh"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

static ggml_cuda_device_info g_info;

const ggml_cuda_device_info & ggml_cuda_info() {
    return g_info;
}

int ggml_cuda_get_device() {
    return 0;
}

void ggml_cuda_set_device(int) {}

extern "C" ggml_backend_buffer_type_t ggml_backend_cuda_buffer_type(int) {
    return nullptr;  // no buffer here is a CUDA buffer
}

[[noreturn]] void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    std::fprintf(stderr, "glue: CUDA error %s in %s (%s:%d): %s\n", stmt, func, file, line, msg);
    std::abort();
}

#include "tree_should_use.inc"

extern "C" cudaError_t __wrap_cudaGetDeviceProperties(cudaDeviceProp * prop, int device) {
    std::memset(prop, 0, sizeof(*prop));
    const char * name = std::getenv("GLUE_GPU_NAME");
    std::snprintf(prop->name, sizeof(prop->name), "%s", name ? name : "NVIDIA H200");
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

static const char * route_name(int code) {
    return ggml_dispatch::route_name(code);
}

static void print_case(const char * name, int run) {
    std::printf("{\"case\":\"%s\",\"run\":\"%s\"}\n", name, run ? route_name(run) : "stock");
}

// each log line tagged with its level ([I] info, [W] warning, [E] error, [-] other), so a test tells the
// hook's warnings from its INFO start-up line
static void tagged_log(enum ggml_log_level level, const char * text, void *) {
    const char * tag = level == GGML_LOG_LEVEL_INFO ? "I" : level == GGML_LOG_LEVEL_WARN ? "W" :
                       level == GGML_LOG_LEVEL_ERROR ? "E" : "-";
    std::fprintf(stderr, "[%s] %s", tag, text);
}

int main() {
    ggml_log_set(tagged_log, nullptr);
    g_info.device_count                    = 1;
    g_info.physical_device_count           = 1;
    g_info.devices[0].cc                   = 900;
    g_info.devices[0].nsm                  = 132;
    g_info.devices[0].smpbo                = 232448;
    g_info.devices[0].smpb                 = 49152;
    g_info.devices[0].warp_size            = 32;
    g_info.devices[0].total_vram           = (size_t) 143771 * 1024 * 1024;
    g_info.devices[0].physical_device      = 0;

    if (const char * ov = std::getenv("GLUE_OVERRIDE")) {
        ggml_backend_cuda_dispatch_set_override(std::atoi(ov));  // initializes the hook, as a harness does
    }
    ggml_cuda_dispatch_init();
    std::printf("{\"active\":%s}\n", ggml_cuda_dispatch_active ? "true" : "false");
    // an error from cudaGraphExecUpdate other than the update failure: instantiate again where the dispatch
    // decides kernels (printed for two codes), never for success
    std::printf("{\"graph_update\":{\"not_supported\":%s,\"invalid_value\":%s,\"success\":%s}}\n",
                ggml_cuda_dispatch_graph_update_error(0, cudaErrorNotSupported) ? "true" : "false",
                ggml_cuda_dispatch_graph_update_error(0, cudaErrorInvalidValue) ? "true" : "false",
                ggml_cuda_dispatch_graph_update_error(0, cudaSuccess) ? "true" : "false");

    // the mmq split's one-wave grid (2j_wave) for tile counts of the qwen3moe-a3b shapes and two edge cases
    {
        const int cases[][2] = {{1536, 132}, {4096, 132}, {200, 132}, {1031, 132}, {3 * 137, 132}};
        std::printf("{\"wave_blocks\":[");
        for (size_t i = 0; i < sizeof(cases)/sizeof(cases[0]); ++i) {
            std::printf("%s[%d,%d,%d]", i ? "," : "", cases[i][0], cases[i][1],
                        ggml_dispatch_mmq_wave_blocks(cases[i][0], cases[i][1]));
        }
        std::printf("]}\n");
    }

    // tensors as llama.cpp builds them (names included), allocated in a CPU buffer
    ggml_init_params params = {ggml_tensor_overhead() * 64 + ggml_graph_overhead(), nullptr, true};
    ggml_context *   ctx    = ggml_init(params);
    ggml_tensor *    wq     = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 4096, 4096);
    ggml_set_name(wq, "blk.0.attn_q.weight");
    ggml_tensor * wh = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 4096, 4096);
    ggml_set_name(wh, "blk.0.ffn_down.weight");
    ggml_tensor * wcol = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4096, 1);
    ggml_set_name(wcol, "col");
    ggml_tensor * x8   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4096, 8);
    ggml_tensor * x512 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4096, 512);
    ggml_tensor * x1   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4096, 1);
    ggml_tensor * x100 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4096, 100);
    // attention: K cache [head_dim 64, 3 kv heads, 512 cells] viewed as [64, 512, 3]; q [64, 7 tokens, 9 heads]
    ggml_tensor * kc = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, 64, 3, 512);
    ggml_tensor * k  = ggml_permute(ctx, kc, 0, 2, 1, 3);
    ggml_set_name(k, "cache_k_l0 (view) (permuted)");
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 7, 9);
    // experts: 8 x [4096 -> 1024] q4_0; 5 tokens, 2 experts each
    ggml_tensor * as  = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_0, 4096, 1024, 8);
    ggml_set_name(as, "blk.0.ffn_up_exps.weight");
    ggml_tensor * xb  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4096, 1, 5);
    ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 5);
    // a gate + up + GLU group as ggml_cuda_try_fuse fuses it at M = 1
    ggml_tensor * wg = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 4096, 1536);
    ggml_set_name(wg, "blk.0.ffn_gate.weight");
    ggml_tensor * wu = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 4096, 1536);
    ggml_set_name(wu, "blk.0.ffn_up.weight");

    ggml_tensor * mm_a  = ggml_mul_mat(ctx, wq, x8);
    ggml_tensor * mm_b  = ggml_mul_mat(ctx, wq, x512);
    ggml_tensor * mm_c  = ggml_mul_mat(ctx, wh, x8);
    ggml_tensor * mm_d  = ggml_mul_mat(ctx, wh, x1);
    ggml_tensor * mm_e  = ggml_mul_mat(ctx, k, q);
    ggml_tensor * mm_f  = ggml_mul_mat(ctx, wcol, x100);
    ggml_tensor * mm_g  = ggml_mul_mat_id(ctx, as, xb, ids);
    ggml_tensor * gate  = ggml_mul_mat(ctx, wg, x1);
    ggml_tensor * up    = ggml_mul_mat(ctx, wu, x1);
    ggml_tensor * glu   = ggml_swiglu_split(ctx, gate, up);
    ggml_cgraph * gf    = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, glu);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    if (buf == nullptr) {
        std::printf("{\"error\":\"no buffer\"}\n");
        return 1;
    }

    // the backend context: only its device is read by the hook (never destroyed: its destructor is CUDA's)
    alignas(ggml_backend_cuda_context) static unsigned char ctx_mem[sizeof(ggml_backend_cuda_context)];
    ggml_backend_cuda_context * cctx = new (ctx_mem) ggml_backend_cuda_context(0);

    struct {
        const char *  name;
        ggml_tensor * node;
    } cases[] = {
        {"q4_0 M=8", mm_a}, {"q4_0 M=512", mm_b}, {"f16 M=8", mm_c}, {"f16 M=1", mm_d},
        {"attention f16 M=7 B=9", mm_e}, {"f32 N=1 M=100", mm_f},
    };
    for (const auto & c : cases) {
        const int run = ggml_cuda_dispatch_active ? ggml_cuda_dispatch_select_mul_mat(*cctx, c.node) : 0;
        print_case(c.name, run);
    }
    {  // MUL_MAT_ID as the hook's ggml_cuda_mul_mat_id_dispatch selects it
        const int run = ggml_cuda_dispatch_active ? ggml_cuda_dispatch_begin_mul_mat_id(*cctx, mm_g) : 0;
        if (ggml_cuda_dispatch_active) {
            ggml_cuda_dispatch_end_mul_mat_id(false);
        }
        print_case("moe q4_0 M=5", run);
    }
    if (ggml_cuda_dispatch_active) {
        int i_gate = -1;
        for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
            if (ggml_graph_node(gf, i) == gate || ggml_graph_node(gf, i) == up) {
                i_gate = i;
                break;
            }
        }
        ggml_cuda_dispatch_note_fused(*cctx, gf, i_gate, ggml_graph_n_nodes(gf) - 1 - i_gate);
    }

    // CUDA graphs: capture case A, replay it 3 times; then an override change makes it stale once
    const void * key   = mm_a;
    bool         stale[3] = {false, false, false};
    ggml_dispatch_counts before, after;
    ggml_backend_cuda_dispatch_get_counts(&before, 0);
    if (ggml_cuda_dispatch_active) {
        {
            ggml_cuda_dispatch_eval_scope capture(cctx, key, true, true);
            ggml_cuda_dispatch_select_mul_mat(*cctx, mm_a);
        }
        for (int r = 0; r < 3; ++r) {
            ggml_cuda_dispatch_eval_scope replay(cctx, key, true, false);
        }
        stale[0] = ggml_cuda_dispatch_graph_stale(cctx, key);
        ggml_backend_cuda_dispatch_set_override(GGML_DISPATCH_ROUTE_CUBLAS);
        stale[1] = ggml_cuda_dispatch_graph_stale(cctx, key);
        stale[2] = ggml_cuda_dispatch_graph_stale(cctx, key);
        ggml_backend_cuda_dispatch_set_override(0);
    }
    ggml_backend_cuda_dispatch_get_counts(&after, 0);
    std::string s = "{\"counts\":{\"ran\":[";
    for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
        s += (i ? "," : "") + std::to_string(after.ran[i]);
    }
    s += "],\"forced\":" + std::to_string(after.forced) + ",\"table\":" + std::to_string(after.table) +
         ",\"ineligible\":" + std::to_string(after.ineligible) + "}";
    s += ",\"graph_nodes\":" + std::to_string(after.ran[3] + after.ran[4] + after.ran[5] + after.ran[1] + after.ran[2] +
                                              after.ran[0] - (before.ran[3] + before.ran[4] + before.ran[5] +
                                                              before.ran[1] + before.ran[2] + before.ran[0]));
    s += std::string(",\"stale\":[") + (stale[0] ? "true" : "false") + "," + (stale[1] ? "true" : "false") + "," +
         (stale[2] ? "true" : "false") + "]}";
    std::printf("%s\n", s.c_str());

    ggml_cuda_dispatch_backend_free(cctx);  // flushes the trace; the footer comes at exit
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return 0;
}
