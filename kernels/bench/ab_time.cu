// A/B timing of compile-time variants of the GEMV: one binary per variant (a candidate edit of the kernel, or the -D
// flags it adds while it is tried), each timing the same cases with CUDA graphs and writing its outputs, so variants
// can be compared for speed and for sameness.
//
// Why a torch-free driver: the torch extension takes ~30 s to build per variant on the device machine; this file
// builds in seconds with nvcc alone, so one device call can build (in parallel) and time several variants. The
// full check against the reference stays in run.py, on the variant that is kept.
//     nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/csrc [-DVARIANT...] -o /tmp/ab kernels/bench/ab_time.cu
//     /tmp/ab OUT_PREFIX I O k2 codebook rows [I O k2 codebook rows ...]
// For each case prints "I O k2 cb rows ksplit us MHz max_us": us is the median of 15 replays of a graph of 48 calls
// over 16 rotated weight sets (so the trellis comes from HBM as in a decode step), max_us the slowest replay, MHz the
// SM clock read by clock_probe right after them (or during them with EXL3_AB_PROBE_DURING=1); writes the case's
// fp16 output (fixed inputs, weight set 0) to OUT_PREFIX.<case index>.bin.
// EXL3_AB_WARM_MS=N replays the graph for N ms before the timed replays, for a card that ramps its SM clock slowly
// (the H200 does not ramp: it changed nothing there, kernels/PERF.md run 85).
#include "gemv_sources.cuh"
#include "gemv_case.cuh"

#include <algorithm>
#include <chrono>

// The SM clock in MHz: clock64 cycles over %globaltimer nanoseconds, per block over `ns` of waiting (long against
// the timer's coarse ticks), median over one block per SM. After the replays (the default) it reads the clock the
// card holds with its tensor cores idle (1980 MHz on the H200); launched on a second stream once the first timed
// replay is queued (EXL3_AB_PROBE_DURING=1), its blocks sit beside the GEMV's (one warp each, asleep between reads)
// and read the clock the SMs run at under the GEMV's load (1785-1812 MHz there, kernels/PERF.md runs 86-89).
__global__ void clock_probe(double* mhz, unsigned long long ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    __nanosleep(500);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < ns);
  const long long c1 = clock64();
  mhz[blockIdx.x] = 1000.0 * static_cast<double>(c1 - c0) / static_cast<double>(t1 - t0);
}

struct ClockProbe {
  int sms = 0;
  double* d = nullptr;
  void launch(cudaStream_t s, unsigned long long ns) {
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&d, sizeof(double) * sms));
    // the largest shared-memory carveout, so the probe does not set an SM to a split the GEMV's blocks cannot use
    CK(cudaFuncSetAttribute(clock_probe, cudaFuncAttributePreferredSharedMemoryCarveout,
                            cudaSharedmemCarveoutMaxShared));
    clock_probe<<<sms, 32, 0, s>>>(d, ns);
    CK(cudaGetLastError());
  }
  double read(cudaStream_t s) {
    std::vector<double> h(sms);
    CK(cudaMemcpyAsync(h.data(), d, sizeof(double) * sms, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaFree(d));
    std::sort(h.begin(), h.end());
    return h[h.size() / 2];
  }
};

static int run_case(const char* prefix, int idx, int in_f, int out_f, int k2, int cb, int rows) {
  GemvCase c(in_f, out_f, k2, cb, rows);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // the output of weight set 0, for comparing variants (poisoned first: every element must be written)
  CK(cudaMemsetAsync(c.p.y, 0xFF, 2ull * rows * out_f, s));
  c.launch(0, s);
  CK(cudaStreamSynchronize(s));
  std::vector<uint16_t> hy(static_cast<size_t>(rows) * out_f);
  CK(cudaMemcpy(hy.data(), c.p.y, 2 * hy.size(), cudaMemcpyDeviceToHost));
  char path[512];
  snprintf(path, sizeof(path), "%s.%d.bin", prefix, idx);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(hy.data(), 2, hy.size(), f) != hy.size()) {
    fprintf(stderr, "cannot write %s\n", path);
    return 1;
  }
  fclose(f);
  // a graph of 48 calls over the rotated sets
  const int calls = 48;
  for (int i = 0; i < 8; ++i) c.launch(i, s);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) c.launch(i, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(ge, s));
  if (const char* w = getenv("EXL3_AB_WARM_MS")) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(atoi(w));
    while (std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 8; ++i) CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
    }
  }
  const bool during = env_flag("EXL3_AB_PROBE_DURING");
  ClockProbe probe;
  cudaStream_t s2;
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  std::vector<double> t;
  for (int r = 0; r < 15; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    // after the first replay is queued, so the GEMV's blocks hold the SMs first; 4 ms of the ~10 ms of replays
    if (during && r == 0) probe.launch(s2, 4000000ull);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(1000.0 * ms / calls);
  }
  std::sort(t.begin(), t.end());
  if (!during) probe.launch(s2, 200000ull);
  const double mhz = probe.read(s2);
  CK(cudaStreamDestroy(s2));
  printf("%d %d %d %d %d %d %.2f %.0f %.2f\n", in_f, out_f, k2, cb, rows, c.ksplit, t[t.size() / 2], mhz, t.back());
  fflush(stdout);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 7 || (argc - 2) % 5 != 0) {
    fprintf(stderr, "usage: %s OUT_PREFIX I O k2 codebook rows [I O k2 codebook rows ...]\n", argv[0]);
    return 2;
  }
  for (int c = 0; 2 + 5 * c < argc; ++c) {
    const char** a = const_cast<const char**>(argv + 2 + 5 * c);
    if (run_case(argv[1], c, atoi(a[0]), atoi(a[1]), atoi(a[2]), atoi(a[3]), atoi(a[4])) != 0) return 1;
  }
  return 0;
}
