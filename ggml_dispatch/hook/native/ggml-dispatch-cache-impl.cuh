// ggml-dispatch: the weight cache's CUDA side (included once, by ggml-dispatch.cu).
//
// Copies are cudaMalloc'd (not from a context's pool: weights outlive contexts) and filled on the
// node's stream by ggml_get_to_fp16_cuda(type), the converter the per-call path runs, then the stream
// is synchronized once so any other stream may read the copy. The budget (bytes, over all devices)
// comes from the table (GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES), or is unlimited under a forced
// configuration or a harness override, and GGML_CUDA_DISPATCH_CACHE=off|<MiB> lowers it.
#pragma once

#include "ggml-dispatch-cache.cuh"
#include "ggml-dispatch-cache.h"
#include "ggml-dispatch-params.h"
#include "convert.cuh"

#include <atomic>
#include <string>

// Makes every captured CUDA graph stale (defined in ggml-dispatch.cu): a graph that read a freed copy,
// or that ran uncached because its copy was pending, is captured again.
void ggml_cuda_dispatch_graphs_stale();

namespace {

// Runs f on `device` and gives the calling thread its current device back (a buffer may be freed from
// any thread, which must not find its device changed).
template <typename F> static auto on_device(int device, F f) -> decltype(f()) {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void) cudaGetLastError();
        prev = -1;
    }
    ggml_cuda_set_device(device);
    auto r = f();
    if (prev >= 0 && prev != device) {
        (void) cudaSetDevice(prev);
    }
    return r;
}

static void * device_alloc(int device, size_t bytes) {
    return on_device(device, [bytes]() -> void * {
        void * p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void) cudaGetLastError();
            return nullptr;
        }
        return p;
    });
}

static void device_free(int device, void * p) {
    on_device(device, [p]() {
        CUDA_CHECK(cudaFree(p));
        return 0;
    });
}

// The KV shadows' share of the buffer hooks (ggml-dispatch-kv-impl.cuh): after a write, how many shadows
// could not be refilled over it (marked stale); how many a buffer's free freed.
static int kv_shadow_refill_written(ggml_backend_buffer_t buffer, const void * lo, size_t size);
static int kv_shadow_buffer_freed(ggml_backend_buffer_t buffer);

// A store of persistent f16 copies under a budget: the weight cache here, the KV shadows
// (ggml-dispatch-kv-impl.cuh). The budget is the table's, or unlimited under force: and harness
// overrides, lowered by the environment variable `env_name`.
struct copy_store {
    ggml_dispatch::weight_cache cache;
    const char *                env_name;
    const char *                label;  // in the start-up and growth lines
    ggml_dispatch::cache_env    env;
    size_t                      table_bytes = 0;
    std::atomic<bool>           warned_alloc{false};
    std::atomic<int64_t>        logged_made{0};  // copies made when the last growth line was logged

    copy_store(const char * env_name, const char * label, bool follow_writes) :
        cache(device_alloc, device_free, follow_writes), env_name(env_name), label(label) {}
};

struct cache_state : copy_store {
    // GGML_CUDA_DISPATCH_CACHE_BUFFERS=any: weights of any non-compute buffer are cached too (for
    // test-backend-ops, whose weights are not in WEIGHTS buffers); default: WEIGHTS buffers only
    bool any_buffer = false;

    cache_state() : copy_store("GGML_CUDA_DISPATCH_CACHE", "weight cache", /*follow_writes =*/ false) {}
};

static cache_state & cache_st() {
    static cache_state * s = new cache_state();  // never destroyed: buffers may be freed at exit
    return *s;
}

static std::string mib_text(size_t bytes) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.1f MiB", (double) bytes / (1024.0 * 1024.0));
    return buf;
}

static std::string budget_text(size_t bytes) {
    return bytes == SIZE_MAX ? std::string("unlimited") : mib_text(bytes);
}

