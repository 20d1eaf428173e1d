// Where a GEMV block spends its time: each block's phases (start skew, x-side load, input transform + packing,
// main loop, end of block) from clock64/globaltimer stamps (stamps.cuh fills the kernel's phase hooks).
//
// Why: the kernel's time is not explained by its main loop alone (kernels/PERF.md run 20); ncu's warp samples
// say how warps stall, not when blocks start and end. No torch: this drives the GEMV's C ABI (exl3_gemv.h) directly.
//     nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/csrc -o /tmp/phase kernels/bench/phase_timing.cu
//     /tmp/phase 4096 14336 4 2 1 [ksplit]      # I O k2 codebook rows [ksplit]
// -DEXL3_TIMING_GT also stamps every phase with %globaltimer (wall-clock ns) at the same instants as clock64 and
// prints each phase in ns and its SM cycles per ns (the clock the SM ran that phase at), and PHASE_CHAIN=1 in
// the environment stamps the last of 8 back-to-back launches (its start overlapped by its predecessor's end, as in
// the timed graphs) instead of a launch that runs alone after a synchronisation (kernels/PERF.md run 86).
#include "stamps.cuh"  // before the kernel: it defines the kernel's phase hooks
#include "gemv_sources.cuh"
#include "gemv_case.cuh"

#include <algorithm>
#include <string>

static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s I O k2 codebook rows [ksplit]\n", argv[0]);
    return 2;
  }
  GemvCase c(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), argc > 6 ? atoi(argv[6]) : 0);
  const Exl3GemvParams& p = c.p;
  const int ks = c.ksplit;
  const int blocks = (p.out_features / 128) * ks;
  unsigned long long* stamps;
  CK(cudaMalloc(&stamps, 8ull * exl3::kStamps * blocks));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // warm-up, then time 64 back-to-back launches (stamps off), then one stamped launch
  for (int i = 0; i < 8; ++i) c.launch(i, s);
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < 64; ++i) c.launch(i, s);
  CK(cudaEventRecord(e1, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaMemcpyToSymbol(exl3::g_exl3_timing, &stamps, sizeof(stamps)));
  // phase k (1..4) runs from stamp k to stamp k + 1: x-side load, transform+pack, main loop, end of block
  const char* names[4] = {"x-side load", "transform+pack", "main loop", "end of block"};
  std::vector<double> pro, start, end;
  std::vector<double> cyc_us[4];                // phases in us, from SM cycles at 1.98 GHz
  std::vector<double> gt_ns[4], cyc_per_ns[4];  // EXL3_TIMING_GT: phases in ns, and cycles per ns
  std::vector<unsigned long long> h(static_cast<size_t>(exl3::kStamps) * blocks);
  const int chain = env_flag("PHASE_CHAIN") ? 8 : 1;
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < chain; ++i) c.launch(9 + rep + i, s);  // the last one's stamps stay
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h.data(), stamps, 8 * h.size(), cudaMemcpyDeviceToHost));
    unsigned long long g0 = ~0ull;
    for (int b = 0; b < blocks; ++b) g0 = std::min(g0, h[b * exl3::kStamps + 0]);
    std::vector<int> per_sm(256, 0);
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* t = &h[static_cast<size_t>(b) * exl3::kStamps];
      const double ghz = 1.98;  // cycles -> us at the boost clock (the stamps' durations are in SM cycles)
      start.push_back((t[0] - g0) / 1000.0);
      end.push_back((t[exl3::kStampsEnd] - g0) / 1000.0);
#ifdef EXL3_TIMING_GT
      const unsigned long long* g = t + exl3::kStampGt;  // the same points in globaltimer ns
      pro.push_back((g[1] - g[0]) / 1000.0);  // block start to its first clock stamp (set-up)
#endif
      for (int k = 1; k < 5; ++k) {
        cyc_us[k - 1].push_back((t[k + 1] - t[k]) / ghz / 1000.0);
#ifdef EXL3_TIMING_GT
        gt_ns[k - 1].push_back((g[k + 1] - g[k]) / 1000.0);
        if (g[k + 1] - g[k] >= 2000) cyc_per_ns[k - 1].push_back(double(t[k + 1] - t[k]) / double(g[k + 1] - g[k]));
#endif
      }
      per_sm[t[exl3::kStampSm] & 255]++;
    }
    int mx = 0, mn = 1 << 30, used = 0;
    for (int c : per_sm)
      if (c) {
        mx = std::max(mx, c);
        mn = std::min(mn, c);
        ++used;
      }
    if (rep == 0) printf("blocks %d on %d SMs (%d..%d per SM)\n", blocks, used, mn, mx);
  }
  printf("I=%d O=%d k2=%d cb=%d rows=%d ksplit=%d: %.2f us per launch (64 back-to-back, no graph)\n", p.in_features,
         p.out_features, p.k2, p.codebook, p.m, ks, 1000.0 * ms / 64);
  printf("phase (us)            p10     p50     p90     max\n");
  auto row = [](const char* n, const std::vector<double>& v) {
    printf("%-18s %7.2f %7.2f %7.2f %7.2f\n", n, pct(v, 0.1), pct(v, 0.5), pct(v, 0.9), pct(v, 1.0));
  };
  row("start (globaltimer)", start);
  if (!pro.empty()) row("set-up", pro);
  for (int k = 0; k < 4; ++k) row(names[k], cyc_us[k]);
  row("end (globaltimer)", end);
  for (int k = 0; k < 4; ++k) {
    if (gt_ns[k].empty()) continue;
    row((std::string(names[k]) + " ns").c_str(), gt_ns[k]);
    if (!cyc_per_ns[k].empty()) row((std::string(names[k]) + " GHz").c_str(), cyc_per_ns[k]);
  }
  return 0;
}
