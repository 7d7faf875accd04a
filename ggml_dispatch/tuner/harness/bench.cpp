#include "bench.h"
#include "race.h"
#include "op.h"

#include "ggml-cpu.h"

#ifdef TUNER_SET_GRAPH_UID
// struct ggml_cgraph is opaque in the public headers; its uid (make_graph) lets ggml-cuda skip the
// per-compute node property comparison (host work that would otherwise sit inside every timed replay)
#    include "ggml-impl.h"
#endif

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#ifdef TUNER_WITH_CUDART
#    include <cuda_runtime_api.h>
#endif

int config_code(const std::string & text) {
    int32_t code = 0;
    return ggml_dispatch_config_parse(text.c_str(), &code) ? (int) code : -1;
}

std::string config_text(int code) {
    char buf[128];
    return ggml_dispatch_config_format(code, buf, sizeof(buf)) < 0 ? std::string() : std::string(buf);
}

ggml_dispatch_counts dispatch_api::take() const {
    ggml_dispatch_counts c;
    memset(&c, 0, sizeof(c));
    if (get_counts) {
        get_counts(&c, 1);
    }
    return c;
}

static double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

double bench_env::elapsed_s() const {
    return (now_us() - (double) t_start_us) * 1e-6;
}

void emit(const json & j) {
    const std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
    fwrite(s.data(), 1, s.size(), stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

void log_line(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("harness: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

// ---------------------------------------------------------------------------------------------
// device and provenance

static std::string lower(std::string s) {
    for (auto & c : s) {
        c = (char) tolower((unsigned char) c);
    }
    return s;
}

static const char * dev_type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU:
            return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU:
            return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU:
            return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL:
            return "accel";
        default:
            return "other";
    }
}

// NVIDIA driver version string (e.g. "580.159.04") through NVML, loaded only if present.
static std::string nvml_driver_version() {
    void * h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        return "";
    }
    using init_t    = int (*)();
    using version_t = int (*)(char *, unsigned int);
    using shutdown_t = int (*)();
    auto init      = (init_t) dlsym(h, "nvmlInit_v2");
    auto version   = (version_t) dlsym(h, "nvmlSystemGetDriverVersion");
    auto shutdown  = (shutdown_t) dlsym(h, "nvmlShutdown");
    std::string out;
    if (init && version && init() == 0) {
        char buf[96] = {};
        if (version(buf, sizeof(buf)) == 0) {
            out = buf;
        }
        if (shutdown) {
            shutdown();
        }
    }
    dlclose(h);
    return out;
}

// cuBLAS version of the library ggml-cuda loaded (the process already has it when ggml-cuda is linked).
static std::string cublas_version() {
    using prop_t = int (*)(int, int *);
    auto  fn     = (prop_t) dlsym(RTLD_DEFAULT, "cublasGetProperty");
    void * h     = nullptr;
    if (!fn) {
        for (const char * so : { "libcublas.so.13", "libcublas.so.12", "libcublas.so" }) {
            h = dlopen(so, RTLD_LAZY | RTLD_NOLOAD);
            if (h) {
                fn = (prop_t) dlsym(h, "cublasGetProperty");
                break;
            }
        }
    }
    std::string out;
    int         major = 0, minor = 0, patch = 0;
    if (fn && fn(0, &major) == 0 && fn(1, &minor) == 0 && fn(2, &patch) == 0) {
        out = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    }
    if (h) {
        dlclose(h);
    }
    return out;
}

#ifdef TUNER_WITH_CUDART
static void query_cuda(device_info & info) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        return;
    }
    int dev = -1;
    for (int i = 0; i < n && !info.pci_bus_id.empty(); ++i) {
        char bus[64] = {};
        if (cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess && lower(bus) == lower(info.pci_bus_id)) {
            dev = i;
            break;
        }
    }
    if (dev < 0) {
        // fall back to the ordinal in the ggml name ("CUDA0")
        const std::string & name = info.dev_name;
        size_t              p    = name.find_first_of("0123456789");
        dev                      = p == std::string::npos ? 0 : atoi(name.c_str() + p);
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        return;
    }
    info.gpu_name     = p.name;
    info.gpu_cc       = 100 * p.major + 10 * p.minor;
    info.gpu_sm_count = p.multiProcessorCount;
    info.smpbo        = (int64_t) p.sharedMemPerBlockOptin;
    char uuid[64];
    const unsigned char * u = (const unsigned char *) p.uuid.bytes;
    snprintf(uuid, sizeof(uuid), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    info.gpu_uuid = uuid;
    if (info.l2_source.empty()) {
        info.l2_bytes  = p.l2CacheSize;
        info.l2_source = "cudaDeviceProp.l2CacheSize";
    }
    int v = 0;
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) {
        info.cuda_version = std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
    }
    if (info.driver.empty() && cudaDriverGetVersion(&v) == cudaSuccess) {
        info.driver        = "cuda-" + std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
        info.driver_source = "cudaDriverGetVersion";
    }
}
#endif