// Sets a store's budget; returns the text for the start-up line ("" when there is nothing to say).
static std::string store_configure(copy_store & st, bool unlimited, size_t table_bytes, const char * env_value) {
    st.env         = ggml_dispatch::parse_cache_env(env_value, st.env_name);
    st.table_bytes = table_bytes;
    const size_t b = ggml_dispatch::cache_budget(unlimited, table_bytes, st.env);
    st.cache.set_budget(b);
    if (!st.env.error.empty()) {
        return "; " + st.env.error;
    }
    if (!unlimited && table_bytes == 0 && !st.env.capped) {
        return "";
    }
    std::string s = std::string("; ") + st.label + " budget " + budget_text(b);
    s += unlimited ? " (forced configurations)" : " (table " + mib_text(table_bytes) + ")";
    if (st.env.capped) {
        s += std::string(", ") + st.env_name + "=" + env_value;
    }
    return s;
}

// A harness override may name a configuration that reads a copy: while one is set the budget is
// unlimited (lowered by the environment); cleared, the table's budget applies again.
static void store_forced(copy_store & st, bool on, bool force_mode) {
    st.cache.set_budget(ggml_dispatch::cache_budget(on || force_mode, st.table_bytes, st.env));
}

// One line when an evaluation made copies: how many bytes a store holds now.
static void store_log_growth(copy_store & st) {
    const ggml_dispatch::cache_stats s = st.cache.stats();
    if (s.counts[ggml_dispatch::CACHE_MADE] == st.logged_made.load()) {
        return;  // no copy made since the last line
    }
    st.logged_made = s.counts[ggml_dispatch::CACHE_MADE];
    GGML_LOG_INFO("ggml_cuda_dispatch: %s: %zu tensors, %zu bytes (%s) cached of a budget of %s; %lld "
                  "requests over budget, %lld failed allocations\n",
                  st.label, s.entries, s.bytes, mib_text(s.bytes).c_str(), budget_text(st.cache.budget()).c_str(),
                  (long long) s.counts[ggml_dispatch::CACHE_NO_BUDGET],
                  (long long) s.counts[ggml_dispatch::CACHE_ALLOC_FAIL]);
}

static std::string cache_configure(bool unlimited, size_t table_bytes, const char * env_value) {
    cache_state & cs     = cache_st();
    std::string   s      = store_configure(cs, unlimited, table_bytes, env_value);
    const char *  buffers = std::getenv("GGML_CUDA_DISPATCH_CACHE_BUFFERS");
    cs.any_buffer         = buffers != nullptr && std::strcmp(buffers, "any") == 0;
    if (cs.any_buffer && cs.env.error.empty() && !s.empty()) {
        s += ", every non-compute buffer";
    }
    return s;
}

// Can a node of weight src0 read a cached copy now (one exists, or one may be made: a weight of a plain
// CUDA buffer of usage WEIGHTS, convertible, within the budget, not under capture)? Asked by the dispatch
// before it runs a table's cached configuration; when not, the table's uncached choice runs instead.
static bool cache_can_serve(int device, cudaStream_t stream, const ggml_tensor * src0) {
    cache_state & cs = cache_st();
    if (src0->buffer == nullptr || src0->type == GGML_TYPE_F16 || ggml_get_to_fp16_cuda(src0->type) == nullptr ||
            ggml_backend_buffer_get_type(src0->buffer) != ggml_backend_cuda_buffer_type(device) ||
            !ggml_is_contiguously_allocated(src0)) {
        return false;
    }
    const int usage = (int) ggml_backend_buffer_get_usage(src0->buffer);
    if (usage != GGML_BACKEND_BUFFER_USAGE_WEIGHTS && !(cs.any_buffer && usage != GGML_BACKEND_BUFFER_USAGE_COMPUTE)) {
        return false;
    }
    const int64_t n = ggml_nelements(src0);
    const int     r = cs.cache.peek(ggml_dispatch::cache_key{device, src0->data, (int) src0->type, n}, (size_t) n * sizeof(half));
    if (r == ggml_dispatch::CACHE_HIT) {
        return true;
    }
    if (r != ggml_dispatch::CACHE_MADE) {
        return false;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
        (void) cudaGetLastError();
        return false;
    }
    if (capture != cudaStreamCaptureStatusNone) {
        // the next direct evaluation makes the copy: captured graphs go stale once per such weight
        void * none = nullptr;
        cs.cache.acquire(ggml_dispatch::cache_key{device, src0->data, (int) src0->type, n}, src0->buffer,
                         ggml_nbytes(src0), (size_t) n * sizeof(half), true, [](void *) { return false; }, &none);
        ggml_cuda_dispatch_graphs_stale();
        return false;
    }
    return true;
}

}  // namespace

