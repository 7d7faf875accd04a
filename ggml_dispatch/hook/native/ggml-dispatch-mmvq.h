// ggml-dispatch: mmvq's candidate launch shapes (feature mmvq_params), shared by the instances in mmvq.cu
// (ggml-dispatch-mmvq.cuh) and the eligibility check in ggml-dispatch.cu.
//
// The candidates, warps per block x rows per block, each uncapped and under each register cap, are generated
// by the registry (ggml_dispatch/registry.py MMVQ_CANDIDATES) into ggml-dispatch-codes.h as
// GGML_DISPATCH_MMVQ_CONFIG_LIST; a candidate's index there is 1 + its position, and index 0 is the tree's own
// constexpr table (calc_nwarps, calc_rows_per_block). Which of them are compiled, and for which weight types,
// is a build choice (each is 8 kernels per type, ncols_dst 1..8): GGML_DISPATCH_MMVQ_CONFIGS ("4x1,8x1,4x2",
// "all" or "none"), GGML_DISPATCH_MMVQ_TYPES ("q4_K,q6_K" or "all") and GGML_DISPATCH_MMVQ_REGS (the caps the
// pairs are compiled under too: "64", "all" or "none"), string literals with items separated by commas,
// semicolons, colons or spaces. Install writes them into ggml-dispatch-build.h (--mmvq-configs, --mmvq-types); a compile
// definition of the same name wins; without either, the registry's defaults. Both sides of the build read the
// same set through these functions, so a configuration the build lacks is ineligible, never a wrong kernel.
#pragma once

#include "ggml-dispatch-codes.h"
#if defined(__has_include)
#if __has_include("ggml-dispatch-build.h")
#include "ggml-dispatch-build.h"
#endif
#endif

#ifndef GGML_DISPATCH_MMVQ_CONFIGS
#define GGML_DISPATCH_MMVQ_CONFIGS GGML_DISPATCH_MMVQ_DEFAULT_CONFIGS
#endif
#ifndef GGML_DISPATCH_MMVQ_TYPES
#define GGML_DISPATCH_MMVQ_TYPES GGML_DISPATCH_MMVQ_DEFAULT_TYPES
#endif
#ifndef GGML_DISPATCH_MMVQ_REGS
#define GGML_DISPATCH_MMVQ_REGS GGML_DISPATCH_MMVQ_DEFAULT_REGS
#endif

#ifdef __CUDACC__
#define GGML_DISPATCH_MMVQ_HD __host__ __device__
#else
#define GGML_DISPATCH_MMVQ_HD
#endif

// Warps per block of candidate `cfg`, or `stock` for index 0 (and any index that is not a candidate).
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_nwarps_or(int cfg, int stock) {
#define GGML_DISPATCH_MMVQ_NWARPS_OF(i, w, r, g) if (cfg == (i)) { return (w); }
    GGML_DISPATCH_MMVQ_CONFIG_LIST(GGML_DISPATCH_MMVQ_NWARPS_OF)
#undef GGML_DISPATCH_MMVQ_NWARPS_OF
    return stock;
}

// Rows per block of candidate `cfg`, or `stock` for index 0.
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_rows_or(int cfg, int stock) {
#define GGML_DISPATCH_MMVQ_ROWS_OF(i, w, r, g) if (cfg == (i)) { return (r); }
    GGML_DISPATCH_MMVQ_CONFIG_LIST(GGML_DISPATCH_MMVQ_ROWS_OF)
#undef GGML_DISPATCH_MMVQ_ROWS_OF
    return stock;
}

// Register cap of candidate `cfg` (0: none, as for index 0).
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_regs_of(int cfg) {
#define GGML_DISPATCH_MMVQ_REGS_OF(i, w, r, g) if (cfg == (i)) { return (g); }
    GGML_DISPATCH_MMVQ_CONFIG_LIST(GGML_DISPATCH_MMVQ_REGS_OF)
#undef GGML_DISPATCH_MMVQ_REGS_OF
    return 0;
}

// The kernel's __launch_bounds__ minimum blocks per SM for candidate `cfg`: 65536 registers over the cap times
// the block's threads, so the compiler keeps to the cap; 1 without a cap (upstream's).
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_min_blocks(int cfg, int warp_size) {
    const int g = ggml_dispatch_mmvq_regs_of(cfg);
    const int w = ggml_dispatch_mmvq_nwarps_or(cfg, 0);
    const int b = g > 0 && w > 0 ? 65536 / (g * w * warp_size) : 1;
    return b > 0 ? b : 1;
}

