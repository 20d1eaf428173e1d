// EXL3 weight reconstruction: W = diag(suh) . H128 . W_hat . H128 . diag(svh) (SPEC 4) into dense fp16 [I, O],
// for the prefill path (reconstruct, then cuBLAS fp16 GEMM; kernels/PERF.md says why that design).
//
// Written for sm_121 (GB10) and checked on sm_90: mma.sync m16n8k16 and cp.async only; no wgmma/TMA, no
// cooperative launch, no grid barrier, no atomics. Plain CUDA behind a C ABI (exl3_recon.h).
//
// The Hadamards are block-diagonal, so each 128x128 block of W depends only on the matching block of W_hat and the
// 128-slices of suh and svh. One thread block (8 warps) reconstructs one 128x128 block at a time, looping over
// the blocks of all layers of the launch with the next block's trellis prefetched by cp.async:
// * Stage 1 (H128 from the left, over k). With k = 16a + b, H128 = H8 (x) H16 (SPEC 4's natural Sylvester order).
//   Warp w owns column tile w (16 columns) and the 8 row tiles a of the block. SPEC 3's trellis order is the mma
//   B-fragment order, so each lane decodes its own 8 positions of tile (a, w) straight into the two B fragments of
//   an m16n8k16 (decoded to fp16 exactly as SPEC 2.3: one fp16 add for 3INST/MCG, one fused fp16 FMA for mul1, so
//   W_hat is bit-exact), and multiplies them by the constant A = H16 (+-1, exact): H16 over b on the tensor cores,
//   fp32 accumulation. H8 over a is a 3-stage butterfly across the lane's 8 accumulator sets (registers only).
// * Stage 2 (H128 from the right, over n = 16c + d). The stage-1 C fragments of a 16-row slab are, as they stand,
//   the A fragment of the next mma (the FlashAttention trick), split into fp16 hi + lo parts so the fp32 value goes
//   through unrounded (~2^-22 relative); B = H16 again: H16 over d. H8 over c crosses warps (c is the warp), so the
//   results go through shared memory (two buffers of 32 rows, one barrier per round), where each thread takes
//   one (row, column pair), runs the 8-point butterfly over c, scales by suh * svh / 128 and rounds to fp16 once.
// The only roundings are fp32 accumulation and the final fp16: W agrees with reference.weight (fp32 throughout)
// to the last fp16 bit except where the two fp32 orders land on opposite sides of a rounding boundary.

#include "exl3_recon.h"

#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <atomic>

#include "exl3_common.cuh"

