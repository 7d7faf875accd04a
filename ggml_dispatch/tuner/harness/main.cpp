// ggml-dispatch-harness: times every candidate configuration of one-op graphs (the ops of op.h's registry).
//
//   ggml-dispatch-harness --cases cases.json [options]   JSON Lines results on stdout, log on stderr
//   ggml-dispatch-harness --info                         the device header line only
//   ggml-dispatch-harness --cases cases.json --emit-test-file ops.txt
//                                                        the cases as a test-backend-ops --test-file
//
// The case list is a JSON array of objects: {"case": id, "op": "MUL_MAT", "layout": "weight",
// "src0_type": "q4_K", "src1_type": "f32", "M":.., "N":.., "K":.., "B": 1, "routes": [...],
// "trials": 5, "nmse_max": 5e-4}; "routes" lists the candidate configurations ("mmq",
// "cublas/out=f32,compute=f16"), stock is always measured as the anchor. Exit status: 0 when every case was handled (a case that could not
// be measured is reported as such on stdout), 2 for bad arguments or an unreadable case list, 1 when the
// backend cannot start.
#include "bench.h"
#include "op.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

static void usage(FILE * f) {
    fprintf(f,
            "usage: ggml-dispatch-harness (--cases FILE|- | --info) [options]\n"
            "  --cases FILE         JSON case list ('-' = stdin)\n"
            "  --info               print the device header and exit\n"
            "  --emit-test-file F   write the cases as a test-backend-ops --test-file and exit\n"
            "  --device NAME        ggml device (default: first GPU, else CPU)\n"
            "  --l2-bytes N         L2 size to rotate against (default: queried from CUDA; 0 = no rotation)\n"
            "  --no-rotate          one weight copy (what test-backend-ops does)\n"
            "  --rotate-factor X    rotated weights total >= X * L2 (default 4)\n"
            "  --trials N           trials per case when a case does not say (default 5)\n"
            "  --nmse-max X         NMSE threshold when a case does not say (default 5e-4)\n"
            "  --drift-max X        anchor drift that marks a trial (default 0.10)\n"
            "  --race-min-trials N  racing: prune a candidate slower than the best beyond noise after N\n"
            "                       trials (95%% t-interval of paired ratios; default 3, 0 = off)\n"
            "  --race-noise X       racing margin: the interval must lie below 1 - X (default 0.02)\n"
            "  --race-screen X      after the first trial, stop timing a candidate more than X times the\n"
            "                       best first time (default 1.5, 0 = off; off with racing off)\n"
            "  --trial-ms X         timed replays per (route, trial) last about X ms (default 25)\n"
            "  --target-graph-us X  replicate nodes until a graph takes about X us (default 2000)\n"
            "  --min-replays N / --max-replays N / --max-nodes N\n"
            "  --warmup N           untimed computes after each route change (default 2)\n"
            "  --dst-budget-mib N   memory for replicated outputs (default 2048)\n"
            "  --ref-cols N         output columns checked against the CPU reference (default 64)\n"
            "  --threads N          CPU threads (default: all)\n"
            "  --seed N             data seed (default 42)\n"
            "  --version            print the harness version\n");
}

