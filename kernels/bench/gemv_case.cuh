// One GEMV case on the device for the torch-free bench drivers (phase_timing.cu, ab_time.cu): the plan, 16 rotated
// weight sets (so the trellis comes from HBM as in a decode step, not from L2) and every buffer the launcher needs,
// filled with fixed pseudo-random data (never zeros: kernels/PERF.md's METHOD note).
//
// Why shared: both drivers time the same launcher on the same kind of inputs; one setup keeps their numbers
// comparable. Include after gemv_sources.cuh.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.cuh"

// A switch of the drivers' environment (EXL3_AB_PROBE_DURING=1, PHASE_CHAIN=1): set to a non-zero number.
inline bool env_flag(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && atoi(v) != 0;
}

// mode 0: any 16 bits (a valid trellis, SPEC 2.2); 1: fp16 activations in about +-1; 2: fp16 in about +-0.05 (suh, svh)
__global__ void gemv_case_fill(uint16_t* p, size_t n, uint32_t seed, int mode) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed * 0x9E3779B9u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    if (mode == 0) p[i] = static_cast<uint16_t>(h);
    else {
      const float u = (static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * (mode == 1 ? 2.0f : 0.1f);
      p[i] = __half_as_ushort(__float2half(u));
    }
  }
}

struct GemvCase {
  static constexpr int kSets = 16;
  Exl3GemvParams p{};
  std::vector<void*> trellis;
  int ksplit = 0;

  // Plans and allocates; prints the launcher's error and exits 1 on a shape it refuses. ksplit 0 = automatic.
  GemvCase(int in_f, int out_f, int k2, int codebook, int rows, int ksplit_in = 0) {
    p.in_features = in_f;
    p.out_features = out_f;
    p.k2 = k2;
    p.codebook = codebook;
    p.m = rows;
    p.ksplit = ksplit_in;
    size_t partial_floats = 0, xprep_halfs = 0, workspace_ints = 0;
    const int st = exl3_gemv_plan(&p, &ksplit, &partial_floats, &xprep_halfs, &workspace_ints);
    if (st != EXL3_OK) {
      fprintf(stderr, "%s\n", exl3_gemv_error_string(st));
      exit(1);
    }
    p.ksplit = ksplit;
    const size_t tbytes = static_cast<size_t>(in_f) * out_f * k2 / 8;
    trellis.resize(kSets);
    for (int i = 0; i < kSets; ++i) {
      CK(cudaMalloc(&trellis[i], tbytes));
      gemv_case_fill<<<1024, 256>>>(static_cast<uint16_t*>(trellis[i]), tbytes / 2, 17 + i, 0);
    }
    void *x, *suh, *svh, *y;
    CK(cudaMalloc(&x, 2ull * rows * in_f));
    CK(cudaMalloc(&suh, 2ull * in_f));
    CK(cudaMalloc(&svh, 2ull * out_f));
    CK(cudaMalloc(&y, 2ull * rows * out_f));
    CK(cudaMalloc(&p.counters, 4 * workspace_ints));  // zero before the first call; the kernel leaves it zero
    CK(cudaMemset(p.counters, 0, 4 * workspace_ints));
    if (partial_floats) CK(cudaMalloc(&p.partials, 4 * partial_floats));
    if (xprep_halfs) CK(cudaMalloc(&p.xprep, 2 * xprep_halfs));
    gemv_case_fill<<<64, 256>>>(static_cast<uint16_t*>(x), static_cast<size_t>(rows) * in_f, 5, 1);
    gemv_case_fill<<<64, 256>>>(static_cast<uint16_t*>(suh), in_f, 6, 2);
    gemv_case_fill<<<64, 256>>>(static_cast<uint16_t*>(svh), out_f, 7, 2);
    CK(cudaDeviceSynchronize());
    p.x = x;
    p.suh = suh;
    p.svh = svh;
    p.y = y;
    p.trellis = trellis[0];
  }
  GemvCase(const GemvCase&) = delete;
  GemvCase& operator=(const GemvCase&) = delete;
  ~GemvCase() {
    for (void* t : trellis) cudaFree(t);
    cudaFree(const_cast<void*>(p.x));
    cudaFree(const_cast<void*>(p.suh));
    cudaFree(const_cast<void*>(p.svh));
    cudaFree(p.y);
    cudaFree(p.counters);
    if (p.partials) cudaFree(p.partials);
    if (p.xprep) cudaFree(p.xprep);
  }
  // One launch on weight set `set`; exits 1 with the launcher's error.
  void launch(int set, cudaStream_t s) {
    p.trellis = trellis[set % kSets];
    const int st = exl3_gemv_launch(&p, s);
    if (st != EXL3_OK) {
      fprintf(stderr, "%s\n", exl3_gemv_error_string(st));
      exit(1);
    }
  }
};
