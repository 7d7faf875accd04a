// ggml-dispatch: bookkeeping of the weight cache (persistent f16 copies of quantized weights that the
// cuBLAS configuration `cublas/weight=cached` reads instead of dequantizing on every call).
//
// Free of CUDA and ggml (C++17) so a host-only test drives it; ggml-dispatch-cache.cu supplies the
// allocator and the fill (the tree's own to-f16 converter, so a cached GEMM equals the per-call one).
//
// Rules kept here:
//  - a copy is keyed by (device, weight data pointer, type, elements): a tensor used by two nodes
//    (tied embeddings) has one copy;
//  - a copy is made only outside CUDA-graph capture; a node under capture runs uncached and the copy
//    is marked pending (the caller then makes captured graphs stale so the next evaluation runs
//    directly and makes it);
//  - the bytes of all copies never exceed the budget; a request over it, or one whose allocation
//    fails, runs uncached (an allocation failure is remembered, warned about once, never retried);
//  - a copy lives as long as its weight's buffer: freeing the buffer frees its copies; a write into
//    the buffer over a cached tensor (set_tensor, memset, copy, clear) frees that copy and marks the
//    tensor mutable, and a mutable tensor is never cached again (it may change).
//
// The same bookkeeping keeps the KV shadows (ggml-dispatch-kv-impl.cuh: f16 copies of a quantized KV
// cache, kept in step with the cache by the graph's own writes) with `follow_writes`: a write from
// outside the graph (a state restore) is refilled into the copy right after it (refill_written), so
// captured graphs stay valid; only a copy whose refill failed is marked stale and refreshed at its next
// direct use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace ggml_dispatch {

// GGML_CUDA_DISPATCH_CACHE: unset = no cap (the table's budget, or unlimited under force/override),
// "off" = 0, "<MiB>" = a cap of that many MiB. Anything else: cap 0 and an error text.
struct cache_env {
    bool        capped    = false;
    size_t      cap_bytes = 0;
    std::string error;
};

inline cache_env parse_cache_env(const char * value, const char * name = "GGML_CUDA_DISPATCH_CACHE") {
    cache_env e;
    if (value == nullptr || value[0] == '\0') {
        return e;
    }
    e.capped = true;
    if (std::strcmp(value, "off") == 0) {
        return e;
    }
    char *                   end = nullptr;
    const unsigned long long mib = std::strtoull(value, &end, 10);
    if (value[0] < '0' || value[0] > '9' || end == nullptr || *end != '\0' || mib > (1ull << 40)) {
        e.error = std::string(name) + "=" + value + " is not off or a number of MiB; caching nothing";
        return e;
    }
    e.cap_bytes = (size_t) mib << 20;
    return e;
}

// The budget in bytes: the table's (or unlimited without one), lowered by the environment's cap.
inline size_t cache_budget(bool unlimited, size_t table_bytes, const cache_env & env) {
    const size_t base = unlimited ? SIZE_MAX : table_bytes;
    return env.capped && env.cap_bytes < base ? env.cap_bytes : base;
}

enum cache_result {
    CACHE_HIT        = 0,  // the copy exists
    CACHE_MADE       = 1,  // made now
    CACHE_CAPTURING  = 2,  // under capture: run uncached, marked pending
    CACHE_NO_BUDGET  = 3,  // would exceed the budget: run uncached
    CACHE_ALLOC_FAIL = 4,  // allocation or fill failed (now or before): run uncached
    CACHE_MUTABLE    = 5,  // the tensor was written after it was cached: never cached again
    CACHE_REFRESHED  = 6,  // follow_writes: the copy was stale (its refill after an outside write failed), filled again
};

inline const char * cache_result_name(int r) {
    static const char * names[] = {"hit", "made", "capturing", "no_budget", "alloc_fail", "mutable", "refreshed"};
    return r >= 0 && r <= CACHE_REFRESHED ? names[r] : "invalid";
}

struct cache_key {
    int          device;
    const void * data;
    int          type;
    int64_t      nelements;

    bool operator<(const cache_key & o) const {
        return std::tie(device, data, type, nelements) < std::tie(o.device, o.data, o.type, o.nelements);
    }
};

struct cache_stats {
    size_t  bytes = 0, peak_bytes = 0, entries = 0;
    int64_t counts[CACHE_REFRESHED + 1] = {};
    int64_t freed = 0, invalidated = 0, refilled = 0;
};

class weight_cache {
  public:
    using alloc_fn = std::function<void *(int device, size_t bytes)>;
    using free_fn  = std::function<void(int device, void * p)>;
    using fill_fn  = std::function<bool(void * copy)>;  // fills the copy from the weight; false = failed

