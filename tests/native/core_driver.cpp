// Drives ggml_dispatch/hook/native/ggml-dispatch-core.h the way the hook in ggml-cuda.cu does (direct graph
// evaluation, CUDA-graph capture and replays, a route override, flushes) and writes a real trace.
// argv[1]: trace path ("stderr" allowed). stdout: one JSON object with what the driver observed.
#include "ggml-dispatch-core.h"

#include <cstdio>
#include <string>

using namespace ggml_dispatch;

static record_key key(const char * tensor, const char * t0, int64_t K, int64_t N, int64_t M, int layout, int fused,
                      int route, int stock, int reason, const char * why = "") {
    record_key k;
    k.op        = layout == GGML_DISPATCH_LAYOUT_EXPERT ? GGML_DISPATCH_OP_MUL_MAT_ID : GGML_DISPATCH_OP_MUL_MAT;
    k.device    = 0;
    k.tensor    = tensor;
    k.src0_type = t0;
    k.src1_type = "f32";
    const int64_t src0_ne[4] = {K, N, layout == GGML_DISPATCH_LAYOUT_EXPERT ? 8 : 1, 1};
    const int64_t src1_ne[4] = {K, layout == GGML_DISPATCH_LAYOUT_EXPERT ? 2 : M,
                                layout == GGML_DISPATCH_LAYOUT_EXPERT ? M : 1, 1};
    for (int i = 0; i < 4; ++i) {
        k.src0_ne[i] = src0_ne[i];
        k.src1_ne[i] = src1_ne[i];
    }
    k.src0_nb[0] = 20;  // q4_1 block
    k.src0_nb[1] = (uint64_t) (K / 32 * 20);
    k.src0_nb[2] = k.src0_nb[1] * (uint64_t) N;
    k.src0_nb[3] = k.src0_nb[2] * (uint64_t) src0_ne[2];
    k.layout      = layout;
    k.fused       = fused;
    k.route       = route;
    k.stock_route = stock;
    k.reason      = reason;
    k.why         = why;
    return k;
}

static void note(recorder & r, const record_key & k, bool forced, bool table, bool ineligible) {
    outcome o;
    o.route      = k.route;
    o.forced     = forced;
    o.table      = table;
    o.ineligible = ineligible;
    r.note(o, r.trace_on() ? &k : nullptr);
}