// The candidate index of nwarps x rows under register cap `regs` (0: none; the index 0 result: not a candidate).
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_index(int nwarps, int rows, int regs = 0) {
#define GGML_DISPATCH_MMVQ_INDEX_OF(i, w, r, g) if (nwarps == (w) && rows == (r) && regs == (g)) { return (i); }
    GGML_DISPATCH_MMVQ_CONFIG_LIST(GGML_DISPATCH_MMVQ_INDEX_OF)
#undef GGML_DISPATCH_MMVQ_INDEX_OF
    return 0;
}

// The ggml type name of an mmvq weight type id (nullptr: mmvq launches no such type).
GGML_DISPATCH_MMVQ_HD static constexpr const char * ggml_dispatch_mmvq_type_name(int type) {
#define GGML_DISPATCH_MMVQ_TYPE_OF(id, name) if (type == (id)) { return name; }
    GGML_DISPATCH_MMVQ_TYPE_LIST(GGML_DISPATCH_MMVQ_TYPE_OF)
#undef GGML_DISPATCH_MMVQ_TYPE_OF
    return nullptr;
}

GGML_DISPATCH_MMVQ_HD static constexpr bool ggml_dispatch_mmvq_sep(char c) {
    return c == ',' || c == ';' || c == ':' || c == ' ';
}

// Item `n` (0-based) of a list as [*begin, *end); false past the last item.
GGML_DISPATCH_MMVQ_HD static constexpr bool ggml_dispatch_mmvq_item(const char * list, int n, const char ** begin,
                                                                    const char ** end) {
    const char * s = list;
    for (int k = 0;; ++k) {
        while (*s != '\0' && ggml_dispatch_mmvq_sep(*s)) {
            ++s;
        }
        if (*s == '\0') {
            return false;
        }
        const char * e = s;
        while (*e != '\0' && !ggml_dispatch_mmvq_sep(*e)) {
            ++e;
        }
        if (k == n) {
            *begin = s;
            *end   = e;
            return true;
        }
        s = e;
    }
}

GGML_DISPATCH_MMVQ_HD static constexpr bool ggml_dispatch_mmvq_item_is(const char * b, const char * e, const char * word) {
    for (; b != e; ++b, ++word) {
        if (*word == '\0' || *b != *word) {
            return false;
        }
    }
    return *word == '\0';
}

// The candidate index an "NxR" item names, uncapped (0: none).
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_item_index(const char * b, const char * e) {
    int w = 0, r = 0;
    bool x = false;
    for (const char * p = b; p != e; ++p) {
        if (*p == 'x' && !x && p != b) {
            x = true;
        } else if (*p >= '0' && *p <= '9' && (x ? r : w) < 1000) {
            (x ? r : w) = 10*(x ? r : w) + (*p - '0');
        } else {
            return 0;
        }
    }
    return x && r > 0 ? ggml_dispatch_mmvq_index(w, r) : 0;
}

GGML_DISPATCH_MMVQ_HD static constexpr bool ggml_dispatch_mmvq_type_item(const char * b, const char * e) {
#define GGML_DISPATCH_MMVQ_TYPE_IS(id, name) if (ggml_dispatch_mmvq_item_is(b, e, name)) { return true; }
    GGML_DISPATCH_MMVQ_TYPE_LIST(GGML_DISPATCH_MMVQ_TYPE_IS)
#undef GGML_DISPATCH_MMVQ_TYPE_IS
    return false;
}

// The register cap a decimal item names, where it is one of GGML_DISPATCH_MMVQ_REGS_LIST (0: none).
GGML_DISPATCH_MMVQ_HD static constexpr int ggml_dispatch_mmvq_regs_item(const char * b, const char * e) {
    int g = 0;
    for (const char * p = b; p != e; ++p) {
        if (*p < '0' || *p > '9' || g >= 1000) {
            return 0;
        }
        g = 10*g + (*p - '0');
    }
#define GGML_DISPATCH_MMVQ_REGS_IS(cg) if (g == (cg)) { return g; }
    GGML_DISPATCH_MMVQ_REGS_LIST(GGML_DISPATCH_MMVQ_REGS_IS)
#undef GGML_DISPATCH_MMVQ_REGS_IS
    return 0;
}