    // follow_writes: the tensors change by design (a KV cache): a write from outside is refilled into the
    // copy after it (refill_written) instead of freeing the copy and marking the tensor mutable.
    weight_cache(alloc_fn a, free_fn f, bool follow_writes = false) :
        alloc_(std::move(a)), free_(std::move(f)), follow_writes_(follow_writes) {}

    void set_budget(size_t bytes) {
        std::lock_guard<std::mutex> lock(mu_);
        budget_ = bytes;
    }

    size_t budget() const {
        std::lock_guard<std::mutex> lock(mu_);
        return budget_;
    }

    // Any entry (copy, pending, failed or mutable mark) at all: the write hooks return at once when not.
    bool empty() const { return n_tracked_.load() == 0; }

    // The copy of a weight, made now when absent and allowed. `buffer` and [lo, lo + size) identify the
    // weight's storage for the lifetime rules. *copy is the copy on CACHE_HIT / CACHE_MADE, else null.
    int acquire(const cache_key & k, const void * buffer, size_t size, size_t copy_bytes, bool capturing,
                const fill_fn & fill, void ** copy) {
        std::lock_guard<std::mutex> lock(mu_);
        *copy = nullptr;
        int r;
        auto it = entries_.find(k);
        if (it != entries_.end() && it->second.copy != nullptr && it->second.stale) {
            if (capturing) {
                r = CACHE_CAPTURING;  // refreshed at the next direct use; this node runs without the copy
            } else if (fill(it->second.copy)) {
                it->second.stale = false;
                *copy            = it->second.copy;
                r                = CACHE_REFRESHED;
            } else {
                release(k, it->second);
                it->second.state = ST_FAILED;
                r                = CACHE_ALLOC_FAIL;
            }
        } else if (it != entries_.end() && it->second.copy != nullptr) {
            *copy = it->second.copy;
            r     = CACHE_HIT;
        } else if (it != entries_.end() && it->second.state == ST_FAILED) {
            r = CACHE_ALLOC_FAIL;
        } else if (it != entries_.end() && it->second.state == ST_MUTABLE) {
            r = CACHE_MUTABLE;
        } else if (copy_bytes > budget_ || stats_.bytes > budget_ - copy_bytes) {
            r = CACHE_NO_BUDGET;
        } else if (capturing) {
            entry & e = track(k, buffer, size);
            e.state   = ST_PENDING;
            r         = CACHE_CAPTURING;
        } else {
            entry & e = track(k, buffer, size);
            void *  p = alloc_(k.device, copy_bytes);
            if (p != nullptr && !fill(p)) {
                free_(k.device, p);
                p = nullptr;
            }
            if (p == nullptr) {
                e.state = ST_FAILED;
                r       = CACHE_ALLOC_FAIL;
            } else {
                e.state = ST_CACHED;
                e.copy  = p;
                e.bytes = copy_bytes;
                stats_.bytes += copy_bytes;
                stats_.entries++;
                stats_.peak_bytes = stats_.bytes > stats_.peak_bytes ? stats_.bytes : stats_.peak_bytes;
                *copy             = p;
                r                 = CACHE_MADE;
            }
        }
        stats_.counts[r]++;
        return r;
    }

