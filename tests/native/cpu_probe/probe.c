// CPU-only probe for a tree with the ggml-dispatch hook installed: MUL_MAT (f32 and q4_0 weights) on the
// CPU backend against a naive reference; the CUDA backend is absent, so the dispatch functions are not
// found and a caller runs stock. Prints one JSON line; exit 0 only if every check holds.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include "ggml-dispatch.h"
#include "ggml-dispatch-table.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double run_case(ggml_backend_t backend, enum ggml_type wtype, int K, int N, int M) {
    struct ggml_init_params params = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(params);
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, wtype, K, N);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);

    float * wf = malloc(sizeof(float) * (size_t) K * N);
    float * xf = malloc(sizeof(float) * (size_t) K * M);
    float * yf = malloc(sizeof(float) * (size_t) N * M);
    float * wr = malloc(sizeof(float) * (size_t) K * N);
    srand(1234);
    for (int i = 0; i < K * N; ++i) wf[i] = (float) rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < K * M; ++i) xf[i] = (float) rand() / RAND_MAX - 0.5f;
    if (wtype == GGML_TYPE_F32) {
        ggml_backend_tensor_set(w, wf, 0, ggml_nbytes(w));
        memcpy(wr, wf, sizeof(float) * (size_t) K * N);
    } else {  // quantize, and take the reference from the dequantized weights
        void * q = malloc(ggml_nbytes(w));
        ggml_quantize_chunk(wtype, wf, q, 0, N, K, NULL);
        ggml_backend_tensor_set(w, q, 0, ggml_nbytes(w));
        ggml_get_type_traits(wtype)->to_float(q, wr, (int64_t) K * N);
        free(q);
    }
    ggml_backend_tensor_set(x, xf, 0, ggml_nbytes(x));
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        return 1e30;
    }
    ggml_backend_tensor_get(y, yf, 0, ggml_nbytes(y));
    double err = 0.0, ref2 = 0.0;
    for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
            double ref = 0.0;
            for (int k = 0; k < K; ++k) ref += (double) wr[(size_t) n * K + k] * xf[(size_t) m * K + k];
            const double d = yf[(size_t) m * N + n] - ref;
            err += d * d;
            ref2 += ref * ref;
        }
    }
    free(wf); free(xf); free(yf); free(wr);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return err / (ref2 > 0 ? ref2 : 1.0);  // NMSE, as test-backend-ops computes it
}

int main(void) {
    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) {
        printf("{\"ok\":false,\"error\":\"no CPU backend\"}\n");
        return 1;
    }
    const double nmse_f32 = run_case(backend, GGML_TYPE_F32, 256, 96, 7);
    const double nmse_q40 = run_case(backend, GGML_TYPE_Q4_0, 256, 96, 33);

    // no CUDA backend in this build: a harness finds no dispatch functions and runs stock
    const int cuda_registered = ggml_backend_reg_by_name("CUDA") != NULL;
    ggml_backend_reg_t cpu_reg = ggml_backend_reg_by_name("CPU");
    const int cpu_has_override = cpu_reg && ggml_backend_reg_get_proc_address(cpu_reg, GGML_DISPATCH_PROC_SET_OVERRIDE) != NULL;
    const int cpu_has_counts = cpu_reg && ggml_backend_reg_get_proc_address(cpu_reg, GGML_DISPATCH_PROC_GET_COUNTS) != NULL;

    // the installed table header: no table -> stock everywhere, no GPU match
    int64_t key[GGML_DISPATCH_KEY_SLOTS] = {0};
    key[GGML_DISPATCH_KEY_MUL_MAT_N]     = 4096;
    key[GGML_DISPATCH_KEY_MUL_MAT_K]     = 4096;
    key[GGML_DISPATCH_KEY_MUL_MAT_B]     = 1;
    const int lookup = ggml_dispatch_table_lookup(GGML_DISPATCH_OP_MUL_MAT, GGML_DISPATCH_LAYOUT_WEIGHT, GGML_TYPE_Q4_0,
                                                  GGML_TYPE_F32, key, 8);
    const int matches = ggml_dispatch_table_gpu_matches("NVIDIA H200", 900, 132);
    struct ggml_dispatch_counts counts;
    memset(&counts, 0, sizeof(counts));

    const int ok = nmse_f32 < 1e-10 && nmse_q40 < 5e-4 && !cuda_registered && !cpu_has_override && !cpu_has_counts &&
                   GGML_DISPATCH_TABLE_LAYOUT_VERSION == 3 && (GGML_DISPATCH_TABLE_RULE_COUNT > 0 || (lookup == 0 && matches == 0));
    printf("{\"ok\":%s,\"nmse_f32\":%.3e,\"nmse_q4_0\":%.3e,\"cuda_registered\":%d,\"cpu_has_dispatch_procs\":%d,"
           "\"table_rules\":%d,\"lookup\":%d,\"gpu_matches\":%d,\"counts_size\":%d}\n",
           ok ? "true" : "false", nmse_f32, nmse_q40, cuda_registered, cpu_has_override || cpu_has_counts,
           (int) GGML_DISPATCH_TABLE_RULE_COUNT, lookup, matches, (int) sizeof(counts));
    ggml_backend_free(backend);
    return ok ? 0 : 1;
}
