// ggml-dispatch: tokens-per-expert statistics of one MUL_MAT_ID call and its routing bucket.
//
// Plain C++ usable in host and device code (no CUDA, no ggml): the trace's device kernel
// (ggml-dispatch-moe.cuh) calls it on the expert counts of one call, a host test calls it on the same
// counts, and ggml_dispatch/registry.py (routing_bucket) spells the same rule for the Python stages.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#    define GGML_DISPATCH_HD __host__ __device__
#else
#    define GGML_DISPATCH_HD
#endif

// Routing buckets (a MulMatIdKey's `routing`; 0 = any routing). Generated names live in the registry.
enum {
    GGML_DISPATCH_ROUTING_ANY          = 0,
    GGML_DISPATCH_ROUTING_SPREAD       = 1,  // tokens reach >= half the experts they could, CV <= 1
    GGML_DISPATCH_ROUTING_SKEWED       = 2,  // neither spread nor concentrated
    GGML_DISPATCH_ROUTING_CONCENTRATED = 3,  // tokens on < 1/8 of the experts they could reach
    GGML_DISPATCH_ROUTING_COUNT        = 4,
};

struct ggml_dispatch_moe_call {
    int64_t picks;     // (token, slot) pairs with a valid expert id
    int32_t nonempty;  // experts that got at least one token
    int32_t max;       // tokens of the busiest expert
    double  mean;      // tokens per non-empty expert
    double  cv;        // coefficient of variation of tokens over the non-empty experts (population)
    int32_t routing;   // GGML_DISPATCH_ROUTING_*
};

// The bucket of a call: coverage = nonempty / min(E, picks).
static GGML_DISPATCH_HD inline int ggml_dispatch_routing_bucket(int64_t picks, int32_t nonempty, double cv, int64_t E) {
    if (picks <= 0 || nonempty <= 0) {
        return GGML_DISPATCH_ROUTING_CONCENTRATED;
    }
    const int64_t reach = picks < E ? picks : E;
    if (2 * (int64_t) nonempty >= reach && cv <= 1.0) {
        return GGML_DISPATCH_ROUTING_SPREAD;
    }
    if (8 * (int64_t) nonempty < reach) {
        return GGML_DISPATCH_ROUTING_CONCENTRATED;
    }
    return GGML_DISPATCH_ROUTING_SKEWED;
}

// Statistics of one call from its per-expert token counts counts[0..E-1].
static GGML_DISPATCH_HD inline ggml_dispatch_moe_call ggml_dispatch_moe_stats(const int32_t * counts, int64_t E) {
    ggml_dispatch_moe_call c = {0, 0, 0, 0.0, 0.0, GGML_DISPATCH_ROUTING_CONCENTRATED};
    double sumsq = 0.0;
    for (int64_t e = 0; e < E; ++e) {
        const int32_t n = counts[e];
        if (n <= 0) {
            continue;
        }
        c.picks += n;
        c.nonempty += 1;
        c.max = n > c.max ? n : c.max;
        sumsq += (double) n * (double) n;
    }
    if (c.nonempty > 0) {
        c.mean = (double) c.picks / c.nonempty;
        const double var = sumsq / c.nonempty - c.mean * c.mean;
        c.cv = var > 0.0 ? sqrt(var) / c.mean : 0.0;
    }
    c.routing = ggml_dispatch_routing_bucket(c.picks, c.nonempty, c.cv, E);
    return c;
}

// Sums over the calls of one trace key (calls captured in a CUDA graph add up on every replay).
struct ggml_dispatch_moe_acc {
    uint64_t calls;
    uint64_t routing[GGML_DISPATCH_ROUTING_COUNT];  // calls per bucket ([0] unused)
    double   picks, nonempty, max, mean, cv;        // sums of the per-call values
    double   max_max;                               // the largest per-call max seen
};

static GGML_DISPATCH_HD inline void ggml_dispatch_moe_add(ggml_dispatch_moe_acc * a, const ggml_dispatch_moe_call & c) {
    a->calls += 1;
    a->routing[c.routing] += 1;
    a->picks += (double) c.picks;
    a->nonempty += c.nonempty;
    a->max += c.max;
    a->mean += c.mean;
    a->cv += c.cv;
    a->max_max = c.max > a->max_max ? c.max : a->max_max;
}

#if defined(__cplusplus)
#    include <cstdio>
#    include <string>

// The trace member of one key's sums (`,"experts":{...}`; empty when no call was sampled): means per
// sampled call, the largest max, and the calls per routing bucket [spread, skewed, concentrated].
inline std::string ggml_dispatch_moe_json(const ggml_dispatch_moe_acc & a) {
    if (a.calls == 0) {
        return "";
    }
    const double n = (double) a.calls;
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  ",\"experts\":{\"sampled\":%llu,\"picks\":%.6g,\"nonempty\":%.6g,\"max\":%.6g,\"max_max\":%.0f,"
                  "\"mean\":%.6g,\"cv\":%.6g,\"routing\":[%llu,%llu,%llu]}",
                  (unsigned long long) a.calls, a.picks / n, a.nonempty / n, a.max / n, a.max_max, a.mean / n,
                  a.cv / n, (unsigned long long) a.routing[1], (unsigned long long) a.routing[2],
                  (unsigned long long) a.routing[3]);
    return buf;
}
#endif
