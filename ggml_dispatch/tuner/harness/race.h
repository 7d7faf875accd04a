// Racing: stop timing a candidate that is slower than the point's current best beyond noise.
//
// After each trial the harness asks, for every candidate still timed, whether its paired ratios against
// the current best (the candidate with the lowest median time over the trials so far) show it slower.
// The statistic: per trial t where both ran ok, x_t = ln(best_us_t / cand_us_t) (< 0: slower); after at
// least `min_trials` pairs, a two-sided Student-t interval at 95% of the mean of x (mean +- t_{n-1} * s /
// sqrt(n)); the candidate is pruned when exp(upper bound) < 1 - noise, i.e. the whole 95% interval of
// the geometric-mean ratio lies below 1 by more than the noise margin. Pure functions, no ggml: a test
// compiles this header alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

struct race_opts {
    int    min_trials = 3;     // pairs needed before a candidate may be pruned; 0 = racing off
    double noise      = 0.02;  // margin below 1 the whole interval must clear
    double screen     = 1.5;   // first-trial screen: pruned after trial 0 if that many times the best; 0 = off
};

// The order in which a trial runs the candidates: a permutation of 0..n-1 drawn from (seed, trial), the
// same on every build (Fisher-Yates over SplitMix64, not std::shuffle, whose algorithm differs between
// standard libraries). A fixed order, or one rotated per trial, gives each candidate the same predecessor
// in every trial; on the H200 a candidate's time depended on its predecessor by up to 1.4x (the sweep in
// evidence/h200-2026-12-02-s10), so that bias entered every paired ratio. Drawn per trial, it becomes noise that the
// paired intervals see.
inline uint64_t race_splitmix64(uint64_t & x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z          = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z          = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline uint64_t race_seed_of(const std::string & s) {  // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h = (h ^ c) * 1099511628211ull;
    }
    return h;
}

inline std::vector<size_t> race_trial_order(size_t n, uint64_t seed, int trial) {
    std::vector<size_t> order(n);
    for (size_t k = 0; k < n; ++k) {
        order[k] = k;
    }
    uint64_t x = seed ^ (0xD1B54A32D192ED03ull * (uint64_t) (trial + 1));
    for (size_t i = n; i > 1; --i) {
        const size_t j = (size_t) (race_splitmix64(x) % i);
        std::swap(order[i - 1], order[j]);
    }
    return order;
}

// Two-sided 95% Student-t quantile for df degrees of freedom (df >= 1).
inline double race_t95(int df) {
    static const double t[] = { 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042 };
    if (df < 1) {
        return INFINITY;
    }
    return df <= 30 ? t[df - 1] : 1.960 + 2.4 / df;  // the normal quantile plus a small-df correction
}

struct race_interval {
    int    n  = 0;           // pairs used
    double lo = 0, hi = 0;   // 95% interval of the geometric-mean ratio best/cand (< 1: cand slower)
};

// The interval of the paired ratios best_us[t] / cand_us[t] over trials where both are finite and > 0.
inline race_interval race_ratio_interval(const std::vector<double> & cand_us, const std::vector<double> & best_us) {
    std::vector<double> x;
    const size_t        n = std::min(cand_us.size(), best_us.size());
    for (size_t t = 0; t < n; ++t) {
        const double c = cand_us[t], b = best_us[t];
        if (std::isfinite(c) && std::isfinite(b) && c > 0 && b > 0) {
            x.push_back(std::log(b / c));
        }
    }
    race_interval r;
    r.n = (int) x.size();
    if (r.n < 2) {
        r.lo = 0;
        r.hi = INFINITY;
        return r;
    }
    double mean = 0;
    for (double v : x) {
        mean += v;
    }
    mean /= r.n;
    double ss = 0;
    for (double v : x) {
        ss += (v - mean) * (v - mean);
    }
    const double half = race_t95(r.n - 1) * std::sqrt(ss / (r.n - 1)) / std::sqrt((double) r.n);
    r.lo              = std::exp(mean - half);
    r.hi              = std::exp(mean + half);
    return r;
}

