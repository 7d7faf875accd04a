// Lab program: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
// On the GPU: the harness interface of the ggml-dispatch hook, end to end.
//
// Four MUL_MAT nodes (q4_0 weights, then F16 weights; M = 8) computed repeatedly on CUDA0 so that
// ggml-cuda captures a CUDA graph and replays it. Checks, through the functions that
// ggml_backend_reg_get_proc_address exports:
//   - counts include replays (5 computes x 4 nodes = 20 nodes, by the route stock takes),
//   - an override runs its route on the next compute (the captured graph is invalidated: a stale
//     replay would count and run the old route) and its output matches stock's (NMSE),
//   - an ineligible override runs stock and counts as ineligible, clearing it restores stock.
// On a tree without the hook the functions are absent: prints {"procs": false} and exits 0.
// Prints one JSON object; exit 1 if any check fails.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cuda.h"
#include "ggml-dispatch.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static const int K = 4096, N = 4096, M = 8, NODES = 4;

struct setup {
    ggml_context *        ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_cgraph *         gf  = nullptr;
    ggml_tensor *         out[NODES];
};

static setup build(ggml_backend_t backend, ggml_type wtype) {
    setup s;
    ggml_init_params params = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    s.ctx = ggml_init(params);
    ggml_tensor * w = ggml_new_tensor_2d(s.ctx, wtype, K, N);
    ggml_tensor * x[NODES];
    for (int i = 0; i < NODES; ++i) {
        x[i]     = ggml_new_tensor_2d(s.ctx, GGML_TYPE_F32, K, M);
        s.out[i] = ggml_mul_mat(s.ctx, w, x[i]);
    }
    s.gf = ggml_new_graph(s.ctx);
    for (int i = 0; i < NODES; ++i) {
        ggml_build_forward_expand(s.gf, s.out[i]);
    }
    s.buf = ggml_backend_alloc_ctx_tensors(s.ctx, backend);

    std::mt19937                     rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float>               wf((size_t) K * N);
    for (float & v : wf) {
        v = dist(rng);
    }
    std::vector<uint8_t> wq(ggml_nbytes(w));
    ggml_quantize_chunk(wtype, wf.data(), wq.data(), 0, N, K, nullptr);
    ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
    for (int i = 0; i < NODES; ++i) {
        std::vector<float> xf((size_t) K * M);
        for (float & v : xf) {
            v = dist(rng);
        }
        ggml_backend_tensor_set(x[i], xf.data(), 0, ggml_nbytes(x[i]));
    }
    return s;
}

static std::vector<float> result(const setup & s) {
    std::vector<float> r;
    for (int i = 0; i < NODES; ++i) {
        std::vector<float> o((size_t) N * M);
        ggml_backend_tensor_get(s.out[i], o.data(), 0, ggml_nbytes(s.out[i]));
        r.insert(r.end(), o.begin(), o.end());
    }
    return r;
}

static double nmse(const std::vector<float> & a, const std::vector<float> & ref) {
    double err = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        err += (double) (a[i] - ref[i]) * (a[i] - ref[i]);
        den += (double) ref[i] * ref[i];
    }
    return den > 0 ? err / den : err;
}

