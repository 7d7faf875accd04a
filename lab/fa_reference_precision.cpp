#include "ggml.h"
#include "ggml-cpu.h"
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>
// NMSE of the CPU backend's FLASH_ATTN_EXT against a float64 reference, with f16 and with f32 K/V holding
// the same (f16-rounded) values: is the CPU reference the less precise side at long KV lengths? (Why the
// harness's FlashAttention reference widens f16/bf16 K/V to f32, ggml_dispatch/tuner/harness/flash_attn_ext.cpp.)
// Runs on the development machine, against the CPU ggml of a harness build (B = its build folder):
//   g++ -O2 -std=c++17 -I<tree>/ggml/include lab/fa_reference_precision.cpp -o fa_prec \
//       -L$B/ggml/src -lggml -lggml-base -lggml-cpu -Wl,-rpath,$B/ggml/src
//   ./fa_prec D M n_kv        (e.g. 128 2 49408: f16 K/V 1.02e-3, f32 K/V 2.4e-11)
static double run(ggml_type kv_type, int D, int H, int Hkv, int M, int n_kv, const std::vector<float> & q,
                  const std::vector<float> & k, const std::vector<float> & v, const std::vector<double> & ref) {
    size_t mem = (size_t) 64 * 1024 * 1024 + (size_t) 2 * n_kv * D * Hkv * 4 * 2 + (size_t) D * M * H * 16;
    ggml_init_params ip = { mem, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * tq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, M);     // [D, heads, M] -> permute
    ggml_tensor * tk = ggml_new_tensor_3d(ctx, kv_type, D, Hkv, n_kv);
    ggml_tensor * tv = ggml_new_tensor_3d(ctx, kv_type, D, Hkv, n_kv);
    ggml_tensor * tm = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, M);
    memcpy(tq->data, q.data(), q.size() * 4);
    for (size_t i = 0; i < k.size(); ++i) {
        if (kv_type == GGML_TYPE_F16) {
            ((ggml_fp16_t *) tk->data)[i] = ggml_fp32_to_fp16(k[i]);
            ((ggml_fp16_t *) tv->data)[i] = ggml_fp32_to_fp16(v[i]);
        } else {
            ((float *) tk->data)[i] = k[i];
            ((float *) tv->data)[i] = v[i];
        }
    }
    for (int i = 0; i < n_kv * M; ++i) ((ggml_fp16_t *) tm->data)[i] = ggml_fp32_to_fp16(0.0f);
    ggml_tensor * qp = ggml_permute(ctx, tq, 0, 2, 1, 3);
    ggml_tensor * kp = ggml_permute(ctx, tk, 0, 2, 1, 3);
    ggml_tensor * vp = ggml_permute(ctx, tv, 0, 2, 1, 3);
    ggml_tensor * y = ggml_flash_attn_ext(ctx, qp, kp, vp, tm, 1.0f / std::sqrt((float) D), 0.0f, 0.0f);
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    ggml_graph_compute_with_ctx(ctx, g, 2);
    // y: [D, H, M] f32
    double num = 0, den = 0;
    const float * out = (const float *) y->data;
    for (size_t i = 0; i < ref.size(); ++i) {
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    ggml_free(ctx);
    return num / den;
}
int main(int argc, char ** argv) {
    const int D = argc > 1 ? atoi(argv[1]) : 128, H = 32, Hkv = 8, M = argc > 2 ? atoi(argv[2]) : 2;
    const int n_kv = argc > 3 ? atoi(argv[3]) : 49408;
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q((size_t) D * H * M), k((size_t) D * Hkv * n_kv), v(k.size());
    for (auto & x : q) x = nd(rng);
    for (auto & x : k) x = ggml_fp16_to_fp32(ggml_fp32_to_fp16(nd(rng)));
    for (auto & x : v) x = ggml_fp16_to_fp32(ggml_fp32_to_fp16(nd(rng)));
    std::vector<double> ref((size_t) D * H * M);
    const double scale = 1.0 / std::sqrt((double) D);
    std::vector<double> s(n_kv);
    for (int m = 0; m < M; ++m)
        for (int h = 0; h < H; ++h) {
            const int hk = h / (H / Hkv);
            const float * qq = &q[((size_t) m * H + h) * D];
            double mx = -1e300;
            for (int j = 0; j < n_kv; ++j) {
                const float * kk = &k[((size_t) j * Hkv + hk) * D];
                double d = 0;
                for (int c = 0; c < D; ++c) d += (double) qq[c] * kk[c];
                s[j] = d * scale;
                mx = std::max(mx, s[j]);
            }
            double sum = 0;
            for (int j = 0; j < n_kv; ++j) { s[j] = std::exp(s[j] - mx); sum += s[j]; }
            for (int c = 0; c < D; ++c) {
                double acc = 0;
                for (int j = 0; j < n_kv; ++j) acc += s[j] * v[((size_t) j * Hkv + hk) * D + c];
                ref[((size_t) m * H + h) * D + c] = acc / sum;
            }
        }
    printf("D=%d M=%d n_kv=%d: NMSE f16 K/V %.3g, f32 K/V %.3g\n", D, M, n_kv,
           run(GGML_TYPE_F16, D, H, Hkv, M, n_kv, q, k, v, ref), run(GGML_TYPE_F32, D, H, Hkv, M, n_kv, q, k, v, ref));
}
