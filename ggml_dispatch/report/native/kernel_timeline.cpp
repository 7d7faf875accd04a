// Kernel timeline of one process, through CUPTI's activity API: every kernel (CUDA graph nodes
// included), memcpy and memset the GPU ran, with its GPU start/end time, for working out where a
// llama.cpp step spends its time (matmul share, other ops, conversion copies, idle gaps).
//
// Loaded by the CUDA driver as an injection library, so the program needs no change:
//   KERNEL_TIMELINE_OUT=run.ktl CUDA_INJECTION64_PATH=$PWD/libkernel_timeline.so llama-bench ...
// Built by `make .carry/libkernel_timeline.so` (CUDA headers and libcupti; `make device-profile-carry`).
//
// The kernel-timeline format, version 1 (this comment is its specification; ggml_dispatch/report/timeline.py's
// parse_ktl reads it, tests/test_report_kernel_timeline.py holds the two together). Text, one record
// per line, fields separated by one space, integers in decimal, times in ns of CUPTI's GPU clock:
//   # kernel-timeline/1                                  first line, exactly
//   N <id> <kernel name>                                 a kernel name, before its first K record; ids
//                                                        count from 0; the name (as CUPTI gives it,
//                                                        usually mangled) runs to the end of the line
//   K <start_ns> <end_ns> <stream> <graph_id> <name id>  a kernel (graph_id 0: launched outside a graph)
//   C <start_ns> <end_ns> <stream> <bytes> <copy kind>   a memcpy (copy kind: CUpti_ActivityMemcpyKind)
//   S <start_ns> <end_ns> <stream> <bytes>               a memset
//   D <records CUPTI dropped>                            last line, written at exit: a file without it
//                                                        is incomplete (the process did not exit cleanly)
// Records come in CUPTI's buffer order, not sorted by time; a reader sorts if it needs to.
#include <cupti.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

std::mutex                           g_mutex;
FILE *                               g_out = nullptr;
std::unordered_map<std::string, int> g_names;
size_t                               g_dropped = 0;

void check(CUptiResult r, const char * what) {
    if (r != CUPTI_SUCCESS) {
        const char * msg = nullptr;
        cuptiGetResultString(r, &msg);
        std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", what, msg != nullptr ? msg : "?");
    }
}

int name_id(const char * name) {
    std::string key = name != nullptr ? name : "?";
    auto        it  = g_names.find(key);
    if (it != g_names.end()) {
        return it->second;
    }
    const int id = (int) g_names.size();
    g_names.emplace(key, id);
    std::fprintf(g_out, "N %d %s\n", id, key.c_str());
    return id;
}

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *size        = 16u << 20;
    *buffer      = static_cast<uint8_t *>(std::aligned_alloc(8, *size));
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t stream_id, uint8_t * buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity *            rec = nullptr;
    while (g_out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
            case CUPTI_ACTIVITY_KIND_KERNEL:
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
                {
                    const auto * k  = reinterpret_cast<const CUpti_ActivityKernel10 *>(rec);
                    const int    id = name_id(k->name);
                    std::fprintf(g_out, "K %" PRIu64 " %" PRIu64 " %u %u %d\n", k->start, k->end, k->streamId,
                                 k->graphId, id);
                    break;
                }
            case CUPTI_ACTIVITY_KIND_MEMCPY:
                {
                    const auto * c = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(rec);
                    std::fprintf(g_out, "C %" PRIu64 " %" PRIu64 " %u %" PRIu64 " %u\n", c->start, c->end, c->streamId,
                                 c->bytes, (unsigned) c->copyKind);
                    break;
                }
            case CUPTI_ACTIVITY_KIND_MEMSET:
                {
                    const auto * s = reinterpret_cast<const CUpti_ActivityMemset4 *>(rec);
                    std::fprintf(g_out, "S %" PRIu64 " %" PRIu64 " %u %" PRIu64 "\n", s->start, s->end, s->streamId,
                                 s->bytes);
                    break;
                }
            default:
                break;
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, stream_id, &dropped) == CUPTI_SUCCESS) {
        g_dropped += dropped;
    }
    std::free(buffer);
}

void finish() {
    check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_out != nullptr) {
        std::fprintf(g_out, "D %zu\n", g_dropped);
        std::fclose(g_out);
        g_out = nullptr;
    }
}

}  // namespace

extern "C" int InitializeInjection(void) {
    const char * path = std::getenv("KERNEL_TIMELINE_OUT");
    if (path == nullptr || path[0] == '\0') {
        std::fprintf(stderr, "kernel_timeline: KERNEL_TIMELINE_OUT is not set; nothing recorded\n");
        return 1;
    }
    g_out = std::fopen(path, "w");
    if (g_out == nullptr) {
        std::perror(path);
        return 0;
    }
    std::fprintf(g_out, "# kernel-timeline/1\n");
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
    std::atexit(finish);
    return 1;
}