    // What acquire() would answer now, without making anything: CACHE_HIT, CACHE_MADE (a copy could be
    // made), CACHE_NO_BUDGET, CACHE_ALLOC_FAIL or CACHE_MUTABLE. The dispatch asks before it picks the
    // cached configuration, so a node whose copy cannot be had runs the table's uncached choice.
    int peek(const cache_key & k, size_t copy_bytes) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = entries_.find(k);
        if (it != entries_.end() && it->second.copy != nullptr) {
            return CACHE_HIT;
        }
        if (it != entries_.end() && it->second.state == ST_FAILED) {
            return CACHE_ALLOC_FAIL;
        }
        if (it != entries_.end() && it->second.state == ST_MUTABLE) {
            return CACHE_MUTABLE;
        }
        return copy_bytes > budget_ || stats_.bytes > budget_ - copy_bytes ? CACHE_NO_BUDGET : CACHE_MADE;
    }

    // The copy of a tensor whatever its state (null: none). The KV shadows' mirror of in-graph writes
    // asks it: a stale copy is written too (its refresh rewrites all of it anyway), so a graph captured
    // while it is stale still carries the mirror.
    void * lookup(const cache_key & k) const {
        if (empty()) {
            return nullptr;
        }
        std::lock_guard<std::mutex> lock(mu_);
        auto it = entries_.find(k);
        return it == entries_.end() ? nullptr : it->second.copy;
    }

    // A write into [lo, lo + size) of `buffer` (before it): the copies it touches are freed and their
    // tensors marked mutable. Returns how many copies were freed (the caller makes captured graphs stale).
    // follow_writes: nothing here; refill_written follows the write.
    int written(const void * buffer, const void * lo, size_t size) {
        if (empty() || follow_writes_) {
            return 0;
        }
        return each_overlapping(buffer, lo, size, [&](const cache_key & k, entry & e, size_t, size_t) {
            if (e.state == ST_MUTABLE) {
                return 0;
            }
            const int freed = release(k, e);
            e.state         = ST_MUTABLE;
            stats_.invalidated++;
            return freed;
        });
    }

    // follow_writes, after a write into [lo, lo + size) of `buffer`: `refill(key, copy, from, to)` brings
    // each fresh copy it touched up to date over the tensor's bytes [from, to) (offsets from the tensor's
    // start, clipped to it); a copy whose refill fails is marked stale (refreshed at its next direct use).
    // Returns how many were marked stale (the caller makes captured graphs stale).
    using refill_fn = std::function<bool(const cache_key & k, void * copy, size_t from, size_t to)>;
    int refill_written(const void * buffer, const void * lo, size_t size, const refill_fn & refill) {
        if (empty() || !follow_writes_) {
            return 0;
        }
        return each_overlapping(buffer, lo, size, [&](const cache_key & k, entry & e, size_t from, size_t to) {
            if (e.copy == nullptr || e.stale) {
                return 0;
            }
            if (refill(k, e.copy, from, to)) {
                stats_.refilled++;
                return 0;
            }
            e.stale = true;
            stats_.invalidated++;
            return 1;
        });
    }

    // The buffer is freed: every copy and mark of its weights goes. Returns how many copies were freed.
    int buffer_freed(const void * buffer) {
        if (empty()) {
            return 0;
        }
        std::lock_guard<std::mutex> lock(mu_);
        int n = 0;
        for (auto it = entries_.begin(); it != entries_.end();) {
            if (it->second.buffer != buffer) {
                ++it;
                continue;
            }
            n += release(it->first, it->second);
            it = entries_.erase(it);
            n_tracked_--;
        }
        return n;
    }

    // Frees every copy (process exit).
    void clear() {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto & kv : entries_) {
            release(kv.first, kv.second);
        }
        entries_.clear();
        n_tracked_ = 0;
    }

    bool pending(const cache_key & k) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = entries_.find(k);
        return it != entries_.end() && it->second.state == ST_PENDING;
    }

    cache_stats stats() const {
        std::lock_guard<std::mutex> lock(mu_);
        return stats_;
    }

  private:
    enum state_kind { ST_PENDING, ST_CACHED, ST_FAILED, ST_MUTABLE };

    struct entry {
        state_kind   state  = ST_PENDING;
        const void * buffer = nullptr;
        const char * lo = nullptr, *hi = nullptr;
        void *       copy  = nullptr;
        size_t       bytes = 0;
        bool         stale = false;  // follow_writes: written from outside since the last fill
    };

    // f(key, entry, from, to) for each entry of `buffer` that [lo, lo + size) overlaps, under the lock, with
    // the overlap as byte offsets into the entry's tensor; the sum of what f returns.
    template <typename F> int each_overlapping(const void * buffer, const void * lo, size_t size, F && f) {
        std::lock_guard<std::mutex> lock(mu_);
        const char * a = (const char *) lo;
        const char * b = a + size;
        int          n = 0;
        for (auto & kv : entries_) {
            entry & e = kv.second;
            if (e.buffer != buffer || e.hi <= a || e.lo >= b) {
                continue;
            }
            n += f(kv.first, e, (size_t) ((a > e.lo ? a : e.lo) - e.lo), (size_t) ((b < e.hi ? b : e.hi) - e.lo));
        }
        return n;
    }

    entry & track(const cache_key & k, const void * buffer, size_t size) {
        auto ins = entries_.emplace(k, entry());
        if (ins.second) {
            n_tracked_++;
        }
        entry & e = ins.first->second;
        e.buffer  = buffer;
        e.lo      = (const char *) k.data;
        e.hi      = e.lo + size;
        return e;
    }

    int release(const cache_key & k, entry & e) {
        if (e.copy == nullptr) {
            return 0;
        }
        free_(k.device, e.copy);
        e.copy  = nullptr;
        e.stale = false;
        stats_.bytes -= e.bytes;
        stats_.entries--;
        stats_.freed++;
        e.bytes = 0;
        return 1;
    }

    alloc_fn                       alloc_;
    free_fn                        free_;
    bool                           follow_writes_ = false;
    mutable std::mutex             mu_;
    std::map<cache_key, entry>     entries_;
    std::atomic<size_t>            n_tracked_{0};
    size_t                         budget_ = 0;
    cache_stats                    stats_;
};

}  // namespace ggml_dispatch
