// MUL_MAT_ID (expert matmuls of MoE models): its case fields, the graph of replicated nodes over rotated
// expert-weight copies with an expert routing drawn per node, the CPU reference on sampled tokens, the
// output check, and its test-backend-ops line. The generic measurement (bench.cpp, op.h) does the rest.
//
// Case fields (besides op.h's): src0_type, src1_type (f32), M (tokens), N, K, E (experts), U (src1
// rows per token: 1 for gate/up, which broadcast the token over its experts; `used` for down),
// used (experts per token, ids->ne[0]) and routing:
//   {"kind": "uniform"}                  top-`used` experts uniformly at random per token (case (b));
//   {"kind": "skewed", "s": 1.2}         experts drawn with weight 1/(rank+1)^s without replacement (c);
//   {"kind": "few", "experts": 8}        every token on the same `experts` >= used experts (d, no-harm);
//   {"kind": "counts", "counts": [...]}  weights = a recorded tokens-per-expert distribution (a).
// Every replicated node gets its own routing drawn from the same distribution (seeded by the node), so
// a graph replay reads as many different routings as it has nodes; the routings do not change between
// replays (changing them would need a host upload inside the timed loop).
#include "op.h"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

namespace {

struct id_case {
    std::string         id;
    std::string         src0_name, src1_name;
    ggml_type           src0 = GGML_TYPE_COUNT, src1 = GGML_TYPE_COUNT;
    int64_t             M = 0, N = 0, K = 0, E = 0, U = 1, used = 1;
    std::string         routing = "uniform";
    double              skew    = 1.2;
    int64_t             few     = 0;
    std::vector<double> weights;  // per expert (counts / skewed); empty = uniform
    bool                rotate  = true;
};

id_case parse_id(const op_case & oc) {
    const json & j = oc.spec;
    id_case      c;
    c.id        = oc.id;
    c.rotate    = oc.rotate;
    const char * expert = ggml_dispatch_layout_name(GGML_DISPATCH_LAYOUT_EXPERT);
    if (get_string(j, "layout", expert) != expert) {
        throw case_error(std::string("MUL_MAT_ID cases have layout '") + expert + "'");
    }
    c.src0_name = get_string(j, "src0_type", nullptr);
    c.src1_name = get_string(j, "src1_type", ggml_type_name(GGML_TYPE_F32));
    c.M         = get_positive(j, "M", true, 0);
    c.N         = get_positive(j, "N", true, 0);
    c.K         = get_positive(j, "K", true, 0);
    c.E         = get_positive(j, "E", true, 0);
    c.used      = get_positive(j, "used", true, 0);
    c.U         = get_positive(j, "U", false, 1);
    if (c.used > c.E) {
        throw case_error("used = " + std::to_string(c.used) + " is more than E = " + std::to_string(c.E));
    }
    if (c.U != 1 && c.U != c.used) {
        throw case_error("U must be 1 (gate/up) or used (down)");
    }
    c.src0 = type_by_name(c.src0_name);
    c.src1 = type_by_name(c.src1_name);
    if (c.src0 == GGML_TYPE_COUNT) {
        throw case_error("unknown src0_type '" + c.src0_name + "'");
    }
    if (c.src1 != GGML_TYPE_F32) {
        throw case_error("MUL_MAT_ID needs src1_type f32 (ggml_cuda_mul_mat_id asserts it)");
    }
    if (c.K % ggml_blck_size(c.src0) != 0) {
        throw case_error("K = " + std::to_string(c.K) + " is not a multiple of the " + c.src0_name +
                         " block size " + std::to_string(ggml_blck_size(c.src0)));
    }
    const json r = j.contains("routing") ? j.at("routing") : json::object({ { "kind", "uniform" } });
    if (!r.is_object()) {
        throw case_error("field 'routing' must be an object");
    }
    c.routing = get_string(r, "kind", "uniform");
    if (c.routing == "uniform") {
    } else if (c.routing == "skewed") {
        if (r.contains("s") && (!r.at("s").is_number() || r.at("s").get<double>() <= 0)) {
            throw case_error("routing.s must be a positive number");
        }
        c.skew = r.value("s", 1.2);
        for (int64_t e = 0; e < c.E; ++e) {
            c.weights.push_back(1.0 / std::pow((double) (e + 1), c.skew));
        }
    } else if (c.routing == "few") {
        c.few = get_positive(r, "experts", false, c.used);
        if (c.few < c.used || c.few > c.E) {
            throw case_error("routing.experts must be between used and E");
        }
    } else if (c.routing == "counts") {
        if (!r.contains("counts") || !r.at("counts").is_array() || (int64_t) r.at("counts").size() != c.E) {
            throw case_error("routing.counts must be a list of E token counts");
        }
        int64_t nonzero = 0;
        for (const json & v : r.at("counts")) {
            if (!v.is_number() || v.get<double>() < 0) {
                throw case_error("routing.counts must hold numbers >= 0");
            }
            c.weights.push_back(v.get<double>());
            nonzero += v.get<double>() > 0;
        }
        if (nonzero < c.used) {
            throw case_error("routing.counts has fewer experts with tokens than used");
        }
    } else {
        throw case_error("routing.kind '" + c.routing + "' is not one of uniform, skewed, few, counts");
    }
    return c;
}

// ids [used, M] of one node: per token `used` distinct experts.
std::vector<int32_t> draw_ids(const id_case & c, uint64_t seed) {
    std::mt19937_64      rng(seed);
    std::vector<int32_t> ids((size_t) (c.used * c.M));
    std::vector<int32_t> all((size_t) c.E);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < c.M; ++t) {
        int32_t * out = ids.data() + t * c.used;
        if (c.routing == "few") {
            std::vector<int32_t> pick(all.begin(), all.begin() + c.few);
            std::shuffle(pick.begin(), pick.end(), rng);
            std::copy(pick.begin(), pick.begin() + c.used, out);
        } else if (c.weights.empty()) {
            std::shuffle(all.begin(), all.end(), rng);
            std::copy(all.begin(), all.begin() + c.used, out);
        } else {
            // weighted sampling without replacement (Efraimidis-Spirakis keys)
            std::uniform_real_distribution<double>   u(1e-12, 1.0);
            std::vector<std::pair<double, int32_t>> keys;
            for (int64_t e = 0; e < c.E; ++e) {
                if (c.weights[(size_t) e] > 0) {
                    keys.push_back({ std::log(u(rng)) / c.weights[(size_t) e], (int32_t) e });
                }
            }
            std::partial_sort(keys.begin(), keys.begin() + c.used, keys.end(),
                              [](const auto & a, const auto & b) { return a.first > b.first; });
            for (int64_t k = 0; k < c.used; ++k) {
                out[k] = keys[(size_t) k].second;
            }
        }
    }
    return ids;
}

