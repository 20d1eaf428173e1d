// The fused MoE decode (exl3_gemv.h, Exl3MoeParams): the one-row integer GEMV (exl3_gemv_i8.cuh, i8_segment) of
// each routed (slot, projection), its expert found on the device, and the weighted sum of each token's slots. The
// planner (exl3_plan.cu) plans and launches both through moe_gemv_kernel and moe_reduce_kernel_for.
//
// A family of its own, compiled in the integer GEMV's translation unit (exl3_gemv_i8.cu includes this file last):
// the MoE and the integer GEMV instantiate the same i8_segment, and compiled apart, NVVM ordered the operands of one
// predicate AND differently in every integer GEMV kernel (one PLOP3 with its inputs swapped: kernels/PERF.md, "the
// kernel source split"), so the kernels' SASS would no longer be the measured one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_gemv_i8.cuh"

namespace exl3 {

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

// ---------------------------------------------------------------------------------------------------------------
// The compiled instances (EXL3_RATES, mul1): what the planner launches
// ---------------------------------------------------------------------------------------------------------------

// The fused MoE's kernel for a rate and its geometry (the one-row integer kernel's, in blocks of kWarpsMoe warps).
bool moe_gemv_kernel(int k2, bool act_in, KernelInfo* out) {
#define EXL3_MOE(K2_, ALL_)                                                                                     \
  if (k2 == K2_) {                                                                                              \
    *out = KernelInfo{act_in ? reinterpret_cast<const void*>(moe_i8_kernel<K2_, true>)                          \
                             : reinterpret_cast<const void*>(moe_i8_kernel<K2_, false>),                        \
                      ring_stages<K2_, kWarpsMoe>() * Rate<K2_>::kSlabBytes, 1, kWarpsMoe, false};               \
    return true;                                                                                                \
  }
  EXL3_RATES(EXL3_MOE)
#undef EXL3_MOE
  return false;
}

const void* moe_reduce_kernel_for(int out_dtype) {
  return out_dtype == 0   ? reinterpret_cast<const void*>(moe_reduce_kernel<0>)
         : out_dtype == 1 ? reinterpret_cast<const void*>(moe_reduce_kernel<1>)
                          : reinterpret_cast<const void*>(moe_reduce_kernel<2>);
}

}  // namespace exl3
