// EXL3 GEMV for 1..8 rows: y[m, O] = x[m, I] . W with W = diag(suh) . H . W_hat . H . diag(svh) (SPEC 4).
//
// Written for sm_121 (GB10: mma.sync m16n8k16, cp.async; no wgmma/TMA) and checked on sm_90 (the same path).
// Plain CUDA, no torch headers: `make kernels` and CI build this file with nvcc alone (see exl3_gemv.h).
//
// How it works (kernels/README.md has the long form):
// * The GEMV is computed transposed, y^T = W_hat^T . x'^T, so that a 16x16 trellis tile is the mma A operand
//   (16 output columns x 16 inputs) and the up-to-8 input rows are the n8 B operand. A lane's 8 trellis positions
//   (SPEC 3) are exactly its A-fragment elements, so each lane decodes its own 8 weights straight into registers.
// * Block = 8 warps (16 in the integer kernel) on one 128-wide column chunk and a contiguous slice of 128-row
//   input chunks (split-K). Each warp streams 16-row slabs (8 tiles = 128 columns, 128*k2 contiguous bytes)
//   through a private cp.async ring in shared memory, with no block barriers in the main loop.
// * The input side (x * suh, then the 128-point Hadamard) is computed per block into shared memory, already in
//   B-fragment order; the integer kernel's warps each compute their own share in registers, on the tensor cores.
//   The output side (Hadamard, then * svh) runs once per column chunk in the block that finishes last (a counter
//   per chunk; the partial sums of the other slices come through global memory and are added in a fixed order, so
//   results are deterministic), which also rounds to fp16. Three hand-overs of those partial sums (see HandOver):
//   fixed-point atomics (fixed_share) and tickets (take_ticket) in the integer kernel up to 2 and 4 rows, the
//   classic fenced "last block" atomic elsewhere. With fixed-point atomics every block finishes its own slice and
//   the block that completes a column's sum stores it.
// * mul1 (every exllamav3 model since v1.0.0) runs in the integer kernel: the hash bytes straight into the integer
//   mma for 1-4 rows; for 5-8 rows decoded to fp16 (DP4A), two weights per register, one fp16 mma per tile.

#include "exl3_gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3_common.cuh"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

namespace exl3 {

// Blocks per SM each kernel is compiled for (register budget 65536 / (threads * this)): with no minimum, ptxas
// capped some sm_121 instances at 64 registers and spilled; the integer kernel schedules its loop tighter with 1.
constexpr int kMinBlocks = 2;
constexpr int kMinBlocksI8 = 1;

// Phase hooks of the bench's phase timing (kernels/bench/stamps.cuh defines them before including this file);
// empty in every product build.
#ifndef EXL3_STAMP
#define EXL3_STAMP(k)
#define EXL3_STAMP_END()
#endif

// Warps per block of the fp16 kernel (two blocks per SM) and of the integer kernel (one block per SM): four warps
// per scheduler instead of two hide the decode's dependency latencies.
constexpr int kWarps = 8;
constexpr int kWarpsI8 = 16;
constexpr int kThreads = kWarps * 32;      // threads per block
constexpr int kMaxRows = 8;                // the mma n8 dimension holds up to 8 input rows
constexpr int kMaxChunksPerBlock = 16;     // 128-row input chunks per block (bounds the x' shared memory)
// The integer kernel may take a whole 4096-input column chunk in one block (no split, no partial sums): its int32
// sums stay exact up to 16448 inputs (4 bytes x 255 x 128 per input), far above 32 chunks.
constexpr int kMaxChunksPerBlockI8 = 32;
// Three split-K hand-overs of a column chunk's partial sums, each the fastest for its row class: fixed-point
// atomics for 1-2 rows (no wait at all), tickets for 3-4 (4 rows make four times the atomics), the fenced "last
// block" atomic for 5-8 rows and the fp16 kernel (where the other two made ptxas schedule the main loop worse).
enum HandOver { kFencedHandOver, kTicketHandOver, kFixedHandOver };
__host__ __device__ constexpr HandOver hand_over(int rows) {
  return rows <= 2 ? kFixedHandOver : rows <= 4 ? kTicketHandOver : kFencedHandOver;
}
// Most slices the fixed-point hand-over counts (its arrival field has 8 bits).
constexpr int kMaxFixedSplit = 255;
// Where the ticket and fixed-point slots start in the int32 workspace (after the column chunks' counters, 16-byte
// aligned).
__host__ __device__ constexpr int slots_offset(int out_features) { return (out_features / 128 + 3) / 4 * 4; }
constexpr int kRedStride = 132;            // fp32 row stride of the per-warp reduction buffer (bank-conflict pad)
constexpr float kHadScale = 0.08838834764831845f;  // 1/sqrt(128)

// cp.async ring depth per warp for blocks of NW warps: up to 32 KiB in flight per block, 2..8 stages, a power of
// two (SlabRing).
constexpr int kRingKiB = 32;
template <int K2, int NW>
__host__ __device__ constexpr int ring_stages() {
  constexpr int per_warp = kRingKiB * 1024 / NW / Rate<K2>::kSlabBytes;
  return per_warp >= 8 ? 8 : (per_warp >= 4 ? 4 : 2);
}

// ---------------------------------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------------------------------

// The mul1 codebook decoded through the integer tensor cores (gemv_i8_kernel): a template codebook id of its own.
constexpr int kMul1Int = 3;

// Codebook hash of a 16-bit state (SPEC 2.3). For 3INST/MCG the result holds two fp16 halves still to be added;
// for mul1 its low 16 bits are the fp16 1024 + byte sum.
template <int CB>
__device__ __forceinline__ uint32_t cb_hash(uint32_t s) {
  if constexpr (CB == 0 || CB == 1) {
    const uint32_t x = cb_mix<CB>(s);
    // (x & kHashMask) ^ kHashXor as ONE lop3 (LUT 0x6A): written plainly, ptxas emits two LOP3s with an
    // immediate each rather than keep the xor constant in a register.
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(r) : "r"(x), "n"(kHashMask), "r"(kHashXor));
    return r;
  } else if constexpr (CB == 2) {
    const uint32_t x = cb_mix<2>(s);
    return __dp4a(x, 0x01010101u, 0x6400u);
  } else {
    // kMul1Int: the hashed word itself; its four bytes are summed by the integer mma (gemv_i8_kernel)
    return cb_mix<2>(s);
  }
}

// Decode without rounding each weight to fp16 first, so no packing of two values into one register:
// * 3INST/MCG: the hashed word IS the half2 (lo, hi) whose sum is the weight, so it goes into the mma as it is,
//   against a B fragment holding each x' value twice: lo*x + hi*x = (lo + hi)*x.
// * mul1: DP4A leaves (1024 + byte sum) as an fp16 in the low half and +0 in the high half; the mma multiplies
//   it by x' directly and the affine map k_inv * h + k_bias is applied to the sums (k_bias times the sum of x').
// The 8 weights of a lane then fill two A fragments (positions 0,4,2,6 and 1,5,3,7), i.e. two mmas per tile
// instead of one, and the pairing PRMT and the fp16 add/FMA per weight disappear (the integer ALU is this
// kernel's busiest pipe). The products and sums are fp32, so the only difference from
// the spec's rounded fp16 weights is that rounding (about 2^-12 relative per weight), well inside the 1e-3
// tolerance on y that the reference paths themselves have.

template <int K2, int CB, int BASE, int NW>
struct TileDecoder {
  template <int E>
  static __device__ __forceinline__ uint32_t h(const uint32_t (&w)[NW]) {
    return cb_hash<CB>(bits16<BASE + Rate<K2>::off(E), NW>(w));
  }
  // A fragments of W_hat^T (rows = output columns n, cols = inputs k). Lane (g, c) owns positions e = 0..7 at
  // n = g + 8*(e>>2), k = 2c + (e&1) + 8*((e>>1)&1): even positions go to the k = 2c / 2c+8 slots of the first
  // mma, odd ones to the same slots of the second (whose B carries x'[2c+1] / x'[2c+9] there).
  static __device__ __forceinline__ void decode(const uint32_t (&w)[NW], uint32_t (&ae)[4], uint32_t (&ao)[4]) {
    if constexpr (K2 == 4 && BASE == 0) {
      // K = 2: states e sit at bits 2e .. 2e+15 of one word. Three shifted copies put every state on a byte
      // boundary, so each is cut with one SHR or PRMT: 12 ALU ops per 8 states instead of 15 (shift + mask).
      // the copies via inline PTX: written in C, the compiler folds (w << 2) >> 16 back into shift + mask
      const uint32_t w0 = w[0];
      uint32_t w1, w2, w3;
      asm("shl.b32 %0, %1, 2;" : "=r"(w1) : "r"(w0));
      asm("shl.b32 %0, %1, 4;" : "=r"(w2) : "r"(w0));
      asm("shl.b32 %0, %1, 6;" : "=r"(w3) : "r"(w0));
      ae[0] = cb_hash<CB>(w0 >> 16);
      ae[1] = cb_hash<CB>(__byte_perm(w0, 0u, 0x4421));  // position 4: bits 8..23
      ae[2] = cb_hash<CB>(w2 >> 16);
      ae[3] = cb_hash<CB>(__byte_perm(w2, 0u, 0x4421));  // position 6
      ao[0] = cb_hash<CB>(w1 >> 16);
      ao[1] = cb_hash<CB>(__byte_perm(w1, 0u, 0x4421));  // position 5
      ao[2] = cb_hash<CB>(w3 >> 16);
      ao[3] = cb_hash<CB>(__byte_perm(w3, 0u, 0x4421));  // position 7
    } else if constexpr (K2 == 8 && BASE == 20 && NW == 2) {
      // K = 4: with V = w0:w1 (w0 first), state e = (V >> (28 - 4e)) & 0xFFFF. Three funnel copies (V >> 4, 16, 20)
      // put every state on a byte boundary of one word, so each is cut by one PRMT: 11 ALU ops per 8 states
      // instead of 13 (shift + mask or funnel + mask for most of them).
      const uint32_t w0 = w[0], w1 = w[1];
      const uint32_t f4 = __funnelshift_r(w1, w0, 4);
      const uint32_t f16 = __funnelshift_r(w1, w0, 16);
      const uint32_t f20 = __funnelshift_r(w1, w0, 20);
      ae[0] = cb_hash<CB>(__byte_perm(f20, 0u, 0x4421));  // e=0: V >> 28
      ao[0] = cb_hash<CB>(__byte_perm(f16, 0u, 0x4421));  // e=1: V >> 24
      ae[2] = cb_hash<CB>(__byte_perm(f20, 0u, 0x4410));  // e=2: V >> 20
      ao[2] = cb_hash<CB>(__byte_perm(f16, 0u, 0x4410));  // e=3: V >> 16
      ae[1] = cb_hash<CB>(__byte_perm(f4, 0u, 0x4421));   // e=4: V >> 12
      ao[1] = cb_hash<CB>(__byte_perm(w1, 0u, 0x4421));   // e=5: V >> 8
      ae[3] = cb_hash<CB>(__byte_perm(f4, 0u, 0x4410));   // e=6: V >> 4
      ao[3] = cb_hash<CB>(__byte_perm(w1, 0u, 0x4410));   // e=7: V
    } else {
      ae[0] = h<0>(w);
      ae[1] = h<4>(w);
      ae[2] = h<2>(w);
      ae[3] = h<6>(w);
      ao[0] = h<1>(w);
      ao[1] = h<5>(w);
      ao[2] = h<3>(w);
      ao[3] = h<7>(w);
    }
  }
};

// Unnormalised 128-point Sylvester Hadamard over a warp: lane l holds elements 4l..4l+3 (natural order).
__device__ __forceinline__ void had128_warp(float (&v)[4], int lane) {
  const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
  v[0] = a0 + a2;
  v[1] = a1 + a3;
  v[2] = a0 - a2;
  v[3] = a1 - a3;
#pragma unroll
  for (int mask = 1; mask < 32; mask <<= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float o = __shfl_xor_sync(0xFFFFFFFFu, v[i], mask);
      v[i] = (lane & mask) ? (o - v[i]) : (v[i] + o);
    }
  }
}

// x' = had128(x * suh) / sqrt(128) of one (row, 128-chunk) in fp32, lane l holding elements 4l..4l+3 (xv, sv: this
// lane's 4 values of x and suh).
__device__ __forceinline__ void xprime_values(uint2 xv, uint2 sv, float (&v)[4], int lane) {
  const float2 x01 = __half22float2(u32_as_h2(xv.x)), x23 = __half22float2(u32_as_h2(xv.y));
  const float2 s01 = __half22float2(u32_as_h2(sv.x)), s23 = __half22float2(u32_as_h2(sv.y));
  v[0] = x01.x * s01.x;
  v[1] = x01.y * s01.y;
  v[2] = x23.x * s23.x;
  v[3] = x23.y * s23.y;
  had128_warp(v, lane);
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] *= kHadScale;
}

// The same x' written as fp16 mma B fragments: the layout is [slab][row][4 lanes] x uint2 (lane (row, c) of a slab
// holds k = 2c, 2c+1 in word 0 and 2c+8, 2c+9 in word 1).
__device__ __forceinline__ void xprime_chunk(uint2 xv, uint2 sv, uint32_t* frag32, int slab_base, int row, int m,
                                             int lane) {
  float v[4];
  xprime_values(xv, sv, v, lane);
  const int q = lane & 3;
  const int slab = slab_base + (lane >> 2);
  const int c = 2 * (q & 1);
  const int word = q >> 1;
  const uint32_t p01 = h2_as_u32(__floats2half2_rn(v[0], v[1]));
  const uint32_t p23 = h2_as_u32(__floats2half2_rn(v[2], v[3]));
  frag32[((slab * m + row) * 4 + c) * 2 + word] = p01;
  frag32[((slab * m + row) * 4 + c + 1) * 2 + word] = p23;
}

struct KernelArgs {
  const __half* x;
  const uint8_t* trellis;
  const __half* suh;
  const __half* svh;
  __half* y;
  float* partials;  // split-K partial sums of the fenced hand-over (per-call scratch)
  int* counters;
  int m;
  int in_features;
  int out_features;
  int ksplit;
  int max_chunks;  // most 128-row chunks any block gets (sizes the shared memory regions)
  const uint8_t* xprep;  // x' already in B-fragment order for all of I (xprep_kernel), or null: compute per block
  uint32_t* slots;  // split-K slots of the ticket and fixed-point hand-overs (in the zeroed workspace, after the
                    // counters)
  int act_in;  // MoE down projection only (kActIn kernels): x holds the slot's gate and up outputs, see x_elems
};

