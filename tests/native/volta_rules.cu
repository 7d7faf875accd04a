// Volta (sm_70, V100) probes of ggml-dispatch's eligibility check against the tree's own rules.
//
// Built by tests/test_native_volta.py with nvcc as host code (no GPU, no Volta toolchain needed: the host
// sees the compiled-arch list only through ggml_cuda_highest_compiled_arch, and grid_config.h replaces
// __CUDA_ARCH_LIST__ with the list of the build under test, e.g. 700 for a V100-only build). The tree's
// ggml_cuda_should_use_* are taken verbatim into tree_should_use.inc, as for eligibility_grid.cu; with
// -DGGML_CUDA_FORCE_MMQ the tree's MMQ choice is the one of a FORCE_MMQ build.
//
// Prints one JSON object: per probe (device cc, type, M) the tree's choice, the check's verdict and
// stock's route, for the test to hold against the rules it names:
//  - MMQ on Volta without GGML_CUDA_FORCE_MMQ only below MMQ_DP4A_MAX_BATCH_SIZE (llama.cpp PR #12098:
//    FP16 tensor cores make cuBLAS faster above it); with FORCE_MMQ at every M. Both are soft choices:
//    the check (hard limits only) allows MMQ at every M on cc 700 with sm_70 device code.
//  - host cc vs compiled arch: a V100 on a build without sm_70 code gets no route at all; an sm_90 GPU
//    on a V100-only build runs the sm_70 code (dp4a MMQ, Volta MMA for F16 mmf, no F32/BF16 mmf).
#include "grid_config.h"

#ifdef GGML_DISPATCH_TEST_ARCH_LIST
#    undef __CUDA_ARCH_LIST__
#    define __CUDA_ARCH_LIST__ GGML_DISPATCH_TEST_ARCH_LIST
#endif

#include "ggml-dispatch-eligibility.cuh"

#include <cstdio>

static ggml_cuda_device_info g_info;

const ggml_cuda_device_info & ggml_cuda_info() {
    return g_info;
}

int ggml_cuda_get_device() {
    return 0;
}

#include "tree_should_use.inc"

static ggml_dispatch_mm_desc contiguous(ggml_type t, int64_t K, int64_t N, int64_t M) {
    const int64_t blk = ggml_blck_size(t);
    const size_t  ts  = ggml_type_size(t);
    const size_t  row = (size_t) (K / blk) * ts;
    ggml_dispatch_mm_desc d = {};
    d.src0_type = t;
    d.src1_type = GGML_TYPE_F32;
    d.dst_type  = GGML_TYPE_F32;
    d.src0_ne[0] = K; d.src0_ne[1] = N; d.src0_ne[2] = 1; d.src0_ne[3] = 1;
    d.src0_nb[0] = ts; d.src0_nb[1] = row; d.src0_nb[2] = row*N; d.src0_nb[3] = row*N;
    d.src1_ne[0] = K; d.src1_ne[1] = M; d.src1_ne[2] = 1; d.src1_ne[3] = 1;
    d.src1_nb[0] = sizeof(float); d.src1_nb[1] = sizeof(float)*K;
    d.src1_nb[2] = sizeof(float)*K*M; d.src1_nb[3] = sizeof(float)*K*M;
    d.dst_nb0 = sizeof(float);
    d.dst_contiguous = d.src0_contiguously_allocated = d.src0_contiguous = d.src1_contiguous = true;
    return d;
}

int main() {
    const int       ccs[]   = {700, 900};
    const ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_BF16};
    const int64_t   Ms[]    = {1, 8, 16, 32, 63, 64, 65, 128, 512};
#ifdef GGML_CUDA_FORCE_MMQ
    const int force_mmq = 1;
#else
    const int force_mmq = 0;
#endif
    std::printf("{\"arch_list\":\"%s\",\"force_mmq\":%d,\"mmq_dp4a_max_batch\":%d,\"probes\":[",
                STRINGIZE(__CUDA_ARCH_LIST__), force_mmq, MMQ_DP4A_MAX_BATCH_SIZE);
    bool first = true;
    for (int cc : ccs) {
        g_info.device_count         = 1;
        g_info.devices[0].cc        = cc;
        g_info.devices[0].smpbo     = cc == 700 ? 96 * 1024 : 227 * 1024;  // V100 / H100-class opt-in smem
        g_info.devices[0].warp_size = 32;
        const ggml_dispatch_dev_desc dev = {cc, 32, g_info.devices[0].smpbo};
        for (ggml_type t : types) {
            for (int64_t M : Ms) {
                const ggml_dispatch_mm_desc d = contiguous(t, 4096, 4096, M);
                const bool tree_mmq = ggml_dispatch_mmq_type(t) && ggml_cuda_should_use_mmq(t, cc, M, 0);
                const bool tree_mmf = ggml_cuda_should_use_mmf(t, cc, 32, d.src0_ne, d.src0_nb, (int) M, false);
                std::printf("%s{\"cc\":%d,\"type\":\"%s\",\"M\":%lld,\"highest_arch\":%d,\"tree_mmq\":%s,"
                            "\"check_mmq\":\"%s\",\"tree_mmf\":%s,\"check_mmf\":\"%s\",\"check_cublas\":\"%s\","
                            "\"stock\":\"%s\"}",
                            first ? "" : ",", cc, ggml_type_name(t), (long long) M, ggml_cuda_highest_compiled_arch(cc),
                            tree_mmq ? "true" : "false",
                            ggml_dispatch_why_name(ggml_dispatch_check(GGML_DISPATCH_ROUTE_MMQ, d, dev)),
                            tree_mmf ? "true" : "false",
                            ggml_dispatch_why_name(ggml_dispatch_check(GGML_DISPATCH_ROUTE_MMF, d, dev)),
                            ggml_dispatch_why_name(ggml_dispatch_check(GGML_DISPATCH_ROUTE_CUBLAS, d, dev)),
                            ggml_dispatch::route_name(ggml_dispatch_stock_route(d, dev)));
                first = false;
            }
        }
    }
    std::printf("]}\n");
    return 0;
}
