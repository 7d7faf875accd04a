// The route-override API of the patched ggml-cuda (ggml-dispatch's native hook).
//
// One definition: when hook/native/ggml-dispatch.h is on the include path (CMake adds it when the
// file exists) it is used; the fallback below is a copy of the same declarations for trees where the
// header is not installed. Both functions are looked up at run time with
// ggml_backend_reg_get_proc_address(); on the CPU backend or an unpatched tree the lookups return NULL
// and the harness measures stock only.
#pragma once

#include <stdint.h>

#if defined(__has_include)
#    if __has_include("ggml-dispatch.h")
#        include "ggml-dispatch.h"
#    endif
#endif

#ifndef GGML_DISPATCH_H
#    define GGML_DISPATCH_H

#    define GGML_DISPATCH_ROUTE_COUNT 6 /* codes 0..5 */

#    ifdef __cplusplus
extern "C" {
#    endif

struct ggml_dispatch_counts {
    int64_t ran[GGML_DISPATCH_ROUTE_COUNT]; /* MUL_MAT/MUL_MAT_ID nodes by route that really ran;
                                               index 0 = a path outside the five table routes */
    int64_t forced;                         /* nodes where an override/force route ran */
    int64_t table;                          /* nodes where a table rule's route ran */
    int64_t ineligible;                     /* nodes where a requested route was refused -> stock ran */
};

typedef void (*ggml_dispatch_set_override_t)(int route_code); /* 0 clears; invalidates captured CUDA graphs */
typedef void (*ggml_dispatch_get_counts_t)(struct ggml_dispatch_counts * out, int reset);

#    ifdef __cplusplus
}
#    endif

#endif  // GGML_DISPATCH_H

#define TUNER_DISPATCH_SET_OVERRIDE_NAME "ggml_backend_cuda_dispatch_set_override"
#define TUNER_DISPATCH_GET_COUNTS_NAME   "ggml_backend_cuda_dispatch_get_counts"