struct id_tensors {
    ggml_context_ptr           ctx;
    ggml_backend_buffer_ptr    buf_w;
    ggml_backend_buffer_ptr    buf_a;
    std::vector<ggml_tensor *> w;
    ggml_tensor *              x = nullptr;
    std::vector<ggml_tensor *> ids;
    std::vector<ggml_tensor *> y;
};

size_t weight_bytes(const id_case & c) {
    return ggml_row_size(c.src0, c.K) * (size_t) (c.N * c.E);
}

void build(id_tensors & t, const id_case & c, int64_t M, int copies, int nodes, ggml_backend_t backend) {
    const size_t     n_tensors = (size_t) (copies + 2 * nodes + 4);
    ggml_init_params p         = { ggml_tensor_overhead() * n_tensors, nullptr, true };
    t.ctx.reset(ggml_init(p));
    if (!t.ctx) {
        throw std::runtime_error("ggml_init failed");
    }
    ggml_context * ctx = t.ctx.get();
    for (int i = 0; i < copies; ++i) {
        ggml_tensor * s = ggml_new_tensor_3d(ctx, c.src0, c.K, c.N, c.E);
        ggml_format_name(s, "w%d", i);
        t.w.push_back(s);
    }
    t.buf_w.reset(ggml_backend_alloc_ctx_tensors(ctx, backend));
    if (!t.buf_w) {
        throw std::runtime_error("allocation of " + std::to_string(copies) + " expert weight copies failed");
    }
    ggml_backend_buffer_set_usage(t.buf_w.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    t.x = ggml_new_tensor_3d(ctx, c.src1, c.K, c.U, M);
    ggml_set_name(t.x, "x");
    for (int i = 0; i < nodes; ++i) {
        ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.used, M);
        ggml_format_name(ids, "ids%d", i);
        t.ids.push_back(ids);
        ggml_tensor * y = ggml_mul_mat_id(ctx, t.w[(size_t) (i % copies)], t.x, ids);
        ggml_format_name(y, "y%d", i);
        t.y.push_back(y);
    }
    t.buf_a.reset(ggml_backend_alloc_ctx_tensors(ctx, backend));
    if (!t.buf_a) {
        throw std::runtime_error("allocation of activations and " + std::to_string(nodes) + " outputs failed");
    }
}

