// torch binding of the EXL3 kernels: shape/dtype checks with readable errors, scratch allocation, launch.
//
// Built on a CUDA machine by torch.utils.cpp_extension (see sparkctl_exl3/cuda.py); the kernels themselves live
// in plain .cu files behind a C ABI (exl3_gemv.h) so they also build without torch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "exl3_gemv.h"
#include "exl3_recon.h"
#include "exl3_ngram.h"

namespace {

constexpr int64_t kMaxRows = 8;

// Messages are built from std::string only: streaming an integer into TORCH_CHECK's message crashed inside the
// extension on the device (torch 2.11 cu130, libstdc++ mismatch in ostream::_M_insert<long>).
std::string num(int64_t v) { return std::to_string(v); }
// Bits per weight from k2 (twice the bits): "4" or "2.5".
std::string bits_str(int64_t k2) { return std::to_string(k2 / 2) + (k2 % 2 ? ".5" : ""); }
std::string dims(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}
std::string dtype_name(const torch::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

// Twice the bits per weight from the trellis' last dimension (16*K, or 16*KA + 8 for K = KA + 0.5).
int64_t k2_of(const torch::Tensor& trellis) {
  const int64_t last = trellis.size(2);
  TORCH_CHECK(last > 0 && last % 8 == 0, "EXL3 GEMV: trellis last dimension must be 16*K (or 16*K+8 for half-integer K), got " + num(last));
  return last / 8;
}

// The tensor-level checks (device, dtype, dimensions that agree with each other); the shape rule itself is the
// kernel's own (exl3_gemv_supports), so it is written once.
void check_inputs(const torch::Tensor& x, const torch::Tensor& trellis, const torch::Tensor& suh, const torch::Tensor& svh,
                  int64_t codebook) {
  TORCH_CHECK(x.is_cuda() && trellis.is_cuda() && suh.is_cuda() && svh.is_cuda(),
              "EXL3 GEMV: x, trellis, suh and svh must all be CUDA tensors");
  TORCH_CHECK(x.device() == trellis.device() && suh.device() == trellis.device() && svh.device() == trellis.device(),
              "EXL3 GEMV: x, trellis, suh and svh must be on one device");
  TORCH_CHECK(x.scalar_type() == torch::kHalf, "EXL3 GEMV: x must be float16, got " + dtype_name(x));
  TORCH_CHECK(trellis.scalar_type() == torch::kShort, "EXL3 GEMV: trellis must be int16, got " + dtype_name(trellis));
  TORCH_CHECK(suh.scalar_type() == torch::kHalf && svh.scalar_type() == torch::kHalf, "EXL3 GEMV: suh and svh must be float16");
  TORCH_CHECK(trellis.dim() == 3, "EXL3 GEMV: trellis must be [I/16, O/16, 16*K], got " + dims(trellis));
  TORCH_CHECK(trellis.is_contiguous(), "EXL3 GEMV: trellis must be contiguous");
  TORCH_CHECK(x.dim() == 2, "EXL3 GEMV: x must be 2-D [rows, I], got " + dims(x));
  const int64_t in_features = trellis.size(0) * 16, out_features = trellis.size(1) * 16;
  TORCH_CHECK(x.size(1) == in_features, "EXL3 GEMV: x has " + num(x.size(1)) + " features but the trellis has " + num(in_features));
  TORCH_CHECK(suh.dim() == 1 && suh.size(0) == in_features, "EXL3 GEMV: suh must be [" + num(in_features) + "], got " + dims(suh));
  TORCH_CHECK(svh.dim() == 1 && svh.size(0) == out_features, "EXL3 GEMV: svh must be [" + num(out_features) + "], got " + dims(svh));
  const int64_t k2 = k2_of(trellis);
  const int st = exl3_gemv_supports(1, static_cast<int>(in_features), static_cast<int>(out_features), static_cast<int>(k2),
                                    static_cast<int>(codebook));
  TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)) + " (layer " + num(in_features) + " x " +
                                 num(out_features) + ", " + bits_str(k2) + " bits, codebook " + num(codebook) + ")");
}

// Returns a copy when t's data is not 16-byte aligned (a view into a larger buffer); the kernel reads 16-byte units.
torch::Tensor aligned(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0) return c;
  return c.clone(at::MemoryFormat::Contiguous);
}

Exl3GemvParams shape_params(int64_t m, int64_t in_features, int64_t out_features, int64_t k2, int64_t codebook,
                            int64_t ksplit) {
  Exl3GemvParams p{};
  p.m = static_cast<int>(m);
  p.in_features = static_cast<int>(in_features);
  p.out_features = static_cast<int>(out_features);
  p.k2 = static_cast<int>(k2);
  p.codebook = static_cast<int>(codebook);
  p.ksplit = static_cast<int>(ksplit);
  return p;
}