// float2 + and - for the read phase's butterfly (two columns at once).
__device__ __forceinline__ float2 operator+(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 operator-(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }

namespace exl3_recon {

using exl3::Rate;
using exl3::h2_as_u32;
using exl3::u32_as_h2;
using exl3::mma_16816;

constexpr int kThreads = 256;    // 8 warps: warp w owns column tile w of the block in stage 1
constexpr int kMinBlocks = 2;    // register budget: 65536 / (256 * 2) = 128 per thread
constexpr int kMaxLayers = 32;   // layers per launch, passed by value (32 x 32 bytes of kernel arguments)
constexpr int kRoundRows = 32;   // rows of a block exchanged through shared memory at a time (two 16-row slabs)
// floats per exchange row: 144 = 16 mod 32, so a half-warp's float2 reads of two rows hit 32 distinct banks, and the
// stage-2 stores are conflict-free with the XOR swizzle of the two 8-column halves (see the stores).
constexpr int kXStride = 144;
constexpr float kInv128 = 1.0f / 128.0f;  // the two 1/sqrt(128) of SPEC 4, exact

struct Layer {
  const uint8_t* trellis;
  const __half* suh;
  const __half* svh;
  __half* w;
};

struct Args {
  Layer layer[kMaxLayers];
  long long ldw;  // row stride of every w (elements)
  int tiles_n;    // O/16: the trellis' tiles per tile row
  int kblocks;    // I/128
  int nblocks;    // cols/128: the column blocks written
  int nblock0;    // col0/128
  int items;      // n_layers * kblocks * nblocks
};

// The lane's 8 states from its normalised words (state e's window starts at bit off(e)).
template <int K2, int NW>
__device__ __forceinline__ void cut_states(const uint32_t (&w)[NW], uint32_t (&st)[8]) {
  using R = Rate<K2>;
  st[0] = exl3::bits16_shift<R::off(0), NW>(w);
  st[1] = exl3::bits16_shift<R::off(1), NW>(w);
  st[2] = exl3::bits16_shift<R::off(2), NW>(w);
  st[3] = exl3::bits16_shift<R::off(3), NW>(w);
  st[4] = exl3::bits16_shift<R::off(4), NW>(w);
  st[5] = exl3::bits16_shift<R::off(5), NW>(w);
  st[6] = exl3::bits16_shift<R::off(6), NW>(w);
  st[7] = exl3::bits16_shift<R::off(7), NW>(w);
}

template <int K2>
__host__ __device__ constexpr int smem_bytes() {
  return 2 * Rate<K2>::kBlockBytes + 2 * kRoundRows * kXStride * 4;
}

// Two states to their fp16 values (SPEC 2.3), as one half2 (s0 in the low half).
template <int CB>
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1) {
  if constexpr (CB == 2) {
    // mul1: DP4A gives the fp16 bits of 1024 + byte sum; then ONE fused fp16 FMA (a separate multiply and add
    // would round twice and differ for 822 of the 1021 sums).
    const uint32_t h0 = __dp4a(exl3::cb_mix<2>(s0), 0x01010101u, 0x6400u);
    const uint32_t h1 = __dp4a(exl3::cb_mix<2>(s1), 0x01010101u, 0x6400u);
    const __half2 k_inv = u32_as_h2(exl3::kMul1InvBits * 0x10001u), k_bias = u32_as_h2(exl3::kMul1BiasBits * 0x10001u);
    return h2_as_u32(__hfma2(u32_as_h2(__byte_perm(h0, h1, 0x5410)), k_inv, k_bias));
  } else {
    // 3INST / MCG: hash, mask and flip to two fp16 halves, then ONE fp16 add of the halves.
    uint32_t x0 = exl3::cb_mix<CB>(s0);
    uint32_t x1 = exl3::cb_mix<CB>(s1);
    x0 = (x0 & exl3::kHashMask) ^ exl3::kHashXor;
    x1 = (x1 & exl3::kHashMask) ^ exl3::kHashXor;
    const __half2 lo = u32_as_h2(__byte_perm(x0, x1, 0x5410)), hi = u32_as_h2(__byte_perm(x0, x1, 0x7632));
    return h2_as_u32(__hadd2(lo, hi));
  }
}

// (H16[r][k], H16[r][k+1]) as a half2 of +-1 (natural Sylvester order, unnormalised).
__device__ __forceinline__ uint32_t h16_pair(int r, int k) { return exl3::had_pair(r, k, 0x3C00u, 0xBC00u); }

// In-place 8-point natural-order Walsh-Hadamard butterfly (unnormalised) over v[0..7].
template <typename T>
__device__ __forceinline__ void fwht8(T (&v)[8]) {
#pragma unroll
  for (int s = 1; s < 8; s <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (i & s) continue;
      const T x = v[i], y = v[i + s];
      v[i] = x + y;
      v[i + s] = x - y;
    }
  }
}

struct Item {
  int layer, kb, nb;
};
__device__ __forceinline__ Item item_of(const Args& p, int item) {
  const int per_layer = p.kblocks * p.nblocks;
  Item it;
  it.layer = item / per_layer;
  const int rem = item - it.layer * per_layer;
  it.kb = rem / p.nblocks;
  it.nb = rem - it.kb * p.nblocks;
  return it;
}