int main() {
    ggml_backend_reg_t reg     = ggml_backend_cuda_reg();
    ggml_backend_t     backend = ggml_backend_cuda_init(0);
    if (!reg || !backend) {
        std::printf("{\"ok\":false,\"error\":\"no CUDA backend\"}\n");
        return 1;
    }
    auto set_override = (ggml_dispatch_set_override_t) ggml_backend_reg_get_proc_address(reg, GGML_DISPATCH_PROC_SET_OVERRIDE);
    auto get_counts   = (ggml_dispatch_get_counts_t) ggml_backend_reg_get_proc_address(reg, GGML_DISPATCH_PROC_GET_COUNTS);
    if (!set_override || !get_counts) {
        std::printf("{\"ok\":true,\"procs\":false}\n");
        ggml_backend_free(backend);
        return 0;
    }

    static const char * names[] = GGML_DISPATCH_ROUTE_NAMES;
    std::string         out = "{\"procs\":true,\"checks\":[";
    bool                all_ok = true;
    int                 n_checks = 0;

    auto counts_json = [](const ggml_dispatch_counts & c) {
        std::string s = "{";
        for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
            s += std::string(i ? "," : "") + "\"" + names[i] + "\":" + std::to_string(c.ran[i]);
        }
        s += ",\"forced\":" + std::to_string(c.forced) + ",\"table\":" + std::to_string(c.table) +
             ",\"ineligible\":" + std::to_string(c.ineligible) + "}";
        return s;
    };

    // computes `reps` times with `route` overridden (0 = stock); expects every node to run `expect`
    auto step = [&](const char * label, setup & s, const std::vector<float> * ref, int route, int reps, int expect,
                    bool expect_forced, bool expect_ineligible) {
        ggml_dispatch_counts c;
        get_counts(&c, 1);  // reset
        set_override(route);
        for (int r = 0; r < reps; ++r) {
            if (ggml_backend_graph_compute(backend, s.gf) != GGML_STATUS_SUCCESS) {
                all_ok = false;
            }
        }
        ggml_backend_synchronize(backend);
        get_counts(&c, 1);
        const int64_t n     = (int64_t) reps * NODES;
        int64_t       total = 0;
        for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
            total += c.ran[i];
        }
        bool ok = c.ran[expect] == n && total == n && c.forced == (expect_forced ? n : 0) &&
                  c.ineligible == (expect_ineligible ? n : 0) && c.table == 0;
        double e = 0;
        if (ref) {
            e  = nmse(result(s), *ref);
            ok = ok && e < 5e-4;
        }
        all_ok = all_ok && ok;
        out += std::string(n_checks++ ? "," : "") + "{\"step\":\"" + label + "\",\"override\":\"" + names[route] +
               "\",\"expect\":\"" + names[expect] + "\",\"computes\":" + std::to_string(reps) +
               ",\"counts\":" + counts_json(c) + ",\"nmse\":" + std::to_string(e) + ",\"ok\":" + (ok ? "true" : "false") + "}";
    };

    // q4_0 weights, M = 8: stock on sm_90 runs mmvq (ne11 <= MMVQ_MAX_BATCH_SIZE)
    setup q = build(backend, GGML_TYPE_Q4_0);
    step("q4_0 stock, graph captured and replayed", q, nullptr, 0, 5, GGML_DISPATCH_ROUTE_MMVQ, false, false);
    const std::vector<float> ref_q = result(q);
    step("q4_0 override mmq", q, &ref_q, GGML_DISPATCH_ROUTE_MMQ, 4, GGML_DISPATCH_ROUTE_MMQ, true, false);
    step("q4_0 override cublas", q, &ref_q, GGML_DISPATCH_ROUTE_CUBLAS, 4, GGML_DISPATCH_ROUTE_CUBLAS, true, false);
    step("q4_0 override mmvf: ineligible, stock runs", q, &ref_q, GGML_DISPATCH_ROUTE_MMVF, 4, GGML_DISPATCH_ROUTE_MMVQ,
         false, true);
    step("q4_0 override mmvq (= stock's route)", q, &ref_q, GGML_DISPATCH_ROUTE_MMVQ, 4, GGML_DISPATCH_ROUTE_MMVQ, true,
         false);
    step("q4_0 override cleared", q, &ref_q, 0, 4, GGML_DISPATCH_ROUTE_MMVQ, false, false);

    // F16 weights, M = 8: stock on sm_90 runs mmf
    setup h = build(backend, GGML_TYPE_F16);
    step("f16 stock", h, nullptr, 0, 5, GGML_DISPATCH_ROUTE_MMF, false, false);
    const std::vector<float> ref_h = result(h);
    step("f16 override mmvf", h, &ref_h, GGML_DISPATCH_ROUTE_MMVF, 4, GGML_DISPATCH_ROUTE_MMVF, true, false);
    step("f16 override cublas", h, &ref_h, GGML_DISPATCH_ROUTE_CUBLAS, 4, GGML_DISPATCH_ROUTE_CUBLAS, true, false);
    step("f16 override mmq: ineligible, stock runs", h, &ref_h, GGML_DISPATCH_ROUTE_MMQ, 4, GGML_DISPATCH_ROUTE_MMF, false,
         true);
    step("f16 override cleared", h, &ref_h, 0, 4, GGML_DISPATCH_ROUTE_MMF, false, false);

    out += "],\"ok\":" + std::string(all_ok ? "true" : "false") + "}";
    std::printf("%s\n", out.c_str());
    ggml_backend_buffer_free(q.buf);
    ggml_free(q.ctx);
    ggml_backend_buffer_free(h.buf);
    ggml_free(h.ctx);
    ggml_backend_free(backend);
    return all_ok ? 0 : 1;
}