// What exl3_gemv_plan says about one launch. The workspace (int32) is zero before the first call and left zero by
// the kernel, so one buffer per stream serves every later call (CUDA graph replays included): the column chunks'
// split-K counters, then the slots of the ticket or fixed-point hand-over, which persist for the same reason (zeroing
// them per call would be one more launch).
struct LaunchPlan {
  int ksplit = 0;
  size_t partial_floats = 0, xprep_halfs = 0, workspace_ints = 0;
};

LaunchPlan plan(const Exl3GemvParams& p) {
  LaunchPlan l;
  const int st = exl3_gemv_plan(&p, &l.ksplit, &l.partial_floats, &l.xprep_halfs, &l.workspace_ints);
  TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)));
  return l;
}

// y = x . W for 2-D fp16 x. `workspace`: see LaunchPlan (kept by the Python side per device and stream, sized by
// gemv_workspace); `ksplit` 0 picks the split automatically.
torch::Tensor gemv(torch::Tensor x, torch::Tensor trellis, torch::Tensor suh, torch::Tensor svh, int64_t codebook,
                   torch::Tensor workspace, int64_t ksplit) {
  check_inputs(x, trellis, suh, svh, codebook);
  const int64_t in_features = trellis.size(0) * 16, out_features = trellis.size(1) * 16;
  TORCH_CHECK(workspace.is_cuda() && workspace.device() == trellis.device() && workspace.scalar_type() == torch::kInt &&
                  workspace.is_contiguous() && reinterpret_cast<uintptr_t>(workspace.data_ptr()) % 16 == 0,
              "EXL3 GEMV: workspace must be a contiguous, 16-byte aligned int32 CUDA tensor on the same device");
  TORCH_CHECK(ksplit >= 0, "EXL3 GEMV: ksplit must be >= 0 (0 = automatic)");
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const torch::Tensor xa = aligned(x), ta = aligned(trellis), sa = aligned(suh), va = aligned(svh);
  const int64_t rows = x.size(0);
  torch::Tensor y = torch::empty({rows, out_features}, x.options());
  if (rows == 0) return y;
  int* ws = workspace.data_ptr<int>();
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int64_t m = std::min(kMaxRows, rows - r0);
    Exl3GemvParams p = shape_params(m, in_features, out_features, k2_of(trellis), codebook, ksplit);
    p.x = static_cast<const at::Half*>(xa.data_ptr()) + r0 * in_features;
    p.trellis = ta.data_ptr();
    p.suh = sa.data_ptr();
    p.svh = va.data_ptr();
    p.y = static_cast<at::Half*>(y.data_ptr()) + r0 * out_features;
    const LaunchPlan l = plan(p);
    const int64_t need = static_cast<int64_t>(l.workspace_ints);
    TORCH_CHECK(workspace.numel() >= need, "EXL3 GEMV: workspace has " + num(workspace.numel()) +
                                               " int32 elements, this call needs " + num(need) + " (gemv_workspace)");
    p.counters = ws;
    torch::Tensor partials, xprep;
    if (l.partial_floats > 0) {
      partials = torch::empty({static_cast<int64_t>(l.partial_floats)}, x.options().dtype(torch::kFloat));
      p.partials = partials.data_ptr<float>();
    }
    if (l.xprep_halfs > 0) {
      xprep = torch::empty({static_cast<int64_t>(l.xprep_halfs)}, x.options());
      p.xprep = xprep.data_ptr();
    }
    p.ksplit = l.ksplit;
    const int st = exl3_gemv_launch(&p, stream);
    TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)));
  }
  return y;
}

// int32 elements of zeroed workspace gemv needs for `rows` rows of this layer on the trellis' device.
int64_t gemv_workspace(torch::Tensor trellis, int64_t rows, int64_t codebook, int64_t ksplit) {
  TORCH_CHECK(trellis.is_cuda() && trellis.dim() == 3, "EXL3 GEMV: trellis must be a 3-D CUDA tensor");
  TORCH_CHECK(rows >= 0 && ksplit >= 0, "EXL3 GEMV: rows and ksplit must be >= 0");
  const c10::cuda::CUDAGuard guard(trellis.device());
  const int64_t in_features = trellis.size(0) * 16, out_features = trellis.size(1) * 16;
  int64_t most = 0;  // a call's launches take 8 rows at a time
  for (const int64_t m : {std::min(kMaxRows, rows), rows % kMaxRows}) {
    if (m == 0) continue;
    const LaunchPlan l = plan(shape_params(m, in_features, out_features, k2_of(trellis), codebook, ksplit));
    most = std::max(most, static_cast<int64_t>(l.workspace_ints));
  }
  return most;
}

