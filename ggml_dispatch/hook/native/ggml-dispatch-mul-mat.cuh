// ggml-dispatch-mul-mat.cuh: MUL_MAT through the route selection, calling the tree's own kernel entry points
// Included by the hook at one place of an upstream file (ggml_dispatch/hook/native/ggml-cuda.hook, hunk 'mul_mat_routed'): it reads
// that file's own functions defined above that place, so it is not a self-contained header.
#pragma once

// ggml-dispatch: set while ggml_cuda_mul_mat_id runs its per-expert fallback by the dispatch's choice.
static thread_local bool ggml_cuda_dispatch_id_sorted_now = false;

// ggml-dispatch: the kernel families MUL_MAT and MUL_MAT_ID share, called with `ids` (nullptr for MUL_MAT);
// false for any other route (the caller's own).
static bool ggml_cuda_dispatch_run_kernel(const int route, ggml_backend_cuda_context & ctx, const ggml_tensor * src0,
                                          const ggml_tensor * src1, const ggml_tensor * ids, ggml_tensor * dst) {
    switch (route) {
        case GGML_DISPATCH_ROUTE_MMVF:
            ggml_cuda_mul_mat_vec_f(ctx, src0, src1, ids, dst);
            return true;
        case GGML_DISPATCH_ROUTE_MMF:
            ggml_cuda_mul_mat_f(ctx, src0, src1, ids, dst);
            return true;
        case GGML_DISPATCH_ROUTE_MMVQ:
            ggml_cuda_mul_mat_vec_q(ctx, src0, src1, ids, dst);
            return true;
        case GGML_DISPATCH_ROUTE_MMQ:
            ggml_cuda_mul_mat_q(ctx, src0, src1, ids, dst);
            return true;
        default:
            return false;
    }
}

// ggml-dispatch: MUL_MAT through the route selection (table / override / force, eligibility check).
// Stock ggml_cuda_mul_mat when the dispatch is inactive or selects stock. A configuration's parameters
// are set around the route's call; a value the route's code could not apply counts the node ineligible.
static void ggml_cuda_mul_mat_dispatch(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    if (!ggml_cuda_dispatch_active) {
        ggml_cuda_mul_mat(ctx, src0, src1, dst);
        return;
    }
    const int config = ggml_cuda_dispatch_begin_mul_mat(ctx, dst);
    ggml_dispatch_params_scope params(ggml_cuda_dispatch_params_of(config));
    const int route = ggml_dispatch_config_route(config);
    if (!ggml_cuda_dispatch_run_kernel(route, ctx, src0, src1, nullptr, dst)) {
        if (route == GGML_DISPATCH_ROUTE_CUBLAS) {
            ggml_cuda_mul_mat_cublas(ctx, src0, src1, dst);
        } else {
            ggml_cuda_mul_mat(ctx, src0, src1, dst);
        }
    }
    ggml_cuda_dispatch_end_mul_mat(params.refused());
}