// Shared memory layout, in bytes (host and device agree through this struct).
struct SmemLayout {
  int xfrag, xraw, suh, stage, red, zsum, total;
  // prepped: x' comes ready from xprep_kernel, so no room for raw x and suh (keeps 8 rows inside the GB10's 99 KiB)
  __host__ __device__ SmemLayout(int m, int max_chunks, int stage_bytes_per_warp, bool prepped) {
    xfrag = 0;                                            // [slab][row][4 lanes] uint2, slabs = 8 * chunks
    xraw = xfrag + max_chunks * 8 * m * 32;               // [row][chunks * 128] fp16, raw x
    suh = xraw + (prepped ? 0 : m * max_chunks * 256);    // [chunks * 128] fp16
    stage = suh + (prepped ? 0 : max_chunks * 256);       // [warp][stage][slab bytes]
    const int main_end = stage + kWarps * stage_bytes_per_warp;
    red = 0;                                              // [warp][row][kRedStride] fp32 (after the main loop)
    zsum = red + kWarps * m * kRedStride * 4;             // [row][128] fp32
    const int red_end = zsum + m * 128 * 4;
    total = main_end > red_end ? main_end : red_end;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Shared pieces of both GEMV kernels: the x-side loads, the trellis ring, and the end of a block
// ---------------------------------------------------------------------------------------------------------------

// Per-row affine applied to the cross-warp sums of a block: z = a[row] * s + b[row] (mul1's k_inv / k_bias, the
// integer path's scale), kept in static shared memory by each kernel.
struct RowAffine {
  float a[kMaxRows];
  float b[kMaxRows];
};

// svh of this column chunk for the lanes that will finish row `warp` (warp < m). The integer kernel loads it as its
// block starts (read at the end, its latency sat on every call's critical path); the fp16 kernel just before its
// end (held through its main loop, it costs registers there).
__device__ __forceinline__ uint2 prefetch_svh(const KernelArgs& p, int col_chunk, int warp, int lane) {
  return warp < p.m ? *reinterpret_cast<const uint2*>(p.svh + col_chunk * 128 + lane * 4) : uint2{0u, 0u};
}

// Split-K hand-over by ticket. A block of a split column chunk takes a ticket from the
// chunk's counter as soon as its main loop ends, with a relaxed atomic: no fence, and the round trip overlaps the
// block's reduction. Every block then stores its partial sums; the block holding the last ticket sums all slices.
// No release/acquire pair tells it that a slice has landed: the value itself does. The slots are zero before a call
// (the finisher clears them as it reads them, and resets the counter; they live in the caller's zeroed workspace,
// exl3_gemv_plan's workspace_ints), a stored partial is never zero (+0.0 is stored as -0.0, the same number), and
// each 32-bit word is written and read whole by strong (relaxed) accesses, so the finisher reads a slot until it is
// non-zero.
// It can only wait for blocks that took a ticket before it, which are resident and running. The fenced hand-over
// (slots stored, release + atomic, then the loads) has three round trips after the reduction; this one has one.
// The "memory" clobbers keep the slot accesses in program order (a volatile store instead of the asm one moved
// ptxas's schedule of the unsplit calls too).
__device__ __forceinline__ int take_ticket(const KernelArgs& p, int col_chunk, int contributors) {
  int t = 0;
  if (contributors > 1 && threadIdx.x == 0)
    asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;" : "=r"(t) : "l"(p.counters + col_chunk) : "memory");
  return t;
}
__device__ __forceinline__ void store_slot(uint32_t* a, float v) {
  const uint32_t b = __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(a), "r"(b == 0u ? 0x80000000u : b) : "memory");
}
__device__ __forceinline__ uint32_t load_slot(const uint32_t* a) {
  uint32_t b;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(b) : "l"(a) : "memory");
  return b;
}

// Split-K hand-over by fixed-point atomics. Every block of a split column chunk finishes
// its own slice as far as it can (output Hadamard, * svh: both linear) and adds the result into one 64-bit slot per
// (row, column) with an atomic that returns the old value. The slot holds [value: 48 bits | specials: 8 | arrivals:
// 8]: the block whose add brings the arrivals to the number of slices has the whole sum in the returned value, with
// no further round trip and no wait for the other blocks (the ticket hand-over that came before spent a round trip
// reading slots that had not all landed yet). The value is fixed point with 30 - ceil(log2(slices)) fraction bits,
// added modulo 2^48: integer adds give the same sum in any order, so results stay deterministic, and any total
// within +-2^17 (fp16 tops out at 65504) comes back exact whatever the slices' own sizes, as long as each is below
// 2^17. A slice that is not finite or not below 2^17 counts as a special instead of adding, and makes the column NaN.
// The finishing block clears the slot for the next call (the workspace is zero between calls).
constexpr float kFixedLimit = 131072.0f;  // 2^17
__device__ __forceinline__ int fixed_frac_bits(int contributors) { return 30 - (32 - __clz(contributors - 1)); }
// What one slice adds to a slot.
__device__ __forceinline__ unsigned long long fixed_share(float v, float to_fixed) {
  return fabsf(v) < kFixedLimit ? (static_cast<unsigned long long>(__float2ll_rn(v * to_fixed)) << 16) + 1ull
                                : 0x101ull;
}
// The column's fp16 value from a complete slot.
__device__ __forceinline__ __half fixed_result(unsigned long long sum, float from_fixed) {
  if (sum & 0xFF00ull) return __ushort_as_half(0x7E00u);
  return __float2half_rn(__ll2float_rn(static_cast<long long>(sum) >> 16) * from_fixed);
}
// Adds a lane's 4 finished values of one row (columns `at` .. `at` + 3 of y) to their slots, and stores and clears
// the columns this add completes.
__device__ __forceinline__ void add_fixed(const KernelArgs& p, const float (&v)[4], size_t at, int contributors) {
  const int f = fixed_frac_bits(contributors);
  const float to_fixed = __int_as_float((127 + f) << 23), from_fixed = __int_as_float((127 - f) << 23);
  unsigned long long* sl = reinterpret_cast<unsigned long long*>(p.slots) + at;
  __half* yp = p.y + at;
  unsigned long long sum[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned long long add = fixed_share(v[j], to_fixed);
    sum[j] = atomicAdd(sl + j, add) + add;
  }
  bool all = true;
#pragma unroll
  for (int j = 0; j < 4; ++j) all = all && static_cast<int>(sum[j] & 0xFFull) == contributors;
  if (all) {
    uint2 res;
    res.x = h2_as_u32(__halves2half2(fixed_result(sum[0], from_fixed), fixed_result(sum[1], from_fixed)));
    res.y = h2_as_u32(__halves2half2(fixed_result(sum[2], from_fixed), fixed_result(sum[3], from_fixed)));
    *reinterpret_cast<uint2*>(yp) = res;
    *reinterpret_cast<ulonglong2*>(sl) = make_ulonglong2(0ull, 0ull);  // cleared for the next call
    *reinterpret_cast<ulonglong2*>(sl + 2) = make_ulonglong2(0ull, 0ull);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (static_cast<int>(sum[j] & 0xFFull) == contributors) {
        yp[j] = fixed_result(sum[j], from_fixed);
        sl[j] = 0ull;
      }
    }
  }
}

// The end of every block, after its warps wrote their partial sums to red[warp][row][kRedStride]: sum the warps,
// apply the row affine, then either finish the column chunk (ksplit 1) or hand the slice over (kMode): fenced or by
// ticket, the slice's partial goes to global memory and the block with the last ticket sums every slice in split
// order (deterministic) and finishes the chunk; fixed-point, every block finishes its own slice and adds it to the
// chunk's slots (fixed_share), and the block that completes a column stores it. To finish = 128-point output
// Hadamard, then * svh, rounded once to fp16.
// `part` points at this column chunk's slots (ticket hand-over: uint32 words, 0 = empty) or partial sums (fenced
// hand-over: floats): slot s, row r, column n at part[s * slot_stride + r * row_stride + n] (the fixed-point
// hand-over uses p.slots instead); `slot` is this block's, `contributors` the number of blocks adding to the
// chunk, `ticket` what take_ticket gave thread 0. `sv`: lane l of warp r < m holds svh[4l .. 4l+3] of the chunk,
// loaded by the caller when its block started (prefetch_svh).
template <int NW, HandOver kMode>
__device__ __forceinline__ void finish_block(const KernelArgs& p, float* red, float* zsum, const RowAffine& ra,
                                             int col_chunk, int slot, int contributors, int ticket, uint32_t* part,
                                             size_t slot_stride, size_t row_stride, uint2 sv) {
  constexpr bool kTicketMode = kMode == kTicketHandOver, kFixedMode = kMode == kFixedHandOver;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int m = p.m;
  __syncthreads();
  const int n0 = col_chunk * 128;
  const int out = p.out_features;
  for (int idx = tid; idx < m * 128; idx += NW * 32) {
    const int row = idx >> 7, n = idx & 127;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) s += red[(w * m + row) * kRedStride + n];
    s = ra.a[row] * s + ra.b[row];
    if (kFixedMode || contributors == 1) zsum[idx] = s;
    else if constexpr (kTicketMode) store_slot(part + slot * slot_stride + row * row_stride + n, s);
    else reinterpret_cast<float*>(part)[slot * slot_stride + row * row_stride + n] = s;
  }
  if (!kFixedMode && contributors > 1) {
    __shared__ int is_last;
    if constexpr (kTicketMode) {
      if (tid == 0) is_last = ticket == contributors - 1;
    } else {
      // the barrier orders every thread's slot stores before thread 0's gpu-scope release (cumulative), whose
      // acquire half (then the barrier below) orders the last block's reads after the other blocks' increments
      __syncthreads();
      if (tid == 0) {
        int done;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(done) : "l"(p.counters + col_chunk) : "memory");
        is_last = done == contributors - 1;
      }
    }
    __syncthreads();
    if (!is_last) {
      EXL3_STAMP(5);
      EXL3_STAMP_END();
      return;
    }
    if constexpr (kTicketMode) {
      for (int idx = tid; idx < m * 128; idx += NW * 32) {
        const int row = idx >> 7, n = idx & 127;
        uint32_t* col = part + row * row_stride + n;
        float s = 0.0f;
        // eight slots' loads in flight at once (its own slot too: this thread stored it, so it reads it back); a
        // slot still zero is read again until its block's store lands
        for (int sp0 = 0; sp0 < contributors; sp0 += 8) {
          uint32_t b[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) b[j] = sp0 + j < contributors ? load_slot(col + (sp0 + j) * slot_stride) : 0u;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int sp = sp0 + j;
            if (sp >= contributors) break;
            while (b[j] == 0u) b[j] = load_slot(col + sp * slot_stride);
            s += __uint_as_float(b[j]);
            col[sp * slot_stride] = 0u;  // cleared for the next call
          }
        }
        zsum[idx] = s;
      }
    } else {
      const float* fpart = reinterpret_cast<const float*>(part);
      for (int idx = tid; idx < m * 128; idx += NW * 32) {
        const int row = idx >> 7, n = idx & 127;
        float s = 0.0f;
        for (int sp = 0; sp < contributors; ++sp) s += __ldcg(fpart + sp * slot_stride + row * row_stride + n);
        zsum[idx] = s;
      }
    }
    if (tid == 0) p.counters[col_chunk] = 0;  // ready for the next call (and for CUDA graph replays)
  }
  __syncthreads();
  if (warp < m) {
    const float4 z = *reinterpret_cast<const float4*>(zsum + warp * 128 + lane * 4);
    float v[4] = {z.x, z.y, z.z, z.w};
    had128_warp(v, lane);
    const float2 s01 = __half22float2(u32_as_h2(sv.x)), s23 = __half22float2(u32_as_h2(sv.y));
    if (kFixedMode && contributors > 1) {
      v[0] = v[0] * kHadScale * s01.x;
      v[1] = v[1] * kHadScale * s01.y;
      v[2] = v[2] * kHadScale * s23.x;
      v[3] = v[3] * kHadScale * s23.y;
      add_fixed(p, v, static_cast<size_t>(warp) * out + n0 + lane * 4, contributors);
    } else {
      uint2 res;
      res.x = h2_as_u32(__floats2half2_rn(v[0] * kHadScale * s01.x, v[1] * kHadScale * s01.y));
      res.y = h2_as_u32(__floats2half2_rn(v[2] * kHadScale * s23.x, v[3] * kHadScale * s23.y));
      *reinterpret_cast<uint2*>(p.y + static_cast<size_t>(warp) * out + n0 + lane * 4) = res;
    }
  }
  EXL3_STAMP(5);
  EXL3_STAMP_END();
}

// One warp's stream of trellis slabs (16 x 128: tiles 8*col_chunk .. +7 of one k-tile row, contiguous in the
// trellis) through its private cp.async ring. The ring has a power-of-two number of stages, so a stage's offset is
// (i & (kStages - 1)) * kSlabBytes; the loads use a 32-bit shared address with the lane's offset folded in, and a
// lane that loads nothing in a step has a zero count for it. Written so, the
// integer kernel's K=2 main loop spends ~12 instructions per slab on the ring and the x' words instead of ~38:
// pointer compares and selects, and lane offsets that ptxas recomputed from the thread
// index every slab, were a sixth of the loop.
template <int K2, int NW>
struct SlabRing {
  using R = Rate<K2>;
  static constexpr int kStages = ring_stages<K2, NW>();
  static constexpr int kLoads = (R::kSlabUnits + 31) / 32;  // 16-byte loads per lane and slab (the last partial)
  const unsigned char* ring;  // this warp's ring (reads)
  uint32_t dst;               // shared address of this warp's ring + 16 * lane (loads)
  const uint8_t* src;         // global address of the next slab to load + 16 * lane
  size_t step;
  int loaded;                 // slabs issued so far
  int got;                    // slabs handed out by next()
  int count_last;             // slabs this lane loads with its last 16-byte unit: 0 if that unit is past the slab
  int count;
  // `count` slabs at k-tile rows first_row, first_row + row_stride, ...
  __device__ __forceinline__ SlabRing(const KernelArgs& p, unsigned char* ring_base, int first_row, int row_stride,
                                      int nch, int col_chunk, int warp, int lane)
      : ring(ring_base + warp * (kStages * R::kSlabBytes)), loaded(0), got(0), count(nch) {
    const size_t tiles_n = static_cast<size_t>(p.out_features >> 4);
    src = p.trellis + (static_cast<size_t>(first_row) * tiles_n + 8 * col_chunk) * R::kTileBytes + 16 * lane;
    step = row_stride * tiles_n * R::kTileBytes;
    dst = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + 16 * lane;
    count_last = 32 * (kLoads - 1) + lane < R::kSlabUnits ? nch : 0;
    // opaque to ptxas, which otherwise rebuilds them from the thread index in every slab
    asm volatile("" : "+r"(dst), "+r"(count_last));
  }
  __device__ __forceinline__ static int stage_offset(int i) { return (i & (kStages - 1)) * R::kSlabBytes; }
  // Always commits a group (empty past the end), so the wait counts stay uniform.
  __device__ __forceinline__ void load() {
    const uint32_t d = dst + stage_offset(loaded);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      if (loaded < (j == kLoads - 1 ? count_last : count)) {
        cp_async16_at(d + 512 * j, src + 512 * j);
      }
    }
    cp_async_commit();
    ++loaded;
    src += step;
  }
  __device__ __forceinline__ const unsigned char* next() { return ring + stage_offset(got++); }
};

