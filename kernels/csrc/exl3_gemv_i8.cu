// The integer (mul1) GEMV for 1..8 rows: the hash bytes straight into the integer mma for 1-4 rows, fp16 x' and one
// fp16 mma per tile for 5-8 rows (exl3_gemv_i8.cuh); its x' kernel (the tuning's xprep_min_rows, in a build with
// EXL3_AB_PATHS only: by default the warps prepare their own x', which is faster, kernels/PERF.md); the instances the
// planner (exl3_plan.cu) asks for through i8_gemv_kernel: every rate of EXL3_RATES, four row classes each. The fused
// MoE (exl3_moe.cuh) is compiled at the end of this file, in the same translation unit.
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_gemv_i8.cuh"

namespace exl3 {

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

#ifdef EXL3_AB_PATHS
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
#endif  // EXL3_AB_PATHS

// ---------------------------------------------------------------------------------------------------------------
// The compiled instances (EXL3_RATES, mul1): what the planner launches
// ---------------------------------------------------------------------------------------------------------------

template <int K2, int kRowCap>
KernelInfo info_i8() {
  return KernelInfo{reinterpret_cast<const void*>(gemv_i8_kernel<K2, kRowCap>), ring_stages<K2, kWarpsI8>() * Rate<K2>::kSlabBytes,
                    kRowCap > 4 ? 2 : 1, kWarpsI8, half_rows(kRowCap)};
}


// One row (its own B layout and prologue), 2 rows and 3-4 rows (one column group; the prologue computes the class's
// rows together, so 2 rows do not pay for 4) and 5-8 rows (fp16 x' and one fp16 mma per tile, half_slabs).
bool i8_gemv_kernel(int k2, int rows, KernelInfo* out) {
#define EXL3_I8(K2_, ALL_)                                      \
  if (k2 == K2_) {                                              \
    *out = rows == 1   ? info_i8<K2_, 1>()                      \
           : rows == 2 ? info_i8<K2_, 2>()                      \
           : rows <= 4 ? info_i8<K2_, 4>()                      \
                       : info_i8<K2_, 8>();                     \
    return true;                                                \
  }
  EXL3_RATES(EXL3_I8)
#undef EXL3_I8
  return false;
}

#ifdef EXL3_AB_PATHS
const void* i8_xprep_kernel() { return reinterpret_cast<const void*>(xprep_i8_kernel); }
#else
const void* i8_xprep_kernel() { return nullptr; }  // an A/B path: not in the product build
#endif

}  // namespace exl3

// The fused MoE's kernels, in this translation unit (exl3_moe.cuh says why).
#include "exl3_moe.cuh"