static void set_threads(ggml_backend_t backend, int n) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    if (!reg) {
        return;
    }
    auto fn = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) {
        fn(backend, n);
    }
}

void bench_init(bench_env & env) {
    ggml_time_init();
    env.t_start_us = (int64_t) now_us();
    harness_opts & o = env.opts;
    if (o.threads <= 0) {
        o.threads = std::max(1u, std::thread::hardware_concurrency());
    }

    if (ggml_backend_dev_count() == 0) {
        ggml_backend_load_all();
    }

    ggml_backend_dev_t dev = nullptr;
    if (!o.device.empty()) {
        dev = ggml_backend_dev_by_name(o.device.c_str());
        if (!dev) {
            std::string have;
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                have += std::string(i ? ", " : "") + ggml_backend_dev_name(ggml_backend_dev_get(i));
            }
            throw std::runtime_error("no ggml device named '" + o.device + "' (have: " + have + ")");
        }
    } else {
        dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
        if (!dev) {
            dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        }
    }
    if (!dev) {
        throw std::runtime_error("no ggml device available");
    }
    env.dev     = dev;
    env.backend = ggml_backend_dev_init(dev, nullptr);
    if (!env.backend) {
        throw std::runtime_error(std::string("cannot initialize ") + ggml_backend_dev_name(dev));
    }
    env.backend_ref = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!env.backend_ref) {
        throw std::runtime_error("cannot initialize the CPU reference backend");
    }
    set_threads(env.backend_ref, o.threads);
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        set_threads(env.backend, o.threads);
    }

    device_info &      info = env.info;
    ggml_backend_reg_t reg  = ggml_backend_dev_backend_reg(dev);
    info.backend            = reg ? ggml_backend_reg_name(reg) : "";
    ggml_backend_dev_props props;
    memset(&props, 0, sizeof(props));
    ggml_backend_dev_get_props(dev, &props);
    info.dev_name     = props.name ? props.name : "";
    info.description  = props.description ? props.description : "";
    info.type         = dev_type_name(props.type);
    info.pci_bus_id   = props.device_id ? props.device_id : "";
    info.memory_total = (int64_t) props.memory_total;
    info.gpu_name     = info.description;

    if (reg) {
        auto get_features =
            (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
        if (get_features) {
            for (ggml_backend_feature * f = get_features(reg); f && f->name; ++f) {
                info.features[f->name] = f->value ? f->value : "";
            }
        }
        env.api.set_override =
            (ggml_dispatch_set_override_t) ggml_backend_reg_get_proc_address(reg, GGML_DISPATCH_PROC_SET_OVERRIDE);
        env.api.get_counts =
            (ggml_dispatch_get_counts_t) ggml_backend_reg_get_proc_address(reg, GGML_DISPATCH_PROC_GET_COUNTS);
        if (!env.api.present()) {
            env.api = dispatch_api{};
        }
    }
    info.dispatch_api = env.api.present();

    if (o.l2_bytes >= 0) {
        info.l2_bytes  = o.l2_bytes;
        info.l2_source = "--l2-bytes";
    }
    if (info.backend == "CUDA") {
        info.driver = nvml_driver_version();
        if (!info.driver.empty()) {
            info.driver_source = "nvml";
        }
#ifdef TUNER_WITH_CUDART
        query_cuda(info);
#endif
        info.cublas_version = cublas_version();
    }
    if (info.l2_source.empty()) {
        info.l2_bytes  = 0;
        info.l2_source = "unknown (no rotation; pass --l2-bytes)";
    }
}

void bench_free(bench_env & env) {
    if (env.backend) {
        env.api.set(0);
        ggml_backend_free(env.backend);
        env.backend = nullptr;
    }
    if (env.backend_ref) {
        ggml_backend_free(env.backend_ref);
        env.backend_ref = nullptr;
    }
}