// cp.async of this block's raw x rows and suh slice (the per-block input transform), as one group.
template <int NW>
__device__ __forceinline__ void load_x_suh(const KernelArgs& p, unsigned char* xraw, unsigned char* suh, int c0,
                                           int nch) {
  const int units_per_row = 16 * nch;  // 16-byte units of 128*nch fp16
  const int units = (p.m + 1) * units_per_row;
  for (int u = threadIdx.x; u < units; u += NW * 32) {
    const int row = u / units_per_row;
    const int within = u - row * units_per_row;
    if (row < p.m) {
      cp_async16(xraw + row * p.max_chunks * 256 + within * 16,
                 reinterpret_cast<const uint8_t*>(p.x) + (static_cast<size_t>(row) * p.in_features + c0 * 128) * 2 +
                     within * 16);
    } else {
      cp_async16(suh + within * 16, reinterpret_cast<const uint8_t*>(p.suh) + c0 * 256 + within * 16);
    }
  }
}

// This lane's window in a tile (SPEC 2.2): starts at ring bit 4*K2*lane + end(0) - 16; the byte offsets of the
// words it spans (they wrap around the tile for lane 0) and the bit offset within the first.
template <int K2>
struct LaneWindow {
  using R = Rate<K2>;
  uint32_t widx[R::kRawWords];
  int o;
  __device__ __forceinline__ explicit LaneWindow(int lane) {
    const int win = (4 * K2 * lane + R::end(0) - 16 + R::kRingBits) % R::kRingBits;
    o = win & 31;
#pragma unroll
    for (int j = 0; j < R::kRawWords; ++j) widx[j] = (((win >> 5) + j) % R::kTileWords) * 4;
  }
  // Decode this lane's 8 positions of the tile at `tw` into the even/odd A fragments.
  template <int CB>
  __device__ __forceinline__ void decode(const unsigned char* tw, uint32_t (&ae)[4], uint32_t (&ao)[4]) const {
    uint32_t raw[R::kRawWords];
#pragma unroll
    for (int j = 0; j < R::kRawWords; ++j) raw[j] = *reinterpret_cast<const uint32_t*>(tw + widx[j]);
    if constexpr (R::kFixed) {
      TileDecoder<K2, CB, R::kFixedO, R::kRawWords>::decode(raw, ae, ao);
    } else {
      uint32_t nw[R::kNormWords];
#pragma unroll
      for (int j = 0; j < R::kNormWords; ++j) nw[j] = __funnelshift_l(raw[j + 1], raw[j], o);
      TileDecoder<K2, CB, 0, R::kNormWords>::decode(nw, ae, ao);
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// fp16 kernel: 3INST and MCG (and mul1 when the tuning's mul1_fp16 is set)
// ---------------------------------------------------------------------------------------------------------------

template <int K2, int CB>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gemv_kernel(const KernelArgs p) {
  using R = Rate<K2>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int m = p.m;
  const int col_chunk = blockIdx.x;
  const int split = blockIdx.y;
  const int n_chunks_k = p.in_features >> 7;
  const int c0 = static_cast<int>(static_cast<long long>(split) * n_chunks_k / p.ksplit);
  const int c1 = static_cast<int>(static_cast<long long>(split + 1) * n_chunks_k / p.ksplit);
  const int nch = c1 - c0;  // 128-row chunks of this block; each warp handles exactly nch slabs
  using Ring = SlabRing<K2, kWarps>;
  const SmemLayout L(m, p.max_chunks, Ring::kStages * R::kSlabBytes, p.xprep != nullptr);

  // Programmatic dependent launch: wait for the previous kernel before touching ANY global memory, the trellis
  // included (only the wait makes the previous kernel's writes visible, and weights may have just been written).
  grid_dependency_wait();
  // The x side first, as its own (oldest) cp.async group: the prologue waits for it alone, while the trellis
  // slabs are still on their way (waiting for everything idled the warps for a quarter of their time).
  if (p.xprep != nullptr) {
    // this block's slabs 8*c0 .. 8*c1 of the prepared fragments: contiguous, 16*m units of 16 bytes per chunk
    const int units = 16 * m * nch;
    const uint8_t* src = p.xprep + static_cast<size_t>(c0) * 8 * m * 32;
    for (int u = tid; u < units; u += kThreads) cp_async16(smem + L.xfrag + u * 16, src + u * 16);
  } else {
    load_x_suh<kWarps>(p, smem + L.xraw, smem + L.suh, c0, nch);
  }
  cp_async_commit();
  // slab i of the warp: k-tile row 8 * c0 + warp + kWarps * i
  const int my_slabs = (8 * nch - warp + kWarps - 1) / kWarps;
  Ring ring(p, smem + L.stage, 8 * c0 + warp, kWarps, my_slabs, col_chunk, warp, lane);
#pragma unroll
  for (int i = 0; i < Ring::kStages - 1; ++i) ring.load();
  cp_async_wait<Ring::kStages - 1>();  // the x group has landed for this thread
  __syncthreads();                  // ... and for every thread

  // --- input side: x' = had128(x * suh) / sqrt(128), stored as mma B fragments ---------------------------------
  if (p.xprep == nullptr) {
    uint32_t* xfrag32 = reinterpret_cast<uint32_t*>(smem + L.xfrag);
    for (int it = warp; it < m * nch; it += kWarps) {
      const int row = it % m;
      const int ch = it / m;
      const uint2 xr = *reinterpret_cast<const uint2*>(smem + L.xraw + row * p.max_chunks * 256 + ch * 256 + lane * 8);
      const uint2 sr = *reinterpret_cast<const uint2*>(smem + L.suh + ch * 256 + lane * 8);
      xprime_chunk(xr, sr, xfrag32, 8 * ch, row, m, lane);
    }
  }
  __syncthreads();

  // mul1: the sum of this slice's x' per row, for the k_bias term (see TileDecoder)
  __shared__ RowAffine ra;
  if (warp < m) {
    float s = 0.0f;
    if constexpr (CB == 2) {
      const uint2* xf = reinterpret_cast<const uint2*>(smem + L.xfrag);
      for (int idx = lane; idx < 8 * nch * 4; idx += 32) {
        const uint2 v = xf[((idx >> 2) * m + warp) * 4 + (idx & 3)];
        const float2 a = __half22float2(u32_as_h2(v.x)), c = __half22float2(u32_as_h2(v.y));
        s += (a.x + a.y) + (c.x + c.y);
      }
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, mask);
    }
    if (lane == 0) {
      ra.a[warp] = CB == 2 ? kMul1Inv : 1.0f;
      ra.b[warp] = CB == 2 ? kMul1Bias * s : 0.0f;
    }
  }

  // --- main loop: decode 8 tiles per slab into A fragments, two mmas each ---------------------------------------
  const LaneWindow<K2> lw(lane);
  const int g = lane >> 2;
  const bool has_row = g < m;
  const uint2* xfrag = reinterpret_cast<const uint2*>(smem + L.xfrag);
  float acc[8][4];
#pragma unroll
  for (int t = 0; t < 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

  for (int i = 0; i < my_slabs; ++i) {
    cp_async_wait<Ring::kStages - 2>();
    __syncwarp();
    ring.load();
    const int sl = warp + kWarps * i;
    uint2 b = make_uint2(0u, 0u);
    if (has_row) b = xfrag[(sl * m + g) * 4 + (lane & 3)];
    // B fragments: b = (x'[2c], x'[2c+1]), (x'[2c+8], x'[2c+9]) for row g (see TileDecoder)
    uint32_t be0, be1, bo0, bo1;
    if constexpr (CB == 2) {
      be0 = b.x;
      be1 = b.y;
      bo0 = __byte_perm(b.x, 0u, 0x1032);  // (x'[2c+1], x'[2c])
      bo1 = __byte_perm(b.y, 0u, 0x1032);
    } else {
      be0 = __byte_perm(b.x, 0u, 0x1010);  // (x'[2c], x'[2c])
      be1 = __byte_perm(b.y, 0u, 0x1010);
      bo0 = __byte_perm(b.x, 0u, 0x3232);  // (x'[2c+1], x'[2c+1])
      bo1 = __byte_perm(b.y, 0u, 0x3232);
    }
    const unsigned char* st = ring.next();
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      uint32_t ae[4], ao[4];
      lw.template decode<CB>(st + t * R::kTileBytes, ae, ao);
      mma_16816(acc[t], ae, be0, be1);
      mma_16816(acc[t], ao, bo0, bo1);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with x' and its ring: the reduction buffer reuses them

  // --- C fragment c0,c1 = (n = g, rows 2c, 2c+1), c2,c3 = (n = g + 8, same rows) -> red[warp][row][n] ---------
  float* red = reinterpret_cast<float*>(smem + L.red);
  {
    const int c = lane & 3;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int n = 16 * t + g;
      const int r0 = 2 * c, r1 = 2 * c + 1;
      if (r0 < m) {
        red[(warp * m + r0) * kRedStride + n] = acc[t][0];
        red[(warp * m + r0) * kRedStride + n + 8] = acc[t][2];
      }
      if (r1 < m) {
        red[(warp * m + r1) * kRedStride + n] = acc[t][1];
        red[(warp * m + r1) * kRedStride + n + 8] = acc[t][3];
      }
    }
  }
  finish_block<kWarps, kFencedHandOver>(p, red, reinterpret_cast<float*>(smem + L.zsum), ra, col_chunk, split,
                                        p.ksplit, 0, reinterpret_cast<uint32_t*>(p.partials) + col_chunk * 128,
                                        static_cast<size_t>(m) * p.out_features, p.out_features,
                                        prefetch_svh(p, col_chunk, warp, lane));
}

// ---------------------------------------------------------------------------------------------------------------
// Integer kernel: mul1 through the int8 tensor cores
// ---------------------------------------------------------------------------------------------------------------
//
// A mul1 weight is k_inv * (1024 + s) + k_bias with s the sum of the four bytes of the hash h = state * 0x83DCD12D
// (SPEC 2.3), so z[n] = sum_k w[k,n] x'[k] = k_inv * sum_k s[k,n] x'[k] + c0 * sum_k x'[k], c0 = 1024 k_inv + k_bias.
// The byte sums need no instruction at all: the mma m16n8k32 u8 x s8 multiplies each of the hash's four bytes by
// x'[k] repeated four times. x' is carried as 16-bit integers q = round(x' / d) (d = max |x'| / 32639 over what one
// int32 sum covers: a warp's run of slabs per row, or the block's slice per row with the x' kernel), split into
// two signed bytes q = 256 hi + lo; hi and lo are two COLUMNS of the same B operand (column 2r = hi of row r, 2r + 1 = lo), so a lane's C fragment holds both halves of one row and one
// tile costs two mmas for up to 4 rows, as the fp16 path does, while the per-weight work drops from IMAD + DP4A
// to IMAD alone. Sums are exact int32 (at most 4096 inputs x 4 bytes x 255 x 128 < 2^31 per block). The only
// rounding is x' to 16 bits (about 1e-5 relative), far below the fp16 rounding of the other path's x'.
// Up to 4 rows (8 columns: hi and lo of each) fit one group. 5..8 rows would take a second group (G = 2: four mmas
// per tile); they go through fp16 x' and one fp16 mma per tile instead (half_slabs).
constexpr float kQMax = 32639.0f;                  // |q| <= 32639 keeps hi = (q + 128) >> 8 within [-127, 127]

// 1 / (the quantisation step) for a warp maximum mx: |x' * inv| <= kQMax. One MUFU.RCP (within 1 ulp, which the
// rounding in quantise_word absorbs: kQMax * (1 + 2^-22) still rounds to kQMax) instead of a division's
// denormal-safe sequence; a maximum below 1e-30 (or 0) quantises everything to 0.
__device__ __forceinline__ float quant_inv(float mx) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(mx));
  return mx > 1e-30f ? kQMax * r : 0.0f;
}

// This lane's B word of one chunk: q = round(x' * inv) of its 4 values (k = 2c, 2c+1, 2c+8, 2c+9) as hi and lo
// bytes; returns the sum of the four q. One FFMA per value does the rounding: v * inv + 1.5 * 2^23 + 128 has the
// bits 0x4B400080 + q, so byte 0 is (q mod 256) ^ 0x80 (the lo byte), byte 1 is (q + 128) >> 8 mod 256 (the hi
// byte, q = 256 hi + lo with lo in [-128, 127]); 4 PRMT gather them. (F2I and the shifts took 27 instructions.)
__device__ __forceinline__ int quantise_word(const float (&v)[4], float inv, uint32_t& hw, uint32_t& lw) {
  constexpr float kMagic = 12583040.0f;  // 1.5 * 2^23 + 128
  constexpr uint32_t kMagicBits = 0x4B400080u;
  uint32_t b[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) b[j] = __float_as_uint(fmaf(v[j], inv, kMagic));
  const uint32_t b01 = __byte_perm(b[0], b[1], 0x5140);  // lo(q0) lo(q1) hi(q0) hi(q1), lo bytes still ^ 0x80
  const uint32_t b23 = __byte_perm(b[2], b[3], 0x5140);
  lw = __byte_perm(b01, b23, 0x5410) ^ 0x80808080u;
  hw = __byte_perm(b01, b23, 0x7632);
  return static_cast<int>((b[0] + b[1]) + (b[2] + b[3]) - 4u * kMagicBits);
}

// The four bytes of w (x' parts for k = 2c, 2c+1, 2c+8, 2c+9), each repeated four times: the B registers of a slab
// in the order the two mmas take them as register pairs, (2c, 2c+8) and (2c+1, 2c+9).
__device__ __forceinline__ uint4 repeat_bytes(uint32_t w) {
  return make_uint4(__byte_perm(w, 0u, 0x0000), __byte_perm(w, 0u, 0x2222), __byte_perm(w, 0u, 0x1111),
                    __byte_perm(w, 0u, 0x3333));
}

// The warp's maximum of m >= 0 (every lane gets it). Non-negative floats order as their bits do, so this is one
// integer warp reduction (REDUX) instead of five dependent shuffles, on the one-row prologue's critical path. The sums of q below use the same instruction.
__device__ __forceinline__ float warp_max_abs(float m) {
  return __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, __float_as_uint(m)));
}

// max(a, b), NaN if either is: with fmaxf (which drops a NaN) an x' of NaN left the warp's maximum finite, the NaN
// became a garbage q, and an input of inf or NaN gave finite outputs. Through this, the maximum, and so the scale of
// the warp's sums, is NaN or inf, and the outputs are not finite, as the reference's are. The same FMNMX.
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float max_abs4(const float (&v)[4]) {
  return fmax_nan(fmax_nan(fabsf(v[0]), fabsf(v[1])), fmax_nan(fabsf(v[2]), fabsf(v[3])));
}

// x' in fp32 (xprime_values); returns max |x'| over the chunk (every lane gets it).
__device__ __forceinline__ float xprime_f32(uint2 xv, uint2 sv, float (&v)[4], int lane) {
  xprime_values(xv, sv, v, lane);
  return warp_max_abs(max_abs4(v));
}

