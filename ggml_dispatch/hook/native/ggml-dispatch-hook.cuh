// ggml-dispatch: what the hook edits in ggml-cuda.cu call. Implementation: ggml-dispatch.cu.
//
// Every call site tests ggml_cuda_dispatch_active first; it is false under GGML_CUDA_DISPATCH=off
// with no route trace, and then ggml-cuda runs exactly its stock code.
#pragma once

#include "common.cuh"
#include "ggml-dispatch.h"
#include "ggml-dispatch-params.h"
#include "ggml-dispatch-cache.cuh"
#include "ggml-dispatch-kv.cuh"

// Set once by ggml_cuda_dispatch_init() (first backend init); read per node.
extern bool ggml_cuda_dispatch_active;

// Reads GGML_CUDA_DISPATCH / GGML_CUDA_ROUTE_TRACE, matches the compiled table against the devices,
// logs one line, opens the trace. Runs once; later calls return at once.
void ggml_cuda_dispatch_init();

// MUL_MAT: the configuration to run (an eligible configuration code, see ggml-dispatch-codes.h), or 0 to run
// stock ggml_cuda_mul_mat. Counts and traces the node.
int ggml_cuda_dispatch_select_mul_mat(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);

// The same in two halves around the run: begin selects (as select_mul_mat), end counts and traces the
// node; `params_refused`: the route's code could not apply a parameter value (ggml-dispatch-params.h),
// the node counts as ineligible (ineligible:params) and its trace records the plain route.
int ggml_cuda_dispatch_begin_mul_mat(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);
void ggml_cuda_dispatch_end_mul_mat(bool params_refused);

// The decoding of a configuration code into the parameters the readers take (ggml-dispatch-eligibility.cuh).
ggml_dispatch_params ggml_cuda_dispatch_params_of(int config);

// MUL_MAT_ID: stock always runs; counts and traces the route its cascade takes.
void ggml_cuda_dispatch_note_mul_mat_id(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);

// MUL_MAT_ID through the route selection, in two halves as MUL_MAT: begin returns the configuration to
// run with ids (0: stock ggml_cuda_mul_mat_id), end counts and traces the node (with its tokens-per-expert
// statistics while the trace is on).
int ggml_cuda_dispatch_begin_mul_mat_id(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);
void ggml_cuda_dispatch_end_mul_mat_id(bool params_refused);

// True where this MUL_MAT_ID node runs the per-expert fallback by the dispatch's choice (a forced or
// overridden id_sorted, eligible; a table's id_sorted rule is refused, codegen never writes one):
// ggml_cuda_mul_mat_id_needs_sync then answers true, so ggml runs that graph directly (no CUDA graph) and
// the fallback's assert holds. Counts nothing; two loads where nothing forces id_sorted.
bool ggml_cuda_dispatch_mul_mat_id_sorted(const ggml_tensor * dst);

// FLASH_ATTN_EXT (fattn.cu): the configuration the node runs (a code of a GGML_DISPATCH_ROUTE_FA_* route):
// the table's / a forced one where `check(device, dst, config)` answers GGML_DISPATCH_OK, else 0 (stock's
// kernel, `stock_route`, as the tree runs it). `run`: the launching call, counted and traced (with the
// configuration); the other calls (scratch sizing, supports_op) ask the same question silently.
// `resolve(device, dst, config)`: the configuration a launch under `config` (0: stock's kernel, given as
// its route) runs, with the parameters the kernel's own rules fill in; what the trace records.
typedef int (*ggml_cuda_dispatch_fattn_check_t)(int device, const ggml_tensor * dst, int config);
typedef int (*ggml_cuda_dispatch_fattn_resolve_t)(int device, const ggml_tensor * dst, int config);
int ggml_cuda_dispatch_select_flash_attn(int device, const ggml_tensor * dst, int stock_route,
                                         ggml_cuda_dispatch_fattn_check_t check, bool run,
                                         ggml_cuda_dispatch_fattn_resolve_t resolve = nullptr);