// Does every item of the lists name something ("all", "none", a candidate pair, an mmvq type, a register cap)?
GGML_DISPATCH_MMVQ_HD static constexpr bool ggml_dispatch_mmvq_lists_valid(const char * configs, const char * types,
                                                                           const char * regs) {
    const char * b = nullptr;
    const char * e = nullptr;
    for (int n = 0; ggml_dispatch_mmvq_item(configs, n, &b, &e); ++n) {
        if (!ggml_dispatch_mmvq_item_is(b, e, "all") && !ggml_dispatch_mmvq_item_is(b, e, "none") &&
                ggml_dispatch_mmvq_item_index(b, e) == 0) {
            return false;
        }
    }
    for (int n = 0; ggml_dispatch_mmvq_item(types, n, &b, &e); ++n) {
        if (!ggml_dispatch_mmvq_item_is(b, e, "all") && !ggml_dispatch_mmvq_type_item(b, e)) {
            return false;
        }
    }
    for (int n = 0; ggml_dispatch_mmvq_item(regs, n, &b, &e); ++n) {
        if (!ggml_dispatch_mmvq_item_is(b, e, "all") && !ggml_dispatch_mmvq_item_is(b, e, "none") &&
                ggml_dispatch_mmvq_regs_item(b, e) == 0) {
            return false;
        }
    }
    return true;
}

static_assert(ggml_dispatch_mmvq_lists_valid(GGML_DISPATCH_MMVQ_CONFIGS, GGML_DISPATCH_MMVQ_TYPES, GGML_DISPATCH_MMVQ_REGS),
              "GGML_DISPATCH_MMVQ_CONFIGS: items NxR, each a candidate of GGML_DISPATCH_MMVQ_CONFIG_LIST (or all, none); "
              "GGML_DISPATCH_MMVQ_TYPES: ggml type names of GGML_DISPATCH_MMVQ_TYPE_LIST (or all); "
              "GGML_DISPATCH_MMVQ_REGS: register caps of GGML_DISPATCH_MMVQ_REGS_LIST (or all, none)");

// Is candidate `cfg` compiled for weight type `type` in this build? (index 0, the tree's table, always is.)
GGML_DISPATCH_MMVQ_HD static constexpr bool ggml_dispatch_mmvq_compiled(int type, int cfg) {
    if (cfg == 0) {
        return true;
    }
    const char * name = ggml_dispatch_mmvq_type_name(type);
    if (name == nullptr || ggml_dispatch_mmvq_nwarps_or(cfg, 0) == 0) {
        return false;
    }
    const char * b = nullptr;
    const char * e = nullptr;
    bool type_in = false;
    for (int n = 0; !type_in && ggml_dispatch_mmvq_item(GGML_DISPATCH_MMVQ_TYPES, n, &b, &e); ++n) {
        type_in = ggml_dispatch_mmvq_item_is(b, e, "all") || ggml_dispatch_mmvq_item_is(b, e, name);
    }
    if (!type_in) {
        return false;
    }
    const int regs = ggml_dispatch_mmvq_regs_of(cfg);
    bool regs_in = regs == 0;
    for (int n = 0; !regs_in && ggml_dispatch_mmvq_item(GGML_DISPATCH_MMVQ_REGS, n, &b, &e); ++n) {
        regs_in = ggml_dispatch_mmvq_item_is(b, e, "all") || ggml_dispatch_mmvq_regs_item(b, e) == regs;
    }
    if (!regs_in) {
        return false;
    }
    const int pair = ggml_dispatch_mmvq_index(ggml_dispatch_mmvq_nwarps_or(cfg, 0), ggml_dispatch_mmvq_rows_or(cfg, 0));
    for (int n = 0; ggml_dispatch_mmvq_item(GGML_DISPATCH_MMVQ_CONFIGS, n, &b, &e); ++n) {
        if (ggml_dispatch_mmvq_item_is(b, e, "all") || ggml_dispatch_mmvq_item_index(b, e) == pair) {
            return true;
        }
    }
    return false;
}