// Requests the trellis of one 128x128 block (8 tile rows of 8 contiguous tiles) into shared memory, tile (a, w) at
// byte (8a + w) * kTileBytes, as one cp.async group.
template <int K2>
__device__ __forceinline__ void load_block(const Args& p, int item, uint32_t smem_dst) {
  using R = Rate<K2>;
  const Item it = item_of(p, item);
  const size_t row_bytes = static_cast<size_t>(p.tiles_n) * R::kTileBytes;
  const uint8_t* base = p.layer[it.layer].trellis + static_cast<size_t>(it.kb) * 8 * row_bytes +
                        static_cast<size_t>(p.nblock0 + it.nb) * 8 * R::kTileBytes;
  for (int u = threadIdx.x; u < R::kBlockUnits; u += kThreads) {
    const int a = u / R::kSlabUnits, r = u - a * R::kSlabUnits;  // tile row a of the block: one slab
    exl3::cp_async16_ordered(smem_dst + u * 16, base + a * row_bytes + r * 16);
  }
  exl3::cp_async_commit_ordered();
}

template <int K2, int CB>
__global__ void __launch_bounds__(kThreads, kMinBlocks) recon_kernel(const __grid_constant__ Args p) {
  using R = Rate<K2>;
  extern __shared__ __align__(16) uint8_t smem[];
  float* xbuf = reinterpret_cast<float*>(smem + 2 * R::kBlockBytes);
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;

  // H16 as the stage-1 A fragment (rows g, g+8; columns 2c.., 2c+8..) and, by symmetry, the stage-2 B fragments
  // (n-half 0: ha[0], ha[2]; n-half 1: ha[1], ha[3]).
  const uint32_t ha[4] = {h16_pair(g, 2 * c), h16_pair(g + 8, 2 * c), h16_pair(g, 2 * c + 8), h16_pair(g + 8, 2 * c + 8)};
  const uint32_t hn[4] = {ha[0] ^ 0x80008000u, ha[1] ^ 0x80008000u, ha[2] ^ 0x80008000u, ha[3] ^ 0x80008000u};
  // The lane's trellis positions 8*lane .. 8*lane+7 need ring bits from b0 = 4*K2*lane + end(0) - 16 (mod R, SPEC
  // 2.2: lane 0's first window wraps to the end of the ring): the words holding them, and b0's offset in the first.
  int word_at[R::kShiftWords];
  int first_bit;
  {
    int b0 = 4 * K2 * lane + R::end(0) - 16;
    b0 = b0 < 0 ? b0 + R::kRingBits : b0;
    first_bit = b0 & 31;
#pragma unroll
    for (int i = 0; i < R::kShiftWords; ++i) {
      const int q = (b0 >> 5) + i;
      word_at[i] = q >= R::kTileWords ? q - R::kTileWords : q;
    }
  }
  // The read phase's item: one row of a round, one column pair of every column tile.
  const int xrow = tid >> 3, xcol = (tid & 7) * 2;
  const int xcol_swz = xcol ^ (((xrow >> 1) & 1) * 8);  // where the stores above put it (row & 7 = g there)

  int item = blockIdx.x;
  if (item >= p.items) return;
  load_block<K2>(p, item, smem_base);
  int stage = 0;
  for (; item < p.items; item += gridDim.x) {
    const int next = item + gridDim.x;
    if (next < p.items) load_block<K2>(p, next, smem_base + (stage ^ 1) * R::kBlockBytes);
    else exl3::cp_async_commit_ordered();  // an empty group keeps the wait count uniform
    const Item it = item_of(p, item);
    exl3::cp_async_wait_ordered<1>();
    __syncthreads();

    // ---- decode the 8 tiles (a, warp) into mma B fragments (held for the whole block: 32 registers) ----
    uint32_t bf[8][4];
    const uint32_t* tiles = reinterpret_cast<const uint32_t*>(smem + stage * R::kBlockBytes);
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      const uint32_t* wds = tiles + (a * 8 + warp) * R::kTileWords;
      // the lane's words, funnel-shifted so its first window starts at bit 0: the 8 cuts are then compile-time
      uint32_t raw[R::kShiftWords], nw[R::kNormWords];
#pragma unroll
      for (int i = 0; i < R::kShiftWords; ++i) raw[i] = wds[word_at[i]];
#pragma unroll
      for (int i = 0; i < R::kNormWords; ++i) nw[i] = __funnelshift_l(raw[i + 1], raw[i], first_bit);
      uint32_t st[8];
      cut_states<K2>(nw, st);
      // SPEC 3: e = 0,1 | 2,3 are rows r0, r0+1 | r0+8, r0+9 of column g (n-half 0); e = 4..7 the same of g + 8.
      bf[a][0] = decode_pair<CB>(st[0], st[1]);
      bf[a][1] = decode_pair<CB>(st[2], st[3]);
      bf[a][2] = decode_pair<CB>(st[4], st[5]);
      bf[a][3] = decode_pair<CB>(st[6], st[7]);
    }

    // ---- per round, slabs a' = 2*round and 2*round + 1 (rows 32*round ..): ----
    // Two exchange buffers, alternating by round: a round's stores cannot overtake the previous round's reads, so
    // one barrier per round suffices (the one before the reads; round r + 2 reuses a buffer only after every thread
    // has passed round r + 1's barrier, i.e. finished round r's reads). Unrolled by 2, the buffer and half of the
    // H8 signs are compile-time; unrolled by 4, ptxas spills (kernels/PERF.md, session 17).
#pragma unroll 2
    for (int round = 0; round < 8 / 2; ++round) {
      float* const xb = xbuf + (round & 1) * (kRoundRows * kXStride);
      // Stage 1: T[a'] = sum_a H8[a'][a] (H16 . tile a), with H8's sign folded into the A operand (-H16). The two
      // slabs differ only in bit 0 of a', so the even and odd a are summed apart (E, O) and T = E + O, E - O.
      float eo[2][2][4];
#pragma unroll
      for (int par = 0; par < 2; ++par) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int i = 0; i < 4; ++i) eo[par][h][i] = 0.0f;
#pragma unroll
          for (int a = par; a < 8; a += 2) {
            const bool neg = __popc((2 * round) & a) & 1;
            uint32_t af[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) af[i] = neg ? hn[i] : ha[i];
            mma_16816(eo[par][h], af, bf[a][2 * h], bf[a][2 * h + 1]);
          }
        }
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        float t[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int i = 0; i < 4; ++i) t[h][i] = s ? eo[0][h][i] - eo[1][h][i] : eo[0][h][i] + eo[1][h][i];
        }
        // Stage 2: the slab's C fragments are the A fragment of T . H16 (split into fp16 hi + lo).
        uint32_t ahi[4], alo[4];
        exl3::split_h2(t[0][0], t[0][1], ahi[0], alo[0]);
        exl3::split_h2(t[0][2], t[0][3], ahi[1], alo[1]);
        exl3::split_h2(t[1][0], t[1][1], ahi[2], alo[2]);
        exl3::split_h2(t[1][2], t[1][3], ahi[3], alo[3]);
        float u[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int i = 0; i < 4; ++i) u[h][i] = 0.0f;
          mma_16816(u[h], ahi, ha[h], ha[h + 2]);
          mma_16816(u[h], alo, ha[h], ha[h + 2]);
        }
        // Rows 16s + g and 16s + g + 8, columns 16*warp + 8h + 2c, the two 8-column halves of a tile swapped in rows
        // with bit 1 of (row & 7) set (an XOR swizzle the read below undoes): a half-warp's 64-bit stores then cover
        // all 32 banks, with no data select.
        const int swz = ((g >> 1) & 1) * 8;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* at = xb + (16 * s + g) * kXStride + 16 * warp + ((8 * h) ^ swz) + 2 * c;
          *reinterpret_cast<float2*>(at) = make_float2(u[h][0], u[h][1]);
          *reinterpret_cast<float2*>(at + 8 * kXStride) = make_float2(u[h][2], u[h][3]);
        }
      }
      // suh and svh do not depend on the exchange: their loads are issued before the barrier, so that their
      // latency hides under the wait
      const int k = it.kb * 128 + kRoundRows * round + xrow;
      const Layer& L = p.layer[it.layer];
      const float scale = __half2float(L.suh[k]) * kInv128;
      const __half* svh = L.svh + (p.nblock0 + it.nb) * 128 + xcol;
      __half2 sv[8];
