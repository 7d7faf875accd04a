// MUL_MAT, the harness's first op: its case fields, the one-op graph over rotated weight copies with
// replicated nodes, the CPU reference, the output check, and its test-backend-ops line. The generic
// measurement (bench.cpp, op.h) does the rest.
#include "op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace {

struct mm_case {
    std::string id;
    int         layout = GGML_DISPATCH_LAYOUT_WEIGHT;  // weight | attention
    std::string src0_name, src1_name;
    ggml_type   src0 = GGML_TYPE_COUNT, src1 = GGML_TYPE_COUNT;
    int64_t     M = 0, N = 0, K = 0, B = 1;
    bool        rotate = true;
};

mm_case parse_mm(const op_case & oc) {
    const json & j = oc.spec;
    mm_case      c;
    c.id                     = oc.id;
    c.rotate                 = oc.rotate;
    const char * weight      = ggml_dispatch_layout_name(GGML_DISPATCH_LAYOUT_WEIGHT);
    const char * attention   = ggml_dispatch_layout_name(GGML_DISPATCH_LAYOUT_ATTENTION);
    const std::string layout = get_string(j, "layout", weight);
    c.src0_name              = get_string(j, "src0_type", nullptr);
    c.src1_name              = get_string(j, "src1_type", ggml_type_name(GGML_TYPE_F32));
    c.M                      = get_positive(j, "M", true, 0);
    c.N                      = get_positive(j, "N", true, 0);
    c.K                      = get_positive(j, "K", true, 0);
    c.B                      = get_positive(j, "B", false, 1);
    if (layout == weight) {
        c.layout = GGML_DISPATCH_LAYOUT_WEIGHT;
    } else if (layout == attention) {
        c.layout = GGML_DISPATCH_LAYOUT_ATTENTION;
    } else {
        throw case_error("layout '" + layout + "' is not supported by the harness (" + weight + ", " + attention + ")");
    }
    if (c.layout == GGML_DISPATCH_LAYOUT_WEIGHT && c.B != 1) {
        throw case_error(std::string("layout '") + weight + "' needs B = 1");
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
    return c;
}

std::string mm_test_file_line(const op_case & oc) {
    const mm_case c = parse_mm(oc);
    // op type ne[4] n_params params... n_src (type ne[4] nb[4])... name; nb[0] = 0 means contiguous
    std::ostringstream s;
    s << (int) GGML_OP_MUL_MAT << ' ' << (int) GGML_TYPE_F32 << ' ' << c.N << ' ' << c.M << ' ' << c.B << " 1 ";
    s << "0 2 ";
    s << (int) c.src0 << ' ' << c.K << ' ' << c.N << ' ' << c.B << " 1 ";
    if (c.layout == GGML_DISPATCH_LAYOUT_ATTENTION) {
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
    return c.layout == GGML_DISPATCH_LAYOUT_ATTENTION ? c.K * c.B : c.K;
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
        if (c.layout == GGML_DISPATCH_LAYOUT_ATTENTION) {
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

// ---------------------------------------------------------------------------------------------
// the instance the generic measurement drives

class mul_mat_instance : public replicated_instance {
  public:
    mul_mat_instance(bench_env & env, const op_case & oc) : c_(parse_mm(oc)) {
        const harness_opts & o = env.opts;
        // how many copies to rotate so that the weights read per graph total >= factor x L2
        wbytes_ = weight_bytes(c_);
        size_replication(env, c_.rotate, wbytes_, (int64_t) (c_.N * c_.M * c_.B) * (int64_t) sizeof(float), "weight copies");

        log_line("case %s: %s %s x %s M=%lld N=%lld K=%lld B=%lld, weight %zu bytes x %d copies, up to %d nodes",
                 c_.id.c_str(), ggml_dispatch_layout_name(c_.layout), c_.src0_name.c_str(), c_.src1_name.c_str(),
                 (long long) c_.M, (long long) c_.N, (long long) c_.K, (long long) c_.B, wbytes_, copies_,
                 max_nodes_);

        // data: one set of random weights uploaded into every copy, one activation tensor
        const std::vector<uint8_t> wdata =
            random_weights(c_.src0, storage_rows(c_), storage_row_len(c_), o.seed, o.threads);
        const std::vector<uint8_t> xdata = random_weights(c_.src1, c_.M * c_.B, c_.K, o.seed + 1, o.threads);

        build(dev_, c_, c_.M, copies_, max_nodes_, env.backend);
        for (ggml_tensor * s : dev_.storage) {
            ggml_backend_tensor_set(s, wdata.data(), 0, wdata.size());
        }
        ggml_backend_tensor_set(dev_.x, xdata.data(), 0, xdata.size());

        // CPU reference on a sample of output columns (all of them when M is small)
        cols_ = sample_columns(c_.M, o.ref_cols);
        mm_tensors r;
        build(r, c_, (int64_t) cols_.size(), 1, 1, env.backend_ref);
        ggml_backend_tensor_set(r.storage[0], wdata.data(), 0, wdata.size());
        const size_t         xrow = ggml_row_size(c_.src1, c_.K);
        std::vector<uint8_t> xs(xrow * cols_.size() * (size_t) c_.B);
        size_t               k = 0;
        for (int64_t b = 0; b < c_.B; ++b) {
            for (int64_t col : cols_) {
                memcpy(xs.data() + k * xrow, xdata.data() + (size_t) (b * c_.M + col) * xrow, xrow);
                ++k;
            }
        }
        ggml_backend_tensor_set(r.x, xs.data(), 0, xs.size());
        graph_holder g = make_graph(r.y, 1);
        if (!compute(env.backend_ref, g.gf)) {
            throw std::runtime_error("CPU reference compute failed");
        }
        ref_.resize((size_t) (c_.N * c_.B) * cols_.size());
        ggml_backend_tensor_get(r.y[0], ref_.data(), 0, ref_.size() * sizeof(float));
    }

    double check(int nodes) override {
        double worst = 0.0;
        for (int i : { 0, nodes - 1 }) {
            const std::vector<float> out = read_columns(dev_.y[(size_t) i], c_, cols_);
            const double             e   = nmse(ref_.data(), out.data(), ref_.size());
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
    }

  protected:
    const std::vector<ggml_tensor *> & outputs() const override { return dev_.y; }

  private:
    mm_case              c_;
    size_t               wbytes_    = 0;
    mm_tensors           dev_;
    std::vector<int64_t> cols_;
    std::vector<float>   ref_;
};

const op_def mul_mat_op = {
    ggml_dispatch_op_name(GGML_DISPATCH_OP_MUL_MAT),
    [](const op_case & c, const harness_opts &) { (void) parse_mm(c); },
    [](bench_env & env, const op_case & c) -> std::unique_ptr<op_instance> {
        return std::make_unique<mul_mat_instance>(env, c);
    },
    mm_test_file_line,
};

}  // namespace

GGML_DISPATCH_HARNESS_OP(mul_mat_op);
