#include "mul_mat.h"

#ifdef TUNER_SET_GRAPH_UID
// struct ggml_cgraph is opaque in the public headers; its uid lets ggml-cuda skip the per-compute
// node property comparison (host work that would otherwise sit inside every timed replay)
#    include "ggml-impl.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

// ---------------------------------------------------------------------------------------------
// case list

static int64_t get_positive(const json & j, const char * key, bool required, int64_t dflt) {
    if (!j.contains(key)) {
        if (required) {
            throw case_error(std::string("missing field '") + key + "'");
        }
        return dflt;
    }
    const json & v = j.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
        throw case_error(std::string("field '") + key + "' must be a positive integer");
    }
    return v.get<int64_t>();
}

static std::string get_string(const json & j, const char * key, const char * dflt) {
    if (!j.contains(key)) {
        if (!dflt) {
            throw case_error(std::string("missing field '") + key + "'");
        }
        return dflt;
    }
    if (!j.at(key).is_string()) {
        throw case_error(std::string("field '") + key + "' must be a string");
    }
    return j.at(key).get<std::string>();
}

static double get_number(const json & j, const char * key, double dflt) {
    if (!j.contains(key)) {
        return dflt;
    }
    if (!j.at(key).is_number() || !(j.at(key).get<double>() > 0)) {
        throw case_error(std::string("field '") + key + "' must be a positive number");
    }
    return j.at(key).get<double>();
}

mm_case parse_case(const json & j, const harness_opts & o) {
    if (!j.is_object()) {
        throw case_error("a case must be a JSON object");
    }
    mm_case c;
    if (!j.contains("case")) {
        throw case_error("missing field 'case'");
    }
    c.id        = j.at("case").is_string() ? j.at("case").get<std::string>() : j.at("case").dump();
    c.op        = get_string(j, "op", nullptr);
    c.layout    = get_string(j, "layout", "weight");
    c.src0_name = get_string(j, "src0_type", nullptr);
    c.src1_name = get_string(j, "src1_type", "f32");
    c.M         = get_positive(j, "M", true, 0);
    c.N         = get_positive(j, "N", true, 0);
    c.K         = get_positive(j, "K", true, 0);
    c.B         = get_positive(j, "B", false, 1);
    c.trials    = (int) get_positive(j, "trials", false, o.trials);
    c.nmse_max  = get_number(j, "nmse_max", o.nmse_max);
    c.drift_max = get_number(j, "drift_max", o.drift_max);
    if (j.contains("rotate")) {
        if (!j.at("rotate").is_boolean()) {
            throw case_error("field 'rotate' must be true or false");
        }
        c.rotate = j.at("rotate").get<bool>();
    } else {
        c.rotate = o.rotate;
    }
    if (c.op != "MUL_MAT") {
        throw case_error("op '" + c.op + "' is not supported by the harness (MUL_MAT only)");
    }
    if (c.layout != "weight" && c.layout != "attention") {
        throw case_error("layout '" + c.layout + "' is not supported by the harness (weight, attention)");
    }
    if (c.layout == "weight" && c.B != 1) {
        throw case_error("layout 'weight' needs B = 1");
    }
    c.src0 = type_by_name(c.src0_name);
    c.src1 = type_by_name(c.src1_name);
    if (c.src0 == GGML_TYPE_COUNT) {
        throw case_error("unknown src0_type '" + c.src0_name + "'");
    }
    if (c.src1 == GGML_TYPE_COUNT) {
        throw case_error("unknown src1_type '" + c.src1_name + "'");
    }
    if (c.K % ggml_blck_size(c.src0) != 0) {
        throw case_error("K = " + std::to_string(c.K) + " is not a multiple of the " + c.src0_name +
                         " block size " + std::to_string(ggml_blck_size(c.src0)));
    }
    if (c.K % ggml_blck_size(c.src1) != 0) {
        throw case_error("K is not a multiple of the src1 block size");
    }
    if (j.contains("routes")) {
        if (!j.at("routes").is_array()) {
            throw case_error("field 'routes' must be a list of route names");
        }
        for (const auto & r : j.at("routes")) {
            if (!r.is_string()) {
                throw case_error("field 'routes' must be a list of route names");
            }
            const std::string name = r.get<std::string>();
            if (name != "stock" && std::find(c.routes.begin(), c.routes.end(), name) == c.routes.end()) {
                c.routes.push_back(name);
            }
        }
    }
    return c;
}

