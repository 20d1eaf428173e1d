// A/B timing of compile-time variants of the prefill's weight reconstruction (csrc/exl3_recon.cu): one binary per
// variant source, each timing the same cases with CUDA graphs and writing its outputs, so variants can be compared
// for speed and for sameness (a variant that only reorders loads and barriers must give the same bits).
//
// Why a torch-free driver: as for ab_time.cu, the torch extension takes ~90 s to build on the device machine and
// this builds in seconds, so one device call can build and time several variants. The full check against the
// reference (prefill_bench.py, tests/kernels/test_prefill_cuda.py) stays on the variant that is kept.
//     nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/csrc -DRECON_SRC='"/path/to/variant.cu"' -o /tmp/rab kernels/bench/recon_ab.cu \
//         kernels/build/nvcc/sm_90/{exl3_plan,exl3_gemv,exl3_gemv_i8}.o
//   (the GEMV's objects from `make kernels`, for the shape rule exl3_recon_supports shares with it)
//     /tmp/rab OUT_PREFIX I O k2 codebook [I O k2 codebook ...]
// For each case prints "I O k2 cb us min_us": us is the median of 15 replays of a graph of 8 launches, each on its
// own weight set (so the trellis comes from HBM and W goes to HBM, as in a prefill), min_us the fastest replay; the
// case's fp16 W (weight set 0) goes to OUT_PREFIX.<case index>.bin.
#ifndef RECON_SRC
#define RECON_SRC "../csrc/exl3_recon.cu"
#endif
#include RECON_SRC

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_check.cuh"

int main(int argc, char** argv) {
  if (argc < 6 || (argc - 2) % 4) {
    fprintf(stderr, "usage: %s OUT_PREFIX I O k2 codebook [I O k2 codebook ...]\n", argv[0]);
    return 2;
  }
  constexpr int kSets = 8, kReps = 15;
  std::mt19937 rng(1234);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  for (int c = 0, a = 2; a < argc; ++c, a += 4) {
    const int I = atoi(argv[a]), O = atoi(argv[a + 1]), k2 = atoi(argv[a + 2]), cb = atoi(argv[a + 3]);
    const size_t tbytes = static_cast<size_t>(I) * O * k2 / 16;  // 16*k2 bytes per 256 weights
    std::vector<uint8_t> ht(tbytes);
    std::vector<__half> hs(I), hv(O);
    std::uniform_real_distribution<float> sd(0.5f, 1.5f);
    for (auto& b : ht) b = static_cast<uint8_t>(rng());
    for (auto& x : hs) x = __float2half(rng() & 1 ? sd(rng) : -sd(rng));
    for (auto& x : hv) x = __float2half(rng() & 1 ? sd(rng) : -sd(rng));
    std::vector<Exl3ReconLayer> layers(kSets);
    std::vector<void*> bufs;
    for (int s = 0; s < kSets; ++s) {
      void *t, *su, *sv, *w;
      CK(cudaMalloc(&t, tbytes));
      CK(cudaMalloc(&su, I * 2));
      CK(cudaMalloc(&sv, O * 2));
      CK(cudaMalloc(&w, static_cast<size_t>(I) * O * 2));
      CK(cudaMemcpy(t, ht.data(), tbytes, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(su, hs.data(), I * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(sv, hv.data(), O * 2, cudaMemcpyHostToDevice));
      CK(cudaMemset(w, 0xFF, static_cast<size_t>(I) * O * 2));  // poisoned: NaN fp16 where nothing is written
      layers[s] = {t, su, sv, w};
      bufs.insert(bufs.end(), {t, su, sv, w});
    }
    auto launch = [&](int s) {
      Exl3ReconParams p{&layers[s], 1, I, O, k2, cb, 0, O, O};
      const int rc = exl3_recon_launch(&p, st);
      if (rc != EXL3_OK) {
        fprintf(stderr, "launch: %s\n", exl3_recon_error_string(rc));
        exit(1);
      }
    };
    for (int s = 0; s < kSets; ++s) launch(s);  // warm-up, and the first call's attribute queries outside capture
    CK(cudaStreamSynchronize(st));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int s = 0; s < kSets; ++s) launch(s);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> us;
    for (int r = 0; r < kReps + 2; ++r) {
      CK(cudaEventRecord(e0, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 2) us.push_back(ms * 1000.0f / kSets);
    }
    std::sort(us.begin(), us.end());
    printf("%d %d %d %d %.1f %.1f\n", I, O, k2, cb, us[us.size() / 2], us[0]);
    std::vector<__half> hw(static_cast<size_t>(I) * O);
    CK(cudaMemcpy(hw.data(), layers[0].w, hw.size() * 2, cudaMemcpyDeviceToHost));
    char path[512];
    snprintf(path, sizeof(path), "%s.%d.bin", argv[1], c);
    FILE* f = fopen(path, "wb");
    if (f == nullptr || fwrite(hw.data(), 2, hw.size(), f) != hw.size()) {
      fprintf(stderr, "cannot write %s\n", path);
      return 1;
    }
    fclose(f);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    for (void* b : bufs) CK(cudaFree(b));
  }
  return 0;
}
