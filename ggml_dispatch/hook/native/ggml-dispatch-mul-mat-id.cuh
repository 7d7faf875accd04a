// ggml-dispatch-mul-mat-id.cuh: MUL_MAT_ID through the route selection, calling the tree's own kernel entry points
// Included by the hook at one place of an upstream file (ggml_dispatch/hook/native/ggml-cuda.hook, hunk 'mul_mat_id_routed'): it reads
// that file's own functions defined above that place, so it is not a self-contained header.
#pragma once

// ggml-dispatch: MUL_MAT_ID through the route selection. A chosen configuration runs its kernel with ids
// (none of them synchronizes the stream, so a captured graph stays valid) or, for id_sorted, the tree's
// per-expert fallback (which does: ggml_cuda_mul_mat_id_needs_sync then keeps that graph uncaptured);
// stock ggml_cuda_mul_mat_id otherwise, whose fallback decides whether CUDA graphs are used, as in the tree.
static void ggml_cuda_mul_mat_id_dispatch(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (!ggml_cuda_dispatch_active) {
        ggml_cuda_mul_mat_id(ctx, dst);
        return;
    }
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    const ggml_tensor * ids  = dst->src[2];
    const int config = ggml_cuda_dispatch_begin_mul_mat_id(ctx, dst);
    ggml_dispatch_params_scope params(ggml_cuda_dispatch_params_of(config));
    const int route = ggml_dispatch_config_route(config);
    if (!ggml_cuda_dispatch_run_kernel(route, ctx, src0, src1, ids, dst)) {
        // id_sorted: the tree's per-expert fallback, by the dispatch's choice; else stock
        ggml_cuda_dispatch_id_sorted_now = route == GGML_DISPATCH_ROUTE_ID_SORTED;
        ggml_cuda_mul_mat_id(ctx, dst);
        ggml_cuda_dispatch_id_sorted_now = false;
    }
    ggml_cuda_dispatch_end_mul_mat_id(params.refused());
}