// Quantize one 128-chunk of x' (fp32, natural order, at xc) to q = round(x' * inv) and write its 8 slabs of packed B
// bytes: lane (s, c) = (lane / 4, lane % 4) makes the words of slab `slab0 + s` for k = 2c, 2c+1, 2c+8, 2c+9, hi
// part at lane slot 8*(row%4) + c of the row's column group, lo part 4 slots on. Returns the warp's sum of q.
__device__ __forceinline__ int pack_chunk(const float* xc, float inv, uint32_t* xq, int slab0, int groups, int row,
                                          int lane) {
  const int sl = lane >> 2, c = lane & 3;
  const float2 a = *reinterpret_cast<const float2*>(xc + 16 * sl + 2 * c);
  const float2 b = *reinterpret_cast<const float2*>(xc + 16 * sl + 2 * c + 8);
  const float v[4] = {a.x, a.y, b.x, b.y};
  uint32_t hw, lw;
  const int sum = quantise_word(v, inv, hw, lw);
  uint32_t* dst = xq + ((slab0 + sl) * groups + (row >> 2)) * 32 + 8 * (row & 3) + c;
  dst[0] = hw;
  dst[4] = lw;
  return __reduce_add_sync(0xFFFFFFFFu, sum);
}

struct SmemI8 {
  int xq, stage, red, zsum, total;
  // xq: the B words of the block's slabs, [slab][group][32 words] (or the one-row repeated layout: the same 128
  // bytes per slab), written by the warps' prologues or copied from xprep_i8_kernel; then each warp's trellis ring.
  // After the main loop the per-warp partial sums (red) and the block's sums (zsum) reuse the space.
  __host__ __device__ SmemI8(int m, int groups, int max_chunks, int stage_bytes_per_warp, int warps) {
    xq = 0;
    stage = xq + max_chunks * 8 * groups * 128;
    const int main_end = stage + warps * stage_bytes_per_warp;
    red = 0;
    zsum = red + warps * m * kRedStride * 4;
    const int red_end = zsum + m * 128 * 4;
    total = main_end > red_end ? main_end : red_end;
  }
};

// Packed-x' scratch of the integer kernel for 2+ rows (xprep_i8_kernel): per split, the B words of its input chunks
// in the layout a block copies ([slab][group][32]); then (d, sum of q) per (split, row).
struct XprepI8 {
  size_t split_bytes, dq_off, bytes;
  __host__ __device__ XprepI8(int m, int ksplit, int max_chunks, int groups) {
    split_bytes = static_cast<size_t>(max_chunks) * 1024 * groups;
    dq_off = split_bytes * ksplit;
    bytes = dq_off + static_cast<size_t>(ksplit) * m * 8;
  }
};

// stage 1: p += (H16 / 16) . (x * suh)^T, the product rounded to fp16 as exllamav3 rounds it
__device__ __forceinline__ void xsuh_mma(float (&p)[4], const uint32_t (&h16)[4], uint2 xv, uint2 sv) {
  mma_16816(p, h16, h2_as_u32(__hmul2(u32_as_h2(xv.x), u32_as_h2(sv.x))),
            h2_as_u32(__hmul2(u32_as_h2(xv.y), u32_as_h2(sv.y))));
}

// x' through the tensor cores (the integer kernel's prologues). Element i = 16a + b of a chunk (a = 0..7, b = 0..15) and H128 = H8 (x) H16, so
// x'*sqrt(128) = H8 . X . H16 with X[a][b]: two mmas and no shuffles, where the butterfly takes 20 shuffles and
// ~50 dependent adds per row and chunk (too many issue slots for the prologue of several rows).
// 1. P^T = (H16 / 16) . X^T as one m16n8k16 (A = the constant H16, B = X^T: lane (g, c) holds x*suh at 16g + 2c,
//    +1, +8, +9, exactly the elements it loads), accumulated in fp32.
// 2. Z = H8 . P as an m16n8k16 per 8 columns b, P entering as fp16 hi + lo parts along k (A = [H8 | H8], rows
//    8..15 unused): P / 16 cannot overflow fp16 (it is at most the largest |x*suh|, itself an fp16), hi + lo
//    carries 22 bits. The C fragment of stage 1 is the B fragment of stage 2 as it stands, and stage 2's C
//    fragment is lane (g, c)'s x' at 16g + 2c, +1, +8, +9: the four values of its own B word of slab g.
// The values come out multiplied by sqrt(128) / 16 (kXpScale undoes it in the scale d, so q is unchanged).
constexpr float kXpScale = kHadScale * 16.0f;
struct HadFrags {
  uint32_t h16[4];  // H16 / 16 as the stage-1 A fragment
  uint32_t h8;      // (H8[g][2c], H8[g][2c+1]) as fp16: stage 2's A fragment is {h8, 0, h8, 0}
};
__device__ __forceinline__ HadFrags had_frags(int lane) {
  const int g = lane >> 2, c = lane & 3;
  constexpr uint32_t kP16 = 0x2C00u, kN16 = 0xAC00u;  // +-1/16
  HadFrags f;
  f.h16[0] = had_pair(g, 2 * c, kP16, kN16);
  f.h16[1] = had_pair(g + 8, 2 * c, kP16, kN16);
  f.h16[2] = had_pair(g, 2 * c + 8, kP16, kN16);
  f.h16[3] = had_pair(g + 8, 2 * c + 8, kP16, kN16);
  f.h8 = had_pair(g, 2 * c, 0x3C00u, 0xBC00u);
  return f;
}
__device__ __forceinline__ void xprime_mma(uint2 xv, uint2 sv, const HadFrags& f, float (&v)[4]) {
  float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  xsuh_mma(p, f.h16, xv, sv);
  const uint32_t a2[4] = {f.h8, 0u, f.h8, 0u};
  uint32_t hi, lo;
  float z0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, z1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  split_h2(p[0], p[1], hi, lo);  // columns b = g (P^T rows g): n-tile 0
  mma_16816(z0, a2, hi, lo);
  split_h2(p[2], p[3], hi, lo);  // b = g + 8: n-tile 1
  mma_16816(z1, a2, hi, lo);
  v[0] = z0[0];
  v[1] = z0[1];
  v[2] = z1[0];
  v[3] = z1[1];
}

// Lane (sl, c)'s four fp16 elements of a 128-chunk, 16 sl + 2c, +1, +8, +9, with v at the first: two 32-bit words
// 8 elements apart (the layout of its B word, which both the tensor-core transform and the butterfly take).
__device__ __forceinline__ uint2 lane_elems(const __half* v) {
  return make_uint2(*reinterpret_cast<const uint32_t*>(v), *reinterpret_cast<const uint32_t*>(v + 8));
}

// The MoE down projection's input, made where it is loaded: h = act(gate) * up of the slot (gate at x, up at
// x + in_features), rounded to fp16 as the reference rounds h before the down projection; non-gated: act(gate).
// Saves the launch and the round trip of a separate activation kernel. act_in: kMoeAct* | kMoeGated.
constexpr int kMoeActSilu = 0, kMoeActGelu = 1, kMoeActGeluTanh = 2, kMoeGated = 4;
__device__ __forceinline__ float moe_act(float g, int act) {
  if (act == kMoeActSilu) return g / (1.0f + expf(-g));
  if (act == kMoeActGelu) return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
  if (act == kMoeActGeluTanh) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return g;
}
__device__ __forceinline__ uint32_t moe_act_pair(uint32_t g, uint32_t u, int act_in) {
  const float2 gf = __half22float2(u32_as_h2(g));
  float a = moe_act(gf.x, act_in & 3), b = moe_act(gf.y, act_in & 3);
  if (act_in & kMoeGated) {
    const float2 uf = __half22float2(u32_as_h2(u));
    a *= uf.x;
    b *= uf.y;
  }
  return h2_as_u32(__floats2half2_rn(a, b));
}
template <bool kActIn>
__device__ __forceinline__ uint2 x_elems(const KernelArgs& p, size_t off) {
  if constexpr (!kActIn) {
    return lane_elems(p.x + off);
  } else {
    const uint2 g = lane_elems(p.x + off);
    const uint2 u = (p.act_in & kMoeGated) ? lane_elems(p.x + p.in_features + off) : g;
    return make_uint2(moe_act_pair(g.x, u.x, p.act_in), moe_act_pair(g.y, u.y, p.act_in));
  }
}

// x' of one row for the warp's H chunks (this lane's 4 elements of each, in units of kXpScale) and the warp's
// maximum |x'| over them. Branch-free over the chunks, so their chains interleave.
template <int H>
__device__ __forceinline__ float xprime_chunks(const uint2 (&xv)[H], const uint2 (&sv)[H], float (&v)[H][4],
                                               const HadFrags& f) {
  float mx = 0.0f;
#pragma unroll
  for (int h = 0; h < H; ++h) {
    xprime_mma(xv[h], sv[h], f, v[h]);
    mx = fmax_nan(mx, max_abs4(v[h]));
  }
  return warp_max_abs(mx);
}

// The one-row prologue of the integer kernel, done by each warp for itself: the warp needs x' only for the 128-chunks
// its run of n slabs (k-tile rows r0 .. r0+n-1, n >= 1) touches (at most H). It loads their x and suh straight into
// registers, transforms them, quantises them with a scale of its own (its maximum |x'|) and packs the B words of its
// own slabs (slab j of the run at xq[32 j]), with no block barrier: the warp's sums are scaled back at the end
// (x' = d * q); waiting for the whole block's x' and its maximum would put two barriers before the first mma.
// Returns d; *qs_out = the sum of q over the run (the k_bias term). The trellis ring's
// first slab is requested with the x loads, the rest once x' is packed.
template <int H, bool kActIn, typename Ring>
__device__ __forceinline__ float warp_prologue(const KernelArgs& p, uint32_t* xq, Ring& ring, int r0, int n, int lane,
                                               int* qs_out) {
  const int cfirst = r0 >> 3, clast = (r0 + n - 1) >> 3;  // the chunks of x the run lies in
  const int c = lane & 3, sl = lane >> 2;
  // Lane (sl, c) takes elements 16 sl + 2c, +1, +8, +9 of each chunk: the four x' values of its own B word of slab sl
  // (k = 2c, 2c+1, 2c+8, 2c+9), which is where the tensor-core transform leaves them (xprime_mma), so no shuffles
  // are needed afterwards to gather a word's values.
  uint2 xv[H], sv[H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    const size_t off = static_cast<size_t>(min(cfirst + h, clast)) * 128 + 16 * sl + 2 * c;  // past clast: a repeat
    xv[h] = x_elems<kActIn>(p, off);
    sv[h] = lane_elems(p.suh + off);
  }
  ring.load();  // one slab now, the rest once x' is packed: x comes back sooner
  EXL3_STAMP(2);
  float v[H][4];
  const float mx = xprime_chunks<H>(xv, sv, v, had_frags(lane));
  const float inv = quant_inv(mx);
  int qs = 0;
#pragma unroll
  for (int h = 0; h < H; ++h) {
    // this lane's 4 elements lie in k-tile row 8 * chunk + sl (16 elements per row), as do the words it writes
    const int row = 8 * (cfirst + h) + sl;
    const bool mine = cfirst + h <= clast && row >= r0 && row < r0 + n;
    uint32_t hw, lw;  // this lane's B word (k = 2c, 2c+1, 2c+8, 2c+9) as hi and lo bytes
    const int sum = quantise_word(v[h], inv, hw, lw);
    if (mine) qs += sum;
    if (mine) {
      // the B words with each byte already repeated four times (kBRepeated), so the main loop loads them as they are
      uint4* dst = reinterpret_cast<uint4*>(xq + (row - r0) * 32);
      dst[c] = repeat_bytes(hw);
      dst[4 + c] = repeat_bytes(lw);
    }
  }
  *qs_out = __reduce_add_sync(0xFFFFFFFFu, qs);
#pragma unroll
  for (int i = 1; i < Ring::kStages - 1; ++i) ring.load();
  __syncwarp();
  return mx * (kXpScale / kQMax);
}

// The prologue of a warp for 2..4 rows (one row: warp_prologue; 5-8 rows: warp_prologue_half): the same per-warp x' as one row, with a scale
// and a sum of q per row, into the packed layout the main loop reads with 4 PRMT per slab (row r's hi and lo words
// at lane slots 8 (r % 4) + c and + 4 of column group r / 4, as xprep_i8_kernel writes them), cheaper than the
// separate x' kernel and the block's copy of its output. Each lane ends with
// the scale and the sum of q of the rows its C fragment holds (row 4 cg + c of group cg), in d_lane / qs_lane.
template <int H, int kRowCap, typename Ring>
__device__ __forceinline__ void warp_prologue_rows(const KernelArgs& p, uint32_t* xq, Ring& ring, int r0, int n,
                                                   int lane, float (&d_lane)[1], int (&qs_lane)[1]) {
  static_assert(kRowCap <= 4, "5-8 rows take warp_prologue_half");
  constexpr int G = 1;
  constexpr int kGroupRows = kRowCap;  // rows computed per column group
  const int cfirst = r0 >> 3, clast = (r0 + n - 1) >> 3;
  const int c = lane & 3, sl = lane >> 2;
  const int m = p.m;
  // elements 16 sl + 2c, +1, +8, +9 of each chunk, as in warp_prologue; x for one column group at a time (all
  // eight rows' loads at once left too few registers for two groups: spills)
  uint2 xv[kGroupRows][H], sv[H];
  auto load_x = [&](int cg) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const size_t off = static_cast<size_t>(min(cfirst + h, clast)) * 128 + 16 * sl + 2 * c;
#pragma unroll
      for (int i = 0; i < kGroupRows; ++i)  // past m: a repeat
        xv[i][h] = lane_elems(p.x + static_cast<size_t>(min(4 * cg + i, m - 1)) * p.in_features + off);
    }
  };
#pragma unroll
  for (int h = 0; h < H; ++h) {
    const size_t off = static_cast<size_t>(min(cfirst + h, clast)) * 128 + 16 * sl + 2 * c;
    sv[h] = lane_elems(p.suh + off);
  }
  load_x(0);
  ring.load();
  EXL3_STAMP(2);
  const HadFrags f = had_frags(lane);
  // The rows of a column group two at a time (rows past m repeat the last one; their words go to B columns no
  // row reads), so their mma and reduction chains overlap (one at a time waits on each chain, four hold too many
  // values).
  constexpr int P = kGroupRows < 2 ? kGroupRows : 2;
  static_assert(kGroupRows % P == 0, "a column group's rows in whole passes");
#pragma unroll
  for (int cg = 0; cg < G; ++cg) {
    if (cg > 0) load_x(cg);
    float mx[4];
    int qs[4];
#pragma unroll
    for (int i0 = 0; i0 < kGroupRows; i0 += P) {
      float v[P][H][4];
#pragma unroll
      for (int i = 0; i < P; ++i) mx[i0 + i] = xprime_chunks<H>(xv[i0 + i], sv, v[i], f);
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const float inv = quant_inv(mx[i0 + i]);
        int sum_q = 0;
#pragma unroll
        for (int h = 0; h < H; ++h) {
          const int row = 8 * (cfirst + h) + sl;
          const bool mine = cfirst + h <= clast && row >= r0 && row < r0 + n;
          uint32_t hw, lw;
          const int sum = quantise_word(v[i][h], inv, hw, lw);
          if (mine) {
            sum_q += sum;
            uint32_t* dst = xq + ((row - r0) * G + cg) * 32 + 8 * (i0 + i) + c;
            dst[0] = hw;
            dst[4] = lw;
          }
        }
        qs[i0 + i] = __reduce_add_sync(0xFFFFFFFFu, sum_q);
      }
    }
    // lane (g, c) keeps row 4 cg + c's scale and sum of q (its C fragment's row; rows past the cap: none)
