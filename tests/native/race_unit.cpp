// The harness's racing functions (ggml_dispatch/tuner/harness/race.h) on fixed inputs; prints one JSON object.
#include "race.h"

#include <cstdio>
#include <string>
#include <vector>

int main() {
    const race_opts o;  // min 3 trials, noise 0.02
    const std::vector<double> best  = { 100, 101, 99, 100, 100 };
    const std::vector<double> slow  = { 130, 131, 129, 130, 130 };  // 30% slower, steady
    const std::vector<double> close = { 101, 100.5, 101.5, 101, 100 };  // ~1% slower: inside the noise
    const std::vector<double> noisy = { 60, 200, 90, 160, 100 };    // slower on average, but noisy
    std::vector<double> slow2(slow.begin(), slow.begin() + 2);
    const race_interval ri = race_ratio_interval(slow, best);
    std::vector<double> with_nan = { NAN, 130, 131, 129 };
    std::vector<std::vector<double>> all = { { 110, 111, 109 }, { 100, 101, NAN }, { 120, 121, 119 } };
    race_opts off;
    off.min_trials = 0;
    // M = 8: every J >= 8 is one column tile, so only j=8 of each stream-k setting stays. M = 100: j=50,
    // 56 and 64 are 2 tiles each, but j=50 is not eligible, so j=56 stays and dominates j=64; j=40 is 3 tiles
    const std::vector<std::string> names = { "mmq", "mmq/j=8,stream_k=on", "mmq/j=16,stream_k=on",
                                             "mmq/j=16,stream_k=off", "mmq/j=8,stream_k=off", "cublas" };
    const std::vector<std::string> d8 = tile_dominated(names, std::vector<bool>(names.size(), true), 8);
    const std::vector<std::string> n2 = { "mmq/j=50", "mmq/j=56", "mmq/j=64", "mmq/j=40" };
    const std::vector<std::string> d100 = tile_dominated(n2, { false, true, true, true }, 100);
    std::printf("{\"dom8\":[\"%s\",\"%s\",\"%s\",\"%s\",\"%s\",\"%s\"],\"dom100\":[\"%s\",\"%s\",\"%s\",\"%s\"],",
                d8[0].c_str(), d8[1].c_str(), d8[2].c_str(), d8[3].c_str(), d8[4].c_str(), d8[5].c_str(),
                d100[0].c_str(), d100[1].c_str(), d100[2].c_str(), d100[3].c_str());
    // the first-trial screen: 100 is the best; 151 (> 1.5x) goes, 149 stays, stock (index 0) at 200 stays,
    // a candidate without a time stays; off at 0 and at 1
    const std::vector<double> first = { 200, 100, 151, 149, NAN };
    const std::vector<int>    scr   = race_screened(first, 1.5, 0);
    std::printf("\"screen\":[%d,%d,%d,%d,%d],\"screen_off\":%d,\"screen_one\":%d,", scr[0], scr[1], scr[2],
                scr[3], scr[4], race_screened(first, 0, 0)[2], race_screened(first, 1.0, 0)[2]);
    // a per-call candidate is screened and raced only against the per-call best: cached (index 1) at 100,
    // per-call at 180 (index 2) and 280 (index 3, > 1.5 x 180), stock (index 0) at 400
    // MUL_MAT_ID screens against stock (index 0 at 200): 151 and 149 stay (faster), a candidate at 301
    // (> 1.5 x 200) goes; a reference without a time screens nothing
    const std::vector<double> first_vs = { 200, 100, 151, 301, NAN };
    const std::vector<int>    scr_vs   = race_screened_against(first_vs, 1.5, 0);
    std::printf("\"screen_vs_stock\":[%d,%d,%d,%d,%d],\"screen_vs_none\":%d,", scr_vs[0], scr_vs[1], scr_vs[2],
                scr_vs[3], scr_vs[4], race_screened_against({ NAN, 100, 400 }, 1.5, 0)[2]);
    const std::vector<double> first2 = { 400, 100, 180, 280 };
    const std::vector<int> scr2 = race_screened(first2, 1.5, 0, { true, false, true, true });
    const std::vector<int> scr3 = race_screened(first2, 1.5, 0);  // no classes: both against the cached 100
    std::printf("\"screen_per_call\":[%d,%d,%d,%d],\"screen_one_class\":[%d,%d,%d,%d],", scr2[0], scr2[1], scr2[2],
                scr2[3], scr3[0], scr3[1], scr3[2], scr3[3]);
    const std::vector<std::vector<double>> us2 = { { 400, 401 }, { 100, 101 }, { 180, 181 }, { 280, 281 } };
    std::printf("\"best_among\":%d,\"best_among_none\":%d,", race_best_among(us2, { true, false, true, true }),
                race_best_among(us2, { false, false, false, false }));
    // the run order of 7 trials of 6 candidates for two cases, then the first case's again (one build: one order)
    const char * ids[] = { "MUL_MAT:weight:q4_1:f32:N1536:K576:B1:M32", "another case",
                           "MUL_MAT:weight:q4_1:f32:N1536:K576:B1:M32" };
    std::printf("\"orders\":[");
    for (int c = 0; c < 3; ++c) {
        for (int t = 0; t < 7; ++t) {
            const std::vector<size_t> ord = race_trial_order(6, race_seed_of(ids[c]), t);
            std::printf("%s[%zu,%zu,%zu,%zu,%zu,%zu]", c + t > 0 ? "," : "", ord[0], ord[1], ord[2], ord[3], ord[4],
                        ord[5]);
        }
    }
    std::printf("],\"order_one\":%zu,\"order_none\":%zu,", race_trial_order(1, 7, 0)[0], race_trial_order(0, 7, 0).size());
    // trials 0-3 with anchors 100, 115, 101, 99: trial 1 is 14% off their median (100.5) at drift 0.10; trial 4
    // (not yet run) is not judged
    const std::vector<bool> dr = race_drifted({ 100, 115, 101, 99, NAN }, 4, 0.10);
    std::printf("\"drifted\":[%d,%d,%d,%d,%d],", (int) dr[0], (int) dr[1], (int) dr[2], (int) dr[3], (int) dr[4]);
    // graph breaking: direct where stock was captured and 25x stock's node time -> pruned; the same but faster
    // than stock, captured, or with stock direct too -> timed
    std::printf("\"graph_break\":[\"%s\",\"%s\",\"%s\",\"%s\"],", graph_break_pruned(true, false, 250, 10).c_str(),
                graph_break_pruned(true, false, 9, 10).c_str(), graph_break_pruned(false, false, 250, 10).c_str(),
                graph_break_pruned(true, true, 250, 10).c_str());
    std::printf("\"slow\":%d,\"slow_after_2\":%d,\"close\":%d,\"noisy\":%d,\"off\":%d,\"nan_pairs\":%d,"
                "\"lo\":%.6f,\"hi\":%.6f,\"n\":%d,\"best\":%d,\"t95_1\":%.3f,\"t95_4\":%.3f,\"t95_100\":%.3f}\n",
                race_prune(slow, best, o), race_prune(slow2, best, o), race_prune(close, best, o),
                race_prune(noisy, best, o), race_prune(slow, best, off), race_ratio_interval(with_nan, best).n,
                ri.lo, ri.hi, ri.n, race_best(all), race_t95(1), race_t95(4), race_t95(100));
    return 0;
}
