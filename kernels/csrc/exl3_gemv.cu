// The fp16 GEMV: 3INST and MCG for 1..8 rows (and mul1 when the tuning sends it here, in a build with the A/B paths),
// y[m, O] = x[m, I] . W with W = diag(suh) . H . W_hat . H . diag(svh) (SPEC 4); its x' kernel for 2+ rows; the
// instances the planner (exl3_plan.cu) asks for through fp16_gemv_kernel. Shared device code: exl3_gemv_device.cuh
// (how the GEMV works).
//
// EXL3_AB_PATHS (bench builds only: kernels/bench/gemv_sources.cuh, SPARKCTL_EXL3_AB_PATHS=1 for the torch
// extension, build_kernels.py --ab-paths): also compile mul1 through this kernel. The default tuning never takes it
// (the integer kernel is faster at every row count, kernels/PERF.md), so the product build leaves its 11 instances
// out; with the define the kernels are exactly those of a build without it plus these (bench/sass_diff.py).
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_gemv_device.cuh"

namespace exl3 {

// ---------------------------------------------------------------------------------------------------------------
// fp16 kernel: 3INST and MCG (and mul1 when the tuning's mul1_fp16 is set, EXL3_AB_PATHS)
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

// ---------------------------------------------------------------------------------------------------------------
// The compiled instances (EXL3_RATES): what the planner launches
// ---------------------------------------------------------------------------------------------------------------

template <int K2, int CB>
KernelInfo info_of() {
  return KernelInfo{reinterpret_cast<const void*>(gemv_kernel<K2, CB>), ring_stages<K2, kWarps>() * Rate<K2>::kSlabBytes, 0, kWarps, false};
}


// The fp16 kernel of rate K2 for codebook cb: 3INST and MCG when kAll (EXL3_RATES); mul1 (every rate) only in a
// build with the A/B paths. False: not compiled here (the planner then says which build has it).
template <int K2, bool kAll>
bool info_fp16(int cb, KernelInfo* out) {
  if constexpr (kAll) {
    if (cb == 0) *out = info_of<K2, 0>();
    if (cb == 1) *out = info_of<K2, 1>();
  }
#ifdef EXL3_AB_PATHS
  if (cb == 2) *out = info_of<K2, 2>();
  return cb == 2 || (kAll && (cb == 0 || cb == 1));
#else
  return kAll && (cb == 0 || cb == 1);
#endif
}

bool fp16_gemv_kernel(int k2, int codebook, KernelInfo* out) {
#define EXL3_FP16(K2_, ALL_) \
  if (k2 == K2_) return info_fp16<K2_, ALL_>(codebook, out);
  EXL3_RATES(EXL3_FP16)
#undef EXL3_FP16
  return false;
}

const void* fp16_xprep_kernel() { return reinterpret_cast<const void*>(xprep_kernel); }

}  // namespace exl3
