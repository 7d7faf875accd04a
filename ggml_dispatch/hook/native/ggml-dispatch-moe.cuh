// ggml-dispatch: tokens-per-expert statistics of traced MUL_MAT_ID calls (included by ggml-dispatch.cu).
//
// Only while the route trace is on: one small kernel per MUL_MAT_ID node, launched on the node's stream
// before stock's cascade runs (it reads ids, writes nothing ggml reads, so the route is the same), counts
// tokens per expert and adds the call's statistics (ggml-dispatch-moe-stats.h) to the trace key's
// accumulator in device memory. Nothing waits for it: under CUDA-graph capture the kernel is captured
// with its accumulator and adds again on every replay, as the key's count does. The host reads the
// accumulators only when the trace flushes (backend free, exit): a device synchronize, then a copy.
// Kernels of one device's accumulator are ordered by their stream; two contexts on one device tracing
// the same key at once could lose an update (the numbers are statistics, not counts).
#pragma once

#include "ggml-dispatch-core.h"
#include "ggml-dispatch-moe-stats.h"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace ggml_dispatch {

static constexpr int MOE_SLOTS     = 4096;   // trace keys with statistics per device
static constexpr int MOE_MAX_E     = 12288;  // experts counted in shared memory (48 KiB)
static constexpr int MOE_BLOCK     = 256;

static __global__ void moe_stats_kernel(const char * __restrict__ ids, const int64_t nb0, const int64_t nb1,
                                        const int U, const int M, const int E, ggml_dispatch_moe_acc * acc) {
    extern __shared__ int32_t moe_counts[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        moe_counts[e] = 0;
    }
    __syncthreads();
    const int64_t picks = (int64_t) U * M;
    for (int64_t i = threadIdx.x; i < picks; i += blockDim.x) {
        const int64_t t = i / U;
        const int64_t u = i % U;
        const int32_t e = *(const int32_t *) (ids + t*nb1 + u*nb0);
        if (e >= 0 && e < E) {
            atomicAdd(&moe_counts[e], 1);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ggml_dispatch_moe_add(acc, ggml_dispatch_moe_stats(moe_counts, E));
    }
}

class moe_stats final : public record_extra {
  public:
    // Device accumulators for every device (outside any capture: at trace start). False if none.
    bool open(int n_devices) {
        std::lock_guard<std::mutex> lock(mu_);
        int cur = 0;
        if (cudaGetDevice(&cur) != cudaSuccess) {
            (void) cudaGetLastError();
            return false;
        }
        bool any = false;
        for (int d = 0; d < n_devices && d < GGML_CUDA_MAX_DEVICES; ++d) {
            void * p = nullptr;
            if (cudaSetDevice(d) == cudaSuccess && cudaMalloc(&p, MOE_SLOTS*sizeof(ggml_dispatch_moe_acc)) == cudaSuccess &&
                    cudaMemset(p, 0, MOE_SLOTS*sizeof(ggml_dispatch_moe_acc)) == cudaSuccess &&
                    cudaDeviceSynchronize() == cudaSuccess) {
                dev_[d] = (ggml_dispatch_moe_acc *) p;
                any     = true;
            } else {
                (void) cudaGetLastError();
            }
        }
        (void) cudaSetDevice(cur);
        return any;
    }

    // One MUL_MAT_ID node traced as `k`, after it ran: count its tokens per expert on its stream (no wait).
    void note(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, const record_key & k) {
        const int           device = ctx.device;
        const ggml_tensor * src0   = dst->src[0];
        const ggml_tensor * ids    = dst->src[2];
        if (device < 0 || device >= GGML_CUDA_MAX_DEVICES || dev_[device] == nullptr || ids == nullptr ||
                ids->type != GGML_TYPE_I32 || src0->ne[2] > MOE_MAX_E || ids->ne[0] <= 0 || ids->ne[1] <= 0 ||
                ids->ne[0] > INT32_MAX || ids->ne[1] > INT32_MAX) {
            return;
        }
        int slot;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto & slots = slots_[device];
            auto   it    = slots.find(k);
            if (it == slots.end()) {
                if ((int) slots.size() >= MOE_SLOTS) {
                    return;
                }
                it = slots.emplace(k, (int) slots.size()).first;
            }
            slot = it->second;
        }
        // the node's stream, which running the node created (never created here: no CUDA call but the launch)
        cudaStream_t stream = ctx.streams[device][ctx.curr_stream_no];
        if (stream == nullptr) {
            return;
        }
        const int E = (int) src0->ne[2];
        moe_stats_kernel<<<1, MOE_BLOCK, E*sizeof(int32_t), stream>>>(
            (const char *) ids->data, (int64_t) ids->nb[0], (int64_t) ids->nb[1], (int) ids->ne[0], (int) ids->ne[1], E,
            dev_[device] + slot);
        (void) cudaGetLastError();
    }

    // The sums since the last flush, then zeroed (the trace's counts are per flush too).
    void begin_flush() override {
        std::lock_guard<std::mutex> lock(mu_);
        int cur = 0;
        if (cudaGetDevice(&cur) != cudaSuccess) {
            (void) cudaGetLastError();
            cur = -1;
        }
        for (int d = 0; d < GGML_CUDA_MAX_DEVICES; ++d) {
            host_[d].clear();
            const size_t n = slots_[d].size();
            if (dev_[d] == nullptr || n == 0) {
                continue;
            }
            host_[d].resize(n);
            const size_t bytes = n*sizeof(ggml_dispatch_moe_acc);
            // ggml's streams do not block on the legacy stream: wait for the device first
            if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess ||
                    cudaMemcpy(host_[d].data(), dev_[d], bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
                    cudaMemset(dev_[d], 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
                (void) cudaGetLastError();
                host_[d].clear();  // no statistics this flush rather than wrong ones
            }
        }
        if (cur >= 0) {
            (void) cudaSetDevice(cur);
        }
    }

    std::string members(const record_key & k) override {
        if (k.op != GGML_DISPATCH_OP_MUL_MAT_ID || k.device < 0 || k.device >= GGML_CUDA_MAX_DEVICES) {
            return std::string();
        }
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = slots_[k.device].find(k);
        if (it == slots_[k.device].end() || (size_t) it->second >= host_[k.device].size()) {
            return std::string();
        }
        return ggml_dispatch_moe_json(host_[k.device][it->second]);
    }

  private:
    std::mutex                                           mu_;
    ggml_dispatch_moe_acc *                              dev_[GGML_CUDA_MAX_DEVICES] = {};
    std::unordered_map<record_key, int, record_key_hash> slots_[GGML_CUDA_MAX_DEVICES];
    std::vector<ggml_dispatch_moe_acc>                   host_[GGML_CUDA_MAX_DEVICES];
};

}  // namespace ggml_dispatch
