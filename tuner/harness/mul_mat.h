// MUL_MAT cases: the one-op graph, its rotated weight copies and replicated nodes, the CPU reference,
// and the trial loop over candidate routes.
#pragma once

#include "bench.h"

#include <stdexcept>
#include <string>
#include <vector>

// A case the harness cannot run as given (bad field, unsupported op or layout).
struct case_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct mm_case {
    std::string              id;
    std::string              op;      // "MUL_MAT"
    std::string              layout;  // "weight" | "attention"
    std::string              src0_name, src1_name;
    ggml_type                src0 = GGML_TYPE_COUNT, src1 = GGML_TYPE_COUNT;
    int64_t                  M = 0, N = 0, K = 0, B = 1;
    std::vector<std::string> routes;  // candidates besides stock
    int                      trials    = 5;
    double                   nmse_max  = 5e-4;
    double                   drift_max = 0.10;
    bool                     rotate    = true;
};

// Validates one case object of the case list (interface 5). Throws case_error naming the field.
mm_case parse_case(const json & j, const harness_opts & o);

// Measures one case; emits its trial rows and a closing {"kind": "case"} line.
void run_mul_mat_case(bench_env & env, const mm_case & c);

// One line of a test-backend-ops --test-file for the case (weight and attention layouts).
std::string test_file_line(const mm_case & c);