// The split-K the kernel would use for this shape on the current device (for the bench's tables).
int64_t gemv_ksplit(int64_t rows, int64_t in_features, int64_t out_features, int64_t k2, int64_t codebook) {
  return plan(shape_params(std::min(kMaxRows, rows), in_features, out_features, k2, codebook, 0)).ksplit;
}

// Whether a launch of `rows` rows (1..8) of this shape is supported: the kernel's one shape rule.
bool supports(int64_t rows, int64_t in_features, int64_t out_features, int64_t k2, int64_t codebook) {
  return exl3_gemv_supports(static_cast<int>(rows), static_cast<int>(in_features), static_cast<int>(out_features),
                            static_cast<int>(k2), static_cast<int>(codebook)) == EXL3_OK;
}

// The splits a shape accepts on the current device, (lo, hi) (for the bench's sweeps and forced-split checks).
std::tuple<int64_t, int64_t> gemv_ksplit_range(int64_t rows, int64_t in_features, int64_t out_features, int64_t k2,
                                               int64_t codebook) {
  const Exl3GemvParams p = shape_params(std::min(kMaxRows, rows), in_features, out_features, k2, codebook, 0);
  int lo = 0, hi = 0;
  const int st = exl3_gemv_ksplit_range(&p, &lo, &hi);
  TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)));
  return {lo, hi};
}

// The planner's tuning (exl3_gemv.h) as a dict, and setting it whole.
std::map<std::string, int64_t> tuning() {
  Exl3GemvTuning t;
  exl3_gemv_get_tuning(&t);
  return {{"mul1_fp16", t.mul1_fp16}, {"i8_max_rows", t.i8_max_rows}, {"xprep_min_rows", t.xprep_min_rows},
          {"smem_limit", t.smem_limit}, {"pdl", t.pdl}};
}

void set_tuning(int64_t mul1_fp16, int64_t i8_max_rows, int64_t xprep_min_rows, int64_t smem_limit, int64_t pdl) {
  TORCH_CHECK(i8_max_rows >= 0 && xprep_min_rows >= 0 && smem_limit >= 0,
              "EXL3 GEMV: i8_max_rows, xprep_min_rows and smem_limit must be >= 0");
  Exl3GemvTuning t;
  t.mul1_fp16 = mul1_fp16 != 0;
  t.i8_max_rows = static_cast<int>(i8_max_rows);
  t.xprep_min_rows = static_cast<int>(xprep_min_rows);
  t.smem_limit = static_cast<int>(smem_limit);
  t.pdl = pdl != 0;
  exl3_gemv_set_tuning(&t);
}

// --- fused MoE decode (exl3_gemv.h, Exl3MoeParams) ---------------------------------------------------------------

// The launches of one MoE forward: gate/up (one per (k2, codebook) pair among them), down (one per pair), reduce.
struct MoeCall {
  int64_t tokens, topk, hidden, width;
  bool gated;
  std::vector<int64_t> gu_sels, down_sels;
  int64_t ksplit_gu, ksplit_down;
};

Exl3MoeParams moe_params(const MoeCall& c, bool down, int64_t sel, int64_t act) {
  Exl3MoeParams p{};
  const int nproj_gu = c.gated ? 2 : 1;
  p.slots = static_cast<int>(c.tokens * c.topk);
  p.table_stride = 3;
  p.proj0 = down ? 2 : 0;
  p.nproj = down ? 1 : nproj_gu;
  p.x_div = down ? 1 : static_cast<int>(c.topk);
  p.x_stride = static_cast<int>(down ? nproj_gu * c.width : c.hidden);
  p.in_features = static_cast<int>(down ? c.width : c.hidden);
  p.out_features = static_cast<int>(down ? c.hidden : c.width);
  p.k2 = static_cast<int>(sel / 4);
  p.codebook = static_cast<int>(sel % 4);
  p.act_in = down ? static_cast<int>(act) | (c.gated ? EXL3_MOE_GATED : 0) : -1;
  p.ksplit = static_cast<int>(down ? c.ksplit_down : c.ksplit_gu);
  return p;
}

