// Drives ggml_dispatch/hook/native/ggml-dispatch-moe-stats.h and the recorder's extra members on the host.
// stdin: lines "E c0 c1 ... c{E-1}" (tokens per expert of one call). stdout: one JSON object per line
// with the call's statistics. argv[1]: a trace path; the driver writes a trace with one MUL_MAT_ID key
// whose expert statistics are the sums over every call read (as the device accumulator holds them),
// flushed twice (two records of the key: the reader must add them up).
#include "ggml-dispatch-core.h"
#include "ggml-dispatch-moe-stats.h"

#include <cstdio>
#include <string>
#include <vector>

using namespace ggml_dispatch;

struct acc_extra final : record_extra {
    ggml_dispatch_moe_acc acc = {};
    std::string           pending;
    void begin_flush() override {
        pending = ggml_dispatch_moe_json(acc);
        acc     = ggml_dispatch_moe_acc{};
    }
    std::string members(const record_key & k) override {
        return k.op == GGML_DISPATCH_OP_MUL_MAT_ID ? pending : std::string();
    }
};

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: moe_driver TRACE < counts\n");
        return 2;
    }
    recorder  rec;
    acc_extra extra;
    const std::string header = "{\"kind\":\"header\",\"schema\":\"ggml-route-trace/1\",\"upstream_commit\":null,"
                               "\"patch_hash\":null,\"table_hash\":null,\"build\":{},\"env\":{},\"devices\":[{\"id\":0,"
                               "\"name\":\"NVIDIA H200\",\"uuid\":\"\",\"cc\":900,\"sm_count\":132,\"smpbo\":232448,"
                               "\"vram_mib\":143771}],\"pid\":1,\"started\":\"2026-12-01T00:00:00Z\"}";
    if (!rec.open_trace(argv[1], header)) {
        return 1;
    }
    rec.set_extra(&extra);
    record_key k;
    k.op        = GGML_DISPATCH_OP_MUL_MAT_ID;
    k.tensor    = "blk.0.ffn_up_exps.weight";
    k.src0_type = "q4_K";
    k.src1_type = "f32";
    long long E0 = 0;
    int       calls = 0;
    long long E;
    while (std::scanf("%lld", &E) == 1) {
        std::vector<int32_t> c((size_t) E);
        for (auto & x : c) {
            if (std::scanf("%d", &x) != 1) {
                return 3;
            }
        }
        const ggml_dispatch_moe_call s = ggml_dispatch_moe_stats(c.data(), E);
        std::printf("{\"picks\":%lld,\"nonempty\":%d,\"max\":%d,\"mean\":%.17g,\"cv\":%.17g,\"routing\":%d}\n",
                    (long long) s.picks, s.nonempty, s.max, s.mean, s.cv, s.routing);
        ggml_dispatch_moe_add(&extra.acc, s);
        E0 = E;
        const int64_t src0_ne[4] = {2048, 768, 8, 1};  // one key whatever E the counts have
        const int64_t src1_ne[4] = {2048, 1, 16, 1};
        for (int i = 0; i < 4; ++i) {
            k.src0_ne[i] = src0_ne[i];
            k.src1_ne[i] = src1_ne[i];
        }
        k.src0_nb[0] = 144;
        k.src0_nb[1] = 144 * 8;
        k.src0_nb[2] = k.src0_nb[1] * 768;
        k.src0_nb[3] = k.src0_nb[2] * 8;
        k.layout      = GGML_DISPATCH_LAYOUT_EXPERT;
        k.route       = GGML_DISPATCH_ROUTE_MMQ;
        k.stock_route = GGML_DISPATCH_ROUTE_MMQ;
        outcome o;
        o.route = k.route;
        rec.note(o, &k);
        if (++calls == 2) {
            rec.flush();  // the first two calls in one record, the rest in a second one
        }
    }
    (void) E0;
    rec.finish();
    return 0;
}