int main(int argc, char ** argv) {
    harness_opts o;
    std::string  cases_path, test_file;
    bool         info_only = false;

    auto need = [&](int & i) -> const char * {
        if (i + 1 >= argc) {
            fprintf(stderr, "harness: error: %s needs a value\n", argv[i]);
            usage(stderr);
            exit(2);
        }
        return argv[++i];
    };
    // accept --opt=value as well as --opt value
    std::vector<std::string> split_args;
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        const size_t      eq = a.find('=');
        if (i > 0 && a.rfind("--", 0) == 0 && eq != std::string::npos) {
            split_args.push_back(a.substr(0, eq));
            split_args.push_back(a.substr(eq + 1));
        } else {
            split_args.push_back(a);
        }
    }
    std::vector<char *> argv2;
    for (auto & a : split_args) {
        argv2.push_back(&a[0]);
    }
    argc = (int) argv2.size();
    argv = argv2.data();

    try {
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (a == "--cases") {
                cases_path = need(i);
            } else if (a == "--info") {
                info_only = true;
            } else if (a == "--emit-test-file") {
                test_file = need(i);
            } else if (a == "--device") {
                o.device = need(i);
            } else if (a == "--l2-bytes") {
                o.l2_bytes = std::stoll(need(i));
            } else if (a == "--no-rotate") {
                o.rotate = false;
            } else if (a == "--rotate-factor") {
                o.rotate_factor = std::stod(need(i));
            } else if (a == "--trials") {
                o.trials = std::stoi(need(i));
            } else if (a == "--nmse-max") {
                o.nmse_max = std::stod(need(i));
            } else if (a == "--drift-max") {
                o.drift_max = std::stod(need(i));
            } else if (a == "--race-min-trials") {
                o.race_min_trials = std::stoi(need(i));
            } else if (a == "--race-noise") {
                o.race_noise = std::stod(need(i));
            } else if (a == "--race-screen") {
                o.race_screen = std::stod(need(i));
            } else if (a == "--trial-ms") {
                o.trial_ms = std::stod(need(i));
            } else if (a == "--target-graph-us") {
                o.target_graph_us = std::stod(need(i));
            } else if (a == "--min-replays") {
                o.min_replays = std::stoi(need(i));
            } else if (a == "--max-replays") {
                o.max_replays = std::stoi(need(i));
            } else if (a == "--max-nodes") {
                o.max_nodes = std::stoi(need(i));
            } else if (a == "--warmup") {
                o.warmup = std::stoi(need(i));
            } else if (a == "--dst-budget-mib") {
                o.dst_budget_bytes = std::stoll(need(i)) << 20;
            } else if (a == "--ref-cols") {
                o.ref_cols = std::stoi(need(i));
            } else if (a == "--threads") {
                o.threads = std::stoi(need(i));
            } else if (a == "--seed") {
                o.seed = std::stoull(need(i));
            } else if (a == "--version") {
                printf("%s\n", TUNER_HARNESS_VERSION);
                return 0;
            } else if (a == "-h" || a == "--help") {
                usage(stdout);
                return 0;
            } else {
                fprintf(stderr, "harness: error: unknown argument %s\n", a.c_str());
                usage(stderr);
                return 2;
            }
        }
    } catch (const std::exception &) {
        fprintf(stderr, "harness: error: bad number in the arguments\n");
        return 2;
    }
    if (o.trials < 1 || o.min_replays < 1 || o.max_replays < o.min_replays || o.max_nodes < 1 || o.warmup < 0 ||
        o.ref_cols < 2 || !(o.rotate_factor > 0) || !(o.trial_ms > 0)) {
        fprintf(stderr, "harness: error: option out of range\n");
        return 2;
    }
    if (cases_path.empty() && !info_only) {
        usage(stderr);
        return 2;
    }

    json cases = json::array();
    if (!cases_path.empty()) {
        std::string text;
        if (cases_path == "-") {
            text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
        } else {
            std::ifstream f(cases_path);
            if (!f) {
                fprintf(stderr, "harness: error: %s: cannot read\n", cases_path.c_str());
                return 2;
            }
            text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        }
        try {
            cases = json::parse(text);
        } catch (const json::parse_error & e) {
            fprintf(stderr, "harness: error: %s: not JSON: %s\n", cases_path.c_str(), e.what());
            return 2;
        }
        if (cases.is_object()) {
            cases = json::array({ cases });
        }
        if (!cases.is_array()) {
            fprintf(stderr, "harness: error: %s: expected a JSON array of cases\n", cases_path.c_str());
            return 2;
        }
    }

    if (!test_file.empty()) {
        std::string lines;
        for (size_t i = 0; i < cases.size(); ++i) {
            try {
                const op_case  c   = parse_case(cases[i], o);
                const op_def * def = find_op(c.op);
                if (!def->test_file_line) {
                    throw case_error("op '" + c.op + "' has no test-backend-ops form");
                }
                lines += def->test_file_line(c) + "\n";
            } catch (const case_error & e) {
                fprintf(stderr, "harness: error: %s: case %zu: %s\n", cases_path.c_str(), i, e.what());
                return 2;
            }
        }
        const std::string tmp = test_file + ".tmp";
        {
            std::ofstream out(tmp);
            out << lines;
            if (!out) {
                fprintf(stderr, "harness: error: %s: cannot write\n", tmp.c_str());
                return 2;
            }
        }
        if (std::rename(tmp.c_str(), test_file.c_str()) != 0) {
            fprintf(stderr, "harness: error: %s: cannot rename into place\n", test_file.c_str());
            return 2;
        }
        fprintf(stderr, "harness: wrote %zu test-backend-ops cases to %s\n", cases.size(), test_file.c_str());
        return 0;
    }

    bench_env env;
    env.opts = o;
    try {
        bench_init(env);
    } catch (const std::exception & e) {
        fprintf(stderr, "harness: error: %s\n", e.what());
        return 1;
    }
    emit(device_header(env));
    log_line("device %s (%s), backend %s, override API %s, L2 %lld bytes (%s)", env.info.dev_name.c_str(),
             env.info.description.c_str(), env.info.backend.c_str(), env.info.dispatch_api ? "found" : "absent",
             (long long) env.info.l2_bytes, env.info.l2_source.c_str());

    for (size_t i = 0; i < cases.size(); ++i) {
        std::string id = "#" + std::to_string(i);
        try {
            if (cases[i].is_object() && cases[i].contains("case")) {
                id = cases[i]["case"].is_string() ? cases[i]["case"].get<std::string>() : cases[i]["case"].dump();
            }
            const op_case c = parse_case(cases[i], env.opts);
            run_case(env, c);
        } catch (const std::exception & e) {
            env.api.set(0);
            log_line("case %s failed: %s", id.c_str(), e.what());
            json end;
            end["kind"]   = "case";
            end["case"]   = id;
            end["status"] = std::string("failed:") + e.what();
            end["t_end_s"] = env.elapsed_s();
            emit(end);
        }
    }
    bench_free(env);
    return 0;
}
