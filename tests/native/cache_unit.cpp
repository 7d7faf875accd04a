// Drives the weight cache's bookkeeping (ggml_dispatch/hook/native/ggml-dispatch-cache.h) the way
// ggml-dispatch-cache-impl.cuh does, with a host allocator that can be told to fail. Prints one JSON
// object of observations; tests/test_native_cache.py asserts on it.
#include "ggml-dispatch-cache.h"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

using namespace ggml_dispatch;

static std::set<void *> g_live;
static int              g_allocs = 0, g_frees = 0, g_fills = 0;
static bool             g_fail_alloc = false, g_fail_fill = false;

static std::string out;
static void kv(const char * k, long long v) {
    out += (out.empty() ? "{\"" : ",\"") + std::string(k) + "\":" + std::to_string(v);
}
static void ks(const char * k, const std::string & v) {
    out += (out.empty() ? "{\"" : ",\"") + std::string(k) + "\":\"" + v + "\"";
}

int main() {
    weight_cache c(
        [](int, size_t bytes) -> void * {
            if (g_fail_alloc) {
                return nullptr;
            }
            void * p = std::malloc(bytes);
            g_live.insert(p);
            g_allocs++;
            return p;
        },
        [](int, void * p) {
            g_live.erase(p);
            g_frees++;
            std::free(p);
        });
    const weight_cache::fill_fn fill = [](void *) {
        g_fills++;
        return !g_fail_fill;
    };

    // two weight buffers; weights are byte ranges inside them
    static char buf_a[4096], buf_b[4096], buf_adapter[64];
    const void * A = buf_a;
    const void * B = buf_b;
    void *       copy = nullptr;

    c.set_budget(1000);
    kv("empty_at_start", c.empty());
    // budget 1000: two copies of 400 fit, the third does not
    const cache_key w0{0, buf_a + 0, 12, 200}, w1{0, buf_a + 1024, 12, 200}, w2{0, buf_b, 12, 200};
    kv("w0_first", c.acquire(w0, A, 112, 400, false, fill, &copy));
    void * w0_copy = copy;
    kv("w0_second", c.acquire(w0, A, 112, 400, false, fill, &copy));  // tied embeddings: same copy
    kv("w0_same_copy", copy == w0_copy);
    kv("fills_after_reuse", g_fills);
    kv("w1", c.acquire(w1, A, 112, 400, false, fill, &copy));
    kv("w2_over_budget", c.acquire(w2, B, 112, 400, false, fill, &copy));
    kv("w2_copy_null", copy == nullptr);
    kv("bytes_full", (long long) c.stats().bytes);

    // the same weight on another device is another copy
    const cache_key w0_dev1{1, buf_a + 0, 12, 200};
    kv("other_device_over_budget", c.acquire(w0_dev1, A, 112, 400, false, fill, &copy));

    // a write into buffer A that touches w1 only frees w1 and marks it mutable
    kv("written_freed", c.written(A, buf_a + 1024 + 50, 10));
    kv("w1_after_write", c.acquire(w1, A, 112, 400, false, fill, &copy));
    kv("w0_still_hit", c.acquire(w0, A, 112, 400, false, fill, &copy));
    kv("bytes_after_write", (long long) c.stats().bytes);
    // a write into another buffer over the same addresses' neighbourhood touches nothing of A
    kv("written_other_buffer", c.written(B, buf_a, 4096));
    // a write next to a copy (not overlapping) frees nothing
    kv("written_adjacent", c.written(A, buf_a + 112, 100));

    // under capture: no allocation, pending; made at the next direct call
    const int allocs_before = g_allocs;
    kv("w2_capturing", c.acquire(w2, B, 112, 400, true, fill, &copy));
    kv("w2_pending", c.pending(w2));
    kv("allocs_during_capture", g_allocs - allocs_before);
    kv("w2_direct", c.acquire(w2, B, 112, 400, false, fill, &copy));
    kv("w2_pending_after", c.pending(w2));

    // freeing buffer A frees w0 (w1 is already gone) and forgets the mutable mark
    kv("freed_with_buffer", c.buffer_freed(A));
    kv("bytes_after_free", (long long) c.stats().bytes);
    kv("w1_after_buffer_reuse", c.acquire(w1, A, 112, 400, false, fill, &copy));

    // a failed allocation runs uncached, is remembered, not retried
    c.set_budget(SIZE_MAX);
    g_fail_alloc = true;
    const cache_key w3{0, buf_adapter, 12, 10};
    kv("w3_alloc_fail", c.acquire(w3, buf_adapter, 10, 20, false, fill, &copy));
    g_fail_alloc = false;
    const int allocs_fail = g_allocs;
    kv("w3_retry", c.acquire(w3, buf_adapter, 10, 20, false, fill, &copy));
    kv("allocs_on_retry", g_allocs - allocs_fail);
    // a failed fill frees what it allocated
    g_fail_fill = true;
    const cache_key w4{0, buf_adapter + 32, 12, 10};
    kv("w4_fill_fail", c.acquire(w4, buf_adapter, 10, 20, false, fill, &copy));
    g_fail_fill = false;

    // budget 0 caches nothing
    c.set_budget(0);
    const cache_key w5{0, buf_b + 2048, 12, 1};
    kv("budget0", c.acquire(w5, B, 1, 2, false, fill, &copy));

    const cache_stats s = c.stats();
    kv("peak_bytes", (long long) s.peak_bytes);
    kv("invalidated", s.invalidated);
    kv("made", s.counts[CACHE_MADE]);
    kv("hits", s.counts[CACHE_HIT]);
    kv("no_budget", s.counts[CACHE_NO_BUDGET]);
    c.clear();
    kv("live_after_clear", (long long) g_live.size());
    kv("allocs", g_allocs);
    kv("frees", g_frees);
    kv("empty_after_clear", c.empty());

    // the environment's cap
    const cache_env unset = parse_cache_env(nullptr), off = parse_cache_env("off"), mib = parse_cache_env("512"),
                    bad = parse_cache_env("lots"), neg = parse_cache_env("-5");
    kv("budget_unset_table", (long long) cache_budget(false, 3 << 20, unset));
    kv("budget_unset_forced_unlimited", cache_budget(true, 0, unset) == SIZE_MAX);
    kv("budget_off", (long long) cache_budget(true, 3 << 20, off));
    kv("budget_lowered", (long long) cache_budget(false, 1024ll << 20, mib));
    kv("budget_not_raised", (long long) cache_budget(false, 3 << 20, mib));
    kv("budget_bad", (long long) cache_budget(false, 3 << 20, bad));
    ks("bad_error", bad.error);
    kv("neg_capped", neg.capped && !neg.error.empty());

    // follow_writes (the KV shadows): an outside write leaves the weight-cache side alone (written), is
    // refilled over the bytes it touched right after it (refill_written, the range clipped to the tensor);
    // a failed refill marks the copy stale, the next direct use fills it again in place, a use under
    // capture runs without it, and the buffer's free still frees it
    {
        weight_cache kvc([](int, size_t bytes) -> void * { g_allocs++; return std::malloc(bytes); },
                         [](int, void * p) { g_frees++; std::free(p); }, true);
        kvc.set_budget(1000);
        char         kv_buf[256];
        const void * KB = kv_buf;
        const cache_key k0{0, kv_buf, 8, 100};
        void * first = nullptr, * again = nullptr;
        int    fills = 0;
        auto   count = [&](void *) { fills++; return true; };
        size_t from = 999, to = 999;
        int    refills = 0;
        auto   refill_ok = [&](const cache_key &, void * c, size_t f, size_t t) {
            refills += c == first;
            from = f;
            to   = t;
            return true;
        };
        auto refill_fail = [&](const cache_key &, void *, size_t, size_t) { return false; };
        kv("kv_made", kvc.acquire(k0, KB, 100, 200, false, count, &first));
        kv("kv_lookup_same", kvc.lookup(k0) == first);
        kv("kv_written_before_nothing", kvc.written(KB, kv_buf + 10, 4));
        kv("kv_refilled_none_stale", kvc.refill_written(KB, kv_buf + 10, 4, refill_ok));
        kv("kv_refill_range", (long long) (from * 1000 + to));
        kv("kv_refill_clipped", kvc.refill_written(KB, kv_buf + 90, 100, refill_ok));
        kv("kv_refill_clipped_range", (long long) (from * 1000 + to));
        kv("kv_refill_outside", kvc.refill_written(KB, kv_buf + 150, 10, refill_ok));
        kv("kv_refill_other_buffer", kvc.refill_written(kv_buf + 1, kv_buf + 10, 4, refill_ok));
        kv("kv_refills", refills);
        kv("kv_refilled_stat", (long long) kvc.stats().refilled);
        kv("kv_hit_after_refill", kvc.acquire(k0, KB, 100, 200, false, count, &again));
        kv("kv_refill_failed_marks", kvc.refill_written(KB, kv_buf + 10, 4, refill_fail));
        kv("kv_refill_failed_again", kvc.refill_written(KB, kv_buf + 10, 4, refill_fail));  // already stale
        kv("kv_lookup_while_stale", kvc.lookup(k0) == first);
        kv("kv_stale_under_capture", kvc.acquire(k0, KB, 100, 200, true, count, &again));
        kv("kv_capture_copy_null", again == nullptr);
        kv("kv_refreshed", kvc.acquire(k0, KB, 100, 200, false, count, &again));
        kv("kv_refreshed_in_place", again == first);
        kv("kv_fills", fills);
        kv("kv_hit_after_refresh", kvc.acquire(k0, KB, 100, 200, false, count, &again));
        kv("kv_bytes", (long long) kvc.stats().bytes);
        kv("kv_freed_with_buffer", kvc.buffer_freed(KB));
        kv("kv_lookup_after_free", kvc.lookup(k0) == nullptr);
        kv("kv_empty_after_free", kvc.empty());
    }
    std::printf("%s}\n", out.c_str());
    return 0;
}
