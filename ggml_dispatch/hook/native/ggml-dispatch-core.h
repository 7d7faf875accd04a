// ggml-dispatch: the parts of the hook that need neither CUDA nor ggml (C++17).
//
//  - GGML_CUDA_DISPATCH parsing,
//  - route/reason names of trace schema ggml-route-trace/1,
//  - counts (always on while the dispatch is active) and the route trace (opt-in), aggregated in
//    memory per node key and flushed at backend free and at exit,
//  - CUDA-graph bookkeeping: what a captured graph recorded is added again on every replay, and a
//    route override makes graphs captured before it stale.
//
// Kept free of CUDA so a host-only test can drive it and check the JSON it writes.
#pragma once

#include "ggml-dispatch.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ggml_dispatch {

// Codes and names come from ggml-dispatch-codes.h (generated from the Python registry).
enum : int {
    ROUTE_MMVF_T      = GGML_DISPATCH_ROUTE_MMVF_T,     // transposed-vector mmvf (ne01 == 1)
    ROUTE_FWHT        = GGML_DISPATCH_ROUTE_FWHT,       // FWHT hint path
    ROUTE_ID_SORTED   = GGML_DISPATCH_ROUTE_ID_SORTED,  // MUL_MAT_ID fallback (a table route: breaks graphs)
    TRACE_ROUTE_COUNT = GGML_DISPATCH_TRACE_ROUTE_COUNT,
};

inline const char * route_name(int code) {
    return ggml_dispatch_route_name(code);
}

// Route name -> table route code 1..ROUTE_COUNT-1, or 0 if not a table route.
inline int table_route_code(const char * name) {
    for (int code = 1; code < GGML_DISPATCH_ROUTE_COUNT; ++code) {
        if (std::strcmp(name, route_name(code)) == 0) {
            return code;
        }
    }
    return 0;
}

// Index into ggml_dispatch_counts::ran: trace-only paths count as 0.
inline int counts_index(int route) {
    return route > 0 && route < GGML_DISPATCH_ROUTE_COUNT ? route : 0;
}

enum mode { MODE_TABLE = 0, MODE_OFF = 1, MODE_FORCE = 2 };

struct env_choice {
    mode        m            = MODE_TABLE;
    int         force_config = 0;  // configuration code (route + parameters) under MODE_FORCE
    std::string error;             // non-empty: the value was not understood (the caller runs stock)
};

inline std::string route_choices() {
    std::string s;
    for (int code = 1; code < GGML_DISPATCH_ROUTE_COUNT; ++code) {
        s += (code > 1 ? "|" : "") + std::string(route_name(code));
    }
    return s;
}

// GGML_CUDA_DISPATCH: unset or "table" -> the compiled table; "off" -> stock; "force:<config>" with a
// configuration "route" or "route/name=value,..." (ggml_dispatch_config_parse).
inline env_choice parse_dispatch_env(const char * value) {
    env_choice c;
    if (value == nullptr || value[0] == '\0' || std::strcmp(value, "table") == 0) {
        return c;
    }
    if (std::strcmp(value, "off") == 0) {
        c.m = MODE_OFF;
        return c;
    }
    if (std::strncmp(value, "force:", 6) == 0) {
        int32_t code = 0;
        if (ggml_dispatch_config_parse(value + 6, &code) && code != 0) {
            if (const char * problem = ggml_dispatch_config_problem(code)) {
                c.m     = MODE_OFF;
                c.error = std::string("GGML_CUDA_DISPATCH=") + value + ": " + problem + "; running stock";
                return c;
            }
            c.m            = MODE_FORCE;
            c.force_config = code;
            return c;
        }
    }
    c.m     = MODE_OFF;
    c.error = std::string("GGML_CUDA_DISPATCH=") + value + " is not one of table, off, force:" + route_choices() +
              "[/name=value,...]; running stock";
    return c;
}

// The canonical text of a configuration code ("stock" for 0, "invalid" for a bad code).
inline std::string config_text(int config) {
    char buf[128];
    const int n = ggml_dispatch_config_format(config, buf, sizeof(buf));
    return n < 0 ? std::string("invalid") : std::string(buf);
}