#pragma unroll
    for (int i = 0; i < kGroupRows; ++i) {
      if (c == i) {
        d_lane[cg] = mx[i] * (kXpScale / kQMax);
        qs_lane[cg] = qs[i];
      }
    }
  }
#pragma unroll
  for (int i = 1; i < Ring::kStages - 1; ++i) ring.load();
  __syncwarp();
}

// Chunks of x' the warp prologue computes for runs of n slabs: exactly n / 8 when runs start on chunk boundaries
// (n a multiple of 8), else up to n / 8 + 2.
__host__ __device__ constexpr int warp_chunks(int n) { return n % 8 == 0 ? n / 8 : n / 8 + 2; }

// The main loop of the integer kernel: `count` slabs from the warp's ring, 8 tiles each, their hashes straight into
// the integer mma against the B words at xqp, advanced past them. Packed layout (kBRepeated false): G * 32 words per
// slab, lane l's word at xqp[32 cg], its bytes repeated here (4 PRMT per slab and group). Repeated layout (one row,
// G = 1, written by warp_prologue): per slab 8 uint4 already repeated, hi then lo part for c = 0..3, which lanes of
// B columns 0 and 1 (g < 2) need; the other lanes' columns belong to no row, so they read a copy (column g & 1).
// The same 128 bytes per slab, 4 ALU instructions per slab fewer.
template <int K2, int G, bool kBRepeated, typename Ring>
__device__ __forceinline__ void i8_slabs(Ring& ring, const LaneWindow<K2>& lw, const uint32_t* xqp,
                                         int (&acc)[G][8][4], int count) {
  using R = Rate<K2>;
  static_assert(!kBRepeated || G == 1, "the repeated B layout holds one row");
  for (int i = 0; i < count; ++i) {
    cp_async_wait<Ring::kStages - 2>();
    __syncwarp();
    ring.load();
    uint32_t be0[G], be1[G], bo0[G], bo1[G];
#pragma unroll
    for (int cg = 0; cg < G; ++cg) {
      const uint4 b = kBRepeated ? *reinterpret_cast<const uint4*>(xqp) : repeat_bytes(xqp[cg * 32]);
      be0[cg] = b.x;  // x'[2c] in all four bytes
      be1[cg] = b.y;  // x'[2c+8]
      bo0[cg] = b.z;  // x'[2c+1]
      bo1[cg] = b.w;  // x'[2c+9]
    }
    xqp += G * 32;
    const unsigned char* st = ring.next();
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      uint32_t ae[4], ao[4];
      lw.template decode<kMul1Int>(st + t * R::kTileBytes, ae, ao);
#pragma unroll
      for (int cg = 0; cg < G; ++cg) {
        imma_16832(acc[cg][t], ae, be0[cg], be1[cg]);
        imma_16832(acc[cg][t], ao, bo0[cg], bo1[cg]);
      }
    }
  }
}

// 5..8 rows: the integer mma's B operand holds 8 columns, i.e. the hi and lo parts of four rows, so 5-8 rows would
// take a second column group and four integer mmas per tile, each holding the scheduler ~6 cycles. Here x' stays fp16 (as the spec's reference and the fp16 kernel have
// it), one B column per row, and a tile's 8 weights per lane are decoded to fp16 (1024 + byte sum, DP4A) and packed
// two per register by PRMT, so a tile is ONE fp16 mma for up to 8 rows: 8 DP4A + 4 PRMT per tile instead of 2 more
// mmas. The affine map is applied to the sums: y = k_inv * sum (1024 + s) x' + k_bias * sum x'.
__host__ __device__ constexpr bool half_rows(int row_cap) { return row_cap > 4; }

// The main loop of the 5-8 row class: `count` slabs, B fragments at xqp[32 j] (lane (g, c): row g's x' at k = 2c,
// 2c+1 and 2c+8, 2c+9 of slab j). sacc gets the sums of x' the k_bias term needs, by one more mma per slab with A =
// ones: its C fragment holds them for rows 2c, 2c + 1, where the lane's C fragment of acc has its rows. They are
// sums of the rounded values the mma sees, as they must be (the k_bias term cancels most of k_inv * 1024 * sum x'),
// and off the path to the first mma, where summing them in the prologue would put them.
template <int K2, typename Ring>
__device__ __forceinline__ void half_slabs(Ring& ring, const LaneWindow<K2>& lw, const uint2* xqp,
                                           float (&acc)[8][4], float (&sacc)[4], int count) {
  using R = Rate<K2>;
  constexpr uint32_t kOnes = 0x3C003C00u;  // fp16 (1, 1)
  const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
  for (int i = 0; i < count; ++i) {
    cp_async_wait<Ring::kStages - 2>();
    __syncwarp();
    ring.load();
    const uint2 b = *xqp;
    xqp += 32;
    mma_16816(sacc, ones, b.x, b.y);  // C[., n]: the sum of row n's x' over the slab
    const unsigned char* st = ring.next();
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      uint32_t ae[4], ao[4], a[4];
      lw.template decode<2>(st + t * R::kTileBytes, ae, ao);  // fp16 1024 + s in each low half
      // A fragment j = (k even, k odd) of one output column: positions (0,1), (4,5), (2,3), (6,7)
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = __byte_perm(ae[j], ao[j], 0x5410);
      mma_16816(acc[t], a, b.x, b.y);
    }
  }
}

// The prologue of a warp for 5..8 rows: x' of every row for the warp's H chunks in fp16, written as the main loop's B
// fragments (slab j of the run at xq[32 j], lane slot 4 row + c). The tensor-core transform of xprime_mma, cut
// down for fp16 x':
// * Lane (sl, c) loads elements 16 sl + 4c .. 4c + 3 of each chunk (one 64-bit load, not two 32-bit ones; the x of
//   eight rows is what the block's first microseconds move) and stage 1's A fragment takes H16's columns in that
//   order (column k of A is H16's column 4c + (k & 1) + 2 ((k >> 3) & 1) for the k = 2c, 2c+1, 2c+8, 2c+9 a lane
//   holds), which leaves P, and everything after it, as xprime_mma has them.
// * Stage 2 transforms a row's two halves in one mma, P rounded once to fp16 (x' is rounded to fp16 anyway): A =
//   diag(H8, H8), the P of the lane's elements 2c, 2c+1 along k 0..7 and of 2c+8, 2c+9 along k 8..15; rows 0..7 of
//   C are x' at 16 sl + 2c, +1 and rows 8..15 at +8, +9. Three mmas per row and chunk become two. (Two rows per
//   mma, one per diagonal block, took the same count, but 0 * inf made a row with an inf turn its partner NaN.)
// * What is stored is x' / sqrt2 (the transform's own scale: the end of the block multiplies the sums by sqrt2), and
//   the rows' loop has no branch per row (the store predicated) so their chains interleave.
// Rows 0..5 always run (the class has at least 5; a sixth past m repeats the fifth), rows 6 and 7 only when
// present. Rows past m write B columns that only reach C columns the end of the block ignores.
template <int H, typename Ring>
__device__ __forceinline__ void warp_prologue_half(const KernelArgs& p, uint2* xq, Ring& ring, int r0, int n,
                                                   int lane) {
  const int cfirst = r0 >> 3, clast = (r0 + n - 1) >> 3;
  const int c = lane & 3, sl = lane >> 2;
  const int m = p.m;
  size_t off[H];
  uint2 sv[H], xv[kMaxRows][H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    off[h] = static_cast<size_t>(min(cfirst + h, clast)) * 128 + 16 * sl + 4 * c;  // past clast: a repeat
    sv[h] = *reinterpret_cast<const uint2*>(p.suh + off[h]);
  }
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r)
#pragma unroll
    for (int h = 0; h < H; ++h)
      xv[r][h] = *reinterpret_cast<const uint2*>(p.x + static_cast<size_t>(min(r, m - 1)) * p.in_features + off[h]);
  ring.load();
  EXL3_STAMP(2);
  constexpr uint32_t kP16 = 0x2C00u, kN16 = 0xAC00u;  // +-1/16
  const uint32_t h16[4] = {had_pair(sl, 4 * c, kP16, kN16), had_pair(sl + 8, 4 * c, kP16, kN16),
                           had_pair(sl, 4 * c + 2, kP16, kN16), had_pair(sl + 8, 4 * c + 2, kP16, kN16)};
  const uint32_t h8 = had_pair(sl, 2 * c, 0x3C00u, 0xBC00u);
  const uint32_t a2[4] = {h8, 0u, 0u, h8};
#pragma unroll
  for (int i = 0; i < kMaxRows / 2; ++i) {
    if (i == kMaxRows / 2 - 1 && m <= 6) break;
#pragma unroll
    for (int h = 0; h < H; ++h) {
      float pa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      xsuh_mma(pa, h16, xv[2 * i][h], sv[h]);
      xsuh_mma(pb, h16, xv[2 * i + 1][h], sv[h]);
      // One mma per row, its two halves (elements 2c, 2c+1 and 2c+8, 2c+9 of the lane's 16) in the two diagonal
      // blocks of A, so a row's values meet only its own zeros: 0 * inf is NaN, and an inf or NaN in one row of a
      // pair turned the other row NaN when the two rows shared an mma.
      float z0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, z1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_16816(z0, a2, h2_as_u32(__floats2half2_rn(pa[0], pa[1])), h2_as_u32(__floats2half2_rn(pa[2], pa[3])));
      mma_16816(z1, a2, h2_as_u32(__floats2half2_rn(pb[0], pb[1])), h2_as_u32(__floats2half2_rn(pb[2], pb[3])));
      const int row = 8 * (cfirst + h) + sl;  // this lane's k-tile row (slab) of chunk h
      const bool mine = cfirst + h <= clast && row >= r0 && row < r0 + n;
      // row 2i (z0) and 2i + 1 (z1): x' / sqrt2 at 16 sl + 2c, +1 (z[0], z[1]) and +8, +9 (z[2], z[3])
      if (mine) {
        xq[(row - r0) * 32 + 4 * (2 * i) + c] =
            make_uint2(h2_as_u32(__floats2half2_rn(z0[0], z0[1])), h2_as_u32(__floats2half2_rn(z0[2], z0[3])));
        xq[(row - r0) * 32 + 4 * (2 * i + 1) + c] =
            make_uint2(h2_as_u32(__floats2half2_rn(z1[0], z1[1])), h2_as_u32(__floats2half2_rn(z1[2], z1[3])));
      }
    }
  }
#pragma unroll
  for (int i = 1; i < Ring::kStages - 1; ++i) ring.load();
  __syncwarp();
}

// Whole 128-row chunks per warp (its runs then start and end on chunk boundaries, so its x' prologue transforms no
// chunk it does not use) when the block's chunks do not split evenly over the warps but the warps taking one more
// chunk fill whole groups of four (warp w runs on scheduler w % 4, so every scheduler gets the same number of
// slabs): e.g. 28 chunks, 12 warps with 2 and 4 with 1, where equal runs were 14 slabs over up to 3 chunks.
__device__ __forceinline__ bool chunk_runs(int nch, int nw) {
  return nch > nw && (nch % nw) % 4 == 0 && nch % nw != 0;
}

// One block's work: input chunks c0 .. c0+nch of column chunk col_chunk; `slot` of `contributors` blocks adding to
// that chunk. The block's 8*nch slabs (k-tile rows 8*c0 ...) are cut into one contiguous run per warp.
template <int K2, int kRowCap, int NW, bool kActIn = false>
__device__ __forceinline__ void i8_segment(const KernelArgs& p, unsigned char* smem, int col_chunk, int c0, int nch,
                                           int slot, int contributors) {
  static_assert(!kActIn || kRowCap == 1, "the MoE down projection's input is made by the one-row prologue");
  using R = Rate<K2>;
  constexpr int G = kRowCap > 4 ? 2 : 1;  // column groups of 4 rows
  constexpr HandOver kMode = hand_over(kRowCap);  // split-K hand-over (see the three above finish_block)
  constexpr bool kHalf = half_rows(kRowCap);       // 5-8 rows: fp16 x', one fp16 mma per tile (half_slabs)
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int m = p.m;
  // x' from xprep_i8_kernel; otherwise each warp prepares its own (always, in the 5-8 row class)
  const bool prepped = !kHalf && p.xprep != nullptr;
  using Ring = SlabRing<K2, NW>;
  const SmemI8 L(m, G, p.max_chunks, Ring::kStages * R::kSlabBytes, NW);
  // this warp's run of the block's slabs: [s0, s0 + n); whole chunks when that keeps each scheduler's four warps
  // at the same number of slabs (see chunk_runs)
  const bool whole = chunk_runs(nch, NW);
  const int cw = nch / NW, cx = nch % NW;
  const int s0 = whole ? 8 * (warp * cw + min(warp, cx)) : warp * 8 * nch / NW;
  const int n = whole ? 8 * (cw + (warp < cx ? 1 : 0)) : (warp + 1) * 8 * nch / NW - s0;
  Ring ring(p, smem + L.stage, 8 * c0 + s0, 1, n, col_chunk, warp, lane);
  const uint2 svh_pre = prefetch_svh(p, col_chunk, warp, lane);

  __shared__ RowAffine ra;
  EXL3_STAMP(1);
  // Per-warp x': the scale and the sum of q of the rows this lane's C fragment holds (row 4 cg + c of group cg);
  // 0 for a warp without slabs (a split into very short slices), which then adds nothing.
  float d_lane[G];
  int qs_lane[G];
  // 5-8 rows: C fragment of the ones-mma, the warp's sums of x' of rows 2c, 2c + 1 in [0], [1] (half_slabs)
  float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int cg = 0; cg < G; ++cg) {
    d_lane[cg] = 0.0f;
    qs_lane[cg] = 0;
  }
  if (!prepped) {
    if (n > 0) {
      uint32_t* xq = reinterpret_cast<uint32_t*>(smem + L.xq) + s0 * G * 32;
      const int r0 = 8 * c0 + s0;
      // as many chunks as this warp's run can touch: a run of n slabs starting on a chunk boundary touches n / 8
      // (all runs do when 8 * nch / NW is a multiple of 8), any run at most n / 8 + 2
      constexpr int kMaxRun = 8 * kMaxChunksPerBlockI8 / NW;
      const bool aligned = whole || (8 * nch) % (8 * NW) == 0;
      if constexpr (kHalf) {
        uint2* xh = reinterpret_cast<uint2*>(smem + L.xq) + s0 * 32;
        if (aligned && n <= 8) warp_prologue_half<1>(p, xh, ring, r0, n, lane);
        else if (aligned) warp_prologue_half<2>(p, xh, ring, r0, n, lane);
        else warp_prologue_half<warp_chunks(15)>(p, xh, ring, r0, n, lane);
      } else if constexpr (kRowCap == 1) {
        float& d = d_lane[0];
        int* qs = &qs_lane[0];
        if (aligned && n <= 8) d = warp_prologue<1, kActIn>(p, xq, ring, r0, n, lane, qs);
        else if (aligned && n <= 16) d = warp_prologue<2, kActIn>(p, xq, ring, r0, n, lane, qs);
        else if (aligned) d = warp_prologue<warp_chunks(kMaxRun), kActIn>(p, xq, ring, r0, n, lane, qs);
        else if (n <= 8) d = warp_prologue<warp_chunks(7), kActIn>(p, xq, ring, r0, n, lane, qs);
        else if (n <= 16) d = warp_prologue<warp_chunks(15), kActIn>(p, xq, ring, r0, n, lane, qs);
        else d = warp_prologue<warp_chunks(kMaxRun - 1), kActIn>(p, xq, ring, r0, n, lane, qs);
      } else {
        static_assert(kMaxRun <= 16, "the rows prologue takes runs of at most 16 slabs");
        if (aligned && n <= 8) warp_prologue_rows<1, kRowCap>(p, xq, ring, r0, n, lane, d_lane, qs_lane);
        else if (aligned) warp_prologue_rows<2, kRowCap>(p, xq, ring, r0, n, lane, d_lane, qs_lane);
        else warp_prologue_rows<warp_chunks(15), kRowCap>(p, xq, ring, r0, n, lane, d_lane, qs_lane);
      }
    }
    if (tid < m) {
      ra.a[tid] = 1.0f;  // the warps' sums come scaled and with their k_bias share (see the end of the block)
      ra.b[tid] = 0.0f;
    }
  } else {
    // this split's packed x' from xprep_i8_kernel: contiguous, in the layout the main loop reads
    const XprepI8 X(m, p.ksplit, p.max_chunks, G);
    const int units = nch * 64 * G;
    const uint8_t* src = p.xprep + slot * X.split_bytes;
    for (int u = tid; u < units; u += (NW * 32)) cp_async16(smem + L.xq + u * 16, src + u * 16);
    cp_async_commit();
    ring.load();
    if (tid < m) {
      const float2 dq = reinterpret_cast<const float2*>(p.xprep + X.dq_off)[slot * m + tid];
      ra.a[tid] = dq.x * kMul1Inv;
      ra.b[tid] = dq.x * kMul1C0 * static_cast<float>(__float_as_int(dq.y));
    }
#pragma unroll
    for (int i = 1; i < Ring::kStages - 1; ++i) ring.load();
    cp_async_wait<Ring::kStages - 1>();  // the x' copy (the oldest group) has landed for this thread
    __syncthreads();                       // ... and for every thread
    EXL3_STAMP(2);
  }

  // --- main loop: 8 tiles per slab, hashes straight into the integer mma ------------------------------------------
  EXL3_STAMP(3);
  const LaneWindow<K2> lw(lane);
  const int g = lane >> 2;
  // Lanes whose B column belongs to no row read whatever the x' area holds there: their column only reaches C
  // columns of absent rows, which the end of the block ignores (integer sums: garbage cannot trap). No per-slab
  // predicate, then.
  const uint32_t* xq_run = reinterpret_cast<const uint32_t*>(smem + L.xq) + s0 * G * 32;  // this warp's first slab
  int acc[G][8][4];  // integer sums (the 5-8 row class: hacc)
  float hacc[8][4];