// Whether to stop timing the candidate: enough pairs and the whole interval below 1 - noise.
inline bool race_prune(const std::vector<double> & cand_us, const std::vector<double> & best_us, const race_opts & o) {
    if (o.min_trials <= 0) {
        return false;
    }
    const race_interval r = race_ratio_interval(cand_us, best_us);
    return r.n >= std::max(o.min_trials, 2) && r.hi < 1.0 - o.noise;
}

// The index of the current best: the lowest median of the finite times so far (-1 if none has one).
inline int race_best(const std::vector<std::vector<double>> & us) {
    int    best = -1;
    double best_med = INFINITY;
    for (size_t k = 0; k < us.size(); ++k) {
        std::vector<double> v;
        for (double x : us[k]) {
            if (std::isfinite(x) && x > 0) {
                v.push_back(x);
            }
        }
        if (v.empty()) {
            continue;
        }
        std::sort(v.begin(), v.end());
        const double med = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
        if (med < best_med) {
            best_med = med;
            best     = (int) k;
        }
    }
    return best;
}

// The current best among the candidates `among` marks (race_best over those only; -1 if none has a time).
// A candidate is raced against the best of the candidates a table could hold in its place: one that runs
// without the weight cache only against those that also do, since a table decided without a cache budget
// cannot use a cached configuration and needs its per-call rivals measured in full.
inline int race_best_among(const std::vector<std::vector<double>> & us, const std::vector<bool> & among) {
    std::vector<std::vector<double>> masked(us.size());
    for (size_t k = 0; k < us.size(); ++k) {
        if (among[k]) {
            masked[k] = us[k];
        }
    }
    return race_best(masked);
}

// The trials so far whose stock anchor is off the median anchor of those trials by more than drift_max:
// the sweep marks such a trial drifted at the end and decisions skip it, so racing does not count it as a
// pair either (a candidate pruned on pairs that are dropped later would be left with too few).
inline std::vector<bool> race_drifted(const std::vector<double> & anchors, size_t upto, double drift_max) {
    std::vector<double> v;
    for (size_t t = 0; t < upto && t < anchors.size(); ++t) {
        if (std::isfinite(anchors[t]) && anchors[t] > 0) {
            v.push_back(anchors[t]);
        }
    }
    std::vector<bool> out(anchors.size(), false);
    if (v.empty()) {
        return out;
    }
    std::sort(v.begin(), v.end());
    const double med = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    for (size_t t = 0; t < upto && t < anchors.size(); ++t) {
        out[t] = std::isfinite(anchors[t]) && std::fabs(anchors[t] / med - 1.0) > drift_max;
    }
    return out;
}

// Pruning by early results (as Triton's prune by early timing): after the first trial, a candidate whose
// time is more than `screen` times the best first-trial time is not timed again. One trial's noise is a
// few percent; a 1.5x gap is far outside it, and a candidate that slow never becomes a point's winner, so
// the race's minimum trials are not spent on it. As in the race, a candidate with `per_call` set is
// screened only against the best of those with it set (empty: every candidate is per-call). Returns, per
// candidate, the index of the best it was screened against (-1 = keep); `keep` (stock) is never screened.
inline std::vector<int> race_screened(const std::vector<double> & first_us, double screen, size_t keep,
                                      const std::vector<bool> & per_call = {}) {
    std::vector<int> out(first_us.size(), -1);
    if (!(screen > 1.0)) {
        return out;
    }
    auto pc = [&](size_t k) { return per_call.empty() || per_call[k]; };
    int    best[2] = { -1, -1 };  // [0]: among all, [1]: among the per-call candidates
    double b[2]    = { INFINITY, INFINITY };
    for (size_t k = 0; k < first_us.size(); ++k) {
        if (!(std::isfinite(first_us[k]) && first_us[k] > 0)) {
            continue;
        }
        for (int c = 0; c < 2; ++c) {
            if ((c == 0 || pc(k)) && first_us[k] < b[c]) {
                b[c]    = first_us[k];
                best[c] = (int) k;
            }
        }
    }
    for (size_t k = 0; k < first_us.size(); ++k) {
        const int c = pc(k) ? 1 : 0;
        if (best[c] >= 0 && k != keep && (int) k != best[c] && std::isfinite(first_us[k]) &&
                first_us[k] > screen * b[c]) {
            out[k] = best[c];
        }
    }
    return out;
}