enum reason_kind {
    REASON_STOCK      = GGML_DISPATCH_REASON_STOCK,
    REASON_TABLE      = GGML_DISPATCH_REASON_TABLE,
    REASON_FORCED     = GGML_DISPATCH_REASON_FORCED,
    REASON_FUSED      = GGML_DISPATCH_REASON_FUSED,
    REASON_INELIGIBLE = GGML_DISPATCH_REASON_INELIGIBLE,
};

enum fused_kind {
    FUSED_NONE  = GGML_DISPATCH_FUSED_NONE,
    FUSED_GLU   = GGML_DISPATCH_FUSED_GLU,
    FUSED_BIAS  = GGML_DISPATCH_FUSED_BIAS,
    FUSED_SCALE = GGML_DISPATCH_FUSED_SCALE,
};

inline const char * fused_name(int f) {
    return ggml_dispatch_fused_name(f);
}

inline const char * layout_name(int layout) {
    return ggml_dispatch_layout_name(layout);
}

// ---------------------------------------------------------------------------------------------
// JSON text

// Appends s as a JSON string literal; bytes that are not valid UTF-8 are written as \u00XX.
inline void json_string(std::string & out, const char * s) {
    out += '"';
    const unsigned char * p = reinterpret_cast<const unsigned char *>(s);
    while (*p) {
        const unsigned char c = *p;
        if (c < 0x80) {
            switch (c) {
                case '"':  out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n";  break;
                case '\r': out += "\\r";  break;
                case '\t': out += "\\t";  break;
                default:
                    if (c < 0x20 || c == 0x7f) {
                        char buf[8];
                        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                        out += buf;
                    } else {
                        out += static_cast<char>(c);
                    }
            }
            ++p;
            continue;
        }
        int len = 0;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
        }
        bool ok = len > 0;
        for (int k = 1; ok && k < len; ++k) {
            ok = (p[k] & 0xc0) == 0x80;
        }
        if (ok && len == 3) {  // no overlongs, no surrogates
            ok = !(c == 0xe0 && p[1] < 0xa0) && !(c == 0xed && p[1] >= 0xa0);
        }
        if (ok && len == 4) {
            ok = !(c == 0xf0 && p[1] < 0x90) && !(c == 0xf4 && p[1] >= 0x90);
        }
        if (ok) {
            out.append(reinterpret_cast<const char *>(p), len);
            p += len;
        } else {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
            ++p;
        }
    }
    out += '"';
}

inline std::string json_string(const char * s) {
    std::string out;
    json_string(out, s);
    return out;
}

inline std::string iso_time_utc() {
    char          buf[32];
    const time_t  t = std::time(nullptr);
    struct tm     tm_utc;
#if defined(_WIN32)
    gmtime_s(&tm_utc, &t);
#else
    gmtime_r(&t, &tm_utc);
#endif
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
    return buf;
}

// ---------------------------------------------------------------------------------------------
// One aggregated trace key: a graph node (or several nodes with the same properties).

struct record_key {
    int         op          = GGML_DISPATCH_OP_MUL_MAT;
    int         device      = 0;
    std::string tensor;
    std::string src0_type;
    std::string src1_type;
    int64_t     src0_ne[4]  = {0, 0, 0, 0};
    uint64_t    src0_nb[4]  = {0, 0, 0, 0};
    int64_t     src1_ne[4]  = {0, 0, 0, 0};
    int         layout      = GGML_DISPATCH_LAYOUT_WEIGHT;
    int         fused       = FUSED_NONE;
    int         route       = 0;  // what ran (route code incl. trace-only codes)
    int         stock_route = 0;  // what stock would have run
    int         reason      = REASON_STOCK;
    std::string why;              // REASON_INELIGIBLE: the eligibility check's answer
    int         config      = -1; // the configuration code that ran (-1: a trace-only path, no configuration)
    std::string extra;            // more members of the record, JSON text starting with ',' (FLASH_ATTN_EXT: "attn")

    bool operator==(const record_key & o) const {
        return op == o.op && device == o.device && layout == o.layout && fused == o.fused && route == o.route &&
               config == o.config &&
               stock_route == o.stock_route && reason == o.reason &&
               std::memcmp(src0_ne, o.src0_ne, sizeof(src0_ne)) == 0 &&
               std::memcmp(src0_nb, o.src0_nb, sizeof(src0_nb)) == 0 &&
               std::memcmp(src1_ne, o.src1_ne, sizeof(src1_ne)) == 0 && tensor == o.tensor &&
               src0_type == o.src0_type && src1_type == o.src1_type && why == o.why && extra == o.extra;
    }
};