std::vector<int64_t> sample_tokens(int64_t M, int want) {
    std::vector<int64_t> cols;
    for (int i = 0; i < std::max(1, want) && (int64_t) cols.size() < M; ++i) {
        const int64_t col = want <= 1 || M <= want ? i : (int64_t) llround((double) i * (double) (M - 1) / (double) (want - 1));
        if (cols.empty() || cols.back() != col) {
            cols.push_back(col);
        }
    }
    return cols;
}

class mul_mat_id_instance : public replicated_instance {
  public:
    mul_mat_id_instance(bench_env & env, const op_case & oc) : c_(parse_id(oc)) {
        const harness_opts & o = env.opts;
        wbytes_                = weight_bytes(c_);
        size_replication(env, c_.rotate, wbytes_, (int64_t) (c_.N * c_.used * c_.M) * (int64_t) sizeof(float),
                         "expert weight copies");
        log_line("case %s: expert %s x %s M=%lld N=%lld K=%lld E=%lld U=%lld used=%lld routing %s, weight %zu bytes x %d "
                 "copies, up to %d nodes",
                 c_.id.c_str(), c_.src0_name.c_str(), c_.src1_name.c_str(), (long long) c_.M, (long long) c_.N,
                 (long long) c_.K, (long long) c_.E, (long long) c_.U, (long long) c_.used, c_.routing.c_str(), wbytes_,
                 copies_, max_nodes_);

        const std::vector<uint8_t> wdata = random_weights(c_.src0, c_.N * c_.E, c_.K, o.seed, o.threads);
        const std::vector<uint8_t> xdata = random_weights(c_.src1, c_.U * c_.M, c_.K, o.seed + 1, o.threads);
        build(dev_, c_, c_.M, copies_, max_nodes_, env.backend);
        for (ggml_tensor * s : dev_.w) {
            ggml_backend_tensor_set(s, wdata.data(), 0, wdata.size());
        }
        ggml_backend_tensor_set(dev_.x, xdata.data(), 0, xdata.size());
        ids_.resize((size_t) max_nodes_);
        for (int i = 0; i < max_nodes_; ++i) {
            ids_[(size_t) i] = draw_ids(c_, o.seed * 1000003u + (uint64_t) i);
            ggml_backend_tensor_set(dev_.ids[(size_t) i], ids_[(size_t) i].data(), 0, ids_[(size_t) i].size() * sizeof(int32_t));
        }
        cols_ = sample_tokens(c_.M, o.ref_cols);
        // the reference of the first node and of every node that may be the last: its routing differs
        const size_t xrow = ggml_row_size(c_.src1, c_.K) * (size_t) c_.U;
        std::vector<uint8_t> xs(xrow * cols_.size());
        for (size_t k = 0; k < cols_.size(); ++k) {
            memcpy(xs.data() + k * xrow, xdata.data() + (size_t) cols_[k] * xrow, xrow);
        }
        id_tensors r;
        build(r, c_, (int64_t) cols_.size(), 1, 1, env.backend_ref);
        ggml_backend_tensor_set(r.w[0], wdata.data(), 0, wdata.size());
        ggml_backend_tensor_set(r.x, xs.data(), 0, xs.size());
        ref_r_ = std::move(r);
        expert_stats(ids_[0]);
    }

