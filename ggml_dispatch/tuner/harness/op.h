// The harness's op interface: what one op's file (mul_mat.cpp today) gives the generic measurement in
// bench.cpp. Adding an op is one file that defines an op_def and registers it with GGML_DISPATCH_HARNESS_OP.
//
// As upstream's tools/tuning measure_cell: the op file builds the graph (replicated nodes over rotated
// weight copies), its CPU reference and the output check; bench.cpp owns eligibility, replication, the
// trials with candidates interleaved and stock re-measured as the anchor, drift and the output lines, and
// switches candidates only through the set/clear-candidate callbacks.
#pragma once

#include "bench.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// A case the harness cannot run as given (bad field, unsupported op or layout).
struct case_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A case field that must be a positive integer: `dflt` when absent unless `required`.
inline int64_t get_positive(const json & j, const char * key, bool required, int64_t dflt) {
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

// A case field that must be a string: `dflt` when absent (nullptr: required).
inline std::string get_string(const json & j, const char * key, const char * dflt) {
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

// A graph of the first `nodes` outputs `y`, in its own context.
struct graph_holder {
    ggml_context_ptr ctx;
    ggml_cgraph *    gf = nullptr;
};

graph_holder make_graph(const std::vector<ggml_tensor *> & y, int nodes);  // bench.cpp

// The fields every case has, whatever its op; `spec` is the whole case object for the op's own fields.
struct op_case {
    std::string              id;
    std::string              op;          // registry op name ("MUL_MAT")
    std::vector<std::string> candidates;  // configurations besides stock, canonical text ("mmq", "cublas/out=f32")
    int                      trials    = 5;
    double                   nmse_max  = 5e-4;
    double                   drift_max = 0.10;
    bool                     rotate    = true;
    json                     spec;
};

// One case's graphs on the device under test, set up by the op's file.
struct op_instance {
    virtual ~op_instance() = default;

    // The graph of `nodes` replicated nodes (a multiple of copies(), at most max_nodes()); the instance keeps it.
    virtual ggml_cgraph * graph(int nodes)  = 0;
    virtual int           copies() const    = 0;  // weight copies rotated through the nodes
    virtual int           max_nodes() const = 0;
    // Poisons the outputs of the first and the last of `nodes` nodes (a skipped node is then caught).
    virtual void          poison(int nodes) = 0;
    // Worst NMSE of the first and the last node's output against the CPU reference (NaN: an unwritten output).
    virtual double        check(int nodes)  = 0;
    // Op-specific fields of the closing {"kind": "case"} line (weight bytes, reference columns, ...).
    virtual void          describe(json & end) const = 0;
};

// What every op's instance shares: `copies_` rotated copies of its weights (or KV cache), up to
// `max_nodes_` replicated outputs (`outputs()`), the graph of the first `nodes` of them, and poisoning the
// first and the last.
class replicated_instance : public op_instance {
  public:
    ggml_cgraph * graph(int nodes) override {
        graph_ = make_graph(outputs(), nodes);
        return graph_.gf;
    }

    int copies() const override { return copies_; }

    int max_nodes() const override { return max_nodes_; }

    void poison(int nodes) override {
        ::poison(outputs()[0]);
        ::poison(outputs()[(size_t) nodes - 1]);
    }

  protected:
    virtual const std::vector<ggml_tensor *> & outputs() const = 0;

    // copies_: enough that one graph reads >= rotate_factor x L2 of `bytes` (one when not `rotate` or
    // the L2 size is unknown), refused above half the device memory (`what` names the copies); max_nodes_: as
    // many nodes of `node_bytes` as the output budget holds, a multiple of copies_.
    void size_replication(const bench_env & env, bool rotate, size_t bytes, int64_t node_bytes, const char * what) {
        const harness_opts & o = env.opts;
        if (rotate && env.info.l2_bytes > 0) {
            copies_ = (int) std::ceil(o.rotate_factor * (double) env.info.l2_bytes / (double) bytes);
            copies_ = std::max(1, std::min(copies_, o.max_nodes));
        }
        if (env.info.memory_total > 0 && (double) copies_ * (double) bytes > 0.5 * (double) env.info.memory_total) {
            throw std::runtime_error(std::string(what) + " would take more than half of the device memory");
        }
        max_nodes_ = (int) std::min<int64_t>(o.max_nodes, std::max<int64_t>(1, o.dst_budget_bytes / node_bytes));
        max_nodes_ = std::max(copies_, max_nodes_ / copies_ * copies_);
    }

    int          copies_    = 1;
    int          max_nodes_ = 1;
    graph_holder graph_;
};

struct op_def {
    const char * op;  // registry op name
    // Checks the op's own fields of a case (throws case_error naming the field).
    std::function<void(const op_case &, const harness_opts &)>                       validate;
    std::function<std::unique_ptr<op_instance>(bench_env &, const op_case &)>         setup;
    // One line of a test-backend-ops --test-file for the case; empty function: the op has no such form.
    std::function<std::string(const op_case &)>                                       test_file_line;
};

// The registered ops (each op file registers itself once at start-up).
std::vector<const op_def *> & harness_ops();
const op_def *                find_op(const std::string & name);

struct op_registrar {
    explicit op_registrar(const op_def & def) { harness_ops().push_back(&def); }
};

#define GGML_DISPATCH_HARNESS_OP(def) static const op_registrar ggml_dispatch_harness_op_registrar_(def)

// Candidate switching, as measure_cell's set/clear callbacks: set(config code) before a candidate's
// computes, clear() for stock. The default drives the patched ggml-cuda's override API.
struct candidate_control {
    std::function<bool()>    present;  // false: only stock can be measured
    std::function<void(int)> set;
    std::function<void()>    clear;
};

candidate_control dispatch_candidates(const dispatch_api & api);

// Validates the common fields of one case object and the op's own (throws case_error naming the field).
op_case parse_case(const json & j, const harness_opts & o);

// Measures one case: eligibility and numerics of every candidate first, then interleaved trials with
// stock as the anchor in each; emits the trial rows and a closing {"kind": "case"} line. t_case0: when the
// case's setup began (env.elapsed_s()).
void measure_case(bench_env & env, const op_case & c, op_instance & inst, const candidate_control & cand,
                  double t_case0);

// Sets the case up with its op's file and measures it with the override API as the candidate control.
void run_case(bench_env & env, const op_case & c);
