// The GEMV's host planner and C ABI (exl3_gemv.h): the shape rule, the tuning, the per-device facts, the plan of a
// call (kernel, split-K, scratch and workspace) and the launches, for the fp16 and integer GEMV and the fused MoE.
//
// Why apart from the kernels: the plan is ordinary host code that decides which compiled kernel runs and with what
// grid; the kernel files (exl3_gemv.cu, exl3_gemv_i8.cu, exl3_moe.cuh) hand out their instances as KernelInfo
// (exl3_gemv_layout.cuh), so changing a plan never touches a kernel, and a kernel's SASS never depends on this file.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <forward_list>
#include <mutex>

#include "exl3_gemv.h"
#include "exl3_gemv_layout.cuh"

namespace exl3 {

// The process's tuning: the defaults, overridden once by the environment (so a whole run can be switched from the
// shell), afterwards only by exl3_gemv_set_tuning. Every plan takes a copy, so a change never reaches half a call.
// Published as an immutable snapshot behind one atomic pointer: a launch reads it with one load and takes no lock;
// the mutex orders only the publishers. Snapshots live until exit (a plan may still be copying the one a new
// exl3_gemv_set_tuning replaces; benches set it a handful of times per process).
std::mutex g_tuning_mu;
std::forward_list<Exl3GemvTuning> g_tuning_snapshots;  // owned here, guarded by g_tuning_mu
std::atomic<const Exl3GemvTuning*> g_tuning{nullptr};

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

// Publishes t as the tuning (when `only_first`, only if none is published yet). Caller holds no lock.
void publish_tuning(const Exl3GemvTuning& t, bool only_first) {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  if (only_first && g_tuning.load(std::memory_order_relaxed) != nullptr) return;
  g_tuning_snapshots.push_front(t);
  g_tuning.store(&g_tuning_snapshots.front(), std::memory_order_release);
}

Exl3GemvTuning current_tuning() {
  const Exl3GemvTuning* t = g_tuning.load(std::memory_order_acquire);
  if (t == nullptr) {
    publish_tuning(tuning_from_env(), true);
    t = g_tuning.load(std::memory_order_acquire);
  }
  return *t;
}

// The kernel of a call: mul1 through the integer kernel up to the tuning's i8_max_rows (default 8: it beats the fp16
// kernel's block-wide x' at every row count), everything else through the fp16 kernel; each family knows its
// compiled instances (EXL3_RATES, exl3_common.cuh).
bool find_kernel(int k2, int cb, int m, const Exl3GemvTuning& t, KernelInfo* out) {
  if (cb == 2 && m <= t.i8_max_rows && !t.mul1_fp16) return i8_gemv_kernel(k2, m, out);
  return fp16_gemv_kernel(k2, cb, out);
}

thread_local char g_error[256];

int fail_cuda(cudaError_t e, const char* what) {
  snprintf(g_error, sizeof(g_error), "EXL3 GEMV: %s failed: %s", what, cudaGetErrorString(e));
  return EXL3_ERR_CUDA;
}

// What the planner needs to know about a device, asked of the runtime once per device: a launch then costs no
// attribute query.
struct DeviceInfo {
  int dev;         // the device's ordinal
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
  d.dev = dev;
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

// The dynamic shared memory ceiling of a kernel (cudaFuncAttributeMaxDynamicSharedMemorySize), set once per (device,
// kernel) to the most that kernel can have on that device (the opt-in limit less its static shared memory): every
// plan's smem is within it, so a launch (or a CUDA-graph capture) makes no attribute call. The ceiling only admits a
// launch's dynamic shared memory; occupancy and the carveout follow what each launch asks for, as before. Kept in a
// lock-free table keyed by the kernel's entry point (the compiled kernels are about a hundred), one bit per device.
struct SmemCeiling {
  std::atomic<const void*> fn{nullptr};
  std::atomic<uint64_t> devices{0};  // bit d: the ceiling is set on device d
};
static_assert(kMaxDevices <= 64, "one bit per device in SmemCeiling::devices");
constexpr int kCeilingSlots = 512;
SmemCeiling g_ceilings[kCeilingSlots];

// The slot of fn (claimed if new), or nullptr when the table is full.
SmemCeiling* ceiling_slot(const void* fn) {
  const uintptr_t h = reinterpret_cast<uintptr_t>(fn);
  const int start = static_cast<int>((h >> 4) % kCeilingSlots);
  for (int i = 0; i < kCeilingSlots; ++i) {
    SmemCeiling& s = g_ceilings[(start + i) % kCeilingSlots];
    const void* have = s.fn.load(std::memory_order_acquire);
    if (have == fn) return &s;
    if (have == nullptr) {
      const void* expected = nullptr;
      if (s.fn.compare_exchange_strong(expected, fn, std::memory_order_acq_rel) || expected == fn) return &s;
    }
  }
  return nullptr;
}

// Makes sure fn may be launched with `smem` bytes of dynamic shared memory on device d.
int ensure_smem(const void* fn, int smem, const DeviceInfo& d) {
  SmemCeiling* s = d.dev >= 0 && d.dev < kMaxDevices ? ceiling_slot(fn) : nullptr;
  const uint64_t bit = s != nullptr ? uint64_t{1} << d.dev : 0;
  if (s != nullptr && (s->devices.load(std::memory_order_acquire) & bit) != 0) return EXL3_OK;
  if (s == nullptr) {  // no slot (a device past kMaxDevices, a full table): set it for this launch, as before
    const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return e == cudaSuccess ? EXL3_OK : fail_cuda(e, "cudaFuncSetAttribute(max dynamic shared memory)");
  }
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, fn);
  if (e != cudaSuccess) return fail_cuda(e, "cudaFuncGetAttributes");
  const int most = d.smem_optin - static_cast<int>(attr.sharedSizeBytes);
  e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, most > smem ? most : smem);
  if (e != cudaSuccess) return fail_cuda(e, "cudaFuncSetAttribute(max dynamic shared memory)");
  s->devices.fetch_or(bit, std::memory_order_acq_rel);
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
  DeviceInfo dev;         // the device it was planned for
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
  // the shape rule passed, so the rate is compiled: a kernel missing here is an A/B path of a bench build
  if (kernel != nullptr) pl->k = *kernel;
  else if (!find_kernel(p->k2, p->codebook, p->m, t, &pl->k)) return EXL3_ERR_AB_PATH;
  DeviceInfo& d = pl->dev;
  st = device_info(&d);
  if (st != EXL3_OK) return st;
  pl->xprep = uses_xprep(p, pl->k, t);
  if (pl->xprep && pl->k.groups > 0 && i8_xprep_kernel() == nullptr) return EXL3_ERR_AB_PATH;
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

int moe_check(int in_features, int out_features, int k2, int codebook) {
  const int st = check_shape(1, in_features, out_features, k2, codebook);
  if (st != EXL3_OK) return st;
  KernelInfo k;
  return codebook == 2 && moe_gemv_kernel(k2, false, &k) ? EXL3_OK : EXL3_ERR_MOE_CODEBOOK;
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
  moe_gemv_kernel(p->k2, p->act_in >= 0, &k);
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
  const void* fn = pl.k.fn;
  Exl3GemvParams one{};  // the shape of each of the launch's GEMVs: one row
  one.m = 1;
  one.in_features = p->in_features;
  one.out_features = p->out_features;
  const int smem = smem_for_chunks(&one, pl.k, pl.max_chunks, false);
  const int sst = ensure_smem(fn, smem, pl.dev);
  if (sst != EXL3_OK) return sst;
  void* args[] = {&a};
  const dim3 grid(p->out_features / 128, pl.ksplit, p->slots * p->nproj);
  const cudaError_t e = launch(fn, grid, smem, stream, args, pl.pdl, pl.k.warps * 32);
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
  const void* fn = moe_reduce_kernel_for(out_dtype);
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

extern "C" void exl3_gemv_set_tuning(const Exl3GemvTuning* t) { exl3::publish_tuning(*t, false); }

extern "C" int exl3_gemv_ab_paths(void) {
  exl3::KernelInfo k;
  return exl3::i8_xprep_kernel() != nullptr && exl3::fp16_gemv_kernel(2, 2, &k) ? 1 : 0;
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
      e = launch(i8_xprep_kernel(), dim3(ks, p->m), 0, stream, args, pl.pdl);
    } else {
      void* args[] = {&xp, &sp, &fp, &m, &in_f};
      const int items = p->m * n_chunks_k;
      e = launch(fp16_xprep_kernel(), dim3((items + kWarps - 1) / kWarps), 0, stream, args,
                 pl.pdl);
    }
    if (e != cudaSuccess) return fail_cuda(e, "input-transform kernel launch");
  }
  const void* fn = pl.k.fn;
  const int smem = smem_for_chunks(p, pl.k, pl.max_chunks, a.xprep != nullptr);
  const int sst = ensure_smem(fn, smem, pl.dev);
  if (sst != EXL3_OK) return sst;
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
    case EXL3_ERR_AB_PATH:
      return "EXL3 GEMV: the tuning asks for an A/B path (mul1 through the fp16 kernel, or the integer kernel's x' "
             "kernel) that the product build leaves out; build with SPARKCTL_EXL3_AB_PATHS=1 (kernels/README.md)";
    case EXL3_ERR_CUDA: return exl3::g_error;
    default: return "EXL3 GEMV: unknown status";
  }
}
