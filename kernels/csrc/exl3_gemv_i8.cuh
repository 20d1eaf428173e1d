// The integer (mul1) GEMV's device code: x' on the tensor cores, its 16-bit quantisation, the warp prologues of the
// four row classes, the main loops, and one block's whole segment (i8_segment). The integer GEMV (exl3_gemv_i8.cu)
// and the fused MoE (exl3_moe.cuh, one row per routed slot) are both this segment; how it works: the comments below
// and kernels/README.md.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_gemv_device.cuh"

namespace exl3 {

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

}  // namespace exl3