json device_header(const bench_env & env) {
    const device_info & d = env.info;
    json                j;
    j["kind"]            = "header";
    j["harness_version"] = TUNER_HARNESS_VERSION;
    j["ggml_commit"]     = ggml_commit();
    j["backend"]         = d.backend;
    j["device"]          = d.dev_name;
    j["description"]     = d.description;
    j["device_type"]     = d.type;
    j["pci_bus_id"]      = d.pci_bus_id;
    j["gpu_name"]        = d.gpu_name;
    j["gpu_uuid"]        = d.gpu_uuid;
    j["gpu_cc"]          = d.gpu_cc;
    j["gpu_sm_count"]    = d.gpu_sm_count;
    j["smpbo"]           = d.smpbo;
    j["driver"]          = d.driver;
    j["driver_source"]   = d.driver_source;
    j["cuda_version"]    = d.cuda_version;
    j["cublas_version"]  = d.cublas_version;
    j["memory_total"]    = d.memory_total;
    j["l2_bytes"]        = d.l2_bytes;
    j["l2_source"]       = d.l2_source;
    j["features"]        = d.features;
    j["dispatch_api"]    = d.dispatch_api;
    j["registry_sha256"] = GGML_DISPATCH_REGISTRY_SHA256;
#ifdef TUNER_SET_GRAPH_UID
    j["graph_uid"] = true;
#else
    j["graph_uid"] = false;
#endif
    const harness_opts & o = env.opts;
    j["opts"] = {
        { "rotate", o.rotate },
        { "rotate_factor", o.rotate_factor },
        { "target_graph_us", o.target_graph_us },
        { "trial_ms", o.trial_ms },
        { "min_replays", o.min_replays },
        { "max_replays", o.max_replays },
        { "max_nodes", o.max_nodes },
        { "warmup", o.warmup },
        { "drift_max", o.drift_max },
        { "race_min_trials", o.race_min_trials },
        { "race_noise", o.race_noise },
        { "race_screen", o.race_screen },
        { "ref_cols", o.ref_cols },
        { "threads", o.threads },
        { "seed", o.seed },
    };
    return j;
}

// ---------------------------------------------------------------------------------------------
// data

static inline uint64_t splitmix64(uint64_t & x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z          = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z          = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)> & fn) {
    threads = (int) std::max<int64_t>(1, std::min<int64_t>(threads, n));
    if (threads == 1) {
        fn(0, n);
        return;
    }
    std::vector<std::thread> pool;
    const int64_t            per = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
        const int64_t a = t * per, b = std::min(n, a + per);
        if (a < b) {
            pool.emplace_back(fn, a, b);
        }
    }
    for (auto & th : pool) {
        th.join();
    }
}

void fill_uniform(float * dst, int64_t n, uint64_t seed, uint64_t stream, int threads) {
    const int64_t chunk   = 1 << 16;
    const int64_t nchunks = (n + chunk - 1) / chunk;
    parallel_for(nchunks, threads, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            uint64_t      state = seed * 0x9E3779B97F4A7C15ull ^ (stream + 1) * 0xD1B54A32D192ED03ull ^ (uint64_t) c;
            const int64_t end   = std::min(n, (c + 1) * chunk);
            for (int64_t i = c * chunk; i < end; ++i) {
                const uint64_t r = splitmix64(state) >> 40;  // 24 random bits
                dst[i]           = (float) ((double) r / (double) (1 << 23) - 1.0);
            }
        }
    });
}

std::vector<uint8_t> random_weights(ggml_type type, int64_t nrows, int64_t n_per_row, uint64_t seed, int threads) {
    std::vector<float> f((size_t) (nrows * n_per_row));
    fill_uniform(f.data(), (int64_t) f.size(), seed, /*stream=*/0, threads);
    std::vector<uint8_t> q(ggml_row_size(type, n_per_row) * (size_t) nrows);
    std::vector<float>   imatrix;
    if (ggml_quantize_requires_imatrix(type)) {
        imatrix.assign((size_t) n_per_row, 1.0f);
    }
    ggml_quantize_init(type);
    parallel_for(nrows, threads, [&](int64_t r0, int64_t r1) {
        ggml_quantize_chunk(type, f.data(), q.data(), r0 * n_per_row, r1 - r0, n_per_row,
                            imatrix.empty() ? nullptr : imatrix.data());
    });
    return q;
}

ggml_type type_by_name(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && name == n && ggml_type_size((ggml_type) t) > 0) {
            return (ggml_type) t;
        }
    }
    return GGML_TYPE_COUNT;
}

void poison(ggml_tensor * t) {
    ggml_backend_tensor_memset(t, 0xFF, 0, ggml_nbytes(t));
}

