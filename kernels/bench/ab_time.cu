// A/B timing of compile-time variants of the GEMV: one binary per variant (built with -D flags), each timing the
// same cases with CUDA graphs and writing its outputs, so variants can be compared for speed and for sameness.
//
// Why a torch-free driver: the torch extension takes ~30 s to build per variant on the device machine; this file
// builds in seconds with nvcc alone, so one device call can build (in parallel) and time several variants. The
// full check against the reference stays in run.py, on the variant that is kept.
//     nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/csrc [-DVARIANT...] -o /tmp/ab kernels/bench/ab_time.cu
//     /tmp/ab OUT_PREFIX I O k2 codebook rows [I O k2 codebook rows ...]
// For each case prints "I O k2 cb rows ksplit us" (median of 15 replays of a graph of 48 calls over 16 rotated
// weight sets, so the trellis comes from HBM as in a decode step) and writes the case's fp16 output (fixed
// inputs, weight set 0) to OUT_PREFIX.<case index>.bin.
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

// Random fp16 in about +-scale (mode 1: activations, mode 2: sign vectors' magnitude), or any 16 bits (mode 0).
__global__ void ab_fill(uint16_t* p, size_t n, uint32_t seed, int mode) {
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

static int run_case(const char* prefix, int idx, int in_f, int out_f, int k2, int cb, int rows) {
  Exl3GemvParams p{};
  p.in_features = in_f;
  p.out_features = out_f;
  p.k2 = k2;
  p.codebook = cb;
  p.m = rows;
  int ks = 0;
  size_t partial_floats = 0, xprep_halfs = 0;
  const int st = exl3_gemv_plan(&p, &ks, &partial_floats, &xprep_halfs);
  if (st != EXL3_OK) {
    fprintf(stderr, "%s\n", exl3_gemv_error_string(st));
    return 1;
  }
  const int sets = 16;
  const size_t tbytes = static_cast<size_t>(in_f) * out_f * k2 / 8;
  std::vector<void*> trellis(sets);
  for (int i = 0; i < sets; ++i) {
    CK(cudaMalloc(&trellis[i], tbytes));
    ab_fill<<<1024, 256>>>(static_cast<uint16_t*>(trellis[i]), tbytes / 2, 17 + i, 0);
  }
  void *x, *suh, *svh, *y, *xprep = nullptr;
  float* partials = nullptr;
  int* counters;
  CK(cudaMalloc(&x, 2ull * rows * in_f));
  CK(cudaMalloc(&suh, 2ull * in_f));
  CK(cudaMalloc(&svh, 2ull * out_f));
  CK(cudaMalloc(&y, 2ull * rows * out_f));
  CK(cudaMalloc(&counters, 4ull * (out_f / 128)));
  CK(cudaMemset(counters, 0, 4ull * (out_f / 128)));
  if (partial_floats) CK(cudaMalloc(&partials, 4 * partial_floats));
  if (xprep_halfs) CK(cudaMalloc(&xprep, 2 * xprep_halfs));
  ab_fill<<<64, 256>>>(static_cast<uint16_t*>(x), static_cast<size_t>(rows) * in_f, 5, 1);
  ab_fill<<<64, 256>>>(static_cast<uint16_t*>(suh), in_f, 6, 2);
  ab_fill<<<64, 256>>>(static_cast<uint16_t*>(svh), out_f, 7, 2);
  p.x = x;
  p.suh = suh;
  p.svh = svh;
  p.y = y;
  p.partials = partials;
  p.counters = counters;
  p.xprep = xprep;
  p.ksplit = ks;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // the output of weight set 0, for comparing variants (poisoned first: every element must be written)
  CK(cudaMemsetAsync(y, 0xFF, 2ull * rows * out_f, s));
  p.trellis = trellis[0];
  if (exl3_gemv_launch(&p, s) != EXL3_OK) return 1;
  CK(cudaStreamSynchronize(s));
  std::vector<uint16_t> hy(static_cast<size_t>(rows) * out_f);
  CK(cudaMemcpy(hy.data(), y, 2 * hy.size(), cudaMemcpyDeviceToHost));
  char path[512];
  snprintf(path, sizeof(path), "%s.%d.bin", prefix, idx);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(hy.data(), 2, hy.size(), f) != hy.size()) {
    fprintf(stderr, "cannot write %s\n", path);
    return 1;
  }
  fclose(f);
  // graph of 48 calls over the rotated sets
  const int calls = 48;
  for (int i = 0; i < 8; ++i) {
    p.trellis = trellis[i % sets];
    if (exl3_gemv_launch(&p, s) != EXL3_OK) return 1;
  }
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) {
    p.trellis = trellis[i % sets];
    if (exl3_gemv_launch(&p, s) != EXL3_OK) return 1;
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(ge, s));
  std::vector<double> t;
  for (int r = 0; r < 15; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(1000.0 * ms / calls);
  }
  std::sort(t.begin(), t.end());
  printf("%d %d %d %d %d %d %.2f\n", in_f, out_f, k2, cb, rows, ks, t[t.size() / 2]);
  fflush(stdout);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  for (void* q : trellis) CK(cudaFree(q));
  CK(cudaFree(x));
  CK(cudaFree(suh));
  CK(cudaFree(svh));
  CK(cudaFree(y));
  CK(cudaFree(counters));
  if (partials) CK(cudaFree(partials));
  if (xprep) CK(cudaFree(xprep));
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