#pragma unroll
  for (int cg = 0; cg < G; ++cg)
#pragma unroll
    for (int t = 0; t < 8; ++t) acc[cg][t][0] = acc[cg][t][1] = acc[cg][t][2] = acc[cg][t][3] = 0;
#pragma unroll
  for (int t = 0; t < 8; ++t) hacc[t][0] = hacc[t][1] = hacc[t][2] = hacc[t][3] = 0.0f;

  if constexpr (kHalf) {
    half_slabs<K2>(ring, lw, reinterpret_cast<const uint2*>(smem + L.xq) + s0 * 32 + lane, hacc, sacc, n);
  } else if (kRowCap == 1 && !prepped) {  // the one-row B layout (warp_prologue)
    i8_slabs<K2, G, kRowCap == 1>(ring, lw, xq_run + 4 * (((lane >> 2) & 1) * 4 + (lane & 3)), acc, n);
  } else {
    i8_slabs<K2, G, false>(ring, lw, xq_run + lane, acc, n);
  }
  // The next kernel's launch overlaps this block's end (its blocks take the SMs this grid leaves idle); not when the
  // x' kernel comes first (xprep path), where it did not pay.
  const int ticket = kMode == kTicketHandOver ? take_ticket(p, col_chunk, contributors) : 0;
  if (!prepped) trigger_dependents();
  cp_async_wait<0>();
  __syncthreads();
  EXL3_STAMP(4);

  // --- C fragment of group cg: c0,c1 = (n = g; hi, lo of row 4cg + c), c2,c3 = (n = g + 8) -> red[warp][row][n] --
  float* red = reinterpret_cast<float*>(smem + L.red);
  if constexpr (kHalf) {
    // C fragment: c0, c1 = (n = g; rows 2c, 2c + 1), c2, c3 = (n = g + 8); z = k_inv * sum h x' + k_bias * sum x'
    const int c = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = 2 * c + j;
      if (row < m) {
        // the prologue stored x' / sqrt2 (kHadScale * 16 = sqrt2)
        constexpr float kA = kMul1Inv * kHadScale * 16.0f;
        const float sb = kMul1Bias * kHadScale * 16.0f * sacc[j];
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int n = 16 * t + g;
          red[(warp * m + row) * kRedStride + n] = fmaf(kA, hacc[t][j], sb);
          red[(warp * m + row) * kRedStride + n + 8] = fmaf(kA, hacc[t][2 + j], sb);
        }
      }
    }
  } else {
    const int c = lane & 3;
#pragma unroll
    for (int cg = 0; cg < G; ++cg) {
      const int row = 4 * cg + c;
      if (row < m) {
        // per-warp x': z = d_w * (k_inv * s + C0 * sum of q) for this warp's share; otherwise the block's affine (ra)
        const float sa = prepped ? 1.0f : d_lane[cg] * kMul1Inv;
        const float sb = prepped ? 0.0f : d_lane[cg] * kMul1C0 * static_cast<float>(qs_lane[cg]);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int n = 16 * t + g;
          red[(warp * m + row) * kRedStride + n] =
              fmaf(sa, fmaf(256.0f, static_cast<float>(acc[cg][t][0]), static_cast<float>(acc[cg][t][1])), sb);
          red[(warp * m + row) * kRedStride + n + 8] =
              fmaf(sa, fmaf(256.0f, static_cast<float>(acc[cg][t][2]), static_cast<float>(acc[cg][t][3])), sb);
        }
      }
    }
  }
  uint32_t* part = (kMode == kTicketHandOver ? p.slots : reinterpret_cast<uint32_t*>(p.partials)) + col_chunk * 128;
  finish_block<NW, kMode>(p, red, reinterpret_cast<float*>(smem + L.zsum), ra, col_chunk, slot, contributors, ticket,
                          part, static_cast<size_t>(m) * p.out_features, p.out_features, svh_pre);
}

// One block = one column chunk x one slice of the input chunks (split-K), as the fp16 kernel (a stream-K grid pays
// the per-segment prologue and end twice in most blocks).
template <int K2, int kRowCap>
__global__ void __launch_bounds__(kWarpsI8 * 32, kMinBlocksI8) gemv_i8_kernel(const KernelArgs p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int n_k = p.in_features >> 7;
  const int split = blockIdx.y;
  const int c0 = static_cast<int>(static_cast<long long>(split) * n_k / p.ksplit);
  const int c1 = static_cast<int>(static_cast<long long>(split + 1) * n_k / p.ksplit);
  grid_dependency_wait();
  EXL3_STAMP(0);
  i8_segment<K2, kRowCap, kWarpsI8>(p, smem, blockIdx.x, c0, c1 - c0, split, p.ksplit);
}

// ---------------------------------------------------------------------------------------------------------------
// Fused MoE decode (exl3_gemv.h, Exl3MoeParams): the one-row integer GEMV of each routed (slot, projection)
// ---------------------------------------------------------------------------------------------------------------

struct MoeArgs {
  KernelArgs k;  // shapes, split, act_in; x, y and the workspace as bases
  const int* ids;
  const int* lookup;
  int n_global, n_local;
  const Exl3MoeTable* table;
  const int* sel_of;
  int table_stride, proj0, nproj;
  int x_div, x_stride;
  int sel;       // 4 * k2 + codebook of this launch's experts
  int ws_ints;   // workspace int32 per (slot, projection): its counters, then its fixed-point slots
};

// The local expert of a slot, or -1 when this rank does not hold it (or the id is out of range).
__device__ __forceinline__ int moe_expert(const int* ids, const int* lookup, int n_global, int n_local, int slot) {
  int e = ids[slot];
  if (lookup != nullptr) e = e >= 0 && e < n_global ? lookup[e] : -1;
  return e >= 0 && e < n_local ? e : -1;
}

// Blocks of 8 warps, two per SM (the GEMV's integer kernel has 16, one per SM): a MoE launch is many small GEMVs,
// and the smaller blocks fill the SMs' last wave better and overlap one block's prologue with another's main loop
// (GLM-like layer, one token: 40.5 us against 49.5 us with 16 warps; kernels/PERF.md, session 16).
constexpr int kWarpsMoe = 8;
constexpr int kMinBlocksMoe = 2;

// Block (column chunk, split, z = slot * nproj + proj): the GEMV block of that slot's expert, found on the device, so
// nothing about the routing reaches the host. Blocks of experts of another (k2, codebook) return at once (a
// mixed-K layer: one launch per pair); each z has its own workspace, so the split-K hand-overs of different slots
// never meet, and duplicate experts across slots are simply computed again.
template <int K2, bool kActIn>
__global__ void __launch_bounds__(kWarpsMoe * 32, kMinBlocksMoe) moe_i8_kernel(const MoeArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  grid_dependency_wait();  // the routing ids (and, for the down projection, its input) come from earlier kernels
  const int z = blockIdx.z;
  const int slot = z / a.nproj, proj = z - slot * a.nproj;
  const int e = moe_expert(a.ids, a.lookup, a.n_global, a.n_local, slot);
  if (e < 0) return;
  const int entry = e * a.table_stride + a.proj0 + proj;
  if (a.sel_of[entry] != a.sel) return;
  const Exl3MoeTable t = a.table[entry];
  KernelArgs p = a.k;
  p.trellis = static_cast<const uint8_t*>(t.trellis);
  p.suh = static_cast<const __half*>(t.suh);
  p.svh = static_cast<const __half*>(t.svh);
  p.x = a.k.x + static_cast<size_t>(slot / a.x_div) * a.x_stride;
  p.y = a.k.y + static_cast<size_t>(z) * p.out_features;
  p.counters = a.k.counters + static_cast<size_t>(z) * a.ws_ints;
  p.slots = reinterpret_cast<uint32_t*>(p.counters + slots_offset(p.out_features));
  const int n_k = p.in_features >> 7;
  const int split = blockIdx.y;
  const int c0 = static_cast<int>(static_cast<long long>(split) * n_k / p.ksplit);
  const int c1 = static_cast<int>(static_cast<long long>(split + 1) * n_k / p.ksplit);
  i8_segment<K2, 1, kWarpsMoe, kActIn>(p, smem, blockIdx.x, c0, c1 - c0, split, p.ksplit);
}

template <int OUT>
__device__ __forceinline__ void moe_store4(void* out, size_t at, const float (&v)[4]) {
  if constexpr (OUT == 0) {
    __half2* o = reinterpret_cast<__half2*>(static_cast<__half*>(out) + at);
    o[0] = __floats2half2_rn(v[0], v[1]);
    o[1] = __floats2half2_rn(v[2], v[3]);
  } else if constexpr (OUT == 1) {
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + at);
    o[0] = __floats2bfloat162_rn(v[0], v[1]);
    o[1] = __floats2bfloat162_rn(v[2], v[3]);
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + at) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

// Each token's routed outputs, weighted and summed in slot order in fp32 (the reference's order: products rounded,
// then added), 4 columns per thread.
template <int OUT>
__global__ void __launch_bounds__(256) moe_reduce_kernel(const __half* y, const int* ids, const int* lookup,
                                                         int n_global, int n_local, const float* w, int topk,
                                                         int hidden, void* out) {
  grid_dependency_wait();
  const int t = blockIdx.y;
  const int n = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (n >= hidden) return;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j = 0; j < topk; ++j) {
    const int slot = t * topk + j;
    if (moe_expert(ids, lookup, n_global, n_local, slot) < 0) continue;
    const float wt = w[slot];
    const uint2 v = *reinterpret_cast<const uint2*>(y + static_cast<size_t>(slot) * hidden + n);
    const float2 a = __half22float2(u32_as_h2(v.x)), b = __half22float2(u32_as_h2(v.y));
    acc[0] = __fadd_rn(acc[0], __fmul_rn(a.x, wt));
    acc[1] = __fadd_rn(acc[1], __fmul_rn(a.y, wt));
    acc[2] = __fadd_rn(acc[2], __fmul_rn(b.x, wt));
    acc[3] = __fadd_rn(acc[3], __fmul_rn(b.y, wt));
  }
  moe_store4<OUT>(out, static_cast<size_t>(t) * hidden + n, acc);
}

// x' for every (row, 128-chunk) of x into global memory, in the B-fragment order the fp16 GEMV reads: done once
// per call instead of once per block when several rows make the per-block transform expensive.
__global__ void __launch_bounds__(kThreads) xprep_kernel(const __half* x, const __half* suh, uint32_t* frag32, int m,
                                                         int in_features) {
  // No early griddepcontrol.launch_dependents: GEMV blocks launched early sit on the SMs waiting for this grid and
  // crowd out its blocks; the implicit trigger at block exit still lets them start on the SMs this grid frees.
  grid_dependency_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int item = blockIdx.x * kWarps + warp;
  if (item >= m * (in_features >> 7)) return;
  const int row = item % m, ch = item / m;
  const uint2 xv = *reinterpret_cast<const uint2*>(x + static_cast<size_t>(row) * in_features + ch * 128 + lane * 4);
  const uint2 sv = *reinterpret_cast<const uint2*>(suh + ch * 128 + lane * 4);
  xprime_chunk(xv, sv, frag32, 8 * ch, row, m, lane);
}

