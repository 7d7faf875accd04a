// Generic measurement machinery of the tuning harness: device and provenance, random quantized data,
// the configuration-override API, poisoning and NMSE, the timing loop, statistics and JSON output.
// Nothing here knows about a particular op; op.h is the op interface, mul_mat.cpp the MUL_MAT op.
#pragma once

#include "ggml-dispatch.h"  // the hook's C interface; its codes header is generated from the registry
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#ifndef TUNER_HARNESS_VERSION
#    define TUNER_HARNESS_VERSION "dev"
#endif

using json = nlohmann::ordered_json;

// Configuration text <-> code through the generated codes header: -1 if the text names no configuration
// (stock is code 0 and has no configuration text); "" for an invalid code.
int         config_code(const std::string & text);
std::string config_text(int code);

struct harness_opts {
    std::string device;                     // ggml device name, "" = first GPU, else CPU
    int64_t     l2_bytes          = -1;     // -1: query the device (CUDA), else as given (0 = no rotation)
    bool        rotate            = true;   // rotate weight copies totalling >= rotate_factor x L2
    double      rotate_factor     = 4.0;
    double      target_graph_us   = 2000;   // replicate nodes until one graph takes about this long
    double      trial_ms          = 25;     // timed replays per (route, trial) take about this long
    int         min_replays       = 5;
    int         max_replays       = 2000;
    int         max_nodes         = 4096;   // cap on replicated nodes per graph
    int64_t     dst_budget_bytes  = int64_t(2) << 30;  // memory for the replicated outputs
    // untimed computes after each override change: ggml-cuda runs the first directly (the override made
    // its captured graph stale), captures on the second, so every timed compute is a graph replay
    int         warmup            = 2;
    double      drift_max         = 0.10;   // a trial is drifted when its anchor is this far from the median
    int         ref_cols          = 64;     // output columns checked against the CPU reference
    int         threads           = 0;      // CPU threads for data generation and the reference (0 = all)
    uint64_t    seed              = 42;
    int         trials            = 5;      // default when a case does not say
    double      nmse_max          = 5e-4;   // default when a case does not say
    // racing (race.h): after race_min_trials paired trials a candidate whose 95% t-interval of the
    // ratio best/candidate lies below 1 - race_noise is no longer timed (0 = time every trial)
    int         race_min_trials   = 3;
    double      race_noise        = 0.02;
    // after trial 0, a candidate more than race_screen times the best first time is not timed again
    // (race.h race_screened; 0 = off; off with racing off too)
    double      race_screen       = 1.5;
};

// What the harness learned about the device under test; printed once as the header line.
struct device_info {
    std::string backend;      // ggml backend registry name ("CUDA", "CPU", ...)
    std::string dev_name;     // ggml device name ("CUDA0")
    std::string description;  // ggml device description (GPU name for CUDA)
    std::string type;         // "gpu", "cpu", ...
    std::string pci_bus_id;
    std::string gpu_name;     // provenance columns (empty / 0 where the backend has no such notion)
    std::string gpu_uuid;
    int         gpu_cc       = 0;
    int         gpu_sm_count = 0;
    int64_t     smpbo        = 0;
    std::string driver;       // NVIDIA driver (NVML), else the CUDA driver API version
    std::string driver_source;
    std::string cuda_version;   // CUDA runtime the process runs with
    std::string cublas_version;
    int64_t     l2_bytes = 0;
    std::string l2_source;
    int64_t     memory_total = 0;
    json        features = json::object();  // the backend's ggml_backend_get_features list
    bool        dispatch_api = false;
};

struct dispatch_api {
    ggml_dispatch_set_override_t set_override = nullptr;
    ggml_dispatch_get_counts_t   get_counts   = nullptr;

    bool present() const { return set_override != nullptr && get_counts != nullptr; }

    void set(int code) const {
        if (set_override) {
            set_override(code);
        }
    }

    ggml_dispatch_counts take() const;  // read and reset; zeros when absent
};

struct bench_env {
    harness_opts   opts;
    ggml_backend_t backend     = nullptr;  // device under test
    ggml_backend_t backend_ref = nullptr;  // CPU reference
    ggml_backend_dev_t dev     = nullptr;
    device_info    info;
    dispatch_api   api;
    int64_t        t_start_us = 0;

    double elapsed_s() const;
};

// Initializes backends, queries the device, looks up the override API. Throws std::runtime_error.
void bench_init(bench_env & env);
void bench_free(bench_env & env);
json device_header(const bench_env & env);

// Emits one JSON object as a line on stdout and flushes.
void emit(const json & j);
void log_line(const char * fmt, ...);

// Uniform [-1, 1] floats, deterministic in (seed, stream), filled by several threads.
void fill_uniform(float * dst, int64_t n, uint64_t seed, uint64_t stream, int threads);

// Random weights of `type`: nrows x n_per_row floats quantized by ggml_quantize_chunk (with an
// all-ones importance matrix where the type requires one). Returns the raw bytes.
std::vector<uint8_t> random_weights(ggml_type type, int64_t nrows, int64_t n_per_row, uint64_t seed, int threads);

// Type by ggml name ("q4_K"); GGML_TYPE_COUNT if unknown.
ggml_type type_by_name(const std::string & name);

// Sets every byte of the tensor to 0xFF (an f32 NaN), so an output a kernel did not write is caught.
void poison(ggml_tensor * t);

// test-backend-ops' normalized mean squared error: sum((a - b)^2) / sum(a^2), a = reference.
double nmse(const float * ref, const float * out, size_t n);

// Times `replays` computes of gf (wall clock around compute + synchronize), one sample per replay, in us.
std::vector<double> time_graph(ggml_backend_t backend, ggml_cgraph * gf, int replays);
bool                compute(ggml_backend_t backend, ggml_cgraph * gf);

double median(std::vector<double> v);

// Which route ran according to the counts: a route name, "other" (code 0), "mixed:<a>=<n>,...", or
// "none" when nothing was counted.
std::string route_ran_of(const ggml_dispatch_counts & c);
int64_t     counted_nodes(const ggml_dispatch_counts & c);
ggml_dispatch_counts counts_sum(const ggml_dispatch_counts & a, const ggml_dispatch_counts & b);