// int32 elements of zeroed workspace the call needs: the largest of its launches' (they run one after another).
int64_t moe_need(const MoeCall& c) {
  int64_t most = 0;
  for (const bool down : {false, true}) {
    for (const int64_t sel : down ? c.down_sels : c.gu_sels) {
      const Exl3MoeParams p = moe_params(c, down, sel, 0);
      int ks = 0;
      size_t partials = 0, ints = 0;
      const int st = exl3_moe_plan(&p, &ks, &partials, &ints);
      TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)) + " (" + (down ? "down" : "gate/up") +
                                     " projection, " + bits_str(sel / 4) + " bits, codebook " + num(sel % 4) + ")");
      TORCH_CHECK(partials == 0, "EXL3 MoE: the one-row integer kernel needs no partial sums");
      most = std::max(most, static_cast<int64_t>(ints));
    }
  }
  return most;
}

int64_t moe_workspace(int64_t tokens, int64_t topk, int64_t hidden, int64_t width, bool gated,
                      std::vector<int64_t> gu_sels, std::vector<int64_t> down_sels, int64_t ksplit_gu,
                      int64_t ksplit_down) {
  return moe_need(MoeCall{tokens, topk, hidden, width, gated, gu_sels, down_sels, ksplit_gu, ksplit_down});
}

// The routed experts' weighted sum for x [T, hidden] fp16: table int64 [E, 3, 3] holds each local expert's (gate,
// up, down) x (trellis, suh, svh) device pointers and sel int32 [E, 3] their 4 * k2 + codebook; lookup int32
// [n_global] maps global ids to local experts (-1: not held), or is empty when ids are local. gu_sels / down_sels:
// the distinct sel values of the gate/up and of the down projections (one launch each).
torch::Tensor moe(torch::Tensor x, torch::Tensor topk_ids, torch::Tensor topk_weights, torch::Tensor lookup,
                  torch::Tensor table, torch::Tensor sel, int64_t width, bool gated, int64_t act,
                  std::vector<int64_t> gu_sels, std::vector<int64_t> down_sels, int64_t out_dtype,
                  torch::Tensor workspace, int64_t ksplit_gu, int64_t ksplit_down) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kHalf,
              "EXL3 MoE: x must be a 2-D float16 CUDA tensor [tokens, hidden], got " + dims(x));
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == x.size(0) && topk_weights.sizes() == topk_ids.sizes(),
              "EXL3 MoE: topk_ids and topk_weights must both be [tokens, top_k] for " + num(x.size(0)) +
                  " tokens, got " + dims(topk_ids) + " and " + dims(topk_weights));
  TORCH_CHECK(topk_ids.device() == x.device() && topk_weights.device() == x.device() && table.device() == x.device() &&
                  sel.device() == x.device() && workspace.device() == x.device(),
              "EXL3 MoE: x, the routing, the expert tables and the workspace must be on one device");
  TORCH_CHECK(table.scalar_type() == torch::kLong && table.dim() == 3 && table.size(1) == 3 && table.size(2) == 3 &&
                  table.is_contiguous(),
              "EXL3 MoE: the expert table must be a contiguous int64 [experts, 3, 3] tensor, got " + dims(table));
  TORCH_CHECK(sel.scalar_type() == torch::kInt && sel.dim() == 2 && sel.size(0) == table.size(0) && sel.size(1) == 3 &&
                  sel.is_contiguous(),
              "EXL3 MoE: sel must be a contiguous int32 [experts, 3] tensor, got " + dims(sel));
  TORCH_CHECK(!lookup.defined() || lookup.numel() == 0 ||
                  (lookup.device() == x.device() && lookup.scalar_type() == torch::kInt && lookup.dim() == 1 &&
                   lookup.is_contiguous()),
              "EXL3 MoE: lookup must be a contiguous int32 vector on the device of x");
  TORCH_CHECK(workspace.scalar_type() == torch::kInt && workspace.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(workspace.data_ptr()) % 16 == 0,
              "EXL3 MoE: workspace must be a contiguous, 16-byte aligned int32 CUDA tensor");
  TORCH_CHECK(out_dtype >= 0 && out_dtype <= 2, "EXL3 MoE: out_dtype must be 0 (fp16), 1 (bf16) or 2 (fp32)");
  TORCH_CHECK(act >= 0 && act <= 2, "EXL3 MoE: act must be 0 (silu), 1 (gelu) or 2 (gelu_tanh)");
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const MoeCall c{x.size(0), topk_ids.size(1), x.size(1), width, gated, gu_sels, down_sels, ksplit_gu, ksplit_down};
  const auto out_type = out_dtype == 0 ? torch::kHalf : out_dtype == 1 ? torch::kBFloat16 : torch::kFloat;
  torch::Tensor out = torch::empty({c.tokens, c.hidden}, x.options().dtype(out_type));
  if (c.tokens == 0) return out;
  const int64_t need = moe_need(c);
  TORCH_CHECK(workspace.numel() >= need, "EXL3 MoE: workspace has " + num(workspace.numel()) +
                                             " int32 elements, this call needs " + num(need) + " (moe_workspace)");
  const torch::Tensor xa = aligned(x);
  const torch::Tensor ids = topk_ids.to(torch::kInt).contiguous();
  const torch::Tensor w = topk_weights.to(torch::kFloat).contiguous();
  const bool has_lookup = lookup.defined() && lookup.numel() > 0;
  const int n_global = has_lookup ? static_cast<int>(lookup.numel()) : 0;
  const int n_local = static_cast<int>(table.size(0));
  const int nproj_gu = gated ? 2 : 1;
  torch::Tensor h = torch::empty({c.tokens * c.topk * nproj_gu, width}, x.options());
  torch::Tensor yd = torch::empty({c.tokens * c.topk, c.hidden}, x.options());
  const auto* tab = reinterpret_cast<const Exl3MoeTable*>(table.data_ptr<int64_t>());
  for (const bool down : {false, true}) {
    for (const int64_t s : down ? down_sels : gu_sels) {
      Exl3MoeParams p = moe_params(c, down, s, act);
      p.x = down ? h.data_ptr() : xa.data_ptr();
      p.y = down ? yd.data_ptr() : h.data_ptr();
      p.ids = ids.data_ptr<int>();
      p.lookup = has_lookup ? lookup.data_ptr<int>() : nullptr;
      p.n_global = n_global;
      p.n_local = n_local;
      p.table = tab;
      p.sel_of = sel.data_ptr<int>();
      p.counters = workspace.data_ptr<int>();
      const int st = exl3_moe_launch(&p, stream);
      TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)));
    }
  }
  const int st = exl3_moe_reduce_launch(yd.data_ptr(), ids.data_ptr<int>(), has_lookup ? lookup.data_ptr<int>() : nullptr,
                                        n_global, n_local, w.data_ptr<float>(), static_cast<int>(c.tokens),
                                        static_cast<int>(c.topk), static_cast<int>(c.hidden), out.data_ptr(),
                                        static_cast<int>(out_dtype), stream);
  TORCH_CHECK(st == EXL3_OK, std::string(exl3_gemv_error_string(st)));
  return out;
}