// The integer kernel's x' for 2+ rows, done once per call instead of once per GEMV block: block (split, row)
// transforms that row's slice of input chunks, finds its maximum and writes the packed 16-bit x' in exactly the
// layout the GEMV block of that split copies into shared memory ([split][slab][group][32] words), plus
// (d, sum of q) per (split, row) after all splits' words.
__global__ void __launch_bounds__(kThreads) xprep_i8_kernel(const __half* x, const __half* suh, uint32_t* xq_out,
                                                            int m, int in_features, int ksplit, int groups,
                                                            int max_chunks) {
  __shared__ float xs[kMaxChunksPerBlockI8 * 128];
  __shared__ unsigned mx_bits;
  __shared__ int qsum;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int split = blockIdx.x, row = blockIdx.y;
  const int n_chunks_k = in_features >> 7;
  const int c0 = static_cast<int>(static_cast<long long>(split) * n_chunks_k / ksplit);
  const int c1 = static_cast<int>(static_cast<long long>(split + 1) * n_chunks_k / ksplit);
  if (threadIdx.x == 0) {
    mx_bits = 0u;
    qsum = 0;
  }
  grid_dependency_wait();
  __syncthreads();
  for (int ch = warp; ch < c1 - c0; ch += kWarps) {
    const size_t off = static_cast<size_t>(c0 + ch) * 128 + lane * 4;
    float v[4];
    const float mx = xprime_f32(*reinterpret_cast<const uint2*>(x + static_cast<size_t>(row) * in_features + off),
                                *reinterpret_cast<const uint2*>(suh + off), v, lane);
    *reinterpret_cast<float4*>(xs + ch * 128 + lane * 4) = make_float4(v[0], v[1], v[2], v[3]);
    if (lane == 0) atomicMax(&mx_bits, __float_as_uint(mx));
  }
  __syncthreads();
  const float amax = __uint_as_float(mx_bits);
  const XprepI8 X(m, ksplit, max_chunks, groups);  // the layout the GEMV blocks copy from
  uint32_t* xq = reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(xq_out) + split * X.split_bytes);
  for (int ch = warp; ch < c1 - c0; ch += kWarps) {
    const int qs = pack_chunk(xs + ch * 128, quant_inv(amax), xq, 8 * ch, groups, row, lane);
    if (lane == 0) atomicAdd(&qsum, qs);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float2* dq = reinterpret_cast<float2*>(reinterpret_cast<uint8_t*>(xq_out) + X.dq_off);
    dq[split * m + row] = make_float2(amax / kQMax, __int_as_float(qsum));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side: the compiled (rate, codebook) pairs, the tuning, the per-device facts, the plan and the launch
// ---------------------------------------------------------------------------------------------------------------

typedef void (*KernelFn)(const KernelArgs);

struct KernelInfo {
  KernelFn fn;
  int stage_bytes_per_warp;
  int groups;  // 0 = the fp16 kernel; 1 or 2 = the integer kernel with that many column groups of 4 rows
  int warps;   // per block
  bool fused_xprime;  // the kernel always prepares its own x' (the 5-8 row class: no x' kernel path)
};

template <int K2, int CB>
KernelInfo info_of() {
  return KernelInfo{gemv_kernel<K2, CB>, ring_stages<K2, kWarps>() * Rate<K2>::kSlabBytes, 0, kWarps, false};
}

template <int K2, int kRowCap>
KernelInfo info_i8() {
  return KernelInfo{gemv_i8_kernel<K2, kRowCap>, ring_stages<K2, kWarpsI8>() * Rate<K2>::kSlabBytes,
                    kRowCap > 4 ? 2 : 1, kWarpsI8, half_rows(kRowCap)};
}

// The fp16 kernel of rate K2 for codebook cb: every codebook when kAll (EXL3_RATES), else mul1 only.
template <int K2, bool kAll>
bool info_fp16(int cb, KernelInfo* out) {
  if constexpr (kAll) {
    if (cb == 0) *out = info_of<K2, 0>();
    if (cb == 1) *out = info_of<K2, 1>();
  }
  if (cb == 2) *out = info_of<K2, 2>();
  return cb == 2 || (kAll && (cb == 0 || cb == 1));
}

// The process's tuning: the defaults, overridden once by the environment (so a whole run can be switched from the
// shell), afterwards only by exl3_gemv_set_tuning. Every plan takes a copy, so a change never reaches half a call.
std::mutex g_tuning_mu;
Exl3GemvTuning g_tuning;
bool g_tuning_ready = false;

int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && v[0] ? atoi(v) : fallback;
}

Exl3GemvTuning tuning_from_env() {
  Exl3GemvTuning t;
  const char* path = getenv("SPARKCTL_EXL3_MUL1_PATH");
  t.mul1_fp16 = path && strcmp(path, "fp16") == 0;
  t.i8_max_rows = env_int("SPARKCTL_EXL3_I8_MAX_ROWS", kMaxRows);
  const int xprep = env_int("SPARKCTL_EXL3_XPREP_MIN_ROWS", 0);
  t.xprep_min_rows = getenv("SPARKCTL_EXL3_XPREP_MIN_ROWS") && xprep < 1 ? 1 : xprep;
  t.smem_limit = env_int("SPARKCTL_EXL3_SMEM_LIMIT", 0);
  t.pdl = env_int("SPARKCTL_EXL3_NO_PDL", 0) == 1 ? 0 : 1;
  return t;
}

Exl3GemvTuning current_tuning() {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  if (!g_tuning_ready) {
    g_tuning = tuning_from_env();
    g_tuning_ready = true;
  }
  return g_tuning;
}

// The compiled configurations: the rates of EXL3_RATES (exl3_common.cuh: integer K 1..8 with every codebook,
// half-integer 1.5/2.5/3.5 with mul1 only); mul1 in both the fp16 and the integer kernel. The integer kernel has four row classes: one row (its own B layout and
// prologue), 2 rows and 3-4 rows (one column group; the prologue computes the class's rows together, so 2 rows do
// not pay for 4) and 5-8 rows (fp16 x' and one fp16 mma per tile, half_slabs). mul1 takes the integer kernel up to
// the tuning's i8_max_rows (default 8: it beats the fp16 kernel's block-wide x' at every row count).
bool find_kernel(int k2, int cb, int m, const Exl3GemvTuning& t, KernelInfo* out) {
  if (cb == 2 && m <= t.i8_max_rows && !t.mul1_fp16) {
#define EXL3_I8(K2_, ALL_)                                                           \
  if (k2 == K2_) {                                                                   \
    *out = m == 1   ? info_i8<K2_, 1>()                                             \
           : m == 2 ? info_i8<K2_, 2>()                                             \
           : m <= 4 ? info_i8<K2_, 4>()                                             \
                    : info_i8<K2_, 8>();                                            \
    return true;                                                                     \
  }
    EXL3_RATES(EXL3_I8)
#undef EXL3_I8
    return false;
  }
#define EXL3_FP16(K2_, ALL_) \
  if (k2 == K2_) return info_fp16<K2_, ALL_>(cb, out);
  EXL3_RATES(EXL3_FP16)
#undef EXL3_FP16
  return false;
}

thread_local char g_error[256];

int fail_cuda(cudaError_t e, const char* what) {
  snprintf(g_error, sizeof(g_error), "EXL3 GEMV: %s failed: %s", what, cudaGetErrorString(e));
  return EXL3_ERR_CUDA;
}

// What the planner needs to know about a device, asked of the runtime once per device: a launch then costs no
// attribute query.
struct DeviceInfo {
  int sms;         // multiprocessors
  int smem_optin;  // shared memory one block may have: 99 KiB on sm_120/121, 227 KiB on sm_90
  int major;       // compute capability (PDL needs 9+)
};
constexpr int kMaxDevices = 64;
struct DeviceSlot {
  std::atomic<bool> ready{false};
  DeviceInfo info{};
};
DeviceSlot g_devices[kMaxDevices];
std::mutex g_devices_mu;

int device_info(DeviceInfo* out) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return fail_cuda(e, "cudaGetDevice");
  const bool cached = dev >= 0 && dev < kMaxDevices;
  if (cached && g_devices[dev].ready.load(std::memory_order_acquire)) {
    *out = g_devices[dev].info;
    return EXL3_OK;
  }
  DeviceInfo d{};
  e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return fail_cuda(e, "cudaDeviceGetAttribute(multiprocessors)");
  e = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return fail_cuda(e, "cudaDeviceGetAttribute(shared memory per block)");
  e = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e != cudaSuccess) return fail_cuda(e, "cudaDeviceGetAttribute(compute capability)");
  if (cached) {
    std::lock_guard<std::mutex> lock(g_devices_mu);
    if (!g_devices[dev].ready.load(std::memory_order_relaxed)) {
      g_devices[dev].info = d;
      g_devices[dev].ready.store(true, std::memory_order_release);
    }
  }
  *out = d;
  return EXL3_OK;
}

// The one shape rule (exl3_gemv_supports): rows, multiples of 128, a codebook, a compiled rate.
int check_shape(int m, int in_features, int out_features, int k2, int codebook) {
  if (m < 1 || m > kMaxRows) return EXL3_ERR_ROWS;
  if (in_features <= 0 || out_features <= 0 || in_features % 128 || out_features % 128) return EXL3_ERR_SHAPE;
  if (codebook < 0 || codebook > 2) return EXL3_ERR_CODEBOOK;
  if (k2 < 2 || k2 > 16) return EXL3_ERR_BITS;
  if ((k2 & 1) && codebook != 2) return EXL3_ERR_CODEBOOK;
  return rate_compiled(k2, codebook) ? EXL3_OK : EXL3_ERR_BITS;
}

int smem_for_chunks(const Exl3GemvParams* p, const KernelInfo& k, int max_chunks, bool prepped) {
  if (k.groups > 0) return SmemI8(p->m, k.groups, max_chunks, k.stage_bytes_per_warp, k.warps).total;
  return SmemLayout(p->m, max_chunks, k.stage_bytes_per_warp, prepped).total;
}

int smem_bytes(const Exl3GemvParams* p, const KernelInfo& k, int ksplit, bool prepped) {
  const int n_chunks_k = p->in_features / 128;
  return smem_for_chunks(p, k, (n_chunks_k + ksplit - 1) / ksplit, prepped);
}

// Whether the input transform runs once per call in its own kernel: by default from 2 rows in the fp16 kernel
// (with one row the per-block transform is cheaper than a second launch) and never in the integer kernel, whose
// warps prepare their own x' for any row count (cheaper than the x' kernel and its copy); the tuning's
// xprep_min_rows moves the threshold for both.
bool uses_xprep(const Exl3GemvParams* p, const KernelInfo& k, const Exl3GemvTuning& t) {
  if (k.fused_xprime) return false;
  if (t.xprep_min_rows > 0) return p->m >= t.xprep_min_rows;
  return k.groups == 0 && p->m >= 2;
}

// Shared memory one block may use: the device's, or the tuning's smem_limit when lower (a big GPU checking a small
// GPU's choices).
int smem_limit(const DeviceInfo& d, const Exl3GemvTuning& t) {
  return t.smem_limit > 0 && t.smem_limit < d.smem_optin ? t.smem_limit : d.smem_optin;
}

// How a call's split column chunks are handed over: by row class in the integer kernel, fenced in the fp16 kernel.
HandOver call_hand_over(const Exl3GemvParams* p, const KernelInfo& k) {
  return k.groups > 0 ? hand_over(p->m) : kFencedHandOver;
}

// Everything a launch needs to know: the kernel, its grid and scratch, read from the tuning and the device once.
struct Plan {
  KernelInfo k;
  bool xprep;      // x' prepared by its own kernel first
  bool pdl;        // programmatic dependent launch
  int lo, hi;      // the splits this call accepts
  int ksplit;      // input-dimension split: the grid is (O / 128) x ksplit
  int max_chunks;  // most input chunks one block holds
  size_t partial_floats, xprep_halfs;
  size_t workspace_ints;  // the zeroed int32 workspace (p->counters): counters, then the ticket or fixed-point slots
};

// The splits a call accepts: at most kMaxChunksPerBlock (fp16 kernel) or kMaxChunksPerBlockI8 chunks per block, a
// block's shared memory within the limit, and at most kMaxFixedSplit slices for the fixed-point hand-over.
int ksplit_range(const Exl3GemvParams* p, const DeviceInfo& d, const Exl3GemvTuning& t, Plan* pl) {
  const int n_chunks_k = p->in_features / 128;
  const int most = pl->k.groups > 0 ? kMaxChunksPerBlockI8 : kMaxChunksPerBlock;
  const int limit = smem_limit(d, t);
  int ks = (n_chunks_k + most - 1) / most;
  while (ks < n_chunks_k && smem_bytes(p, pl->k, ks, pl->xprep) > limit) ++ks;
  if (smem_bytes(p, pl->k, ks, pl->xprep) > limit) return EXL3_ERR_KSPLIT;
  pl->lo = ks;
  const bool fixed = call_hand_over(p, pl->k) == kFixedHandOver;
  pl->hi = fixed && n_chunks_k > kMaxFixedSplit ? kMaxFixedSplit : n_chunks_k;
  return pl->lo <= pl->hi ? EXL3_OK : EXL3_ERR_KSPLIT;
}

// Split-K choice: enough blocks that every multiprocessor gets two of them (one block of 8 warps cannot hide the
// decode latency alone), balanced against the per-block fixed cost (x' prologue, pipeline fill, reduction). Model:
// a multiprocessor holding b blocks of c chunks needs max(c + 1, b * (c + 1) / 2) time units (two blocks of 8 warps
// share it), or b * (c + 1) for blocks of 16 warps (one at a time).
int auto_ksplit(const Exl3GemvParams* p, const Plan& pl, const DeviceInfo& d, int batch) {
  const int sms = d.sms;
  const int n_chunks_k = p->in_features / 128;
  const int n_chunks_n = p->out_features / 128 * batch;  // a MoE launch runs `batch` GEMVs side by side
  // Integer kernel: when the column chunks alone fill one wave of the multiprocessors (80-100% of them), no split
  // at all: an SM decodes as fast with one long block as with two halves, and the partial-sum exchange is saved.
  if (pl.k.groups > 0 && pl.lo == 1 && n_chunks_n <= sms && 5 * n_chunks_n >= 4 * sms) return 1;
  const bool one_per_sm = pl.k.warps >= 16;
  int best = pl.lo;
  double best_cost = 1e30;
  for (int ks = pl.lo; ks <= pl.hi; ++ks) {
    const int per_block = (n_chunks_k + ks - 1) / ks;
    if (ks > pl.lo && per_block == (n_chunks_k + ks - 2) / (ks - 1)) continue;  // same work per block, more blocks
    const long long blocks = static_cast<long long>(n_chunks_n) * ks;
    const long long per_sm = (blocks + sms - 1) / sms;
    const double unit = per_block + 1.0;
    const double cost = one_per_sm ? per_sm * unit : (per_sm * unit / 2.0 > unit ? per_sm * unit / 2.0 : unit);
    if (cost < best_cost - 1e-9) {
      best_cost = cost;
      best = ks;
    }
  }
  return best;
}

