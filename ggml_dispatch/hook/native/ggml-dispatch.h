/* ggml-dispatch: public C interface of the dispatch hook compiled into ggml-cuda.
 *
 * Installed into ggml/src/ggml-cuda/ by `ggml-dispatch install`. Usable from C and C++.
 * Op, layout, route, parameter and configuration codes and names come from ggml-dispatch-codes.h,
 * generated from the Python registry (ggml_dispatch/registry.py) at install.
 *
 * A harness obtains the two functions below with
 *     ggml_backend_reg_get_proc_address(ggml_backend_cuda_reg(), GGML_DISPATCH_PROC_SET_OVERRIDE)
 * On an unpatched tree (or another backend) the lookup returns NULL: run stock only then.
 */
#ifndef GGML_DISPATCH_H
#define GGML_DISPATCH_H

#include "ggml-dispatch-codes.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_DISPATCH_PROC_SET_OVERRIDE "ggml_backend_cuda_dispatch_set_override"
#define GGML_DISPATCH_PROC_GET_COUNTS   "ggml_backend_cuda_dispatch_get_counts"

struct ggml_dispatch_counts {
    int64_t ran[GGML_DISPATCH_ROUTE_COUNT]; /* MUL_MAT/MUL_MAT_ID nodes by route that really ran;
                                               index 0 = a path outside the table routes */
    int64_t forced;                         /* nodes where an override/force route ran */
    int64_t table;                          /* nodes where a table rule's route ran */
    int64_t ineligible;                     /* nodes where a requested route was refused -> stock ran */
    int64_t eager;                          /* graph evaluations run directly, not as a CUDA graph (the
                                               first ones after a change, and every one of a graph whose
                                               node breaks graphs: id_sorted, the per-expert fallback) */
};

/* 0 clears the override; a configuration code (a table route code 1..ROUTE_COUNT-1 plus parameter fields,
 * see ggml-dispatch-codes.h; ggml_dispatch_config_parse makes one from "route/name=value") makes every
 * eligible node of an op the route serves run that configuration (ineligible nodes run stock and count as
 * ineligible). Invalid codes are ignored with a warning. Invalidates captured CUDA graphs so the next
 * compute runs the new configuration. Ignored under GGML_CUDA_DISPATCH=off. */
typedef void (*ggml_dispatch_set_override_t)(int config_code);

/* Copies the counts since start (or the last reset) into *out; reset != 0 zeroes them afterwards.
 * Counts include CUDA-graph replays. */
typedef void (*ggml_dispatch_get_counts_t)(struct ggml_dispatch_counts * out, int reset);

#ifdef __cplusplus
}
#endif

#endif /* GGML_DISPATCH_H */
