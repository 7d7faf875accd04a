// Lab program (GPU): the weight cache's run-time rules, end to end, through the override API.
//
// q4_K weights 4096 x 4096 in a WEIGHTS buffer, two MUL_MAT nodes reading the same weight (tied
// embeddings) and one node whose weight sits in an ordinary buffer (an adapter), M = 256, computed
// repeatedly (CUDA graphs capture and replay where ggml-cuda uses them). Checks:
//   - bit-equal: the output of cublas/out=f16,compute=f16,weight=cached equals that of
//     cublas/out=f16,compute=f16 (per-call dequantization) byte for byte;
//   - one copy for the weight used twice: the cache's log line says 1 tensor, 4096*4096*2 bytes;
//   - the adapter's node is refused (counted ineligible) and runs uncached, its output bit-equal too;
//   - a set_tensor of the weight after it was cached: the next cached compute equals a per-call
//     compute on the new data (a stale copy would not) and no new copy is made (mutable);
//   - the buffer freed and a new weight buffer made: its cached compute equals its per-call compute;
//   - a failed allocation (VRAM taken by a large buffer first): one warning, the node runs uncached,
//     bit-equal, no abort.
// Prints one JSON object; exit 1 if any check fails. Needs GGML_CUDA_DISPATCH unset (table mode).
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cuda.h"
#include "ggml-dispatch.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

static const int K = 4096, N = 4096, M = 256;

static std::mutex               g_log_mu;
static std::vector<std::string> g_log;

static void log_cb(enum ggml_log_level level, const char * text, void *) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_log.emplace_back(text);
    std::fputs(text, stderr);
    (void) level;
}

static int count_log(const char * needle) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    int n = 0;
    for (const std::string & s : g_log) {
        n += s.find(needle) != std::string::npos;
    }
    return n;
}

static std::string last_log(const char * needle) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    for (auto it = g_log.rbegin(); it != g_log.rend(); ++it) {
        if (it->find(needle) != std::string::npos) {
            std::string s = *it;
            while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) {
                s.pop_back();
            }
            return s;
        }
    }
    return "";
}

struct model {
    ggml_context *        ctx_w = nullptr, *ctx = nullptr;
    ggml_backend_buffer_t buf_w = nullptr, buf_adapter = nullptr, buf = nullptr;
    ggml_tensor *         w = nullptr, *adapter = nullptr;
    ggml_cgraph *         gf = nullptr;
    ggml_tensor *         out[3];
};

static std::vector<uint8_t> quantized(uint32_t seed) {
    std::mt19937                          rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float>                    wf((size_t) K * N);
    for (float & v : wf) {
        v = dist(rng);
    }
    std::vector<uint8_t> wq(ggml_row_size(GGML_TYPE_Q4_K, K) * N);
    ggml_quantize_chunk(GGML_TYPE_Q4_K, wf.data(), wq.data(), 0, N, K, nullptr);
    return wq;
}

