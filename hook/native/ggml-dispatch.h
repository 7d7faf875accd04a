/* ggml-dispatch: public C interface of the dispatch hook compiled into ggml-cuda.
 *
 * Installed into ggml/src/ggml-cuda/ by `ggml-dispatch install`. Usable from C and C++.
 * The route codes are shared with Python (ggml_dispatch.schema.ROUTE_CODES); a test parses this
 * file and compares.
 *
 * A harness obtains the two functions below with
 *     ggml_backend_reg_get_proc_address(ggml_backend_cuda_reg(), GGML_DISPATCH_PROC_SET_OVERRIDE)
 * On an unpatched tree (or another backend) the lookup returns NULL: run stock only then.
 */
#ifndef GGML_DISPATCH_H
#define GGML_DISPATCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Route codes (table routes). 0 = stock / no rule. */
#define GGML_DISPATCH_ROUTE_STOCK  0
#define GGML_DISPATCH_ROUTE_MMVF   1
#define GGML_DISPATCH_ROUTE_MMF    2
#define GGML_DISPATCH_ROUTE_MMVQ   3
#define GGML_DISPATCH_ROUTE_MMQ    4
#define GGML_DISPATCH_ROUTE_CUBLAS 5
#define GGML_DISPATCH_ROUTE_COUNT  6 /* codes 0..5 */

/* Op and layout codes (ggml_dispatch.schema.OP_CODES / LAYOUT_CODES). */
#define GGML_DISPATCH_OP_MUL_MAT    0
#define GGML_DISPATCH_OP_MUL_MAT_ID 1
#define GGML_DISPATCH_LAYOUT_WEIGHT    0
#define GGML_DISPATCH_LAYOUT_ATTENTION 1
#define GGML_DISPATCH_LAYOUT_EXPERT    2

/* Names of the route codes as traces and table.json spell them; index = code, [0] = "stock". */
#define GGML_DISPATCH_ROUTE_NAMES { "stock", "mmvf", "mmf", "mmvq", "mmq", "cublas" }

#define GGML_DISPATCH_PROC_SET_OVERRIDE "ggml_backend_cuda_dispatch_set_override"
#define GGML_DISPATCH_PROC_GET_COUNTS   "ggml_backend_cuda_dispatch_get_counts"

struct ggml_dispatch_counts {
    int64_t ran[GGML_DISPATCH_ROUTE_COUNT]; /* MUL_MAT/MUL_MAT_ID nodes by route that really ran;
                                               index 0 = a path outside the five table routes */
    int64_t forced;                         /* nodes where an override/force route ran */
    int64_t table;                          /* nodes where a table rule's route ran */
    int64_t ineligible;                     /* nodes where a requested route was refused -> stock ran */
};

/* 0 clears the override; 1..5 make every eligible MUL_MAT node run that route (ineligible nodes run
 * stock and count as ineligible). Invalidates captured CUDA graphs so the next compute runs the new
 * route. Ignored under GGML_CUDA_DISPATCH=off. */
typedef void (*ggml_dispatch_set_override_t)(int route_code);

/* Copies the counts since start (or the last reset) into *out; reset != 0 zeroes them afterwards.
 * Counts include CUDA-graph replays. */
typedef void (*ggml_dispatch_get_counts_t)(struct ggml_dispatch_counts * out, int reset);

#ifdef __cplusplus
}
#endif

#endif /* GGML_DISPATCH_H */