bool moe_supports(int64_t in_features, int64_t out_features, int64_t k2, int64_t codebook) {
  return exl3_moe_supports(static_cast<int>(in_features), static_cast<int>(out_features), static_cast<int>(k2),
                           static_cast<int>(codebook)) == EXL3_OK;
}

// --- reconstruction (prefill) ---
// W = diag(suh) . H . W_hat . H . diag(svh) as dense fp16 (exl3_recon.h), for reconstruct-then-cuBLAS prefill.
// The checks are the GEMV's (same wording, minus x); the shape rule is the GEMV's own (exl3_recon_supports).

void check_recon_layer(const torch::Tensor& trellis, const torch::Tensor& suh, const torch::Tensor& svh,
                       int64_t codebook) {
  TORCH_CHECK(trellis.is_cuda() && suh.is_cuda() && svh.is_cuda(),
              "EXL3 reconstruct: trellis, suh and svh must all be CUDA tensors");
  TORCH_CHECK(suh.device() == trellis.device() && svh.device() == trellis.device(),
              "EXL3 reconstruct: trellis, suh and svh must be on one device");
  TORCH_CHECK(trellis.scalar_type() == torch::kShort, "EXL3 reconstruct: trellis must be int16, got " + dtype_name(trellis));
  TORCH_CHECK(suh.scalar_type() == torch::kHalf && svh.scalar_type() == torch::kHalf,
              "EXL3 reconstruct: suh and svh must be float16");
  TORCH_CHECK(trellis.dim() == 3, "EXL3 reconstruct: trellis must be [I/16, O/16, 16*K], got " + dims(trellis));
  TORCH_CHECK(trellis.is_contiguous(), "EXL3 reconstruct: trellis must be contiguous");
  const int64_t in_features = trellis.size(0) * 16, out_features = trellis.size(1) * 16;
  TORCH_CHECK(suh.dim() == 1 && suh.size(0) == in_features,
              "EXL3 reconstruct: suh must be [" + num(in_features) + "], got " + dims(suh));
  TORCH_CHECK(svh.dim() == 1 && svh.size(0) == out_features,
              "EXL3 reconstruct: svh must be [" + num(out_features) + "], got " + dims(svh));
  const int64_t last = trellis.size(2);
  TORCH_CHECK(last > 0 && last % 8 == 0,
              "EXL3 reconstruct: trellis last dimension must be 16*K (or 16*K+8 for half-integer K), got " + num(last));
  const int64_t k2 = last / 8;
  const int st = exl3_recon_supports(static_cast<int>(in_features), static_cast<int>(out_features),
                                     static_cast<int>(k2), static_cast<int>(codebook));
  TORCH_CHECK(st == EXL3_OK, std::string(exl3_recon_error_string(st)) + " (layer " + num(in_features) + " x " +
                                 num(out_features) + ", " + bits_str(k2) + " bits, codebook " + num(codebook) + ")");
}

