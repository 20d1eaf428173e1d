// Where a GEMV block spends its time: each block's phases (start skew, x-side load, input transform + packing,
// main loop, end of block) from clock64/globaltimer stamps written by an EXL3_TIMING build of the kernel.
//
// Why: the kernel's time is not explained by its main loop alone (kernels/PERF.md run 20); ncu's warp samples
// say how warps stall, not when blocks start and end. No torch: this drives the C ABI of exl3_gemv.cu directly.
//     nvcc -O3 -std=c++17 -arch=sm_90 -DEXL3_TIMING -Ikernels/csrc -o /tmp/phase kernels/bench/phase_timing.cu
//     /tmp/phase 4096 14336 4 2 1 [ksplit]      # I O k2 codebook rows [ksplit]
#include "../csrc/exl3_gemv.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

__global__ void fill_random(uint16_t* p, size_t n, uint32_t seed, int mode) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    if (mode == 0) p[i] = static_cast<uint16_t>(h);  // trellis: any bits
    else {                                           // fp16 in about +-scale
      const float u = (static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * (mode == 1 ? 2.0f : 0.1f);
      p[i] = __half_as_ushort(__float2half(u));
    }
  }
}

static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s I O k2 codebook rows [ksplit]\n", argv[0]);
    return 2;
  }
  Exl3GemvParams p{};
  p.in_features = atoi(argv[1]);
  p.out_features = atoi(argv[2]);
  p.k2 = atoi(argv[3]);
  p.codebook = atoi(argv[4]);
  p.m = atoi(argv[5]);
  p.ksplit = argc > 6 ? atoi(argv[6]) : 0;
  int ks = 0;
  size_t partial_floats = 0, xprep_halfs = 0;
  int st = exl3_gemv_plan(&p, &ks, &partial_floats, &xprep_halfs);
  if (st != EXL3_OK) {
    fprintf(stderr, "%s\n", exl3_gemv_error_string(st));
    return 1;
  }
  p.ksplit = ks;
  const int sets = 16;  // rotate weight sets so the trellis comes from HBM, as in a decode step
  const size_t tbytes = static_cast<size_t>(p.in_features) * p.out_features * p.k2 / 8;
  std::vector<void*> trellis(sets);
  for (int i = 0; i < sets; ++i) {
    CK(cudaMalloc(&trellis[i], tbytes));
    fill_random<<<1024, 256>>>(static_cast<uint16_t*>(trellis[i]), tbytes / 2, 17 + i, 0);
  }
  void *x, *suh, *svh, *y, *xprep = nullptr;
  float* partials = nullptr;
  int* counters;
  CK(cudaMalloc(&x, 2ull * p.m * p.in_features));
  CK(cudaMalloc(&suh, 2ull * p.in_features));
  CK(cudaMalloc(&svh, 2ull * p.out_features));
  CK(cudaMalloc(&y, 2ull * p.m * p.out_features));
  CK(cudaMalloc(&counters, 4 * 4096));
  CK(cudaMemset(counters, 0, 4 * 4096));
  if (partial_floats) CK(cudaMalloc(&partials, 4 * partial_floats));
  if (xprep_halfs) CK(cudaMalloc(&xprep, 2 * xprep_halfs));
  fill_random<<<64, 256>>>(static_cast<uint16_t*>(x), static_cast<size_t>(p.m) * p.in_features, 5, 1);
  fill_random<<<64, 256>>>(static_cast<uint16_t*>(suh), p.in_features, 6, 2);
  fill_random<<<64, 256>>>(static_cast<uint16_t*>(svh), p.out_features, 7, 2);
  p.x = x;
  p.suh = suh;
  p.svh = svh;
  p.y = y;
  p.partials = partials;
  p.counters = counters;
  p.xprep = xprep;
  const int blocks = (p.out_features / 128) * ks;
  unsigned long long* stamps;
  CK(cudaMalloc(&stamps, 8ull * exl3::kStamps * blocks));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // warm-up, then time 64 back-to-back launches (stamps off), then one stamped launch
  for (int i = 0; i < 8; ++i) {
    p.trellis = trellis[i % sets];
    if (exl3_gemv_launch(&p, s) != EXL3_OK) return 1;
  }
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < 64; ++i) {
    p.trellis = trellis[i % sets];
    exl3_gemv_launch(&p, s);
  }
  CK(cudaEventRecord(e1, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaMemcpyToSymbol(exl3::g_exl3_timing, &stamps, sizeof(stamps)));
  std::vector<double> pro, xload, prep, main_loop, tail, start, end;
  std::vector<unsigned long long> h(static_cast<size_t>(exl3::kStamps) * blocks);
  for (int rep = 0; rep < 3; ++rep) {
    p.trellis = trellis[(9 + rep) % sets];
    exl3_gemv_launch(&p, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h.data(), stamps, 8 * h.size(), cudaMemcpyDeviceToHost));
    unsigned long long g0 = ~0ull;
    for (int b = 0; b < blocks; ++b) g0 = std::min(g0, h[b * exl3::kStamps + 0]);
    std::vector<int> per_sm(256, 0);
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* t = &h[static_cast<size_t>(b) * exl3::kStamps];
      const double ghz = 1.98;  // cycles -> us at the boost clock (the stamps' durations are in SM cycles)
      start.push_back((t[0] - g0) / 1000.0);
      end.push_back((t[7] - g0) / 1000.0);
      xload.push_back((t[2] - t[1]) / ghz / 1000.0);
      prep.push_back((t[3] - t[2]) / ghz / 1000.0);
      main_loop.push_back((t[4] - t[3]) / ghz / 1000.0);
      tail.push_back((t[5] - t[4]) / ghz / 1000.0);
      per_sm[t[6] & 255]++;
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
  row("x-side load", xload);
  row("transform+pack", prep);
  row("main loop", main_loop);
  row("end of block", tail);
  row("end (globaltimer)", end);
  return 0;
}