    double check(int nodes) override {
        double worst = 0.0;
        for (int i : { 0, nodes - 1 }) {
            const std::vector<float> ref = reference(i);
            const size_t             col = (size_t) (c_.N * c_.used);
            std::vector<float>       out(col * cols_.size());
            for (size_t k = 0; k < cols_.size(); ++k) {
                ggml_backend_tensor_get(dev_.y[(size_t) i], out.data() + k * col, (size_t) cols_[k] * col * sizeof(float),
                                        col * sizeof(float));
            }
            const double e = nmse(ref.data(), out.data(), ref.size());
            if (std::isnan(e)) {
                return (double) NAN;
            }
            worst = std::max(worst, e);
        }
        return worst;
    }

    void describe(json & end) const override {
        end["weight_bytes"]  = wbytes_;
        end["rotated_bytes"] = wbytes_ * (size_t) copies_;
        end["ref_cols"]      = cols_.size();
        end["routing"]       = c_.routing;
        end["experts"]       = experts_;
    }

  protected:
    const std::vector<ggml_tensor *> & outputs() const override { return dev_.y; }

  private:
    // The CPU reference of node i on the sampled tokens (computed on first use, kept).
    std::vector<float> reference(int i) {
        auto it = refs_.find(i);
        if (it != refs_.end()) {
            return it->second;
        }
        std::vector<int32_t> ids((size_t) c_.used * cols_.size());
        for (size_t k = 0; k < cols_.size(); ++k) {
            memcpy(ids.data() + k * (size_t) c_.used, ids_[(size_t) i].data() + (size_t) cols_[k] * (size_t) c_.used,
                   (size_t) c_.used * sizeof(int32_t));
        }
        ggml_backend_tensor_set(ref_r_.ids[0], ids.data(), 0, ids.size() * sizeof(int32_t));
        graph_holder g = make_graph(ref_r_.y, 1);
        if (!compute(ref_backend_, g.gf)) {
            throw std::runtime_error("CPU reference compute failed");
        }
        std::vector<float> out(ggml_nelements(ref_r_.y[0]));
        ggml_backend_tensor_get(ref_r_.y[0], out.data(), 0, out.size() * sizeof(float));
        refs_[i] = out;
        return out;
    }

    // Tokens per expert of one node's routing, as the trace's statistics count them.
    void expert_stats(const std::vector<int32_t> & ids) {
        std::vector<int64_t> n((size_t) c_.E, 0);
        for (int32_t e : ids) {
            n[(size_t) e]++;
        }
        int64_t nonempty = 0, mx = 0, picks = 0;
        double  sumsq = 0;
        for (int64_t v : n) {
            if (v > 0) {
                nonempty++;
                mx = std::max(mx, v);
                picks += v;
                sumsq += (double) v * (double) v;
            }
        }
        const double mean = nonempty ? (double) picks / (double) nonempty : 0.0;
        const double var  = nonempty ? sumsq / (double) nonempty - mean * mean : 0.0;
        experts_ = { { "nonempty", nonempty }, { "max", mx }, { "mean", mean },
                     { "cv", var > 0 && mean > 0 ? std::sqrt(var) / mean : 0.0 } };
    }

  public:
    ggml_backend_t ref_backend_ = nullptr;

  private:
    id_case                                c_;
    size_t                                 wbytes_    = 0;
    id_tensors                             dev_;
    id_tensors                             ref_r_;
    std::vector<std::vector<int32_t>>      ids_;
    std::vector<int64_t>                   cols_;
    std::map<int, std::vector<float>>      refs_;
    json                                   experts_;
};

const op_def mul_mat_id_op = {
    ggml_dispatch_op_name(GGML_DISPATCH_OP_MUL_MAT_ID),
    [](const op_case & c, const harness_opts &) { (void) parse_id(c); },
    [](bench_env & env, const op_case & c) -> std::unique_ptr<op_instance> {
        auto inst          = std::make_unique<mul_mat_id_instance>(env, c);
        inst->ref_backend_ = env.backend_ref;
        return inst;
    },
    nullptr,  // test-backend-ops draws its own ids: no comparable --test-file line
};

}  // namespace

GGML_DISPATCH_HARNESS_OP(mul_mat_id_op);