double nmse(const float * ref, const float * out, size_t n) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double d = (double) ref[i] - (double) out[i];
        err += d * d;
        norm += (double) ref[i] * (double) ref[i];
    }
    if (std::isnan(err)) {
        return NAN;
    }
    return norm > 0.0 ? err / norm : err;
}

// ---------------------------------------------------------------------------------------------
// timing

bool compute(ggml_backend_t backend, ggml_cgraph * gf) {
    const ggml_status st = ggml_backend_graph_compute(backend, gf);
    ggml_backend_synchronize(backend);
    return st == GGML_STATUS_SUCCESS;
}

std::vector<double> time_graph(ggml_backend_t backend, ggml_cgraph * gf, int replays) {
    std::vector<double> t;
    t.reserve((size_t) replays);
    for (int r = 0; r < replays; ++r) {
        const double t0 = now_us();
        if (!compute(backend, gf)) {
            throw std::runtime_error("ggml_backend_graph_compute failed");
        }
        t.push_back(now_us() - t0);
    }
    return t;
}

double median(std::vector<double> v) {
    if (v.empty()) {
        return NAN;
    }
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

ggml_dispatch_counts counts_sum(const ggml_dispatch_counts & a, const ggml_dispatch_counts & b) {
    ggml_dispatch_counts s;
    for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
        s.ran[i] = a.ran[i] + b.ran[i];
    }
    s.forced     = a.forced + b.forced;
    s.table      = a.table + b.table;
    s.ineligible = a.ineligible + b.ineligible;
    s.eager      = a.eager + b.eager;
    return s;
}

int64_t counted_nodes(const ggml_dispatch_counts & c) {
    int64_t n = 0;
    for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
        n += c.ran[i];
    }
    return n;
}

std::string route_ran_of(const ggml_dispatch_counts & c) {
    std::vector<int> seen;
    for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
        if (c.ran[i] > 0) {
            seen.push_back(i);
        }
    }
    if (seen.empty()) {
        return "none";
    }
    auto name = [](int i) { return std::string(i == 0 ? "other" : ggml_dispatch_route_name(i)); };
    if (seen.size() == 1) {
        return name(seen[0]);
    }
    std::string s = "mixed:";
    for (size_t k = 0; k < seen.size(); ++k) {
        s += (k ? "," : "") + name(seen[k]) + "=" + std::to_string(c.ran[seen[k]]);
    }
    return s;
}

// ---------------------------------------------------------------------------------------------
// ops and cases

std::vector<const op_def *> & harness_ops() {
    static std::vector<const op_def *> ops;
    return ops;
}

const op_def * find_op(const std::string & name) {
    for (const op_def * d : harness_ops()) {
        if (name == d->op) {
            return d;
        }
    }
    return nullptr;
}

static int64_t get_positive_int(const json & j, const char * key, int64_t dflt) {
    if (!j.contains(key)) {
        return dflt;
    }
    const json & v = j.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
        throw case_error(std::string("field '") + key + "' must be a positive integer");
    }
    return v.get<int64_t>();
}

static double get_positive_number(const json & j, const char * key, double dflt) {
    if (!j.contains(key)) {
        return dflt;
    }
    if (!j.at(key).is_number() || !(j.at(key).get<double>() > 0)) {
        throw case_error(std::string("field '") + key + "' must be a positive number");
    }
    return j.at(key).get<double>();
}

op_case parse_case(const json & j, const harness_opts & o) {
    if (!j.is_object()) {
        throw case_error("a case must be a JSON object");
    }
    op_case c;
    if (!j.contains("case")) {
        throw case_error("missing field 'case'");
    }
    c.id = j.at("case").is_string() ? j.at("case").get<std::string>() : j.at("case").dump();
    if (!j.contains("op")) {
        throw case_error("missing field 'op'");
    }
    if (!j.at("op").is_string()) {
        throw case_error("field 'op' must be a string");
    }
    c.op               = j.at("op").get<std::string>();
    const op_def * def = find_op(c.op);
    if (def == nullptr) {
        std::string have;
        for (const op_def * d : harness_ops()) {
            have += std::string(have.empty() ? "" : ", ") + d->op;
        }
        throw case_error("op '" + c.op + "' is not supported by the harness (" + have + " only)");
    }
    c.trials    = (int) get_positive_int(j, "trials", o.trials);
    c.nmse_max  = get_positive_number(j, "nmse_max", o.nmse_max);
    c.drift_max = get_positive_number(j, "drift_max", o.drift_max);
    if (j.contains("rotate")) {
        if (!j.at("rotate").is_boolean()) {
            throw case_error("field 'rotate' must be true or false");
        }
        c.rotate = j.at("rotate").get<bool>();
    } else {
        c.rotate = o.rotate;
    }
    // candidates: configurations ("routes" for the plain ones of the case list's first version); stock is the anchor
    if (j.contains("routes")) {
        if (!j.at("routes").is_array()) {
            throw case_error("field 'routes' must be a list of configurations");
        }
        for (const auto & r : j.at("routes")) {
            if (!r.is_string()) {
                throw case_error("field 'routes' must be a list of configurations");
            }
            const int         code = config_code(r.get<std::string>());
            const std::string name = code > 0 ? config_text(code) : r.get<std::string>();  // canonical when legal
            if (r.get<std::string>() != ggml_dispatch_route_name(0) &&
                std::find(c.candidates.begin(), c.candidates.end(), name) == c.candidates.end()) {
                c.candidates.push_back(name);
            }
        }
    }
    c.spec = j;
    def->validate(c, o);
    return c;
}