static model build(ggml_backend_t backend, uint32_t seed) {
    model            m;
    ggml_init_params params = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    m.ctx_w                 = ggml_init(params);
    m.w                     = ggml_new_tensor_2d(m.ctx_w, GGML_TYPE_Q4_K, K, N);
    ggml_set_name(m.w, "token_embd.weight");
    m.buf_w = ggml_backend_alloc_ctx_tensors(m.ctx_w, backend);
    ggml_backend_buffer_set_usage(m.buf_w, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    m.ctx       = ggml_init(params);
    m.adapter   = ggml_new_tensor_2d(m.ctx, GGML_TYPE_Q4_K, K, N);
    ggml_set_name(m.adapter, "adapter.weight");
    ggml_tensor * x[3];
    for (int i = 0; i < 3; ++i) {
        x[i] = ggml_new_tensor_2d(m.ctx, GGML_TYPE_F32, K, M);
    }
    m.out[0] = ggml_mul_mat(m.ctx, m.w, x[0]);
    m.out[1] = ggml_mul_mat(m.ctx, m.w, x[1]);
    m.out[2] = ggml_mul_mat(m.ctx, m.adapter, x[2]);
    m.gf     = ggml_new_graph(m.ctx);
    for (ggml_tensor * o : m.out) {
        ggml_build_forward_expand(m.gf, o);
    }
    m.buf = ggml_backend_alloc_ctx_tensors(m.ctx, backend);  // usage ANY, as an adapter's buffer

    const std::vector<uint8_t> wq = quantized(seed);
    ggml_backend_tensor_set(m.w, wq.data(), 0, wq.size());
    const std::vector<uint8_t> aq = quantized(seed + 1);
    ggml_backend_tensor_set(m.adapter, aq.data(), 0, aq.size());
    std::mt19937                          rng(seed + 2);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (ggml_tensor * t : x) {
        std::vector<float> xf((size_t) K * M);
        for (float & v : xf) {
            v = dist(rng);
        }
        ggml_backend_tensor_set(t, xf.data(), 0, ggml_nbytes(t));
    }
    return m;
}

static void release(model & m) {
    ggml_backend_buffer_free(m.buf);
    ggml_backend_buffer_free(m.buf_w);
    ggml_free(m.ctx);
    ggml_free(m.ctx_w);
    m = model();
}

static std::vector<uint8_t> bytes_of(const model & m) {
    std::vector<uint8_t> r;
    for (ggml_tensor * o : m.out) {
        std::vector<uint8_t> b(ggml_nbytes(o));
        ggml_backend_tensor_get(o, b.data(), 0, b.size());
        r.insert(r.end(), b.begin(), b.end());
    }
    return r;
}

int main() {
    ggml_log_set(log_cb, nullptr);
    ggml_backend_reg_t reg     = ggml_backend_cuda_reg();
    ggml_backend_t     backend = ggml_backend_cuda_init(0);
    if (!reg || !backend) {
        std::printf("{\"ok\":false,\"error\":\"no CUDA backend\"}\n");
        return 1;
    }
    auto set_override = (ggml_dispatch_set_override_t) ggml_backend_reg_get_proc_address(reg, GGML_DISPATCH_PROC_SET_OVERRIDE);
    auto get_counts   = (ggml_dispatch_get_counts_t) ggml_backend_reg_get_proc_address(reg, GGML_DISPATCH_PROC_GET_COUNTS);
    int32_t per_call = 0, cached = 0;
    if (!set_override || !get_counts || !ggml_dispatch_config_parse("cublas/out=f16,compute=f16", &per_call) ||
            !ggml_dispatch_config_parse("cublas/out=f16,compute=f16,weight=cached", &cached)) {
        std::printf("{\"ok\":false,\"error\":\"no dispatch hook or no cublas/weight=cached configuration\"}\n");
        return 1;
    }

    std::string out      = "{\"checks\":[";
    bool        all_ok   = true;
    int         n_checks = 0;
    auto        check    = [&](const char * what, bool ok, const std::string & detail) {
        all_ok = all_ok && ok;
        out += std::string(n_checks++ ? "," : "") + "{\"check\":\"" + what + "\",\"ok\":" + (ok ? "true" : "false") +
               ",\"detail\":\"" + detail + "\"}";
    };
    // computes `reps` times under `config`; returns the output bytes and the ineligible count
    auto run = [&](model & m, int config, int reps, int64_t * ineligible) {
        ggml_dispatch_counts c;
        get_counts(&c, 1);
        set_override(config);
        for (int r = 0; r < reps; ++r) {
            if (ggml_backend_graph_compute(backend, m.gf) != GGML_STATUS_SUCCESS) {
                all_ok = false;
            }
        }
        ggml_backend_synchronize(backend);
        get_counts(&c, 1);
        if (ineligible) {
            *ineligible = c.ineligible;
        }
        return bytes_of(m);
    };

    const char * grown = "ggml_cuda_dispatch: weight cache:";
    model        m     = build(backend, 1);
    int64_t      inel  = 0;
    const std::vector<uint8_t> ref = run(m, per_call, 4, &inel);
    check("per-call run: nothing refused", inel == 0, "ineligible " + std::to_string(inel));
    const std::vector<uint8_t> got = run(m, cached, 6, &inel);
    check("cached output bit-equal to per-call", got == ref, "bytes " + std::to_string(got.size()));
    check("adapter node refused each compute", inel == 6, "ineligible " + std::to_string(inel));
    const std::string line = last_log(grown);
    const std::string want = "1 tensors, " + std::to_string((size_t) K * N * 2) + " bytes";
    check("one copy for the weight used twice", line.find(want) != std::string::npos, line);

    // rewrite the weight: the copy must go, the tensor stays uncached
    const int before = count_log(grown);
    const std::vector<uint8_t> wq2 = quantized(7);
    ggml_backend_tensor_set(m.w, wq2.data(), 0, wq2.size());
    const std::vector<uint8_t> got2 = run(m, cached, 3, nullptr);
    const std::vector<uint8_t> ref2 = run(m, per_call, 3, nullptr);
    check("after set_tensor: cached run equals per-call on the new data", got2 == ref2 && got2 != ref, "");
    check("after set_tensor: no new copy", count_log(grown) == before, last_log(grown));

    // free the buffers, make a new model (likely at the same addresses): a stale copy would show
    release(m);
    model m2 = build(backend, 11);
    const std::vector<uint8_t> got3 = run(m2, cached, 3, nullptr);
    const std::vector<uint8_t> ref3 = run(m2, per_call, 3, nullptr);
    check("after buffer free: new weights cached afresh, bit-equal", got3 == ref3 && got3 != ref, last_log(grown));
    release(m2);

    // a failed allocation: take almost all free VRAM with one buffer, then ask for a new copy
    model m3 = build(backend, 21);
    const std::vector<uint8_t> ref4 = run(m3, per_call, 2, nullptr);  // the pool now holds the per-call scratch
    size_t free_b = 0, total_b = 0;
    ggml_backend_dev_memory(ggml_backend_get_device(backend), &free_b, &total_b);
    // leave less than one copy (32 MiB) free; a large allocation may need a little slack
    size_t                leave = 0;
    ggml_backend_buffer_t hog   = nullptr;
    for (size_t mib : {8, 16, 24}) {
        leave = mib << 20;
        hog   = free_b > leave ? ggml_backend_buft_alloc_buffer(ggml_backend_get_default_buffer_type(backend), free_b - leave)
                               : nullptr;
        if (hog != nullptr) {
            break;
        }
    }
    const int             warned_before = count_log("weight cache: cannot allocate");
    const std::vector<uint8_t> got4 = run(m3, cached, 2, nullptr);
    const int             warned = count_log("weight cache: cannot allocate") - warned_before;
    check("failed allocation: one warning, uncached, bit-equal", hog != nullptr && warned == 1 && got4 == ref4,
          "hog " + std::to_string(hog ? free_b - leave : 0) + " bytes, warnings " + std::to_string(warned));
    if (hog) {
        ggml_backend_buffer_free(hog);
    }
    release(m3);
    set_override(0);

    out += "],\"ok\":" + std::string(all_ok ? "true" : "false") + "}";
    std::printf("%s\n", out.c_str());
    ggml_backend_free(backend);
    return all_ok ? 0 : 1;
}
