// Phase stamps for kernels/bench/phase_timing.cu: include BEFORE gemv_sources.cuh (the GEMV's kernels), whose
// EXL3_STAMP hooks (exl3_gemv_device.cuh) are empty otherwise.
//
// Why a bench-only header: the product kernels must not carry timing code; this one defines the hooks so that thread 0
// of each block writes clock64() at fixed points of the block's life (1..5), plus %globaltimer at its start (0) and
// end (kStampsEnd), into g_exl3_timing[block * kStamps + k]. With -DEXL3_TIMING_GT it also writes %globaltimer at
// every point into [block * kStamps + kStampGt + k], so each phase has its SM cycles and its wall-clock ns read at
// the same instants.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

namespace exl3 {
constexpr int kStampsEnd = 7;  // stamps 0 and kStampsEnd are globaltimer ns, 1..5 clock64
constexpr int kStampSm = 6;    // the slot that holds the SM id
constexpr int kStampGt = 8;    // EXL3_TIMING_GT: slot kStampGt + k holds globaltimer at stamp k
#ifdef EXL3_TIMING_GT
constexpr bool kStampsGt = true;
#else
constexpr bool kStampsGt = false;
#endif
constexpr int kStamps = kStampsGt ? 2 * kStampGt : kStampGt;
__device__ unsigned long long* g_exl3_timing = nullptr;
__device__ __forceinline__ void exl3_stamp(int k) {
  if (threadIdx.x == 0 && g_exl3_timing != nullptr) {
    unsigned long long* t = g_exl3_timing + (static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kStamps;
    const bool wall = k == 0 || k == kStampsEnd;
    unsigned long long gt = 0;
    if (wall || kStampsGt) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
    t[k] = wall ? gt : clock64();
    if (kStampsGt) t[kStampGt + k] = gt;
    if (k == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      t[kStampSm] = sm;
    }
  }
}
}  // namespace exl3

#define EXL3_STAMP(k) exl3::exl3_stamp(k)
#define EXL3_STAMP_END() exl3::exl3_stamp(exl3::kStampsEnd)