struct record_key_hash {
    size_t operator()(const record_key & k) const {
        uint64_t h = 1469598103934665603ull;
        auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
        mix((uint64_t) k.op);
        mix((uint64_t) k.device);
        mix((uint64_t) k.layout | ((uint64_t) k.fused << 8) | ((uint64_t) k.route << 16) |
            ((uint64_t) k.stock_route << 24) | ((uint64_t) k.reason << 32));
        for (int i = 0; i < 4; ++i) {
            mix((uint64_t) k.src0_ne[i]);
            mix(k.src0_nb[i]);
            mix((uint64_t) k.src1_ne[i]);
        }
        mix(std::hash<std::string>()(k.tensor));
        mix(std::hash<std::string>()(k.src0_type));
        mix((uint64_t) (int64_t) k.config);
        mix(std::hash<std::string>()(k.extra));
        return (size_t) h;
    }
};

// Extra members of route records (MUL_MAT_ID's tokens-per-expert statistics, ggml-dispatch-moe.cuh): asked
// once per flush, then per written key for a `,"name":value` fragment (empty: none).
struct record_extra {
    virtual ~record_extra() = default;
    virtual void        begin_flush() {}
    virtual std::string members(const record_key & k) = 0;
};

inline std::string route_record_json(const record_key & k, int64_t count, const std::string & extra = std::string()) {
    std::string s = "{\"kind\":\"route\",\"op\":";
    json_string(s, ggml_dispatch_op_name(k.op));
    s += ",\"device\":" + std::to_string(k.device);
    s += ",\"tensor\":";
    json_string(s, k.tensor.c_str());
    s += ",\"src0_type\":";
    json_string(s, k.src0_type.c_str());
    s += ",\"src1_type\":";
    json_string(s, k.src1_type.c_str());
    auto arr = [&s](const char * name, const auto * v) {
        s += ",\"";
        s += name;
        s += "\":[";
        for (int i = 0; i < 4; ++i) {
            s += (i ? "," : "") + std::to_string(v[i]);
        }
        s += "]";
    };
    arr("src0_ne", k.src0_ne);
    arr("src0_nb", k.src0_nb);
    arr("src1_ne", k.src1_ne);
    s += ",\"layout\":\"";
    s += layout_name(k.layout);
    s += "\",\"fused\":";
    const char * f = fused_name(k.fused);
    s += f ? std::string("\"") + f + "\"" : std::string("null");
    s += ",\"route\":\"";
    s += route_name(k.route);
    s += "\",\"stock_route\":\"";
    s += route_name(k.stock_route);
    s += "\",\"config\":";
    if (k.config > 0) {
        json_string(s, config_text(k.config).c_str());
    } else {
        s += "null";
    }
    s += ",\"reason\":";
    if (k.reason == REASON_INELIGIBLE) {
        json_string(s, (std::string(ggml_dispatch_reason_name(k.reason)) + ":" +
                        (k.why.empty() ? std::string("unknown") : k.why)).c_str());
    } else {
        json_string(s, ggml_dispatch_reason_name(k.reason));
    }
    s += k.extra;
    s += extra;
    s += ",\"count\":" + std::to_string(count) + "}";
    return s;
}

// ---------------------------------------------------------------------------------------------
// Counts, trace records and CUDA-graph captures.

struct outcome {
    int  route      = 0;  // what ran (route code, trace-only codes allowed)
    bool forced     = false;
    bool table      = false;
    bool ineligible = false;
};

class recorder {
  public:
    static constexpr size_t MAX_KEYS = 1u << 20;

    recorder() {
        for (auto & r : ran_) {
            r.store(0);
        }
    }