#pragma unroll
      for (int w = 0; w < 8; ++w) sv[w] = *reinterpret_cast<const __half2*>(svh + 16 * w);
      __syncthreads();
      float2 v[8];
#pragma unroll
      for (int w = 0; w < 8; ++w) v[w] = *reinterpret_cast<const float2*>(xb + xrow * kXStride + 16 * w + xcol_swz);
      fwht8(v);
      __half* out = L.w + static_cast<long long>(k) * p.ldw + it.nb * 128 + xcol;
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        const float2 s2 = __half22float2(sv[w]);
        const __half2 r = __floats2half2_rn(v[w].x * scale * s2.x, v[w].y * scale * s2.y);
        *reinterpret_cast<__half2*>(out + 16 * w) = r;
      }
    }
    stage ^= 1;
  }
}


thread_local char g_error[256];

// Resident blocks per (device, k2, codebook) instance (0 = not asked yet); the attribute set by the first launch on
// a device holds for the rest of the process.
constexpr int kMaxDevices = 64;
std::atomic<int> g_resident[kMaxDevices][17][3];

int fail_cuda(cudaError_t e, const char* what) {
  snprintf(g_error, sizeof(g_error), "EXL3 reconstruct: %s failed: %s", what, cudaGetErrorString(e));
  return EXL3_ERR_CUDA;
}