// The plan of a call (what exl3_gemv_plan reports and exl3_gemv_launch runs: one computation for both) under
// tuning t, for `batch` GEMVs of this shape in one launch (the MoE kernels; 1 otherwise).
int plan_with(const Exl3GemvParams* p, const Exl3GemvTuning& t, int batch, Plan* pl,
              const KernelInfo* kernel = nullptr) {
  int st = check_shape(p->m, p->in_features, p->out_features, p->k2, p->codebook);
  if (st != EXL3_OK) return st;
  if (kernel != nullptr) pl->k = *kernel;
  else if (!find_kernel(p->k2, p->codebook, p->m, t, &pl->k)) return EXL3_ERR_BITS;
  DeviceInfo d;
  st = device_info(&d);
  if (st != EXL3_OK) return st;
  pl->xprep = uses_xprep(p, pl->k, t);
  pl->pdl = d.major >= 9 && t.pdl != 0;
  st = ksplit_range(p, d, t, pl);
  if (st != EXL3_OK) return st;
  const int ks = p->ksplit != 0 ? p->ksplit : auto_ksplit(p, *pl, d, batch);
  if (ks < pl->lo || ks > pl->hi) return EXL3_ERR_KSPLIT;
  const int n_k = p->in_features / 128;
  pl->ksplit = ks;
  pl->max_chunks = (n_k + ks - 1) / ks;
  const size_t split_floats = ks > 1 ? static_cast<size_t>(ks) * p->m * p->out_features : 0;
  const HandOver h = call_hand_over(p, pl->k);
  const bool fixed = h == kFixedHandOver, ticket = h == kTicketHandOver;
  pl->partial_floats = fixed || ticket ? 0 : split_floats;
  // ticket slots: one per (slice, row, column); fixed-point slots: one 64-bit word per (row, column)
  const size_t fixed_ints = fixed && ks > 1 ? 2 * static_cast<size_t>(p->m) * p->out_features : 0;
  pl->workspace_ints = slots_offset(p->out_features) + (ticket ? split_floats : fixed_ints);
  // x' scratch: fp16 fragments (fp16 kernel), or packed 16-bit x' with its scales (integer kernel)
  const size_t mi = static_cast<size_t>(p->m) * p->in_features;
  pl->xprep_halfs = !pl->xprep ? 0
                    : pl->k.groups > 0 ? (XprepI8(p->m, ks, pl->max_chunks, pl->k.groups).bytes + 15) / 16 * 8
                                       : mi;
  return EXL3_OK;
}

int plan_call(const Exl3GemvParams* p, Plan* pl) { return plan_with(p, current_tuning(), 1, pl); }

cudaError_t launch(const void* fn, dim3 grid, int smem, cudaStream_t stream, void** args, bool pdl,
                   int threads = kWarps * 32) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  // Programmatic dependent launch: this kernel's blocks may be launched while the previous kernel drains; each
  // kernel's griddepcontrol.wait comes before its first global memory access.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelExC(&cfg, fn, args);
  return e == cudaSuccess ? cudaGetLastError() : e;
}

// The fused MoE's kernel for a rate: the one-row integer kernel's geometry (its plan), the MoE entry point.
// The fused MoE's kernel for a rate and its geometry (the one-row integer kernel's, in blocks of kWarpsMoe warps).
bool moe_kernel(int k2, bool act_in, const void** fn, KernelInfo* info) {
#define EXL3_MOE(K2_, ALL_)                                                                                        \
  if (k2 == K2_) {                                                                                                 \
    if (fn)                                                                                                        \
      *fn = act_in ? reinterpret_cast<const void*>(moe_i8_kernel<K2_, true>)                                      \
                   : reinterpret_cast<const void*>(moe_i8_kernel<K2_, false>);                                    \
    if (info) *info = KernelInfo{nullptr, ring_stages<K2_, kWarpsMoe>() * Rate<K2_>::kSlabBytes, 1, kWarpsMoe, false}; \
    return true;                                                                                                   \
  }
  EXL3_RATES(EXL3_MOE)
#undef EXL3_MOE
  return false;
}

int moe_check(int in_features, int out_features, int k2, int codebook) {
  const int st = check_shape(1, in_features, out_features, k2, codebook);
  if (st != EXL3_OK) return st;
  return codebook == 2 && moe_kernel(k2, false, nullptr, nullptr) ? EXL3_OK : EXL3_ERR_MOE_CODEBOOK;
}

// The MoE launch's plan: the one-row integer GEMV's, whatever the tuning says about mul1 (the MoE has no fp16-kernel
// path), split for slots * nproj GEMVs side by side.
int moe_plan(const Exl3MoeParams* p, Plan* pl) {
  const int st = moe_check(p->in_features, p->out_features, p->k2, p->codebook);
  if (st != EXL3_OK) return st;
  if (p->slots < 0 || p->nproj < 1) return EXL3_ERR_ROWS;
  Exl3GemvParams q{};
  q.m = 1;
  q.in_features = p->in_features;
  q.out_features = p->out_features;
  q.k2 = p->k2;
  q.codebook = p->codebook;
  q.ksplit = p->ksplit;
  Exl3GemvTuning t = current_tuning();
  t.mul1_fp16 = 0;
  t.i8_max_rows = kMaxRows;
  t.xprep_min_rows = 0;
  const int batch = p->slots * p->nproj > 0 ? p->slots * p->nproj : 1;
  KernelInfo k;
  moe_kernel(p->k2, p->act_in >= 0, nullptr, &k);
  return plan_with(&q, t, batch, pl, &k);
}

}  // namespace exl3

extern "C" int exl3_moe_supports(int in_features, int out_features, int k2, int codebook) {
  return exl3::moe_check(in_features, out_features, k2, codebook);
}

extern "C" int exl3_moe_plan(const Exl3MoeParams* p, int* ksplit, size_t* partial_floats, size_t* workspace_ints) {
  exl3::Plan pl;
  const int st = exl3::moe_plan(p, &pl);
  if (st != EXL3_OK) return st;
  const size_t z = static_cast<size_t>(p->slots) * p->nproj;
  *ksplit = pl.ksplit;
  *partial_floats = pl.partial_floats * z;
  *workspace_ints = pl.workspace_ints * z;
  return EXL3_OK;
}

extern "C" int exl3_moe_launch(const Exl3MoeParams* p, cudaStream_t stream) {
  using namespace exl3;
  Plan pl;
  const int st = moe_plan(p, &pl);
  if (st != EXL3_OK) return st;
  if (p->slots == 0) return EXL3_OK;
  const uintptr_t any = reinterpret_cast<uintptr_t>(p->x) | reinterpret_cast<uintptr_t>(p->y) |
                        reinterpret_cast<uintptr_t>(p->counters);
  if ((any & 15) != 0 || p->counters == nullptr || p->ids == nullptr || p->table == nullptr ||
      p->sel_of == nullptr || (pl.partial_floats > 0 && p->partials == nullptr) || (p->x_stride & 7) != 0 ||
      p->x_div < 1)
    return EXL3_ERR_ALIGN;
  MoeArgs a{};
  a.k.x = static_cast<const __half*>(p->x);
  a.k.y = static_cast<__half*>(p->y);
  a.k.partials = p->partials;
  a.k.counters = p->counters;
  a.k.m = 1;
  a.k.in_features = p->in_features;
  a.k.out_features = p->out_features;
  a.k.ksplit = pl.ksplit;
  a.k.max_chunks = pl.max_chunks;
  a.k.xprep = nullptr;
  a.k.act_in = p->act_in < 0 ? 0 : p->act_in;
  a.ids = p->ids;
  a.lookup = p->lookup;
  a.n_global = p->n_global;
  a.n_local = p->n_local;
  a.table = p->table;
  a.sel_of = p->sel_of;
  a.table_stride = p->table_stride;
  a.proj0 = p->proj0;
  a.nproj = p->nproj;
  a.x_div = p->x_div;
  a.x_stride = p->x_stride;
  a.sel = 4 * p->k2 + p->codebook;
  a.ws_ints = static_cast<int>(pl.workspace_ints);
  const void* fn = nullptr;
  moe_kernel(p->k2, p->act_in >= 0, &fn, nullptr);
  Exl3GemvParams one{};  // the shape of each of the launch's GEMVs: one row
  one.m = 1;
  one.in_features = p->in_features;
  one.out_features = p->out_features;
  const int smem = smem_for_chunks(&one, pl.k, pl.max_chunks, false);
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return fail_cuda(e, "cudaFuncSetAttribute(max dynamic shared memory)");
  void* args[] = {&a};
  const dim3 grid(p->out_features / 128, pl.ksplit, p->slots * p->nproj);
  e = launch(fn, grid, smem, stream, args, pl.pdl, pl.k.warps * 32);
  if (e != cudaSuccess) return fail_cuda(e, "MoE kernel launch");
  return EXL3_OK;
}

extern "C" int exl3_moe_reduce_launch(const void* y, const int* ids, const int* lookup, int n_global, int n_local,
                                      const float* weights, int tokens, int topk, int hidden, void* out,
                                      int out_dtype, cudaStream_t stream) {
  using namespace exl3;
  if (tokens == 0) return EXL3_OK;
  if (tokens < 0 || topk < 1 || hidden <= 0 || hidden % 4 != 0 || out_dtype < 0 || out_dtype > 2)
    return EXL3_ERR_SHAPE;
  if (((reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(out)) & 15) != 0) return EXL3_ERR_ALIGN;
  const void* fn = out_dtype == 0   ? reinterpret_cast<const void*>(moe_reduce_kernel<0>)
                   : out_dtype == 1 ? reinterpret_cast<const void*>(moe_reduce_kernel<1>)
                                    : reinterpret_cast<const void*>(moe_reduce_kernel<2>);
  const __half* yh = static_cast<const __half*>(y);
  void* args[] = {&yh, &ids, &lookup, &n_global, &n_local, &weights, &topk, &hidden, &out};
  DeviceInfo d;
  const int st = device_info(&d);
  if (st != EXL3_OK) return st;
  const dim3 grid((hidden / 4 + 255) / 256, tokens);
  const cudaError_t e = launch(fn, grid, 0, stream, args, d.major >= 9 && current_tuning().pdl != 0, 256);
  if (e != cudaSuccess) return fail_cuda(e, "MoE reduce kernel launch");
  return EXL3_OK;
}

extern "C" int exl3_gemv_supports(int m, int in_features, int out_features, int k2, int codebook) {
  return exl3::check_shape(m, in_features, out_features, k2, codebook);
}

extern "C" void exl3_gemv_get_tuning(Exl3GemvTuning* t) { *t = exl3::current_tuning(); }

extern "C" void exl3_gemv_set_tuning(const Exl3GemvTuning* t) {
  std::lock_guard<std::mutex> lock(exl3::g_tuning_mu);
  exl3::g_tuning = *t;
  exl3::g_tuning_ready = true;
}

extern "C" int exl3_gemv_plan(const Exl3GemvParams* p, int* ksplit, size_t* partial_floats, size_t* xprep_halfs,
                              size_t* workspace_ints) {
  exl3::Plan pl;
  const int st = exl3::plan_call(p, &pl);
  if (st != EXL3_OK) return st;
  *ksplit = pl.ksplit;
  *partial_floats = pl.partial_floats;
  *xprep_halfs = pl.xprep_halfs;
  *workspace_ints = pl.workspace_ints;
  return EXL3_OK;
}

extern "C" int exl3_gemv_ksplit_range(const Exl3GemvParams* p, int* lo, int* hi) {
  Exl3GemvParams q = *p;
  q.ksplit = 0;
  exl3::Plan pl;
  const int st = exl3::plan_call(&q, &pl);
  if (st != EXL3_OK) return st;
  *lo = pl.lo;
  *hi = pl.hi;
  return EXL3_OK;
}

extern "C" int exl3_gemv_launch(const Exl3GemvParams* p, cudaStream_t stream) {
  using namespace exl3;
  Plan pl;
  const int st = plan_call(p, &pl);
  if (st != EXL3_OK) return st;
  int ks = pl.ksplit;
  const uintptr_t any = reinterpret_cast<uintptr_t>(p->x) | reinterpret_cast<uintptr_t>(p->trellis) |
                        reinterpret_cast<uintptr_t>(p->suh) | reinterpret_cast<uintptr_t>(p->svh) |
                        reinterpret_cast<uintptr_t>(p->y) | reinterpret_cast<uintptr_t>(p->partials) |
                        reinterpret_cast<uintptr_t>(p->xprep);
  if ((any & 15) != 0 || p->counters == nullptr || (pl.partial_floats > 0 && p->partials == nullptr) ||
      (pl.xprep_halfs > 0 && p->xprep == nullptr))
    return EXL3_ERR_ALIGN;

  const int n_chunks_k = p->in_features / 128;
  KernelArgs a;
  a.x = static_cast<const __half*>(p->x);
  a.trellis = static_cast<const uint8_t*>(p->trellis);
  a.suh = static_cast<const __half*>(p->suh);
  a.svh = static_cast<const __half*>(p->svh);
  a.y = static_cast<__half*>(p->y);
  a.partials = p->partials;
  a.counters = p->counters;
  a.slots = reinterpret_cast<uint32_t*>(p->counters + slots_offset(p->out_features));
  a.m = p->m;
  a.in_features = p->in_features;
  a.out_features = p->out_features;
  a.ksplit = ks;
  a.max_chunks = pl.max_chunks;
  a.xprep = pl.xprep_halfs > 0 ? static_cast<const uint8_t*>(p->xprep) : nullptr;
  cudaError_t e;
  if (a.xprep != nullptr) {
    const __half* xp = a.x;
    const __half* sp = a.suh;
    void* fp = p->xprep;
    int m = p->m, in_f = p->in_features, groups = pl.k.groups, max_chunks = pl.max_chunks;
    if (pl.k.groups > 0) {
      void* args[] = {&xp, &sp, &fp, &m, &in_f, &ks, &groups, &max_chunks};
      e = launch(reinterpret_cast<const void*>(xprep_i8_kernel), dim3(ks, p->m), 0, stream, args, pl.pdl);
    } else {
      void* args[] = {&xp, &sp, &fp, &m, &in_f};
      const int items = p->m * n_chunks_k;
      e = launch(reinterpret_cast<const void*>(xprep_kernel), dim3((items + kWarps - 1) / kWarps), 0, stream, args,
                 pl.pdl);
    }
    if (e != cudaSuccess) return fail_cuda(e, "input-transform kernel launch");
  }
  const void* fn = reinterpret_cast<const void*>(pl.k.fn);
  const int smem = smem_for_chunks(p, pl.k, pl.max_chunks, a.xprep != nullptr);
  e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return fail_cuda(e, "cudaFuncSetAttribute(max dynamic shared memory)");
  void* args[] = {&a};
  e = launch(fn, dim3(p->out_features / 128, ks), smem, stream, args, pl.pdl, pl.k.warps * 32);
  if (e != cudaSuccess) return fail_cuda(e, "kernel launch");
  return EXL3_OK;
}

extern "C" const char* exl3_gemv_error_string(int status) {
  switch (status) {
    case EXL3_OK: return "ok";
    case EXL3_ERR_ROWS: return "EXL3 GEMV takes 1 to 8 rows per launch";
    case EXL3_ERR_SHAPE: return "EXL3 GEMV needs in_features and out_features to be positive multiples of 128";
    case EXL3_ERR_BITS: return "EXL3 GEMV supports 1..8 bits per weight, and 1.5/2.5/3.5 with the mul1 codebook";
    case EXL3_ERR_CODEBOOK: return "EXL3 GEMV: codebook must be 0 (3inst), 1 (mcg) or 2 (mul1); half-integer rates need mul1";
    case EXL3_ERR_KSPLIT:
      return "EXL3 GEMV: ksplit out of range for this shape (a block takes at most 16 chunks of 128 inputs and must "
             "fit the device's shared memory per block; 1-2 rows of mul1 take at most 255 slices)";
    case EXL3_ERR_ALIGN: return "EXL3 GEMV: every tensor must be 16-byte aligned and the scratch buffers present";
    case EXL3_ERR_MOE_CODEBOOK:
      return "EXL3 fused MoE takes the mul1 codebook only (3inst and mcg experts run per expert through the GEMV)";
    case EXL3_ERR_CUDA: return exl3::g_error;
    default: return "EXL3 GEMV: unknown status";
  }
}
