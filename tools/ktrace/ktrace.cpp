// ktrace: every kernel's start and end on the GPU, including the kernels of replayed CUDA graphs,
// which ncu profiles one at a time, serialised, and so without the overlap that programmatic
// dependent launch gives them. A CUPTI injection library: no change to the program traced.
//
//   CUDA_INJECTION64_PATH=build/libtwell_ktrace.so TWELL_KTRACE_OUT=trace.tsv twell bench model ...
//   scripts/ktrace.py trace.tsv            (per-kernel durations and gaps of each replayed graph)
//
// Writes one line a kernel at the program's exit: start and end (ns, GPU clock), graph id and
// graph node id (0 outside graphs), stream, grid and block sizes, and the (mangled) name.
//
// With TWELL_KTRACE_HOST=1 it also writes <out>.host.tsv: every CUDA runtime call on the host
// (kind api) and every memset on the GPU (kind memset), in the kernels' time base, to see where
// the GPU waits for the host (a step's launch preamble, for instance).
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  uint64_t start, end, node;
  uint32_t graph, stream;
  int grid, block;
  std::string name;
};

std::mutex mutex;
std::vector<Record>* records = new std::vector<Record>;  // never freed: used until the very end
struct HostRecord {
  uint64_t start, end;
  uint32_t stream, correlation;
  const char* kind;
  std::string name;
};
std::vector<HostRecord>* host_records = new std::vector<HostRecord>;
constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mutex);
  CUpti_Activity* activity = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &activity) == CUPTI_SUCCESS) {
    if (activity->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(activity);
      const char* name = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS) name = nullptr;
      host_records->push_back({a->start, a->end, 0, a->correlationId, "api", name ? name : "?"});
      continue;
    }
    if (activity->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(activity);
      host_records->push_back({m->start, m->end, m->streamId, m->correlationId, "memset", std::to_string(m->bytes)});
      continue;
    }
    if (activity->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
    records->push_back({k->start, k->end, k->graphNodeId, k->graphId, k->streamId, k->gridX * k->gridY * k->gridZ,
                        k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?"});
  }
  std::free(buffer);
}

void write_records() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("TWELL_KTRACE_OUT");
  if (!path) path = "ktrace.tsv";
  FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "ktrace: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(f, "start_ns\tend_ns\tgraph\tnode\tstream\tgrid\tblock\tname\n");
  for (const Record& r : *records)
    std::fprintf(f, "%llu\t%llu\t%u\t%llu\t%u\t%d\t%d\t%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.graph, static_cast<unsigned long long>(r.node), r.stream,
                 r.grid, r.block, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "ktrace: %zu kernels written to %s\n", records->size(), path);
  if (host_records->empty()) return;
  const std::string host_path = std::string(path) + ".host.tsv";
  FILE* h = std::fopen(host_path.c_str(), "w");
  if (!h) {
    std::fprintf(stderr, "ktrace: cannot write %s\n", host_path.c_str());
    return;
  }
  std::fprintf(h, "start_ns\tend_ns\tkind\tstream\tcorrelation\tname\n");
  for (const HostRecord& r : *host_records)
    std::fprintf(h, "%llu\t%llu\t%s\t%u\t%u\t%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.kind, r.stream, r.correlation, r.name.c_str());
  std::fclose(h);
  std::fprintf(stderr, "ktrace: %zu host calls and memsets written to %s\n", host_records->size(), host_path.c_str());
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "ktrace: CUPTI activity tracing could not be enabled\n");
    return 0;
  }
  const char* host = std::getenv("TWELL_KTRACE_HOST");
  if (host && *host && *host != '0' &&
      (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
       cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS))
    std::fprintf(stderr, "ktrace: host call tracing could not be enabled\n");
  std::atexit(write_records);
  return 1;
}
