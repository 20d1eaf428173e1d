// Issue rate of the instructions the EXL3 decode is made of, per SM per cycle, on the GPU at hand.
//
// Why: the GEMV's speed on the H200 is set by which pipe its decode saturates (kernels/PERF.md); this measures
// each candidate instruction's sustained rate instead of trusting tables. Build and run on the device machine:
//     nvcc -O3 -arch=sm_90 -o /tmp/pipes kernels/bench/pipes.cu && /tmp/pipes
// Each kernel runs 8 independent dependency chains per thread of one instruction (inline PTX, so the compiler
// can neither fold nor reorder them away); cycles come from clock64 inside each block, so clocks don't matter.
// Each line also gives the clock the SMs ran that load at (cycles over %globaltimer ns, median over the blocks, of
// the last of `launches` back-to-back launches): `/tmp/pipes clock` runs each load 40 times at 16 warps per SM to
// see which units make the H200 run below the 1980 MHz nvidia-smi reports (kernels/PERF.md run 89).
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

constexpr int kIters = 4096;
constexpr int kChains = 8;

template <int OP>
__device__ __forceinline__ void step(uint32_t (&a)[kChains], uint32_t c1, uint32_t c2, float (&f)[kChains][4]) {
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    if constexpr (OP == 0) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    if constexpr (OP == 1) asm volatile("dp4a.u32.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    if constexpr (OP == 2) asm volatile("shf.l.wrap.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    if constexpr (OP == 3) asm volatile("prmt.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    if constexpr (OP == 4) asm volatile("lop3.b32 %0, %0, %1, %2, 0x6A;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    if constexpr (OP == 5) asm volatile("shr.b32 %0, %0, %1;" : "+r"(a[i]) : "r"(c1));
    if constexpr (OP == 6) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(f[i][0]), "+f"(f[i][1]), "+f"(f[i][2]), "+f"(f[i][3])
          : "r"(c1), "r"(c2), "r"(c1), "r"(c2), "r"(c1), "r"(c2));
    }
    if constexpr (OP == 7) {
      int* g = reinterpret_cast<int*>(&f[i][0]);
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+r"(g[0]), "+r"(g[1]), "+r"(g[2]), "+r"(g[3])
          : "r"(c1), "r"(c2), "r"(c1), "r"(c2), "r"(c1), "r"(c2));
    }
    if constexpr (OP == 8) {  // IMAD + SHF interleaved: do the two pipes overlap?
      if (i & 1) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("shf.l.wrap.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    }
    if constexpr (OP == 9) {  // IMAD + PRMT + IMMA mix of the int8 decode: 4 IMAD, 4 PRMT per IMMA
      if (i < 4) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("prmt.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      if (i == 7) {
        int* g = reinterpret_cast<int*>(&f[0][0]);
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(g[0]), "+r"(g[1]), "+r"(g[2]), "+r"(g[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(c1), "r"(c2));
      }
    }
    if constexpr (OP == 10) asm volatile("mul.lo.u32 %0, %0, %1;" : "+r"(a[i]) : "r"(c1));
  }
}

template <int OP>
__global__ void bench(uint32_t c1, uint32_t c2, uint32_t* sink, long long* cycles, unsigned long long* ns) {
  uint32_t a[kChains];
  float f[kChains][4];
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    a[i] = threadIdx.x * 7 + i;
    f[i][0] = f[i][1] = f[i][2] = f[i][3] = 0.f;
  }
  __syncthreads();
  unsigned long long g0, g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) step<OP>(a, c1, c2, f);
  __syncthreads();
  const long long t1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  uint32_t s = 0;
#pragma unroll
  for (int i = 0; i < kChains; ++i) s += a[i] + __float_as_uint(f[i][0] + f[i][1] + f[i][2] + f[i][3]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = t1 - t0;
    ns[blockIdx.x] = g1 - g0;
  }
}

template <int OP>
void run(const char* name, int sms, int blocks_per_sm, int threads, double inst_per_step, int launches = 2) {
  const int blocks = sms * blocks_per_sm;
  uint32_t* sink;
  long long* cyc;
  unsigned long long* ns;
  cudaMalloc(&sink, sizeof(uint32_t) * blocks * threads);
  cudaMalloc(&cyc, sizeof(long long) * blocks);
  cudaMalloc(&ns, sizeof(unsigned long long) * blocks);
  for (int l = 0; l < launches; ++l) bench<OP><<<blocks, threads>>>(0x83DCD12Du, 0x01010101u, sink, cyc, ns);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("%s: %s\n", name, cudaGetErrorString(e));
    return;
  }
  long long* h = new long long[blocks];
  cudaMemcpy(h, cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
  std::vector<unsigned long long> hn(blocks);
  cudaMemcpy(hn.data(), ns, sizeof(unsigned long long) * blocks, cudaMemcpyDeviceToHost);
  long long mx = 0;
  std::vector<double> ghz;
  for (int i = 0; i < blocks; ++i) {
    mx = h[i] > mx ? h[i] : mx;
    ghz.push_back(double(h[i]) / double(hn[i]));
  }
  std::sort(ghz.begin(), ghz.end());
  const double warp_inst = double(blocks_per_sm) * (threads / 32) * kIters * inst_per_step;
  printf("%-34s warps/SM %3d: %.3f warp-inst/clk/SM (%.2f clk per warp-inst per SMSP), %.3f GHz over %.0f us\n",
         name, blocks_per_sm * threads / 32, warp_inst / mx, 4.0 * mx / warp_inst, ghz[ghz.size() / 2],
         hn[0] / 1000.0);
  delete[] h;
  cudaFree(sink);
  cudaFree(cyc);
  cudaFree(ns);
}

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, %d SMs, sm_%d%d\n", prop.name, sms, prop.major, prop.minor);
  if (argc > 1 && strcmp(argv[1], "clock") == 0) {
    run<0>("IMAD (mad.lo.u32)", sms, 4, 128, kChains, 40);
    run<2>("SHF (funnel shift)", sms, 4, 128, kChains, 40);
    run<8>("IMAD+SHF alternating", sms, 4, 128, kChains, 40);
    run<6>("HMMA m16n8k16 f16->f32", sms, 4, 128, kChains, 40);
    run<7>("IMMA m16n8k32 u8.s8->s32", sms, 4, 128, kChains, 40);
    run<9>("4 IMAD + 4 PRMT + 1 IMMA (per step)", sms, 4, 128, 9, 40);
    return 0;
  }
  for (int bps : {1, 2, 4}) {
    run<0>("IMAD (mad.lo.u32)", sms, bps, 256, kChains);
    run<10>("IMUL (mul.lo.u32)", sms, bps, 256, kChains);
    run<1>("IDP (dp4a)", sms, bps, 256, kChains);
    run<2>("SHF (funnel shift)", sms, bps, 256, kChains);
    run<3>("PRMT", sms, bps, 256, kChains);
    run<4>("LOP3", sms, bps, 256, kChains);
    run<5>("SHR", sms, bps, 256, kChains);
    run<8>("IMAD+SHF alternating", sms, bps, 256, kChains);
    run<6>("HMMA m16n8k16 f16->f32", sms, bps, 256, kChains);
    run<7>("IMMA m16n8k32 u8.s8->s32", sms, bps, 256, kChains);
    run<9>("4 IMAD + 4 PRMT + 1 IMMA (per step)", sms, bps, 256, 9);
  }
  return 0;
}
