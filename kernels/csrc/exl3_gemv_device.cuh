// The device code the GEMV's kernel families share (the fp16 kernel, the integer kernel, the fused MoE): the
// decode of a lane's trellis window, the x' transform, the trellis ring, and the end of a block with its split-K
// hand-overs. EXL3 GEMV for 1..8 rows: y[m, O] = x[m, I] . W with W = diag(suh) . H . W_hat . H . diag(svh)
// (SPEC 4).
//
// Written for sm_121 (GB10: mma.sync m16n8k16, cp.async; no wgmma/TMA) and checked on sm_90 (the same path).
// Plain CUDA, no torch headers: `make kernels` and CI build the kernels with nvcc alone (see exl3_gemv.h).
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

#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_gemv_layout.cuh"

// Phase hooks of the bench's phase timing (kernels/bench/stamps.cuh defines them before including this file);
// empty in every product build.
#ifndef EXL3_STAMP
#define EXL3_STAMP(k)
#define EXL3_STAMP_END()
#endif

namespace exl3 {

// ---------------------------------------------------------------------------------------------------------------
// Small device helpers: the decode of a tile into A fragments, the 128-point butterfly
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

}  // namespace exl3