    // ---- counts ----------------------------------------------------------------------------
    void get_counts(ggml_dispatch_counts * out, bool reset) {
        for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
            out->ran[i] = reset ? ran_[i].exchange(0) : ran_[i].load();
        }
        out->forced     = reset ? forced_.exchange(0) : forced_.load();
        out->table      = reset ? table_.exchange(0) : table_.load();
        out->ineligible = reset ? ineligible_.exchange(0) : ineligible_.load();
        out->eager      = reset ? eager_.exchange(0) : eager_.load();
    }

    // ---- trace output ----------------------------------------------------------------------
    // `path` "stderr" writes lines prefixed "ggml-route-trace: " to stderr. Returns false (and
    // leaves the trace off) when the file cannot be opened.
    bool open_trace(const char * path, const std::string & header_json) {
        std::lock_guard<std::mutex> lock(mu_);
        if (std::strcmp(path, "stderr") == 0) {
            out_    = stderr;
            prefix_ = "ggml-route-trace: ";
        } else {
            out_ = std::fopen(path, "w");
            if (out_ == nullptr) {
                return false;
            }
            owned_ = true;
        }
        write_line_locked(header_json);
        std::fflush(out_);
        trace_on_ = true;
        return true;
    }

    bool trace_on() const { return trace_on_; }
    // True between eval_begin and the next eval_begin of a CUDA-graph capture on this thread.
    static bool capturing() { return tl_capture() != nullptr; }

    // Writes every key with a count since the last flush and zeroes the counts.
    void flush() {
        std::lock_guard<std::mutex> lock(mu_);
        flush_locked();
    }

    // Flush, footer, close. Later records are dropped (counted in nothing: the file is closed).
    void finish() {
        std::lock_guard<std::mutex> lock(mu_);
        if (!trace_on_) {
            return;
        }
        flush_locked();
        std::string f = "{\"kind\":\"footer\",\"records\":" + std::to_string(lines_) +
                        ",\"dropped\":" + std::to_string(dropped_) + ",\"ended\":\"" + iso_time_utc() + "\"}";
        write_line_locked(f);
        std::fflush(out_);
        if (owned_) {
            std::fclose(out_);
        }
        out_      = nullptr;
        trace_on_ = false;
    }

    // ---- one node --------------------------------------------------------------------------
    // `key` may be null when the trace is off (the caller builds it only when trace_on()).
    void note(const outcome & o, const record_key * key) {
        const int idx = counts_index(o.route);
        ran_[idx].fetch_add(1, std::memory_order_relaxed);
        if (o.forced) {
            forced_.fetch_add(1, std::memory_order_relaxed);
        }
        if (o.table) {
            table_.fetch_add(1, std::memory_order_relaxed);
        }
        if (o.ineligible) {
            ineligible_.fetch_add(1, std::memory_order_relaxed);
        }
        capture * cap = tl_capture();
        if (cap != nullptr) {
            cap->ran[idx]++;
            cap->forced += o.forced;
            cap->table += o.table;
            cap->ineligible += o.ineligible;
        }
        if (key != nullptr && trace_on_) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!trace_on_) {
                return;
            }
            auto it = records_.find(*key);
            if (it == records_.end()) {
                if (records_.size() >= MAX_KEYS) {
                    dropped_++;
                    if (cap != nullptr) {
                        cap->dropped++;
                    }
                    return;
                }
                it = records_.emplace(*key, 0).first;
            }
            it->second++;
            if (cap != nullptr) {
                cap->trace_counts.push_back(&it->second);
            }
        }
    }

    // ---- CUDA graphs -----------------------------------------------------------------------
    // Called at the start of every graph evaluation of a backend context.
    void eval_begin(const void * ctx, const void * graph_key, bool use_graph, bool update_required) {
        tl_capture() = nullptr;
        if (!use_graph) {
            eager_.fetch_add(1, std::memory_order_relaxed);
            return;  // direct evaluation: nodes count as they run
        }
        const std::pair<const void *, const void *> id(ctx, graph_key);
        std::lock_guard<std::mutex> lock(mu_);
        if (update_required) {  // capture: what the nodes record now is what every replay runs
            std::unique_ptr<capture> & c = captures_[id];
            c.reset(new capture());
            c->generation = generation_.load();
            tl_capture()  = c.get();
            return;
        }
        auto it = captures_.find(id);  // replay
        if (it == captures_.end()) {
            unknown_replays_++;
            return;
        }
        const capture & c = *it->second;
        for (int i = 0; i < GGML_DISPATCH_ROUTE_COUNT; ++i) {
            ran_[i].fetch_add(c.ran[i], std::memory_order_relaxed);
        }
        forced_.fetch_add(c.forced, std::memory_order_relaxed);
        table_.fetch_add(c.table, std::memory_order_relaxed);
        ineligible_.fetch_add(c.ineligible, std::memory_order_relaxed);
        dropped_ += c.dropped;
        if (trace_on_) {
            for (int64_t * n : c.trace_counts) {
                (*n)++;
            }
        }
    }

    void eval_end() { tl_capture() = nullptr; }

    // True once per captured graph recorded before the last override change: the caller treats it
    // as a property change, so the graph is evaluated directly and captured again.
    bool graph_stale(const void * ctx, const void * graph_key) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = captures_.find(std::make_pair(ctx, graph_key));
        if (it == captures_.end() || it->second->generation == generation_.load()) {
            return false;
        }
        captures_.erase(it);
        return true;
    }

    void forget_context(const void * ctx) {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = captures_.begin(); it != captures_.end();) {
            it = it->first.first == ctx ? captures_.erase(it) : std::next(it);
        }
    }

    // ---- configuration override -------------------------------------------------------------
    void set_override(int config) {
        override_.store(config);
        override_seen_.store(true);
        generation_.fetch_add(1);
    }

    int override_config() const { return override_.load(std::memory_order_relaxed); }

    // Makes every graph captured so far stale (the weight cache freed or is about to make a copy it read).
    void invalidate_graphs() { generation_.fetch_add(1); }

    // Route records get extra members from `e` at flush (not owned; null: none).
    void set_extra(record_extra * e) {
        std::lock_guard<std::mutex> lock(mu_);
        extra_ = e;
    }

    // An override was set at least once (cleared or not): routes may change after graphs were allocated.
    bool override_seen() const { return override_seen_.load(std::memory_order_relaxed); }

    int64_t unknown_replays() const { return unknown_replays_; }

    size_t capture_count() {
        std::lock_guard<std::mutex> lock(mu_);
        return captures_.size();
    }

  private:
    struct capture {
        int64_t                ran[GGML_DISPATCH_ROUTE_COUNT] = {};
        int64_t                forced = 0, table = 0, ineligible = 0, dropped = 0;
        std::vector<int64_t *> trace_counts;  // one entry per recorded node; values live in records_
        uint64_t               generation = 0;
    };

    struct pair_hash {
        size_t operator()(const std::pair<const void *, const void *> & p) const {
            return std::hash<const void *>()(p.first) * 31u + std::hash<const void *>()(p.second);
        }
    };

    static capture *& tl_capture() {
        static thread_local capture * c = nullptr;
        return c;
    }

    void write_line_locked(const std::string & line) {
        if (out_ == nullptr) {
            return;
        }
        std::fputs(prefix_, out_);
        std::fputs(line.c_str(), out_);
        std::fputc('\n', out_);
    }

    void flush_locked() {
        if (!trace_on_ || out_ == nullptr) {
            return;
        }
        if (extra_ != nullptr) {
            extra_->begin_flush();
        }
        for (auto & kv : records_) {
            if (kv.second == 0) {
                continue;
            }
            write_line_locked(route_record_json(kv.first, kv.second,
                                                extra_ != nullptr ? extra_->members(kv.first) : std::string()));
            kv.second = 0;  // keys stay: captured graphs point at their counters
            lines_++;
        }
        std::fflush(out_);
    }

    std::atomic<int64_t> ran_[GGML_DISPATCH_ROUTE_COUNT] = {};
    std::atomic<int64_t> forced_{0}, table_{0}, ineligible_{0}, eager_{0};
    std::atomic<int>      override_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool>     override_seen_{false};  // the weight cache bumps generation_ too

    std::mutex                                              mu_;
    std::atomic<bool>                                       trace_on_{false};
    FILE *                                                  out_      = nullptr;
    bool                                                    owned_    = false;
    const char *                                            prefix_   = "";
    std::unordered_map<record_key, int64_t, record_key_hash> records_;
    int64_t                                                 lines_   = 0;
    int64_t                                                 dropped_ = 0;
    int64_t                                                 unknown_replays_ = 0;
    record_extra *                                          extra_           = nullptr;
    std::unordered_map<std::pair<const void *, const void *>, std::unique_ptr<capture>, pair_hash> captures_;
};

}  // namespace ggml_dispatch
