// Issue rate of the instructions the EXL3 decode is made of, per SM per cycle, on the GPU at hand.
//
// Why: the GEMV's speed on the H200 is set by which pipe its decode saturates (kernels/PERF.md); this measures
// each candidate instruction's sustained rate instead of trusting tables. Build and run on the device machine:
//     nvcc -O3 -arch=sm_90 -o /tmp/pipes kernels/bench/pipes.cu && /tmp/pipes
// Each kernel runs 8 independent dependency chains per thread of one instruction (inline PTX, so the compiler
// can neither fold nor reorder them away); cycles come from clock64 inside each block, so clocks don't matter.
// Each line also gives the clock the SMs ran that load at (cycles over %globaltimer ns, median over the blocks, of
// the last of `launches` back-to-back launches): `/tmp/pipes clock` runs each load 40 times at 16 warps per SM to
// see which units make the H200 run below the 1980 MHz nvidia-smi reports (kernels/PERF.md run 89). `/tmp/pipes tile`
// times whole-tile models of the decode and mixes of IMMA with other instructions (kernels/PERF.md run 91).
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

constexpr int kIters = 4096;
constexpr int kChains = 8;

// The two mmas every model here uses, accumulating in place: integer m16n8k32 (u8 x s8) and fp16 m16n8k16.
__device__ __forceinline__ void imma_acc(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// D = A B + c in every element: a fresh integer m16n8k32 result over a constant start
__device__ __forceinline__ void imma_set(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1, int c) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c));
}
__device__ __forceinline__ void hmma_acc(float& c0, float& c1, float& c2, float& c3, uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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
    if constexpr (OP == 6) hmma_acc(f[i][0], f[i][1], f[i][2], f[i][3], c1, c2, c1, c2, c1, c2);
    if constexpr (OP == 7) imma_acc(*reinterpret_cast<int(*)[4]>(&f[i][0]), c1, c2, c1, c2, c1, c2);
    if constexpr (OP == 8) {  // IMAD + SHF interleaved: do the two pipes overlap?
      if (i & 1) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("shf.l.wrap.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    }
    if constexpr (OP == 9) {  // IMAD + PRMT + IMMA mix of the int8 decode: 4 IMAD, 4 PRMT per IMMA
      if (i < 4) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("prmt.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      if (i == 7) imma_acc(*reinterpret_cast<int(*)[4]>(&f[0][0]), a[0], a[1], a[2], a[3], c1, c2);
    }
    if constexpr (OP == 10) asm volatile("mul.lo.u32 %0, %0, %1;" : "+r"(a[i]) : "r"(c1));
    if constexpr (OP == 14 || OP == 15 || OP == 16) {
      // 8 ALU or IMAD chains and two IMMAs on constant operands (accumulators of their own): which pipe does the
      // IMMA hold? 14: 8 IMAD, 15: 8 PRMT, 16: 4 IMAD + 4 PRMT
      const bool imad = OP == 14 || (OP == 16 && i < 4);
      if (imad) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("prmt.b32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      if (i == 3 || i == 7) imma_acc(*reinterpret_cast<int(*)[4]>(&f[i][0]), c1, c2, c1, c2, c1, c2);
    }
    if constexpr (OP == 11) asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+f"(f[i][0]) : "f"(__uint_as_float(c1)));
    if constexpr (OP == 12) {  // IMAD + IDP: one pipe or two?
      if (i & 1) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("dp4a.u32.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
    }
    if constexpr (OP == 13) {  // IMAD + FFMA: does the fp32 FMA take the IMAD's pipe?
      if (i & 1) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(a[i]) : "r"(c1), "r"(c2));
      else asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+f"(f[i][0]) : "f"(__uint_as_float(c1)));
    }
  }
}

// One block's timed loop, on both counters read side by side after a block barrier: SM cycles (clock64) and
// wall-clock ns (%globaltimer), so cycles / ns is the clock the SM ran that loop at.
struct BlockTimer {
  unsigned long long g0 = 0, g1 = 0;
  long long t0 = 0, t1 = 0;
  __device__ __forceinline__ void start() {
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    t0 = clock64();
  }
  __device__ __forceinline__ void stop() {
    __syncthreads();
    t1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  }
  // thread 0 writes the block's cycles and ns
  __device__ __forceinline__ void store(long long* cycles, unsigned long long* ns) const {
    if (threadIdx.x == 0) {
      cycles[blockIdx.x] = t1 - t0;
      ns[blockIdx.x] = g1 - g0;
    }
  }
};

template <int OP>
__global__ void bench(uint32_t c1, uint32_t c2, uint32_t* sink, long long* cycles, unsigned long long* ns) {
  uint32_t a[kChains];
  float f[kChains][4];
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    a[i] = threadIdx.x * 7 + i;
    f[i][0] = f[i][1] = f[i][2] = f[i][3] = 0.f;
  }
  BlockTimer timer;
  timer.start();
  for (int it = 0; it < kIters; ++it) step<OP>(a, c1, c2, f);
  timer.stop();
  uint32_t s = 0;
#pragma unroll
  for (int i = 0; i < kChains; ++i) s += a[i] + __float_as_uint(f[i][0] + f[i][1] + f[i][2] + f[i][3]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  timer.store(cycles, ns);
}

// Whole-tile models of the decode (`/tmp/pipes tile`): 8 tiles per iteration, each lane cutting its 8 K=2 windows
// out of one word (3 SHL, 4 SHR, 4 PRMT) and hashing them (8 IMAD), then
//   MODE 0: the integer mma path of 1-4 rows: two IMMA m16n8k32 per tile on the four-byte hashes, B loop-invariant;
//   MODE 4: MODE 0 with the tile's second IMMA on an accumulator of its own;
//   MODE 5: eight IMMA m8n8k16 per tile (one hash per lane each);
//   MODE 1: no tensor cores: a DP4A byte sum and one FFMA per weight, the integer sum read as a denormal fp32
//           (its bits are s * 2^-149, so x' scaled by 2^127 gives s * x' * 2^-22 exactly);
//   MODE 2: the 5-8 row class: DP4A to 1024 + s as fp16, pairs packed by PRMT, one fp16 mma per tile for 8 rows;
//   MODE 3: MODE 2 with the byte sums from two IMMAs against a selector B instead of the DP4As.
// Why: a screen for decode schemes before building them into the kernel. It is only a screen: ptxas allocates the
// model's registers its own way (MODE 0 here feeds every IMMA from one set of A registers, where the kernel
// alternates two), and MODE 4's gain did not carry over to the kernel (kernels/PERF.md run 91).
__device__ __forceinline__ uint32_t shl_u(uint32_t a, int n) {
  uint32_t r;
  asm volatile("shl.b32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(n));
  return r;
}
__device__ __forceinline__ uint32_t shr16(uint32_t a) {
  uint32_t r;
  asm volatile("shr.b32 %0, %1, 16;" : "=r"(r) : "r"(a));
  return r;
}
__device__ __forceinline__ uint32_t mid16(uint32_t a) {
  uint32_t r;
  asm volatile("prmt.b32 %0, %1, 0, 0x4421;" : "=r"(r) : "r"(a));
  return r;
}
__device__ __forceinline__ uint32_t hash1(uint32_t x, uint32_t c) {
  uint32_t r;
  asm volatile("mul.lo.u32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(c));
  return r;
}

template <int MODE>
__global__ void tile_bench(const uint32_t* words, uint32_t c, float xs, uint32_t* sink, long long* cycles,
                           unsigned long long* ns) {
  int acc[8][4] = {};
  int acc2[8][4] = {};
  float facc[8][2] = {};
  float acc8[8][2] = {};
  const int g = (threadIdx.x & 31) >> 2, cq = threadIdx.x & 3;
  const uint32_t sel0 = g == cq ? 0x01010101u : 0u, sel1 = g == cq + 4 ? 0x01010101u : 0u;
  const uint32_t b0 = 0x01010101u * (threadIdx.x & 7), b1 = b0 ^ 0x02020202u;
  const float xv[4] = {xs, xs * 0.5f, -xs, xs * 0.25f};
  uint32_t u = words[threadIdx.x & 31];
  int s2 = 2, s4 = 4, s6 = 6;
  BlockTimer timer;
  timer.start();
  for (int it = 0; it < kIters / 8; ++it) {
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      asm volatile("add.u32 %0, %0, %1;" : "+r"(u) : "r"(c));  // stands in for the tile's word load
      const uint32_t w1 = shl_u(u, s2), w2 = shl_u(u, s4), w3 = shl_u(u, s6);
      uint32_t h[8];
      h[0] = hash1(shr16(u), c);
      h[1] = hash1(shr16(w1), c);
      h[2] = hash1(shr16(w2), c);
      h[3] = hash1(shr16(w3), c);
      h[4] = hash1(mid16(u), c);
      h[5] = hash1(mid16(w1), c);
      h[6] = hash1(mid16(w2), c);
      h[7] = hash1(mid16(w3), c);
      if constexpr (MODE == 0 || MODE == 4) {
        // MODE 4: the tile's second mma on an accumulator of its own (no C dependency between the two)
        imma_acc(acc[t], h[0], h[4], h[2], h[6], b0, b1);
        imma_acc(MODE == 4 ? acc2[t] : acc[t], h[1], h[5], h[3], h[7], b1, b0);
      } else if constexpr (MODE == 5) {
        // the small integer mma, m8n8k16: one hash per lane per mma, eight mmas per tile
#pragma unroll
        for (int e = 0; e < 8; ++e)
          asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.u8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};"
                       : "+r"(acc[t][2 * (e >> 2)]), "+r"(acc[t][2 * (e >> 2) + 1])
                       : "r"(h[e]), "r"((e & 1) ? b1 : b0));
      } else if constexpr (MODE == 2) {
        // the 5-8 row class (v25): DP4A to 1024 + s as fp16, pairs packed by PRMT, one fp16 mma for 8 rows
        uint32_t v[8], a[4];
#pragma unroll
        for (int e = 0; e < 8; ++e)
          asm volatile("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(v[e]) : "r"(h[e]), "r"(0x01010101u), "r"(0x6400u));
#pragma unroll
        for (int j = 0; j < 4; ++j)
          asm volatile("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(a[j]) : "r"(v[2 * j]), "r"(v[2 * j + 1]));
        hmma_acc(facc[t][0], facc[t][1], acc8[t][0], acc8[t][1], a[0], a[1], a[2], a[3], b0, b1);
      } else if constexpr (MODE == 3) {
        // byte sums by two integer mmas against a selector B (column n picks the four bytes of input n), C = 0x6400
        // so D holds 1024 + s as fp16 bits; D's fragment is the fp16 mma's A fragment once packed by PRMT
        int d[2][4];
        imma_set(d[0], h[0], h[4], h[2], h[6], sel0, sel1, 0x6400);
        imma_set(d[1], h[1], h[5], h[3], h[7], sel0, sel1, 0x6400);
        uint32_t a[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          asm volatile("prmt.b32 %0, %1, %2, 0x5410;"
                       : "=r"(a[j])
                       : "r"(d[j >> 1][2 * (j & 1)]), "r"(d[j >> 1][2 * (j & 1) + 1]));
        hmma_acc(facc[t][0], facc[t][1], acc8[t][0], acc8[t][1], a[0], a[1], a[2], a[3], b0, b1);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          uint32_t sb;
          asm volatile("dp4a.u32.u32 %0, %1, %2, 0;" : "=r"(sb) : "r"(h[e]), "r"(0x01010101u));
          asm volatile("fma.rn.f32 %0, %1, %2, %0;" : "+f"(facc[t][e >> 2]) : "f"(__uint_as_float(sb)), "f"(xv[e & 3]));
        }
      }
    }
  }
  timer.stop();
  uint32_t s = u;
#pragma unroll
  for (int t = 0; t < 8; ++t)
    s += acc[t][0] + acc[t][1] + acc[t][2] + acc[t][3] + acc2[t][0] + acc2[t][1] + acc2[t][2] + acc2[t][3] +
         __float_as_uint(facc[t][0] + facc[t][1]) + __float_as_uint(acc8[t][0] + acc8[t][1]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  timer.store(cycles, ns);
}

// What one load's blocks measured: the slowest block's cycles and ns, the first block's ns, and the median over the
// blocks of cycles per ns (the SM clock).
struct Measured {
  long long max_cycles = 0;
  unsigned long long max_ns = 0, first_ns = 0;
  double ghz = 0;
};

// Launches `launch(sink, cycles, ns)` `launches` times over `blocks` blocks of `threads` and reads back what the
// last launch's blocks wrote; false (after saying why) if a launch failed.
template <typename Launch>
bool measure(const char* name, int blocks, int threads, int launches, Launch launch, Measured& m) {
  uint32_t* sink;
  long long* cyc;
  unsigned long long* ns;
  cudaMalloc(&sink, sizeof(uint32_t) * blocks * threads);
  cudaMalloc(&cyc, sizeof(long long) * blocks);
  cudaMalloc(&ns, sizeof(unsigned long long) * blocks);
  for (int l = 0; l < launches; ++l) launch(sink, cyc, ns);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("%s: %s\n", name, cudaGetErrorString(e));
    return false;
  }
  std::vector<long long> h(blocks);
  std::vector<unsigned long long> hn(blocks);
  cudaMemcpy(h.data(), cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
  cudaMemcpy(hn.data(), ns, sizeof(unsigned long long) * blocks, cudaMemcpyDeviceToHost);
  std::vector<double> ghz;
  for (int i = 0; i < blocks; ++i) {
    m.max_cycles = std::max(m.max_cycles, h[i]);
    m.max_ns = std::max(m.max_ns, hn[i]);
    ghz.push_back(double(h[i]) / double(hn[i]));
  }
  std::sort(ghz.begin(), ghz.end());
  m.ghz = ghz[ghz.size() / 2];
  m.first_ns = hn[0];
  cudaFree(sink);
  cudaFree(cyc);
  cudaFree(ns);
  return true;
}

template <int MODE>
void run_tile(const char* name, int sms, int blocks_per_sm, int threads, int launches) {
  const int blocks = sms * blocks_per_sm;
  uint32_t* words;
  cudaMalloc(&words, sizeof(uint32_t) * 32);
  std::vector<uint32_t> hw(32);
  for (int i = 0; i < 32; ++i) hw[i] = 0x9E3779B9u * (i + 1);
  cudaMemcpy(words, hw.data(), sizeof(uint32_t) * 32, cudaMemcpyHostToDevice);
  Measured m;
  const bool ok = measure(name, blocks, threads, launches, [&](uint32_t* sink, long long* cyc, unsigned long long* ns) {
    tile_bench<MODE><<<blocks, threads>>>(words, 0x83DCD12Du, 1.0e30f, sink, cyc, ns);
  }, m);
  cudaFree(words);
  if (!ok) return;
  const double tiles = double(blocks_per_sm) * (threads / 32) * kIters;  // warp-tiles per SM
  printf("%-34s warps/SM %3d: %.2f clk per warp-tile per SMSP, %.3f GHz, %.3f ns per warp-tile per SMSP\n", name,
         blocks_per_sm * threads / 32, 4.0 * m.max_cycles / tiles, m.ghz, 4.0 * m.max_ns / tiles);
}

template <int OP>
void run(const char* name, int sms, int blocks_per_sm, int threads, double inst_per_step, int launches = 2) {
  const int blocks = sms * blocks_per_sm;
  Measured m;
  if (!measure(name, blocks, threads, launches, [&](uint32_t* sink, long long* cyc, unsigned long long* ns) {
        bench<OP><<<blocks, threads>>>(0x83DCD12Du, 0x01010101u, sink, cyc, ns);
      }, m))
    return;
  const double warp_inst = double(blocks_per_sm) * (threads / 32) * kIters * inst_per_step;
  printf("%-34s warps/SM %3d: %.3f warp-inst/clk/SM (%.2f clk per warp-inst per SMSP), %.3f GHz over %.0f us\n",
         name, blocks_per_sm * threads / 32, warp_inst / m.max_cycles, 4.0 * m.max_cycles / warp_inst, m.ghz,
         m.first_ns / 1000.0);
}

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, %d SMs, sm_%d%d\n", prop.name, sms, prop.major, prop.minor);
  if (argc > 1 && strcmp(argv[1], "tile") == 0) {
    for (int bps : {2, 4, 8}) {
      run_tile<0>("tile: IMMA path (v25)", sms, bps, 128, 40);
      run_tile<4>("tile: IMMA path, 2 accumulators", sms, bps, 128, 40);
      run_tile<5>("tile: IMMA m8n8k16 x8", sms, bps, 128, 40);
      run_tile<1>("tile: DP4A + denormal FFMA", sms, bps, 128, 40);
      run_tile<2>("tile 5-8 rows: DP4A+PRMT+HMMA (v25)", sms, bps, 128, 40);
      run_tile<3>("tile 5-8 rows: 2 IMMA sums+PRMT+HMMA", sms, bps, 128, 40);
    }
    for (int bps : {4, 8}) {
      run<14>("8 IMAD + 2 IMMA (per step)", sms, bps, 128, 10);
      run<15>("8 PRMT + 2 IMMA (per step)", sms, bps, 128, 10);
      run<16>("4 IMAD + 4 PRMT + 2 IMMA (per step)", sms, bps, 128, 10);
      run<7>("IMMA m16n8k32 u8.s8->s32", sms, bps, 128, kChains);
      run<0>("IMAD (mad.lo.u32)", sms, bps, 128, kChains);
      run<3>("PRMT", sms, bps, 128, kChains);
    }
    run<11>("FFMA (fma.rn.f32)", sms, 4, 128, kChains, 40);
    run<12>("IMAD+IDP alternating", sms, 4, 128, kChains, 40);
    run<13>("IMAD+FFMA alternating", sms, 4, 128, kChains, 40);
    return 0;
  }
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