int main(int argc, char ** argv) {
    const char * path = argc > 1 ? argv[1] : "stderr";
    std::string  out  = "{\"env\":{";
    const char * values[] = {"",
                             "table",
                             "off",
                             "force:mmq",
                             "force:cublas",
                             "force:bogus",
                             "sometimes",
                             "force:cublas/compute=f16,out=f32",
                             "force:mmq/j=64,stream_k=off",
                             "force:cublas/out=f64",
                             "force:cublas/out=f32,out=f16",
                             "force:mmq/",
                             "force:stock",
                             "force:mmvq/nwarps=8,rows=1",
                             "force:mmvq/rows=2",
                             "force:mmvq/nwarps=16,rows=1",
                             "force:mmvq/regs=64,rows=2,nwarps=4",
                             "force:mmvq/regs=64",
                             "force:mmvq/nwarps=4,rows=2,regs=48",
                             "force:mmvf/block=128"};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); ++i) {
        const env_choice c = parse_dispatch_env(values[i]);
        out += (i ? "," : "") + json_string(values[i]) + ":[" + std::to_string((int) c.m) + "," +
               std::to_string(c.force_config) + "," + (c.error.empty() ? "false" : "true") + "]";
    }
    out += "},\"env_errors\":{";
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); ++i) {
        out += (i ? "," : "") + json_string(values[i]) + ":" + json_string(parse_dispatch_env(values[i]).error.c_str());
    }
    const env_choice unset = parse_dispatch_env(nullptr);
    out += "},\"env_unset\":" + std::to_string((int) unset.m);

    recorder *  r      = new recorder();
    std::string header = "{\"kind\":\"header\",\"schema\":\"ggml-route-trace/1\",\"upstream_commit\":"
                         "\"0c1e57098bba43ac29e6e3b677cdceebdd22334f\",\"patch_hash\":\"" +
                         std::string(64, 'a') +
                         "\",\"table_hash\":null,\"build\":{\"cuda_arch_list\":\"900\"},\"env\":{\"GGML_CUDA_DISPATCH\":"
                         "null},\"devices\":[{\"id\":0,\"name\":\"NVIDIA H200\",\"uuid\":\"GPU-0\",\"cc\":900,"
                         "\"sm_count\":132,\"smpbo\":232448,\"vram_mib\":143771}],\"pid\":1,\"started\":\"" +
                         iso_time_utc() + "\"}";
    const bool opened = r->open_trace(path, header);

    const void * ctx   = reinterpret_cast<const void *>(0x1000);
    const void * graph = reinterpret_cast<const void *>(0x2000);

    // direct evaluation (no CUDA graph): every node counts once
    r->eval_begin(ctx, graph, false, false);
    note(*r, key("blk.0.attn_q.weight", "q4_1", 576, 576, 1, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_MMVQ, GGML_DISPATCH_ROUTE_MMVQ, REASON_STOCK), false, false, false);
    note(*r, key("blk.0.attn_k.weight", "q4_1", 576, 192, 7, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_MMQ, GGML_DISPATCH_ROUTE_MMVQ, REASON_FORCED), true, false, false);
    note(*r, key("blk.0.attn_v.weight", "q4_1", 576, 192, 9, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_MMQ, GGML_DISPATCH_ROUTE_MMQ, REASON_INELIGIBLE, "batch"), false, false, true);
    note(*r, key("blk.0.ffn_up.weight", "q4_1", 576, 1536, 1, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_GLU,
                 GGML_DISPATCH_ROUTE_MMVQ, GGML_DISPATCH_ROUTE_MMVQ, REASON_FUSED), false, false, false);
    note(*r, key("blk.0.ffn_gate_exps.weight", "q4_1", 576, 1536, 33, GGML_DISPATCH_LAYOUT_EXPERT, FUSED_NONE,
                 ROUTE_ID_SORTED, ROUTE_ID_SORTED, REASON_STOCK), false, false, false);
    note(*r, key("we\"ird\\name\n\x01\xff\xc3\xa9", "q4_1", 576, 64, 2, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_CUBLAS, GGML_DISPATCH_ROUTE_MMVQ, REASON_TABLE), false, true, false);
    r->eval_end();

    // capture: what the nodes record now, every replay runs again
    r->eval_begin(ctx, graph, true, true);
    note(*r, key("blk.1.attn_q.weight", "q4_1", 576, 576, 1, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_MMVQ, GGML_DISPATCH_ROUTE_MMVQ, REASON_STOCK), false, false, false);
    note(*r, key("blk.1.attn_k.weight", "q4_1", 576, 192, 1, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_CUBLAS, GGML_DISPATCH_ROUTE_MMVQ, REASON_FORCED), true, false, false);
    r->eval_end();
    for (int rep = 0; rep < 5; ++rep) {
        r->eval_begin(ctx, graph, true, false);
        r->eval_end();
    }
    r->flush();  // mid-run flush (backend free): counts restart from zero per key

    ggml_dispatch_counts c1;
    r->get_counts(&c1, 0);

    // an override change makes the captured graph stale exactly once
    const bool stale_before = r->graph_stale(ctx, graph);
    r->set_override(GGML_DISPATCH_ROUTE_MMQ);
    const bool stale_after  = r->graph_stale(ctx, graph);
    const bool stale_again  = r->graph_stale(ctx, graph);
    const int  override_now = r->override_config();

    // a replay of a graph that was never captured cannot be counted
    r->eval_begin(ctx, reinterpret_cast<const void *>(0x3000), true, false);
    r->eval_end();

    // after the flush: one more direct node for a key seen before
    r->eval_begin(ctx, graph, false, false);
    note(*r, key("blk.0.attn_q.weight", "q4_1", 576, 576, 1, GGML_DISPATCH_LAYOUT_WEIGHT, FUSED_NONE,
                 GGML_DISPATCH_ROUTE_MMVQ, GGML_DISPATCH_ROUTE_MMVQ, REASON_STOCK), false, false, false);
    r->eval_end();

    ggml_dispatch_counts c2;
    r->get_counts(&c2, 1);
    ggml_dispatch_counts c3;
    r->get_counts(&c3, 0);
    r->forget_context(ctx);
    const size_t captures_left = r->capture_count();
    r->finish();

    auto counts_json = [](const ggml_dispatch_counts & c) {
        std::string s = "{\"ran\":[";
        for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
            s += (i ? "," : "") + std::to_string(c.ran[i]);
        }
        s += "],\"forced\":" + std::to_string(c.forced) + ",\"table\":" + std::to_string(c.table) +
             ",\"ineligible\":" + std::to_string(c.ineligible) + ",\"eager\":" + std::to_string(c.eager) + "}";
        return s;
    };
    out += ",\"opened\":" + std::string(opened ? "true" : "false");
    out += ",\"counts_after_replays\":" + counts_json(c1);
    out += ",\"counts_end\":" + counts_json(c2);
    out += ",\"counts_after_reset\":" + counts_json(c3);
    out += ",\"stale_before\":" + std::string(stale_before ? "true" : "false");
    out += ",\"stale_after\":" + std::string(stale_after ? "true" : "false");
    out += ",\"stale_again\":" + std::string(stale_again ? "true" : "false");
    out += ",\"override\":" + std::to_string(override_now);
    out += ",\"unknown_replays\":" + std::to_string(r->unknown_replays());
    out += ",\"captures_left\":" + std::to_string(captures_left);
    out += ",\"route_names\":[";
    for (int i = 0; i < TRACE_ROUTE_COUNT; ++i) {
        out += (i ? "," : "") + json_string(route_name(i));
    }
    out += "],\"config_texts\":{";
    const int config_codes[] = {0, GGML_DISPATCH_ROUTE_MMQ, 1541, 20484, 1 << 30, -1};
    for (size_t i = 0; i < sizeof(config_codes) / sizeof(config_codes[0]); ++i) {
        out += (i ? ",\"" : "\"") + std::to_string(config_codes[i]) + "\":" + json_string(config_text(config_codes[i]).c_str());
    }
    out += "}}";
    std::printf("%s\n", out.c_str());
    return 0;
}