// The first-use warm-up of the table's FlashAttention configurations. CUDA loads a kernel at its first
// launch (lazy loading, milliseconds each), so a kernel the table picks only at some depth would load inside
// the first step that reaches it. For a node about to run `chosen`, `warm(config, user)` is asked to launch,
// on this node, each configuration the table names for nodes of its kind (K/V types, head dims, GQA ratio;
// every KV bucket and Q width) that has not run on this device yet, and config 0, stock's kernel on this
// node, where the table displaces it at a Q width stock has not run yet (a deeper node the table leaves to
// stock runs it); it answers whether it did (a configuration the node's scratch cannot hold waits for a node
// that can). Only in table mode, outside CUDA-graph capture, and not with GGML_CUDA_DISPATCH_WARMUP=off.
// Returns how many it launched.
typedef bool (*ggml_cuda_dispatch_fattn_warm_t)(int config, void * user);
int ggml_cuda_dispatch_warm_up_flash_attn(int device, const ggml_tensor * dst, int chosen,
                                          ggml_cuda_dispatch_fattn_warm_t warm, void * user);

// True where the first-use warm-up may launch a kernel that converts K/V to f16 on a node whose own kernel does
// not (stock's MMA for a Q width where the table runs VEC, say): in table mode with the warm-up on, a table with
// FlashAttention rules, and a KV length of at most GGML_DISPATCH_FA_WARM_COPIES_MAX_KV. The scratch of such a
// node then holds the f16 copies (at most 1024 x D x KV heads x 2 x 2 bytes: 4 MiB at D 256 and 4 KV heads).
// Deeper nodes keep the scratch their own kernel needs, so a long context costs no memory for the warm-up.
#define GGML_DISPATCH_FA_WARM_COPIES_MAX_KV 1024
bool ggml_cuda_dispatch_fattn_warm_copies(int device, int64_t n_kv);

// cudaGraphExecUpdate returned `stat`, an error other than the update failure ggml handles: true (and a
// warning naming the error, the first few times) where the dispatch decides kernels (a table that applies on
// `device`, a forced configuration, an override), so the caller instantiates the graph again as it does after
// an update failure instead of aborting. On the H200 the tuning harness met such an error under cuBLAS
// configurations (GGML_ASSERT(stat == cudaSuccess) after cudaGraphExecUpdate). A sticky error (a kernel's
// fault) still aborts, at the instantiation, now with its name. Stock (no table, off) keeps the assert.
bool ggml_cuda_dispatch_graph_update_error(int device, cudaError_t stat);

// True when an attention kernel can change after the graph was allocated (a route override was set, or a
// FlashAttention route is forced): the scratch then holds the f16 copies of K and V for every kernel.
bool ggml_cuda_dispatch_fattn_size_all();

// ggml_cuda_try_fuse consumed nodes i..i+n_skip: count and trace the matmuls among them as fused.
void ggml_cuda_dispatch_note_fused(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, int n_skip);

// CUDA graphs: begin/end of one graph evaluation (capture, replay or direct), and whether the
// graph captured under this key predates the last route override change.
void ggml_cuda_dispatch_eval_begin(const ggml_backend_cuda_context * ctx, const void * graph_key, bool use_cuda_graph,
                                   bool cuda_graph_update_required);
void ggml_cuda_dispatch_eval_end();
bool ggml_cuda_dispatch_graph_stale(const ggml_backend_cuda_context * ctx, const void * graph_key);

// Flushes the trace and forgets the context's captured graphs.
void ggml_cuda_dispatch_backend_free(const ggml_backend_cuda_context * ctx);

// Exported through ggml_backend_reg_get_proc_address (see ggml-dispatch.h).
void ggml_backend_cuda_dispatch_set_override(int config_code);
void ggml_backend_cuda_dispatch_get_counts(struct ggml_dispatch_counts * out, int reset);

struct ggml_cuda_dispatch_eval_scope {
    const bool on;

    ggml_cuda_dispatch_eval_scope(const ggml_backend_cuda_context * ctx, const void * graph_key, bool use_cuda_graph,
                                  bool cuda_graph_update_required)
        : on(ggml_cuda_dispatch_active) {
        if (on) {
            ggml_cuda_dispatch_eval_begin(ctx, graph_key, use_cuda_graph, cuda_graph_update_required);
        }
    }

    ~ggml_cuda_dispatch_eval_scope() {
        if (on) {
            ggml_cuda_dispatch_eval_end();
        }
    }

    ggml_cuda_dispatch_eval_scope(const ggml_cuda_dispatch_eval_scope &)             = delete;
    ggml_cuda_dispatch_eval_scope & operator=(const ggml_cuda_dispatch_eval_scope &) = delete;
};