std::string test_file_line(const mm_case & c) {
    // op type ne[4] n_params params... n_src (type ne[4] nb[4])... name; nb[0] = 0 means contiguous
    std::ostringstream s;
    s << (int) GGML_OP_MUL_MAT << ' ' << (int) GGML_TYPE_F32 << ' ' << c.N << ' ' << c.M << ' ' << c.B << " 1 ";
    s << "0 2 ";
    s << (int) c.src0 << ' ' << c.K << ' ' << c.N << ' ' << c.B << " 1 ";
    if (c.layout == "attention") {
        const size_t rs = ggml_row_size(c.src0, c.K * c.B);
        s << ggml_type_size(c.src0) << ' ' << rs << ' ' << ggml_row_size(c.src0, c.K) << ' ' << rs * c.N << ' ';
    } else {
        s << "0 0 0 0 ";
    }
    s << (int) c.src1 << ' ' << c.K << ' ' << c.M << ' ' << c.B << " 1 0 0 0 0 ";
    s << c.id;
    return s.str();
}

// ---------------------------------------------------------------------------------------------
// graph construction

namespace {

struct mm_tensors {
    ggml_context_ptr            ctx;
    ggml_backend_buffer_ptr     buf_w;
    ggml_backend_buffer_ptr     buf_a;
    std::vector<ggml_tensor *>  storage;  // one per weight copy (allocated)
    std::vector<ggml_tensor *>  w;        // src0 as the op sees it (the storage itself or a view)
    ggml_tensor *               x = nullptr;
    std::vector<ggml_tensor *>  y;
};

// Bytes of one weight copy and the shape of its storage.
int64_t storage_rows(const mm_case & c) {
    return c.N;
}

int64_t storage_row_len(const mm_case & c) {
    return c.layout == "attention" ? c.K * c.B : c.K;
}

size_t weight_bytes(const mm_case & c) {
    return ggml_row_size(c.src0, storage_row_len(c)) * (size_t) storage_rows(c);
}

// copies x weights, one activation tensor [K, M, B], `nodes` outputs y_i = mul_mat(w[i % copies], x).
// Weights go in their own buffer (usage WEIGHTS) as in llama.cpp.
void build(mm_tensors & t, const mm_case & c, int64_t M, int copies, int nodes, ggml_backend_t backend) {
    const size_t n_tensors = (size_t) (2 * copies + nodes + 4);
    ggml_init_params p     = { ggml_tensor_overhead() * n_tensors, nullptr, true };
    t.ctx.reset(ggml_init(p));
    if (!t.ctx) {
        throw std::runtime_error("ggml_init failed");
    }
    ggml_context * ctx = t.ctx.get();
    for (int i = 0; i < copies; ++i) {
        ggml_tensor * s = ggml_new_tensor_2d(ctx, c.src0, storage_row_len(c), storage_rows(c));
        ggml_format_name(s, "w%d", i);
        t.storage.push_back(s);
        if (c.layout == "attention") {
            // a KV-cache-like view: K-vectors of B heads interleaved in each of the N rows. GQA (fewer
            // KV heads broadcast over B query heads) is not modelled: the census key carries only B.
            ggml_tensor * v = ggml_view_3d(ctx, s, c.K, c.N, c.B, ggml_row_size(c.src0, c.K * c.B),
                                           ggml_row_size(c.src0, c.K), 0);
            t.w.push_back(v);
        } else {
            t.w.push_back(s);
        }
    }
    t.buf_w.reset(ggml_backend_alloc_ctx_tensors(ctx, backend));
    if (!t.buf_w) {
        throw std::runtime_error("allocation of " + std::to_string(copies) + " weight copies (" +
                                 std::to_string(copies * weight_bytes(c)) + " bytes) failed");
    }
    ggml_backend_buffer_set_usage(t.buf_w.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    // activations and outputs live in a second pass over the same context: tensors created after the
    // first allocation are allocated by the second call
    t.x = ggml_new_tensor_3d(ctx, c.src1, c.K, M, c.B);
    ggml_set_name(t.x, "x");
    for (int i = 0; i < nodes; ++i) {
        ggml_tensor * y = ggml_mul_mat(ctx, t.w[(size_t) (i % copies)], t.x);
        ggml_format_name(y, "y%d", i);
        t.y.push_back(y);
    }
    t.buf_a.reset(ggml_backend_alloc_ctx_tensors(ctx, backend));
    if (!t.buf_a) {
        throw std::runtime_error("allocation of activations and " + std::to_string(nodes) + " outputs failed");
    }
}

struct graph_holder {
    ggml_context_ptr ctx;
    ggml_cgraph *    gf = nullptr;
};

graph_holder make_graph(const std::vector<ggml_tensor *> & y, int nodes) {
    graph_holder  g;
    const size_t  size = (size_t) nodes * 2 + 64;
    ggml_init_params p = { ggml_graph_overhead_custom(size, false), nullptr, true };
    g.ctx.reset(ggml_init(p));
    g.gf = ggml_new_graph_custom(g.ctx.get(), size, false);
    for (int i = 0; i < nodes; ++i) {
        ggml_build_forward_expand(g.gf, y[(size_t) i]);
    }
#ifdef TUNER_SET_GRAPH_UID
    static uint64_t next_uid = uint64_t(1) << 62;  // far from the uids ggml's scheduler hands out
    g.gf->uid                = ++next_uid;
#endif
    return g;
}

std::vector<int64_t> sample_columns(int64_t M, int want) {
    std::vector<int64_t> cols;
    if (M <= want) {
        for (int64_t i = 0; i < M; ++i) {
            cols.push_back(i);
        }
        return cols;
    }
    for (int i = 0; i < want; ++i) {
        const int64_t col = (int64_t) llround((double) i * (double) (M - 1) / (double) (want - 1));
        if (cols.empty() || cols.back() != col) {
            cols.push_back(col);
        }
    }
    return cols;
}

// The output columns `cols` (of every batch) of y, in the reference's order [B][cols][N].
std::vector<float> read_columns(ggml_tensor * y, const mm_case & c, const std::vector<int64_t> & cols) {
    const size_t       col_bytes = (size_t) c.N * sizeof(float);
    std::vector<float> out((size_t) (c.N * c.B) * cols.size());
    // small outputs in one copy; large ones column by column (less device-to-host traffic per check)
    const bool         whole = ggml_nbytes(y) <= (size_t) 16 << 20 || cols.size() == (size_t) c.M;
    std::vector<float> all;
    if (whole) {
        all.resize(ggml_nbytes(y) / sizeof(float));
        ggml_backend_tensor_get(y, all.data(), 0, ggml_nbytes(y));
    }
    size_t k = 0;
    for (int64_t b = 0; b < c.B; ++b) {
        for (int64_t col : cols) {
            const size_t off = (size_t) (b * c.M + col) * col_bytes;
            if (whole) {
                memcpy(out.data() + k * (size_t) c.N, (const char *) all.data() + off, col_bytes);
            } else {
                ggml_backend_tensor_get(y, out.data() + k * (size_t) c.N, off, col_bytes);
            }
            ++k;
        }
    }
    return out;
}

struct candidate {
    std::string name;
    int         code    = 0;
    int         replays = 0;
    double      node_us = 0;  // per-node time seen while checking eligibility
};

json row(const mm_case & c, const std::string & route, int trial) {
    json r;
    r["kind"]  = "trial";
    r["case"]  = c.id;
    r["route"] = route;
    r["trial"] = trial;
    return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// measurement

void run_mul_mat_case(bench_env & env, const mm_case & c) {
    const harness_opts & o       = env.opts;
    const double         t_case0 = env.elapsed_s();
    const dispatch_api & api     = env.api;

    // how many copies to rotate so that the weights read per graph total >= factor x L2
    const size_t wbytes = weight_bytes(c);
    int          copies = 1;
    if (c.rotate && env.info.l2_bytes > 0) {
        copies = (int) std::ceil(o.rotate_factor * (double) env.info.l2_bytes / (double) wbytes);
        copies = std::max(1, std::min(copies, o.max_nodes));
    }
    if (env.info.memory_total > 0 && (double) copies * (double) wbytes > 0.5 * (double) env.info.memory_total) {
        throw std::runtime_error("weight copies would take more than half of the device memory");
    }
    const size_t ybytes = (size_t) (c.N * c.M * c.B) * sizeof(float);
    int          max_nodes = (int) std::min<int64_t>(o.max_nodes, std::max<int64_t>(1, o.dst_budget_bytes / (int64_t) ybytes));
    max_nodes              = std::max(copies, max_nodes / copies * copies);

    log_line("case %s: %s %s x %s M=%lld N=%lld K=%lld B=%lld, weight %zu bytes x %d copies, up to %d nodes",
             c.id.c_str(), c.layout.c_str(), c.src0_name.c_str(), c.src1_name.c_str(), (long long) c.M,
             (long long) c.N, (long long) c.K, (long long) c.B, wbytes, copies, max_nodes);

    // data: one set of random weights uploaded into every copy, one activation tensor
    const std::vector<uint8_t> wdata =
        random_weights(c.src0, storage_rows(c), storage_row_len(c), o.seed, o.threads);
    const std::vector<uint8_t> xdata = random_weights(c.src1, c.M * c.B, c.K, o.seed + 1, o.threads);

    mm_tensors dev;
    build(dev, c, c.M, copies, max_nodes, env.backend);
    for (ggml_tensor * s : dev.storage) {
        ggml_backend_tensor_set(s, wdata.data(), 0, wdata.size());
    }
    ggml_backend_tensor_set(dev.x, xdata.data(), 0, xdata.size());

    // CPU reference on a sample of output columns (all of them when M is small)
    const std::vector<int64_t> cols = sample_columns(c.M, o.ref_cols);
    std::vector<float>         ref;
    {
        mm_tensors r;
        build(r, c, (int64_t) cols.size(), 1, 1, env.backend_ref);
        ggml_backend_tensor_set(r.storage[0], wdata.data(), 0, wdata.size());
        const size_t         xrow = ggml_row_size(c.src1, c.K);
        std::vector<uint8_t> xs(xrow * cols.size() * (size_t) c.B);
        size_t               k = 0;
        for (int64_t b = 0; b < c.B; ++b) {
            for (int64_t col : cols) {
                memcpy(xs.data() + k * xrow, xdata.data() + (size_t) (b * c.M + col) * xrow, xrow);
                ++k;
            }
        }
        ggml_backend_tensor_set(r.x, xs.data(), 0, xs.size());
        graph_holder g = make_graph(r.y, 1);
        if (!compute(env.backend_ref, g.gf)) {
            throw std::runtime_error("CPU reference compute failed");
        }
        ref.resize((size_t) (c.N * c.B) * cols.size());
        ggml_backend_tensor_get(r.y[0], ref.data(), 0, ref.size() * sizeof(float));
    }
    auto check = [&](int nodes) {
        double worst = 0.0;
        for (int i : { 0, nodes - 1 }) {
            const std::vector<float> out = read_columns(dev.y[(size_t) i], c, cols);
            const double             e   = nmse(ref.data(), out.data(), ref.size());
            if (std::isnan(e)) {
                return (double) NAN;
            }
            worst = std::max(worst, e);
        }
        return worst;
    };
    const double setup_s = env.elapsed_s() - t_case0;

    // candidates refused before timing: reported once per trial (with that trial's anchor), never timed
    struct refused {
        std::string route, status, route_ran, reason;
        double      nmse;
    };
    std::vector<refused> refusals;
    auto not_timed = [&](const std::string & route, const char * status, const std::string & route_ran, double e,
                         const std::string & reason) {
        refusals.push_back({ route, status, route_ran, reason, e });
    };

    // candidates: stock first (the anchor), then the requested routes the backend can be asked for
    std::vector<candidate> cands;
    cands.push_back({ "stock", 0, 0, 0 });
    for (const std::string & r : c.routes) {
        const int code = route_code(r);
        if (code <= 0) {
            not_timed(r, "ineligible", "", NAN, "unknown-route");
        } else if (!api.present()) {
            not_timed(r, "ineligible", "", NAN, "no-override-api");
        } else {
            cands.push_back({ r, code, 0, 0 });
        }
    }

    // eligibility: each candidate once on a graph of `copies` nodes; refused or wrong ones are not timed
    int         nodes0 = copies;
    std::string stock_ran;
    {
        graph_holder           g0 = make_graph(dev.y, nodes0);
        std::vector<candidate> ok;
        for (candidate & cd : cands) {
            log_line("case %s: check route=%s", c.id.c_str(), cd.name.c_str());
            api.set(cd.code);
            for (int i : { 0, nodes0 - 1 }) {
                poison(dev.y[(size_t) i]);
            }
            api.take();
            for (int w = 0; w < o.warmup; ++w) {
                if (!compute(env.backend, g0.gf)) {
                    throw std::runtime_error("ggml_backend_graph_compute failed");
                }
            }
            // one replay after the warm-up: its time sizes the graph and the replays per trial
            const double last = time_graph(env.backend, g0.gf, 1)[0];
            const ggml_dispatch_counts cnt = api.take();
            const std::string ran = api.present() ? route_ran_of(cnt) : "unverified";
            const double      e   = check(nodes0);
            cd.node_us            = last / nodes0;
            if (cd.code == 0) {
                stock_ran = ran;
            }
            if (cd.code != 0 && cnt.ineligible > 0) {
                not_timed(cd.name, "ineligible", ran, e, "fell-back:" + ran);
                continue;
            }
            if (cd.code != 0 && ran != cd.name) {
                not_timed(cd.name, "wrong", ran, e, "ran:" + ran);
                continue;
            }
            if (cd.code != 0 && !(e <= c.nmse_max)) {
                char buf[96];
                snprintf(buf, sizeof(buf), "nmse %.3g > %.3g", e, c.nmse_max);
                not_timed(cd.name, "wrong", ran, e, buf);
                continue;
            }
            ok.push_back(cd);
        }
        cands = ok;
    }

    // replicate nodes until one graph takes about target_graph_us (a multiple of `copies`)
    const double stock_node_us = std::max(cands[0].node_us, 0.01);
    int          nodes         = (int) std::ceil(o.target_graph_us / stock_node_us);
    nodes                      = std::min(max_nodes, std::max(copies, (nodes + copies - 1) / copies * copies));
    graph_holder g             = make_graph(dev.y, nodes);
    for (candidate & cd : cands) {
        const double graph_us = std::max(cd.node_us * nodes, 1.0);
        cd.replays = (int) std::clamp((double) std::ceil(o.trial_ms * 1000.0 / graph_us), (double) o.min_replays,
                                      (double) o.max_replays);
    }
    log_line("case %s: %d nodes per graph, %zu timed candidates, %d trials", c.id.c_str(), nodes, cands.size(),
             c.trials);

    // trials: candidates interleaved, order rotated each trial, stock in every trial as the anchor
    const size_t                      n = cands.size();
    std::vector<std::vector<json>>    trial_rows((size_t) c.trials);
    std::vector<double>               anchors((size_t) c.trials, NAN);
    for (int t = 0; t < c.trials; ++t) {
        for (size_t k = 0; k < n; ++k) {
            const candidate & cd = cands[(k + (size_t) t) % n];
            log_line("case %s: trial %d route=%s", c.id.c_str(), t, cd.name.c_str());
            api.set(cd.code);
            for (int w = 0; w < o.warmup; ++w) {
                if (!compute(env.backend, g.gf)) {
                    throw std::runtime_error("ggml_backend_graph_compute failed");
                }
            }
            api.take();
            std::vector<double> s = time_graph(env.backend, g.gf, cd.replays - 1);
            // the last replay writes into poisoned outputs, so a replay that skipped a node is caught
            poison(dev.y[0]);
            poison(dev.y[(size_t) nodes - 1]);
            const std::vector<double> last = time_graph(env.backend, g.gf, 1);
            s.push_back(last[0]);
            const ggml_dispatch_counts cnt = api.take();
            const double               e   = check(nodes);

            std::string ran    = "unverified";
            std::string status = "ok";
            std::string reason;
            if (api.present()) {
                ran                    = route_ran_of(cnt);
                const int64_t expected = (int64_t) nodes * cd.replays;
                if (cd.code != 0 && cnt.ineligible > 0) {
                    status = "ineligible";
                    reason = "fell-back:" + ran;
                } else if (cd.code != 0 && ran != cd.name) {
                    status = "wrong";
                    reason = "ran:" + ran;
                } else if (counted_nodes(cnt) != expected) {
                    status = "wrong";
                    reason = "counted " + std::to_string(counted_nodes(cnt)) + " of " + std::to_string(expected) +
                             " nodes";
                }
            }
            if (status == "ok" && !(e <= c.nmse_max)) {
                char buf[96];
                snprintf(buf, sizeof(buf), "nmse %.3g > %.3g", e, c.nmse_max);
                status = "wrong";
                reason = buf;
            }
            json r             = row(c, cd.name, t);
            r["us"]            = median(s) / nodes;
            r["replays"]       = cd.replays;
            r["nodes"]         = nodes;
            r["weight_copies"] = copies;
            r["anchor_us"]     = nullptr;
            r["nmse"]          = std::isnan(e) ? json(nullptr) : json(e);
            r["route_ran"]     = ran;
            r["status"]        = status;
            r["reason"]        = reason;
            r["t_end_s"]       = env.elapsed_s();
            if (cd.code == 0) {
                anchors[(size_t) t] = r["us"].get<double>();
            }
            trial_rows[(size_t) t].push_back(r);
        }
    }
    api.set(0);

    // anchors and drift: a trial whose stock time is off the median stock time by > drift_max is marked
    std::vector<double> valid;
    for (double a : anchors) {
        if (!std::isnan(a)) {
            valid.push_back(a);
        }
    }
    const double med = median(valid);
    int          n_drifted = 0;
    for (int t = 0; t < c.trials; ++t) {
        for (const refused & f : refusals) {
            json r             = row(c, f.route, t);
            r["us"]            = nullptr;
            r["replays"]       = 0;
            r["nodes"]         = 0;
            r["weight_copies"] = copies;
            r["nmse"]          = std::isnan(f.nmse) ? json(nullptr) : json(f.nmse);
            r["route_ran"]     = f.route_ran;
            r["status"]        = f.status;
            r["reason"]        = f.reason;
            r["t_end_s"]       = nullptr;
            trial_rows[(size_t) t].push_back(r);
        }
        const double a       = anchors[(size_t) t];
        const double off     = std::fabs(a / med - 1.0);
        const bool   drifted = !std::isnan(a) && off > c.drift_max;
        n_drifted += drifted;
        for (json & r : trial_rows[(size_t) t]) {
            r["anchor_us"] = std::isnan(a) ? json(nullptr) : json(a);
            if (drifted && r["status"] == "ok") {
                char buf[64];
                snprintf(buf, sizeof(buf), "anchor %+.1f%% off the median", 100.0 * (a / med - 1.0));
                r["status"] = "drifted";
                r["reason"] = buf;
            }
            emit(r);
        }
    }

    json end;
    end["kind"]          = "case";
    end["case"]          = c.id;
    end["status"]        = "done";
    end["weight_bytes"]  = wbytes;
    end["weight_copies"] = copies;
    end["rotated_bytes"] = wbytes * (size_t) copies;
    end["l2_bytes"]      = env.info.l2_bytes;
    end["nodes"]         = nodes;
    end["stock_route_ran"] = stock_ran;
    end["ref_cols"]      = cols.size();
    end["trials"]        = c.trials;
    end["drifted"]       = n_drifted;
    end["nmse_max"]      = c.nmse_max;
    end["drift_max"]     = c.drift_max;
    end["setup_s"]       = setup_s;
    end["elapsed_s"]     = env.elapsed_s() - t_case0;
    end["t_end_s"]       = env.elapsed_s();
    json reps            = json::object();
    for (const candidate & cd : cands) {
        reps[cd.name] = cd.replays;
    }
    end["replays"] = reps;
    emit(end);
}