const void * ggml_cuda_dispatch_cached_weight(int device, cudaStream_t stream, const ggml_tensor * src0,
                                              ggml_type compute_type, bool cuda_buffer) {
    ggml_dispatch_params & p       = ggml_dispatch_params_current();
    const to_fp16_cuda_t   convert = ggml_get_to_fp16_cuda(src0->type);
    cache_state &          cs      = cache_st();
    const int usage = src0->buffer != nullptr ? (int) ggml_backend_buffer_get_usage(src0->buffer) : -1;
    const bool weights = usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS ||
                         (cs.any_buffer && usage >= 0 && usage != GGML_BACKEND_BUFFER_USAGE_COMPUTE);
    if (compute_type != GGML_TYPE_F16 || src0->type == GGML_TYPE_F16 || convert == nullptr || !cuda_buffer ||
            !weights || !ggml_is_contiguously_allocated(src0)) {
        p.refused = 1;
        return nullptr;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
        (void) cudaGetLastError();
        capture = cudaStreamCaptureStatusActive;  // unknown: do not allocate
    }
    const int64_t                  n = ggml_nelements(src0);
    const ggml_dispatch::cache_key k{device, src0->data, (int) src0->type, n};
    void *                         copy = nullptr;
    const int r = cs.cache.acquire(k, src0->buffer, ggml_nbytes(src0), (size_t) n * sizeof(half),
                                   capture != cudaStreamCaptureStatusNone,
                                   [&](void * dst) {
                                       convert(src0->data, (half *) dst, n, stream);
                                       if (cudaStreamSynchronize(stream) != cudaSuccess) {
                                           (void) cudaGetLastError();
                                           return false;
                                       }
                                       return true;
                                   },
                                   &copy);
    if (r == ggml_dispatch::CACHE_CAPTURING) {
        ggml_cuda_dispatch_graphs_stale();  // the next evaluation runs directly and makes the copy
    } else if (r == ggml_dispatch::CACHE_ALLOC_FAIL && !cs.warned_alloc.exchange(true)) {
        GGML_LOG_WARN("ggml_cuda_dispatch: weight cache: cannot allocate %zu bytes for %s on device %d; "
                      "it and any later failure run uncached\n",
                      (size_t) n * sizeof(half), src0->name, device);
    }
    return copy;
}

void ggml_cuda_dispatch_cache_written(ggml_backend_buffer_t buffer, const void * lo, size_t size) {
    if (cache_st().cache.written(buffer, lo, size) > 0) {
        ggml_cuda_dispatch_graphs_stale();
    }
}

void ggml_cuda_dispatch_cache_written_after(ggml_backend_buffer_t buffer, const void * lo, size_t size) {
    if (kv_shadow_refill_written(buffer, lo, size) > 0) {
        ggml_cuda_dispatch_graphs_stale();
    }
}

void ggml_cuda_dispatch_cache_buffer_freed(ggml_backend_buffer_t buffer) {
    const int n = (cache_st().cache.empty() ? 0 : cache_st().cache.buffer_freed(buffer)) + kv_shadow_buffer_freed(buffer);
    if (n > 0) {
        ggml_cuda_dispatch_graphs_stale();
    }
}
