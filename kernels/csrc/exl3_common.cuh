// What every EXL3 kernel family shares: the format's facts (SPEC 1-3: the compiled rates, a rate's trellis geometry,
// the codebooks' constants), the PTX helpers, and the ONE list of compiled rates.
//
// Why one header: the format helpers and the lists of compiled rates were written out in each kernel file and again
// in the Python benches, so a rate or a constant changed in one place and not in the others either failed to build or
// went unchecked. Every kernel family (exl3_gemv.cu, exl3_gemv_i8.cu, exl3_moe.cuh, exl3_recon.cu, exl3_ngram.cu) and
// the host planner (exl3_plan.cu) include this file; the Python benches read EXL3_RATES from it
// (kernels/bench/compiled_rates.py), so nothing restates the list.
//
// Everything here is inline (templates, constexpr, __forceinline__), so each translation unit compiles its own copy
// and the kernels' SASS is what it was when these helpers were written in each file (kernels/bench/sass_diff.py).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------------------------
// The compiled rates
// ---------------------------------------------------------------------------------------------------------------

// X(K2, ALL): every rate the kernels are compiled for, K2 = twice the bits per weight, in the order the benches list
// them; ALL = 1: with every codebook (3INST, MCG, mul1), ALL = 0: with mul1 only (the half-integer rates, SPEC 2.5).
// The GEMV (both kernels), the fused MoE and the reconstruction instantiate exactly these, and the shape rule
// (exl3_gemv_supports) takes exactly these. Keep it one X(k2, 0 or 1) per rate: compiled_rates.py parses it.
#define EXL3_RATES(X) \
  X(2, 1) X(4, 1) X(6, 1) X(8, 1) X(10, 1) X(12, 1) X(14, 1) X(16, 1) X(3, 0) X(5, 0) X(7, 0)