// The screen against one reference candidate `ref` (MUL_MAT_ID: stock, index 0) instead of the best: a
// candidate whose first trial is more than `screen` x the reference's is out; the reference stays.
inline std::vector<int> race_screened_against(const std::vector<double> & first_us, double screen, size_t ref) {
    std::vector<int> out(first_us.size(), -1);
    if (!(screen > 1.0) || ref >= first_us.size() || !(std::isfinite(first_us[ref]) && first_us[ref] > 0)) {
        return out;
    }
    for (size_t k = 0; k < first_us.size(); ++k) {
        if (k != ref && std::isfinite(first_us[k]) && first_us[k] > screen * first_us[ref]) {
            out[k] = (int) ref;
        }
    }
    return out;
}

// Pruning by a model before timing (as Triton's prune_configs_by): an mmq configuration whose column-tile
// width J gives as many column tiles over M as a smaller eligible J with the same other parameters does
// the same number of tiles with more padded columns, so it is not timed. Recorded H200 sweeps never had
// such a configuration as a point's best. Returns, per name, the dominating name ("" = keep). Only names
// of the form "mmq/j=<J>[,rest]" take part; `eligible` marks the names that passed their checks.
inline std::vector<std::string> tile_dominated(const std::vector<std::string> & names,
                                               const std::vector<bool> & eligible, long M) {
    std::vector<std::string> out(names.size());
    auto parse = [](const std::string & s, int & j, std::string & rest) {
        const std::string pre = "mmq/j=";
        if (s.compare(0, pre.size(), pre) != 0) {
            return false;
        }
        size_t end = s.find(',', pre.size());
        j          = std::atoi(s.substr(pre.size(), end - pre.size()).c_str());
        rest       = end == std::string::npos ? "" : s.substr(end);
        return j > 0;
    };
    std::map<std::pair<std::string, long>, std::pair<int, size_t>> smallest;  // (rest, tiles) -> (J, index)
    for (size_t i = 0; i < names.size(); ++i) {
        int         j;
        std::string rest;
        if (!eligible[i] || !parse(names[i], j, rest)) {
            continue;
        }
        const auto key = std::make_pair(rest, (M + j - 1) / j);
        auto       it  = smallest.find(key);
        if (it == smallest.end() || j < it->second.first) {
            smallest[key] = { j, i };
        }
    }
    for (size_t i = 0; i < names.size(); ++i) {
        int         j;
        std::string rest;
        if (!eligible[i] || !parse(names[i], j, rest)) {
            continue;
        }
        const auto & s = smallest.at(std::make_pair(rest, (M + j - 1) / j));
        if (s.second != i) {
            out[i] = names[s.second];
        }
    }
    return out;
}

// A configuration that breaks CUDA graphs (its eligibility run's replay ran directly where stock's was
// captured: a node that synchronizes the stream, the per-expert fallback) is worth timing only if its own
// node beats stock's there; in a model the whole graph would lose its capture, a cost beyond the node.
// Returns why it is not timed ("" = time it). Where stock runs directly too, nothing is broken by it.
inline std::string graph_break_pruned(bool eager, bool stock_eager, double node_us, double stock_node_us) {
    if (!eager || stock_eager || !(node_us >= stock_node_us)) {
        return "";
    }
    char buf[128];
    std::snprintf(buf, sizeof(buf), "breaks CUDA graphs: its graph ran directly, %.2fx stock's node time",
                  node_us / std::max(stock_node_us, 1e-9));
    return buf;
}