// Writes columns col0 .. col0 + out.size(-1) of each layer's W into out ([I, cols] for one layer, [E, I, cols] for
// E layers of one shape, rate and codebook; rows may be strided, e.g. a column slice of a bigger buffer, the last
// dimension must be dense). One launch per 32 layers, no sync, no allocation (graph-safe).
void reconstruct_into(std::vector<torch::Tensor> trellis, std::vector<torch::Tensor> suh, std::vector<torch::Tensor> svh,
                      int64_t codebook, torch::Tensor out, int64_t col0) {
  const int64_t n = static_cast<int64_t>(trellis.size());
  TORCH_CHECK(n >= 1 && static_cast<int64_t>(suh.size()) == n && static_cast<int64_t>(svh.size()) == n,
              "EXL3 reconstruct: one suh and one svh per trellis, at least one layer");
  for (int64_t i = 0; i < n; ++i) check_recon_layer(trellis[i], suh[i], svh[i], codebook);
  const torch::Tensor& t0 = trellis[0];
  const int64_t in_features = t0.size(0) * 16, out_features = t0.size(1) * 16, k2 = t0.size(2) / 8;
  for (int64_t i = 1; i < n; ++i)
    TORCH_CHECK(trellis[i].sizes() == t0.sizes() && trellis[i].device() == t0.device(),
                "EXL3 reconstruct: the layers of one launch must share shape, rate and device, got " + dims(t0) +
                    " and " + dims(trellis[i]));
  TORCH_CHECK(out.is_cuda() && out.device() == t0.device() && out.scalar_type() == torch::kHalf,
              "EXL3 reconstruct: out must be a float16 CUDA tensor on the trellis' device");
  TORCH_CHECK((n == 1 && out.dim() == 2) || out.dim() == 3,
              "EXL3 reconstruct: out must be [I, cols] for one layer or [layers, I, cols], got " + dims(out));
  const int64_t lead = out.dim() == 3 ? out.size(0) : 1;
  const int64_t rows = out.size(out.dim() - 2), cols = out.size(out.dim() - 1);
  TORCH_CHECK(lead == n && rows == in_features, "EXL3 reconstruct: out must be [" + std::string(n > 1 || out.dim() == 3 ? num(n) + ", " : "") +
                                                    num(in_features) + ", cols], got " + dims(out));
  TORCH_CHECK(out.stride(out.dim() - 1) == 1 && out.stride(out.dim() - 2) >= cols,
              "EXL3 reconstruct: out's rows must be dense (last stride 1), got strides of " + dims(out));
  const c10::cuda::CUDAGuard guard(t0.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  std::vector<torch::Tensor> keep;  // aligned copies live until the launch is queued
  std::vector<Exl3ReconLayer> layers(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    keep.push_back(aligned(trellis[i]));
    keep.push_back(aligned(suh[i]));
    keep.push_back(aligned(svh[i]));
    layers[i].trellis = keep[keep.size() - 3].data_ptr();
    layers[i].suh = keep[keep.size() - 2].data_ptr();
    layers[i].svh = keep[keep.size() - 1].data_ptr();
    layers[i].w = static_cast<at::Half*>(out.data_ptr()) + (out.dim() == 3 ? i * out.stride(0) : 0);
  }
  if (cols == 0) return;
  Exl3ReconParams p{};
  p.layers = layers.data();
  p.n_layers = static_cast<int>(n);
  p.in_features = static_cast<int>(in_features);
  p.out_features = static_cast<int>(out_features);
  p.k2 = static_cast<int>(k2);
  p.codebook = static_cast<int>(codebook);
  p.col0 = static_cast<int>(col0);
  p.cols = static_cast<int>(cols);
  p.ldw = out.stride(out.dim() - 2);
  const int st = exl3_recon_launch(&p, stream);
  TORCH_CHECK(st == EXL3_OK, std::string(exl3_recon_error_string(st)) + " (layer " + num(in_features) + " x " +
                                 num(out_features) + ", columns " + num(col0) + " + " + num(cols) + ")");
}

// W [I, cols] of one layer, columns col0 .. col0 + cols (cols < 0: to the end).
torch::Tensor reconstruct(torch::Tensor trellis, torch::Tensor suh, torch::Tensor svh, int64_t codebook, int64_t col0,
                          int64_t cols) {
  check_recon_layer(trellis, suh, svh, codebook);
  const int64_t in_features = trellis.size(0) * 16, out_features = trellis.size(1) * 16;
  if (cols < 0) cols = out_features - col0;
  TORCH_CHECK(col0 >= 0 && cols >= 0 && col0 % 128 == 0 && cols % 128 == 0 && col0 + cols <= out_features,
              std::string(exl3_recon_error_string(EXL3_RECON_ERR_COLUMNS)) + " (layer " + num(in_features) + " x " +
                  num(out_features) + ", columns " + num(col0) + " + " + num(cols) + ")");
  torch::Tensor w = torch::empty({in_features, cols}, suh.options());
  reconstruct_into({trellis}, {suh}, {svh}, codebook, w, col0);
  return w;
}

// Whether a layer of this shape, rate and codebook can be reconstructed (the shape rule, exl3_recon_supports).
bool recon_supports(int64_t in_features, int64_t out_features, int64_t k2, int64_t codebook) {
  return exl3_recon_supports(static_cast<int>(in_features), static_cast<int>(out_features), static_cast<int>(k2),
                             static_cast<int>(codebook)) == EXL3_OK;
}

// --- n-gram (PLE) lookup ---
// out[r] = the packed table's row rows[r] decoded to fp16, for the rows in [row_base, row_base + table.size(0));
// a sharded table is one call per shard into the same out (rows of other shards are left as they are).
void ngram_lookup(const torch::Tensor& rows, const torch::Tensor& table, int64_t row_base,
                  const torch::Tensor& head_offsets, const torch::Tensor& head_bias, const torch::Tensor& out) {
  TORCH_CHECK(rows.is_cuda() && table.is_cuda() && head_offsets.is_cuda() && head_bias.is_cuda() && out.is_cuda(),
              "n-gram lookup: rows, table, head_offsets, head_bias and out must all be CUDA tensors");
  TORCH_CHECK(rows.device() == table.device() && head_offsets.device() == table.device() &&
                  head_bias.device() == table.device() && out.device() == table.device(),
              "n-gram lookup: all tensors must be on one device");
  TORCH_CHECK(rows.scalar_type() == torch::kLong && rows.dim() == 1 && rows.is_contiguous(),
              "n-gram lookup: rows must be contiguous int64 [N], got " + dtype_name(rows) + " " + dims(rows));
  TORCH_CHECK(table.scalar_type() == torch::kShort && table.dim() == 2 && table.is_contiguous(),
              "n-gram lookup: table must be contiguous int16 [rows, words], got " + dtype_name(table) + " " + dims(table));
  TORCH_CHECK(head_offsets.scalar_type() == torch::kLong && head_offsets.dim() == 1 && head_offsets.is_contiguous(),
              "n-gram lookup: head_offsets must be contiguous int64 [heads]");
  const int64_t heads = head_offsets.size(0);
  TORCH_CHECK(head_bias.scalar_type() == torch::kHalf && head_bias.dim() == 2 && head_bias.size(0) == heads &&
                  head_bias.is_contiguous(),
              "n-gram lookup: head_bias must be contiguous float16 [" + num(heads) + ", dim], got " + dims(head_bias));
  const int64_t dim = head_bias.size(1);
  TORCH_CHECK(out.scalar_type() == torch::kHalf && out.dim() == 2 && out.size(0) == rows.size(0) &&
                  out.size(1) == dim && out.is_contiguous(),
              "n-gram lookup: out must be contiguous float16 [" + num(rows.size(0)) + ", " + num(dim) + "]");
  const c10::cuda::CUDAGuard guard(table.device());
  const int st = exl3_ngram_lookup_launch(
      rows.data_ptr<int64_t>(), rows.size(0), table.data_ptr<int16_t>(), row_base, table.size(0),
      static_cast<int>(table.size(1)), head_offsets.data_ptr<int64_t>(), static_cast<int>(heads),
      head_bias.data_ptr(), static_cast<int>(dim), out.data_ptr(), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(st == EXL3_NGRAM_OK, std::string(exl3_ngram_error_string(st)) + " (table " + dims(table) + ", dim " +
                                      num(dim) + ")");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "sparkctl EXL3 CUDA kernels";
  m.def("gemv", &gemv, "y = x . W for an EXL3 layer, 1..8 rows per launch (more rows are launched in groups of 8)",
        py::arg("x"), py::arg("trellis"), py::arg("suh"), py::arg("svh"), py::arg("codebook_id"), py::arg("workspace"),
        py::arg("ksplit") = 0);
  m.def("gemv_workspace", &gemv_workspace, "int32 elements of zeroed workspace gemv needs for this layer and rows",
        py::arg("trellis"), py::arg("rows"), py::arg("codebook_id"), py::arg("ksplit") = 0);
  m.def("gemv_ksplit", &gemv_ksplit, "the automatic split-K for a shape on the current device", py::arg("rows"),
        py::arg("in_features"), py::arg("out_features"), py::arg("k2"), py::arg("codebook_id"));
  m.def("gemv_ksplit_range", &gemv_ksplit_range, "(lo, hi): the splits a shape accepts on the current device",
        py::arg("rows"), py::arg("in_features"), py::arg("out_features"), py::arg("k2"), py::arg("codebook_id"));
  m.def("supports", &supports, "whether the GEMV takes rows (1..8) of this shape, rate and codebook", py::arg("rows"),
        py::arg("in_features"), py::arg("out_features"), py::arg("k2"), py::arg("codebook_id"));
  m.def("tuning", &tuning, "the planner's tuning (exl3_gemv.h, Exl3GemvTuning)");
  m.def("set_tuning", &set_tuning, "replace the planner's tuning", py::arg("mul1_fp16"), py::arg("i8_max_rows"),
        py::arg("xprep_min_rows"), py::arg("smem_limit"), py::arg("pdl"));
  m.def("ab_paths", []() { return exl3_gemv_ab_paths() != 0; },
        "whether this build has the A/B paths' kernels (EXL3_AB_PATHS: mul1 through the fp16 kernel, the integer "
        "kernel's x' kernel)");
  m.def("moe", &moe, "fused EXL3 MoE decode: the routed experts' weighted sum (three launches per (k2, codebook))",
        py::arg("x"), py::arg("topk_ids"), py::arg("topk_weights"), py::arg("lookup"), py::arg("table"), py::arg("sel"),
        py::arg("width"), py::arg("gated"), py::arg("act"), py::arg("gu_sels"), py::arg("down_sels"),
        py::arg("out_dtype"), py::arg("workspace"), py::arg("ksplit_gu") = 0, py::arg("ksplit_down") = 0);
  m.def("moe_workspace", &moe_workspace, "int32 elements of zeroed workspace a fused MoE call needs", py::arg("tokens"),
        py::arg("topk"), py::arg("hidden"), py::arg("width"), py::arg("gated"), py::arg("gu_sels"),
        py::arg("down_sels"), py::arg("ksplit_gu") = 0, py::arg("ksplit_down") = 0);
  m.def("moe_supports", &moe_supports, "whether the fused MoE takes experts of this shape, rate and codebook",
        py::arg("in_features"), py::arg("out_features"), py::arg("k2"), py::arg("codebook_id"));
  // --- reconstruction (prefill) ---
  m.def("reconstruct", &reconstruct, "W [I, cols] (fp16) of an EXL3 layer, columns col0 .. col0 + cols (cols -1: to the end)",
        py::arg("trellis"), py::arg("suh"), py::arg("svh"), py::arg("codebook_id"), py::arg("col0") = 0,
        py::arg("cols") = -1);
  m.def("reconstruct_into", &reconstruct_into,
        "write columns col0.. of each layer's W into out ([I, cols] or [layers, I, cols]); layers share shape and rate",
        py::arg("trellis"), py::arg("suh"), py::arg("svh"), py::arg("codebook_id"), py::arg("out"), py::arg("col0") = 0);
  m.def("recon_supports", &recon_supports, "whether a layer of this shape, rate and codebook can be reconstructed",
        py::arg("in_features"), py::arg("out_features"), py::arg("k2"), py::arg("codebook_id"));
  // --- n-gram (PLE) lookup ---
  m.def("ngram_lookup", &ngram_lookup, "decode rows of a packed n-gram (PLE) table shard into out (fp16 [N, dim])",
        py::arg("rows"), py::arg("table"), py::arg("row_base"), py::arg("head_offsets"), py::arg("head_bias"),
        py::arg("out"));
}