candidate_control dispatch_candidates(const dispatch_api & api) {
    candidate_control cc;
    cc.present = [&api]() { return api.present(); };
    cc.set     = [&api](int code) { api.set(code); };
    cc.clear   = [&api]() { api.set(0); };
    return cc;
}

namespace {

struct candidate {
    std::string name;
    int         code    = 0;
    int         replays = 0;
    double      node_us = 0;      // per-node time seen while checking eligibility
    bool        eager   = false;  // that check's replay ran without a CUDA graph
};

json trial_row(const op_case & c, const std::string & name, int trial) {
    json r;
    r["kind"]  = "trial";
    r["case"]  = c.id;
    r["route"] = name;
    r["trial"] = trial;
    return r;
}

}  // namespace

void measure_case(bench_env & env, const op_case & c, op_instance & inst, const candidate_control & cand,
                  double t_case0) {
    const harness_opts & o       = env.opts;
    const double         setup_s = env.elapsed_s() - t_case0;
    const dispatch_api & api     = env.api;
    const bool           present = cand.present();
    const int            copies  = inst.copies();

    auto select = [&](int code) {
        if (code == 0) {
            cand.clear();
        } else {
            cand.set(code);
        }
    };
    // the route name a configuration must run as (the counts report routes)
    auto route_of = [](int code) { return std::string(ggml_dispatch_route_name(ggml_dispatch_config_route(code))); };

    // candidates refused before timing: reported once per trial (with that trial's anchor), never timed
    struct refused {
        std::string name, status, route_ran, reason;
        double      nmse;
    };
    std::vector<refused> refusals;
    auto not_timed = [&](const std::string & name, const char * status, const std::string & route_ran, double e,
                         const std::string & reason) {
        refusals.push_back({ name, status, route_ran, reason, e });
    };

    // candidates: stock first (the anchor), then the requested configurations the backend can be asked for
    std::vector<candidate> cands;
    cands.push_back({ ggml_dispatch_route_name(0), 0, 0, 0 });
    for (const std::string & name : c.candidates) {
        const int code = config_code(name);
        if (code <= 0) {
            not_timed(name, "ineligible", "", NAN, "unknown-route");
        } else if (!present) {
            not_timed(name, "ineligible", "", NAN, "no-override-api");
        } else {
            cands.push_back({ name, code, 0, 0 });
        }
    }

    // eligibility: each candidate once on a graph of `copies` nodes; refused or wrong ones are not timed
    const int   nodes0 = copies;
    std::string stock_ran;
    bool        stock_eager    = false;
    double      stock_check_us = 0;  // stock's node time in the eligibility run
    {
        ggml_cgraph *          g0 = inst.graph(nodes0);
        std::vector<candidate> ok;
        for (candidate & cd : cands) {
            log_line("case %s: check route=%s", c.id.c_str(), cd.name.c_str());
            select(cd.code);
            inst.poison(nodes0);
            api.take();
            for (int w = 0; w < o.warmup; ++w) {
                if (!compute(env.backend, g0)) {
                    throw std::runtime_error("ggml_backend_graph_compute failed");
                }
            }
            const ggml_dispatch_counts warm = api.take();
            // one replay after the warm-up: its time sizes the graph and the replays per trial
            const double               last = time_graph(env.backend, g0, 1)[0];
            const ggml_dispatch_counts once = api.take();
            const ggml_dispatch_counts cnt  = counts_sum(warm, once);
            const std::string          ran  = api.present() ? route_ran_of(cnt) : "unverified";
            const double               e    = inst.check(nodes0);
            cd.node_us                      = last / nodes0;
            cd.eager                        = api.present() && once.eager > 0;
            if (cd.code == 0) {
                stock_ran      = ran;
                stock_eager    = cd.eager;
                stock_check_us = cd.node_us;
            }
            if (cd.code != 0 && cnt.ineligible > 0) {
                not_timed(cd.name, "ineligible", ran, e, "fell-back:" + ran);
                continue;
            }
            if (cd.code != 0 && ran != route_of(cd.code)) {
                not_timed(cd.name, "wrong", ran, e, "ran:" + ran);
                continue;
            }
            if (cd.code != 0 && !(e <= c.nmse_max)) {
                char buf[96];
                snprintf(buf, sizeof(buf), "nmse %.3g > %.3g", e, c.nmse_max);
                not_timed(cd.name, "wrong", ran, e, buf);
                continue;
            }
            // a configuration whose graph ran without CUDA graphs where stock's was captured breaks graphs
            // (its node synchronizes: the per-expert fallback); in a model the whole graph would run so, a
            // cost beyond its node, so unless its own node is faster than stock's it is not timed further
            const std::string broken =
                cd.code != 0 ? graph_break_pruned(cd.eager, stock_eager, cd.node_us, stock_check_us) : "";
            if (!broken.empty()) {
                not_timed(cd.name, "pruned", ran, e, broken);
                log_line("case %s: pruned route=%s (%s)", c.id.c_str(), cd.name.c_str(), broken.c_str());
                continue;
            }
            ok.push_back(cd);
        }
        cands = ok;
    }

    // replicate nodes until one graph takes about target_graph_us (a multiple of `copies`)
    const int    max_nodes     = inst.max_nodes();
    const double stock_node_us = std::max(cands[0].node_us, 0.01);
    int          nodes         = (int) std::ceil(o.target_graph_us / stock_node_us);
    nodes                      = std::min(max_nodes, std::max(copies, (nodes + copies - 1) / copies * copies));
    ggml_cgraph * g            = inst.graph(nodes);
    for (candidate & cd : cands) {
        const double graph_us = std::max(cd.node_us * nodes, 1.0);
        cd.replays = (int) std::clamp((double) std::ceil(o.trial_ms * 1000.0 / graph_us), (double) o.min_replays,
                                      (double) o.max_replays);
    }
    log_line("case %s: %d nodes per graph, %zu timed candidates, %d trials", c.id.c_str(), nodes, cands.size(),
             c.trials);

    // trials: candidates interleaved, order rotated each trial, stock in every trial as the anchor;
    // racing (race.h) stops timing a candidate slower than the current best beyond noise. MUL_MAT_ID races
    // against stock instead: its table rule must be harmless under every routing (ggml_dispatch/codegen/moe.py), so a
    // configuration slower than some bucket's best but not than stock there still needs its full trials,
    // and one slower than stock beyond noise in any bucket is out of the routing-0 decision.
    const bool vs_stock = c.op == ggml_dispatch_op_name(GGML_DISPATCH_OP_MUL_MAT_ID);
    const size_t                     n = cands.size();
    std::vector<std::vector<json>>   trial_rows((size_t) c.trials);
    std::vector<double>              anchors((size_t) c.trials, NAN);
    std::vector<std::vector<double>> ok_us(n, std::vector<double>((size_t) c.trials, NAN));
    std::vector<std::string>         pruned(n);  // non-empty: why it is no longer timed
    const race_opts                  race = { o.race_min_trials, o.race_noise, o.race_screen };
    std::vector<bool>                per_call(n);  // runs without the weight cache (race.h race_best_among)
    for (size_t k = 0; k < n; ++k) {
        per_call[k] = cands[k].name.find("weight=cached") == std::string::npos;
    }
    if (race.min_trials > 0 && c.op == ggml_dispatch_op_name(GGML_DISPATCH_OP_MUL_MAT) && c.spec.contains("M")) {
        // the tile model (race.h): a wider mmq tile with the same column-tile count is not timed
        std::vector<std::string> names;
        for (const candidate & cd : cands) {
            names.push_back(cd.name);
        }
        const std::vector<std::string> dom =
            tile_dominated(names, std::vector<bool>(n, true), c.spec["M"].get<long>());
        for (size_t k = 0; k < n; ++k) {
            if (!dom[k].empty()) {
                pruned[k] = "tile model: as many column tiles as " + dom[k];
                log_line("case %s: pruned route=%s (%s)", c.id.c_str(), cands[k].name.c_str(), pruned[k].c_str());
            }
        }
    }
    const uint64_t order_seed = race_seed_of(c.id);
    for (int t = 0; t < c.trials; ++t) {
        const std::vector<size_t> order = race_trial_order(n, order_seed, t);  // race.h: predecessors vary
        for (size_t k = 0; k < n; ++k) {
            const size_t      idx = order[k];
            const candidate & cd  = cands[idx];
            if (!pruned[idx].empty()) {
                json r             = trial_row(c, cd.name, t);
                r["us"]            = nullptr;
                r["replays"]       = 0;
                r["nodes"]         = nodes;
                r["weight_copies"] = copies;
                r["anchor_us"]     = nullptr;
                r["nmse"]          = nullptr;
                r["route_ran"]     = "";
                r["status"]        = "pruned";
                r["reason"]        = pruned[idx];
                r["t_end_s"]       = nullptr;
                trial_rows[(size_t) t].push_back(r);
                continue;
            }
            log_line("case %s: trial %d route=%s", c.id.c_str(), t, cd.name.c_str());
            select(cd.code);
            for (int w = 0; w < o.warmup; ++w) {
                if (!compute(env.backend, g)) {
                    throw std::runtime_error("ggml_backend_graph_compute failed");
                }
            }
            api.take();
            std::vector<double> s = time_graph(env.backend, g, cd.replays - 1);
            // the last replay writes into poisoned outputs, so a replay that skipped a node is caught
            inst.poison(nodes);
            const std::vector<double> last = time_graph(env.backend, g, 1);
            s.push_back(last[0]);
            const ggml_dispatch_counts cnt = api.take();
            const double               e   = inst.check(nodes);

            std::string ran    = "unverified";
            std::string status = "ok";
            std::string reason;
            if (api.present()) {
                ran                    = route_ran_of(cnt);
                const int64_t expected = (int64_t) nodes * cd.replays;
                if (cd.code != 0 && cnt.ineligible > 0) {
                    status = "ineligible";
                    reason = "fell-back:" + ran;
                } else if (cd.code != 0 && ran != route_of(cd.code)) {
                    status = "wrong";
                    reason = "ran:" + ran;
                } else if (counted_nodes(cnt) != expected) {
                    status = "wrong";
                    reason = "counted " + std::to_string(counted_nodes(cnt)) + " of " + std::to_string(expected) +
                             " nodes";
                } else if (cnt.eager > 0 && !stock_eager) {
                    reason = "breaks CUDA graphs: " + std::to_string(cnt.eager) + " of " +
                             std::to_string(cd.replays) + " replays ran directly";
                }
            }
            if (status == "ok" && !(e <= c.nmse_max)) {
                char buf[96];
                snprintf(buf, sizeof(buf), "nmse %.3g > %.3g", e, c.nmse_max);
                status = "wrong";
                reason = buf;
            }
            json r             = trial_row(c, cd.name, t);
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
            if (status == "ok") {
                ok_us[idx][(size_t) t] = r["us"].get<double>();
            }
            trial_rows[(size_t) t].push_back(r);
        }
        if (race.min_trials > 0 && t == 0 && c.trials > 1) {
            std::vector<double> first(n);
            for (size_t k = 0; k < n; ++k) {
                first[k] = pruned[k].empty() ? ok_us[k][0] : NAN;
            }
            // stock (k = 0) is the anchor, never screened
            const std::vector<int> scr = vs_stock ? race_screened_against(first, race.screen, 0)
                                                  : race_screened(first, race.screen, 0, per_call);
            for (size_t k = 0; k < n; ++k) {
                if (scr[k] < 0) {
                    continue;
                }
                char buf[200];
                snprintf(buf, sizeof(buf), "screen: first trial %.2fx %s's", first[k] / first[(size_t) scr[k]],
                         cands[(size_t) scr[k]].name.c_str());
                pruned[k] = buf;
                log_line("case %s: pruned route=%s (%s)", c.id.c_str(), cands[k].name.c_str(), buf);
            }
        }
        if (race.min_trials > 0 && t + 1 >= race.min_trials && t + 1 < c.trials) {
            // pairs of trials that will be marked drifted do not count (race_drifted)
            const std::vector<bool>          drifted = race_drifted(anchors, (size_t) t + 1, c.drift_max);
            std::vector<std::vector<double>> clean   = ok_us;
            for (auto & v : clean) {
                for (size_t u = 0; u < v.size(); ++u) {
                    if (drifted[u]) {
                        v[u] = NAN;
                    }
                }
            }
            const int best_any      = race_best(clean);
            const int best_per_call = race_best_among(clean, per_call);
            for (size_t k = 1; k < n; ++k) {  // stock (k = 0) is the anchor: always timed
                const int best = vs_stock ? 0 : per_call[k] ? best_per_call : best_any;
                if (best < 0 || k == (size_t) best || !pruned[k].empty() ||
                        !race_prune(clean[k], clean[(size_t) best], race)) {
                    continue;
                }
                const race_interval ri = race_ratio_interval(clean[k], clean[(size_t) best]);
                char                buf[200];
                snprintf(buf, sizeof(buf), "race: %s/this 95%% CI [%.3f, %.3f] < %.3f after %d trials",
                         cands[(size_t) best].name.c_str(), ri.lo, ri.hi, 1.0 - race.noise, ri.n);
                pruned[k] = buf;
                log_line("case %s: pruned route=%s (%s)", c.id.c_str(), cands[k].name.c_str(), buf);
            }
        }
    }
    cand.clear();

    // anchors and drift: a trial whose stock time is off the median stock time by > drift_max is marked
    std::vector<double> valid;
    for (double a : anchors) {
        if (!std::isnan(a)) {
            valid.push_back(a);
        }
    }
    const double med       = median(valid);
    int          n_drifted = 0;
    for (int t = 0; t < c.trials; ++t) {
        for (const refused & f : refusals) {
            json r             = trial_row(c, f.name, t);
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
    end["kind"]   = "case";
    end["case"]   = c.id;
    end["status"] = "done";
    inst.describe(end);
    end["weight_copies"]   = copies;
    end["l2_bytes"]        = env.info.l2_bytes;
    end["nodes"]           = nodes;
    end["stock_route_ran"] = stock_ran;
    end["trials"]          = c.trials;
    end["drifted"]         = n_drifted;
    end["nmse_max"]        = c.nmse_max;
    end["drift_max"]       = c.drift_max;
    end["setup_s"]         = setup_s;
    end["elapsed_s"]       = env.elapsed_s() - t_case0;
    end["t_end_s"]         = env.elapsed_s();
    json reps              = json::object();
    for (const candidate & cd : cands) {
        reps[cd.name] = cd.replays;
    }
    end["replays"] = reps;
    emit(end);
}

void run_case(bench_env & env, const op_case & c) {
    const double   t_case0 = env.elapsed_s();
    const op_def * def     = find_op(c.op);
    if (def == nullptr) {
        throw case_error("op '" + c.op + "' is not supported by the harness");
    }
    std::unique_ptr<op_instance> inst = def->setup(env, c);
    measure_case(env, c, *inst, dispatch_candidates(env.api), t_case0);
}

// The tensors a graph of y[0..nodes) holds (outputs, the views and permutes of each rotated copy, leafs):
// the graph's size. A fixed multiple of `nodes` undercounts when many copies feed few nodes (a small KV
// cache rotated 30x against L2 gives each copy its own views: GGML_ASSERT(cgraph->n_nodes < cgraph->size)).
static size_t graph_tensors(const std::vector<ggml_tensor *> & y, int nodes) {
    std::unordered_set<const ggml_tensor *> seen;
    std::vector<const ggml_tensor *>        todo(y.begin(), y.begin() + nodes);
    while (!todo.empty()) {
        const ggml_tensor * t = todo.back();
        todo.pop_back();
        if (t == nullptr || !seen.insert(t).second) {
            continue;
        }
        for (const ggml_tensor * s : t->src) {
            todo.push_back(s);
        }
        todo.push_back(t->view_src);
    }
    return seen.size();
}

graph_holder make_graph(const std::vector<ggml_tensor *> & y, int nodes) {
    graph_holder     g;
    const size_t     size = graph_tensors(y, nodes) + 64;
    ggml_init_params p    = { ggml_graph_overhead_custom(size, false), nullptr, true };
    g.ctx.reset(ggml_init(p));
    g.gf = ggml_new_graph_custom(g.ctx.get(), size, false);
    for (int i = 0; i < nodes; ++i) {
        ggml_build_forward_expand(g.gf, y[(size_t) i]);
    }
#ifdef TUNER_SET_GRAPH_UID
    // one counter for every op's graphs, far from the uids ggml's scheduler hands out: no two graphs of a
    // run share a uid
    static uint64_t next_uid = uint64_t(1) << 62;
    g.gf->uid                = ++next_uid;
#endif
    return g;
}