typedef void (*KernelFn)(Args);

template <int K2, int CB>
KernelFn kernel_for() {
  return recon_kernel<K2, CB>;
}

// The compiled instances: exactly the rates and codebooks of the shape rule (EXL3_RATES, exl3_common.cuh).
template <int K2, bool kAll>
bool select_rate(int cb, KernelFn* fn, int* smem) {
  if constexpr (kAll) {
    if (cb == 0) *fn = kernel_for<K2, 0>();
    if (cb == 1) *fn = kernel_for<K2, 1>();
  }
  if (cb == 2) *fn = kernel_for<K2, 2>();
  *smem = smem_bytes<K2>();
  return cb == 2 || (kAll && (cb == 0 || cb == 1));
}

bool select(int k2, int cb, KernelFn* fn, int* smem) {
#define EXL3R_RATE(K2_, ALL_) \
  if (k2 == K2_) return select_rate<K2_, ALL_>(cb, fn, smem);
  EXL3_RATES(EXL3R_RATE)
#undef EXL3R_RATE
  return false;
}

}  // namespace exl3_recon

extern "C" int exl3_recon_supports(int in_features, int out_features, int k2, int codebook) {
  return exl3_gemv_supports(1, in_features, out_features, k2, codebook);
}

extern "C" int exl3_recon_launch(const Exl3ReconParams* p, cudaStream_t stream) {
  using namespace exl3_recon;
  if (p == nullptr || p->layers == nullptr || p->n_layers < 1) return EXL3_RECON_ERR_COLUMNS;
  const int st = exl3_recon_supports(p->in_features, p->out_features, p->k2, p->codebook);
  if (st != EXL3_OK) return st;
  if (p->col0 < 0 || p->cols <= 0 || p->col0 % 128 || p->cols % 128 || p->col0 + p->cols > p->out_features ||
      p->ldw < p->cols || p->ldw % 2)
    return EXL3_RECON_ERR_COLUMNS;
  for (int i = 0; i < p->n_layers; ++i) {
    const Exl3ReconLayer& l = p->layers[i];
    if (l.trellis == nullptr || l.suh == nullptr || l.svh == nullptr || l.w == nullptr ||
        reinterpret_cast<uintptr_t>(l.trellis) % 16 || reinterpret_cast<uintptr_t>(l.svh) % 4 ||
        reinterpret_cast<uintptr_t>(l.w) % 4)
      return EXL3_ERR_ALIGN;
  }
  KernelFn fn = nullptr;
  int smem = 0;
  if (!select(p->k2, p->codebook, &fn, &smem)) return EXL3_ERR_BITS;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return fail_cuda(e, "cudaGetDevice");
  const void* f = reinterpret_cast<const void*>(fn);
  // resident blocks of the grid, asked of the runtime once per (device, instance): later launches (CUDA-graph
  // captures included) make no attribute call
  std::atomic<int>* cached = dev >= 0 && dev < kMaxDevices ? &g_resident[dev][p->k2][p->codebook] : nullptr;
  int resident = cached != nullptr ? cached->load(std::memory_order_acquire) : 0;
  if (resident == 0) {
    int sms = 0, per_sm = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return fail_cuda(e, "cudaDeviceGetAttribute(multiprocessors)");
    e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return fail_cuda(e, "cudaFuncSetAttribute(max dynamic shared memory)");
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, kThreads, smem);
    if (e != cudaSuccess) return fail_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    resident = sms * (per_sm < 1 ? 1 : per_sm);
    if (cached != nullptr) cached->store(resident, std::memory_order_release);
  }
  const int kblocks = p->in_features / 128, nblocks = p->cols / 128;
  for (int first = 0; first < p->n_layers; first += kMaxLayers) {
    const int n = p->n_layers - first < kMaxLayers ? p->n_layers - first : kMaxLayers;
    Args a{};
    for (int i = 0; i < n; ++i) {
      const Exl3ReconLayer& l = p->layers[first + i];
      a.layer[i].trellis = static_cast<const uint8_t*>(l.trellis);
      a.layer[i].suh = static_cast<const __half*>(l.suh);
      a.layer[i].svh = static_cast<const __half*>(l.svh);
      a.layer[i].w = static_cast<__half*>(l.w);
    }
    a.ldw = p->ldw;
    a.tiles_n = p->out_features / 16;
    a.kblocks = kblocks;
    a.nblocks = nblocks;
    a.nblock0 = p->col0 / 128;
    const long long items = static_cast<long long>(n) * kblocks * nblocks;
    if (items > 0x7FFFFFFFLL) return EXL3_RECON_ERR_COLUMNS;
    a.items = static_cast<int>(items);
    const int grid = static_cast<int>(items < resident ? items : resident);
    void* args[] = {&a};
    e = cudaLaunchKernel(f, dim3(grid), dim3(kThreads), args, static_cast<size_t>(smem), stream);
    if (e != cudaSuccess) return fail_cuda(e, "kernel launch");
  }
  return EXL3_OK;
}

extern "C" const char* exl3_recon_error_string(int status) {
  switch (status) {
    case EXL3_OK: return "ok";
    case EXL3_ERR_SHAPE: return "EXL3 reconstruct needs in_features and out_features to be positive multiples of 128";
    case EXL3_ERR_BITS:
      return "EXL3 reconstruct supports 1..8 bits per weight, and 1.5/2.5/3.5 with the mul1 codebook";
    case EXL3_ERR_CODEBOOK:
      return "EXL3 reconstruct: codebook must be 0 (3inst), 1 (mcg) or 2 (mul1); half-integer rates need mul1";
    case EXL3_ERR_ALIGN:
      return "EXL3 reconstruct: trellis must be 16-byte aligned, svh and the output 4-byte aligned, none missing";
    case EXL3_RECON_ERR_COLUMNS:
      return "EXL3 reconstruct: at least one layer, col0 and cols multiples of 128 with col0 + cols <= out_features, "
             "and an even row stride ldw >= cols";
    case EXL3_ERR_CUDA: return exl3_recon::g_error;
    default: return exl3_gemv_error_string(status);
  }
}
