// What the GEMV's kernel families (exl3_gemv.cu: fp16, exl3_gemv_i8.cu: integer, exl3_moe.cuh: fused MoE) and the
// host planner (exl3_plan.cu) agree on: block geometry, the split-K hand-overs, the kernels' arguments, the
// shared-memory and scratch layouts, and how the planner asks a family for a kernel.
//
// Why a header of its own: the planner sizes shared memory, scratch and workspace with the very structs the kernels
// index with, and it must not see (or compile) the kernels' device code to do so.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "exl3_common.cuh"
#include "exl3_gemv.h"

namespace exl3 {

// Blocks per SM each kernel is compiled for (register budget 65536 / (threads * this)): with no minimum, ptxas
// capped some sm_121 instances at 64 registers and spilled; the integer kernel schedules its loop tighter with 1.
constexpr int kMinBlocks = 2;
constexpr int kMinBlocksI8 = 1;

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

// The fused MoE's launch (exl3_gemv.h, Exl3MoeParams): the one-row integer GEMV of each routed (slot, projection).
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

// A compiled kernel as the planner sees it: its entry point and the geometry its plan depends on. Each family's file
// hands these out (below); the planner never names a kernel template itself.
struct KernelInfo {
  const void* fn;
  int stage_bytes_per_warp;
  int groups;  // 0 = the fp16 kernel; 1 or 2 = the integer kernel with that many column groups of 4 rows
  int warps;   // per block
  bool fused_xprime;  // the kernel always prepares its own x' (the 5-8 row class: no x' kernel path)
};

// The kernel families' entry points, each defined in its own file (the rates: EXL3_RATES, exl3_common.cuh).
// exl3_gemv.cu: the fp16 kernel of (k2, codebook) (false for mul1 without EXL3_AB_PATHS), and its x' kernel.
bool fp16_gemv_kernel(int k2, int codebook, KernelInfo* out);
const void* fp16_xprep_kernel();
// exl3_gemv_i8.cu: the integer (mul1) kernel of k2 for `rows` rows (its row class), and its x' kernel (nullptr
// without EXL3_AB_PATHS).
bool i8_gemv_kernel(int k2, int rows, KernelInfo* out);
const void* i8_xprep_kernel();
// exl3_moe.cuh: the fused MoE's one-row kernel of k2 (act_in: the down projection, whose input is act(gate) * up),
// and the kernel that sums each token's slots into out_dtype (0 fp16, 1 bf16, 2 fp32).
bool moe_gemv_kernel(int k2, bool act_in, KernelInfo* out);
const void* moe_reduce_kernel_for(int out_dtype);

}  // namespace exl3