namespace exl3 {

// Whether (k2, codebook) is a compiled pair: a rate of EXL3_RATES, with a codebook it is compiled for.
__host__ __device__ constexpr bool rate_compiled(int k2, int codebook) {
#define EXL3_RATE_COMPILED(K2_, ALL_) \
  if (k2 == K2_) return (ALL_) ? codebook >= 0 && codebook <= 2 : codebook == 2;
  EXL3_RATES(EXL3_RATE_COMPILED)
#undef EXL3_RATE_COMPILED
  return false;
}

// ---------------------------------------------------------------------------------------------------------------
// The format
// ---------------------------------------------------------------------------------------------------------------

// SPEC 2.3: the codebooks' hashes of a 16-bit state. 3INST and MCG mask and flip the hashed word into two fp16 halves
// whose sum is the weight; mul1 sums the four bytes of its hash s, and the weight is fp16(k_inv * (1024 + s) + k_bias)
// in one fused rounding.
constexpr uint32_t k3instMul = 89226354u;
constexpr uint32_t k3instAdd = 64248484u;
constexpr uint32_t kMcgMul = 0xCBAC1FEDu;
constexpr uint32_t kHashMask = 0x8FFF8FFFu;  // 3INST / MCG: (x & kHashMask) ^ kHashXor
constexpr uint32_t kHashXor = 0x3B603B60u;
constexpr uint32_t kMul1Mul = 0x83DCD12Du;
constexpr unsigned short kMul1InvBits = 0x1EEE;   // fp16 k_inv
constexpr unsigned short kMul1BiasBits = 0xC931;  // fp16 k_bias
constexpr float kMul1Inv = 0.00676727294921875f;  // fp16 0x1EEE as a float
constexpr float kMul1Bias = -10.3828125f;         // fp16 0xC931 as a float
constexpr float kMul1C0 = -3.453125f;             // 1024 * k_inv + k_bias, exact (the weight of s = 0)

// The codebook's multiply (and add) of a state: CB 0 = 3INST, 1 = MCG, 2 = mul1.
template <int CB>
__host__ __device__ __forceinline__ uint32_t cb_mix(uint32_t s) {
  static_assert(CB >= 0 && CB <= 2, "codebook 0..2");
  return CB == 0 ? s * k3instMul + k3instAdd : CB == 1 ? s * kMcgMul : s * kMul1Mul;
}

// Geometry of one rate. K2 = twice the bits per weight, so the half-integer rates (mul1 1.5/2.5/3.5) fit one template.
// A 16x16 tile is a ring of 16 * K bits (SPEC 2.1); lane l of a warp owns trellis positions 8l .. 8l+7 (SPEC 3), whose
// states are the 16-bit windows ending at its positions' ring bits.
template <int K2>
struct Rate {
  // Bits carried by trellis position j (SPEC 2.5: odd positions take the extra bit at half-integer rates).
  __host__ __device__ static constexpr int width(int j) { return (K2 & 1) ? (K2 / 2 + (j & 1)) : K2 / 2; }
  // Ring bit just past position e of a lane's 8 positions, relative to the lane's first bit (4 * K2 * lane).
  __host__ __device__ static constexpr int end(int e) {
    int s = 0;
    for (int i = 0; i <= e; ++i) s += width(i);
    return s;
  }
  // Start of state e's 16-bit window relative to the start of state 0's window.
  __host__ __device__ static constexpr int off(int e) { return end(e) - end(0); }
  static constexpr int kSpan = off(7) + 16;            // bits one lane needs
  static constexpr int kRingBits = 128 * K2;           // 256 * K
  static constexpr int kTileWords = 4 * K2;            // 32-bit words per 16x16 tile
  static constexpr int kTileBytes = 16 * K2;
  static constexpr int kSlabBytes = 8 * kTileBytes;    // 8 tiles = one 16 x 128 slab (contiguous in the trellis)
  static constexpr int kSlabUnits = kSlabBytes / 16;   // 16-byte cp.async units per slab
  static constexpr int kBlockBytes = 64 * kTileBytes;  // the 8 x 8 tiles of a 128 x 128 block
  static constexpr int kBlockUnits = kBlockBytes / 16;
  static constexpr int kNormWords = (kSpan + 31) / 32;  // words once the lane's first window starts at bit 0
  // Words as stored when the first window starts anywhere in the first word (then funnel-shifted to bit 0).
  static constexpr int kShiftWords = kNormWords + 1;
  // A lane's window starts at bit 4*K2*lane + end(0) - 16; when 4*K2 is a multiple of 32 that offset within a
  // word is the same for every lane and known at compile time, so the extraction shifts become constants.
  static constexpr bool kFixed = (K2 % 8) == 0;
  static constexpr int kFixedO = (((end(0) - 16) % 32) + 32) % 32;
  // Words a lane loads: its span from the known offset when kFixed, else kShiftWords.
  static constexpr int kRawWords = kFixed ? (kFixedO + kSpan + 31) / 32 : kShiftWords;
  static_assert(kRawWords <= kTileWords && kShiftWords <= kTileWords, "window longer than a tile");
};

// ---------------------------------------------------------------------------------------------------------------
// Bits, halves and the Hadamard's signs
// ---------------------------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t h2_as_u32(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ __half2 u32_as_h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// 16 bits at bit offset OFF (MSB first) of the word sequence w[0], w[1], ...
template <int OFF, int NW>
__device__ __forceinline__ uint32_t bits16(const uint32_t (&w)[NW]) {
  constexpr int q = OFF / 32;
  constexpr int r = OFF % 32;
  if constexpr (r + 16 <= 32) {
    static_assert(q < NW, "window past the loaded words");
    constexpr int sh = 16 - r;
    if constexpr (sh == 0) return w[q] & 0xFFFFu;
    else if constexpr (sh == 16) return w[q] >> 16;
    else if constexpr (sh == 8) return __byte_perm(w[q], 0u, 0x4421);
    else return (w[q] >> sh) & 0xFFFFu;
  } else {
    static_assert(q + 1 < NW, "window past the loaded words");
    return __funnelshift_r(w[q + 1], w[q], 48 - r) & 0xFFFFu;
  }
}

// The same 16 bits with a plain shift (and mask) or one funnel shift, never PRMT: the reconstruction's cut. Both give
// the same bits; each kernel keeps the one it was measured with, since the other changes its SASS.
template <int OFF, int NW>
__device__ __forceinline__ uint32_t bits16_shift(const uint32_t (&w)[NW]) {
  constexpr int q = OFF / 32, r = OFF % 32;
  if constexpr (r + 16 <= 32) {
    static_assert(q < NW, "window past the loaded words");
    return (w[q] >> (16 - r)) & 0xFFFFu;
  } else {
    static_assert(q + 1 < NW, "window past the loaded words");
    return __funnelshift_l(w[q + 1], w[q], r) >> 16;
  }
}

// fp16 pair (s * H[i][j], s * H[i][j + 1]) of the Sylvester Hadamard H[i][j] = (-1)^popc(i & j) (natural order), with
// pos and neg the fp16 bits of +s and -s.
__device__ __forceinline__ uint32_t had_pair(int i, int j, uint32_t pos, uint32_t neg) {
  return ((__popc(i & j) & 1) ? neg : pos) | (((__popc(i & (j + 1)) & 1) ? neg : pos) << 16);
}

// fp16 hi and lo parts of (a, b): hi = rn(a, b), lo = rn of the remainders, so that hi + lo carries ~22 bits of an fp32
// value through an fp16 mma.
__device__ __forceinline__ void split_h2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  hi = h2_as_u32(h);
  lo = h2_as_u32(__floats2half2_rn(a - hf.x, b - hf.y));
}

// ---------------------------------------------------------------------------------------------------------------
// PTX helpers (sm_90 and sm_121: mma.sync, cp.async, griddepcontrol; no wgmma/TMA)
// ---------------------------------------------------------------------------------------------------------------

// cp.async without a memory clobber: the GEMV orders its own shared-memory accesses around the copies by its
// barriers and syncwarps. Trellis bytes are read once per call: .cg keeps them out of L1.
__device__ __forceinline__ void cp_async16_at(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  cp_async16_at(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The same with a "memory" clobber, which keeps the compiler's own shared-memory accesses on their side of each copy,
// commit and wait (the reconstruction's double buffer relies on it).
__device__ __forceinline__ void cp_async16_ordered(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit_ordered() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_ordered() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Programmatic dependent launch (sm_90+): wait until the kernel before this one has finished and its writes are
// visible. Everything issued before this call must not depend on earlier kernels.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel on the stream be scheduled now rather than at block exit (its griddepcontrol.wait still waits
// for this grid to end and its memory to be visible, so this is only about when its blocks get launched).
__device__ __forceinline__ void trigger_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// fp16 mma, fp32 accumulation: C (16x8) += A (16x16, row) . B (16x8, col).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Integer mma: A = 16x32 unsigned bytes, B = 32x8 signed bytes, C = exact int32 sums.
__device__ __forceinline__ void imma_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace exl3
