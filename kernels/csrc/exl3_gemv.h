// C ABI of the EXL3 GEMV and fused MoE (the planner kernels/csrc/exl3_plan.cu; the kernels exl3_gemv.cu, exl3_gemv_i8.cu, exl3_moe.cuh).
//
// Why a plain C interface: the .cu files must compile with nvcc alone (no torch headers) so that `make kernels`
// and CI can build and check them on a machine without torch's CUDA build; the torch binding (bindings.cpp) is a
// thin layer over these calls.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Error codes returned by the launcher; exl3_gemv_error_string() turns one into a sentence.
enum Exl3GemvStatus {
  EXL3_OK = 0,
  EXL3_ERR_ROWS = 1,       // m outside 1..8
  EXL3_ERR_SHAPE = 2,      // I or O not a positive multiple of 128
  EXL3_ERR_BITS = 3,       // k2 (twice the bits per weight) not a compiled rate
  EXL3_ERR_CODEBOOK = 4,   // codebook id not 0, 1 or 2, or a half-integer rate with a codebook other than mul1
  EXL3_ERR_KSPLIT = 5,     // ksplit outside the valid range for this shape
  EXL3_ERR_ALIGN = 6,      // a pointer not aligned to 16 bytes
  EXL3_ERR_CUDA = 7,       // a CUDA runtime call failed (see exl3_gemv_last_cuda_error)
  EXL3_ERR_MOE_CODEBOOK = 8,  // the fused MoE takes mul1 experts only
  EXL3_ERR_AB_PATH = 9,    // the tuning asks for an A/B path this build leaves out (see exl3_gemv_ab_paths)
};

// One GEMV call: y[m, O] = x[m, I] . W, W = diag(suh) . H . W_hat(trellis) . H . diag(svh) (SPEC 4).
typedef struct Exl3GemvParams {
  const void* x;        // fp16 [m, I], row-major, contiguous
  const void* trellis;  // int16 [I/16, O/16, 8*k2], contiguous
  const void* suh;      // fp16 [I]
  const void* svh;      // fp16 [O]
  void* y;              // fp16 [m, O], row-major, contiguous (fully overwritten)
  float* partials;      // fp32 scratch, exl3_gemv_plan()'s partial_floats elements (may be NULL when that is 0)
  int* counters;        // int32 workspace of exl3_gemv_plan()'s workspace_ints, 16-byte aligned, all zero before the
                        // first call; the kernel leaves it zero again, so it can serve every later call on a stream
  void* xprep;          // fp16 scratch of exl3_gemv_plan()'s xprep_halfs elements (may be NULL when that is 0)
  int m;                // rows, 1..8
  int in_features;      // I, multiple of 128
  int out_features;     // O, multiple of 128
  int k2;               // twice the bits per weight: 2..16 (even = integer K), or 3, 5, 7 (1.5, 2.5, 3.5 bpw; mul1 only)
  int codebook;         // 0 = 3INST, 1 = MCG, 2 = mul1
  int ksplit;           // number of slices of the input dimension; 0 = choose automatically
} Exl3GemvParams;

// The one shape rule: EXL3_OK when a launch of m rows of this layer is supported (m 1..8, I and O positive
// multiples of 128, a codebook 0..2, a compiled rate; half-integer rates with mul1 only), else the status saying
// why. The torch binding, the torch ops and the bench all ask this, so the rule is written once.
int exl3_gemv_supports(int m, int in_features, int out_features, int k2, int codebook);

// The planner's tuning, one per process: the defaults below, overridden once by the environment on first use
// (SPARKCTL_EXL3_MUL1_PATH=fp16, SPARKCTL_EXL3_I8_MAX_ROWS, SPARKCTL_EXL3_XPREP_MIN_ROWS, SPARKCTL_EXL3_SMEM_LIMIT,
// SPARKCTL_EXL3_NO_PDL=1), afterwards only by exl3_gemv_set_tuning. The defaults are the measured fastest; the
// others are check and A/B paths. Two of those need kernels only a bench build compiles (EXL3_AB_PATHS): mul1
// through the fp16 kernel (mul1_fp16, or i8_max_rows below the rows of a call) and the integer kernel's x' kernel
// (xprep_min_rows > 0 for a mul1 call); in the product build a call planned onto them returns EXL3_ERR_AB_PATH.
typedef struct Exl3GemvTuning {
  int mul1_fp16;       // 1: mul1 through the fp16 kernel instead of the integer kernel (default 0)
  int i8_max_rows;     // most rows mul1 takes through the integer kernel (default 8)
  int xprep_min_rows;  // > 0: x' prepared once per call by its own kernel from this many rows on, in both kernels;
                       // 0 (default): from 2 rows in the fp16 kernel, never in the integer kernel
  int smem_limit;      // > 0: bytes of shared memory per block the planner may use when below the device's (a big
                       // GPU checking a small GPU's plans); 0 (default): the device's
  int pdl;             // 1 (default): programmatic dependent launch on sm_90+; 0: plain launches
} Exl3GemvTuning;
void exl3_gemv_get_tuning(Exl3GemvTuning* t);
void exl3_gemv_set_tuning(const Exl3GemvTuning* t);
// 1 when this build has the A/B paths' kernels (compiled with EXL3_AB_PATHS), else 0.
int exl3_gemv_ab_paths(void);

// Fills *ksplit (the split that will be used: p->ksplit if non-zero, else the automatic choice for the current
// device), *partial_floats (fp32 scratch elements the caller must provide in p->partials), *xprep_halfs (fp16
// scratch for the input transform done once per call; 0 = the transform is fused into the GEMV, see the tuning's
// xprep_min_rows) and *workspace_ints (the int32 elements of the zeroed workspace p->counters: a split-K counter per
// column chunk, then the slots of the ticket or fixed-point hand-over when the call uses one; a workspace sized for
// a bigger call serves a smaller one).
int exl3_gemv_plan(const Exl3GemvParams* p, int* ksplit, size_t* partial_floats, size_t* xprep_halfs,
                   size_t* workspace_ints);

// The splits this call accepts (p->ksplit is ignored): *lo (blocks must fit the device's shared memory and take at
// most 16, or 32 in the integer kernel, chunks of 128 inputs) to *hi (the number of chunks, or 255 for 1-2 rows of
// mul1).
int exl3_gemv_ksplit_range(const Exl3GemvParams* p, int* lo, int* hi);

// Launches the kernel on `stream`. Returns EXL3_OK or an Exl3GemvStatus code.
int exl3_gemv_launch(const Exl3GemvParams* p, cudaStream_t stream);

// ----- Fused MoE decode: only the routed experts, no host synchronisation ---------------------------------------
//
// One launch computes one projection (or gate and up together) of every routed (token, slot) pair as a one-row GEMV
// of that slot's expert, found on the device through the routing ids and a table of expert pointers; a second one
// does the down projection with act(gate) * up made as its input is loaded; a third (exl3_moe_reduce_launch) sums
// each token's slots weighted by the router. Experts of a projection may differ in K: a launch runs the experts of
// one (k2, codebook) pair (`sel`) and its blocks for other experts return at once, so a layer of uniform K takes three
// launches. Blocks are (O / 128) x ksplit x (slots * nproj); every launch is CUDA-graph capturable.
typedef struct Exl3MoeTable {
  const void* trellis;  // int16 [I/16, O/16, 8*k2]
  const void* suh;      // fp16 [I]
  const void* svh;      // fp16 [O]
} Exl3MoeTable;

typedef struct Exl3MoeParams {
  const void* x;        // fp16 input rows: slot s reads row s / x_div at x + row * x_stride halves
  int x_div, x_stride;
  const int* ids;       // int32 [slots]: the global expert id of each slot (token-major: slot = token * topk + j)
  const int* lookup;    // int32 [n_global]: global id -> local expert, -1 = not held here; NULL: the id is local
  int n_global, n_local;
  const Exl3MoeTable* table;  // device [n_local][table_stride]: this launch's projections at proj0, proj0 + 1, ..
  const int* sel_of;          // device [n_local][table_stride]: 4 * k2 + codebook of each entry
  int table_stride, proj0;
  int nproj;            // projections per slot in this launch: z = slot * nproj + proj, y row z
  int slots;
  void* y;              // fp16 [slots * nproj, O]
  int* counters;        // zeroed int32 workspace, exl3_moe_plan's workspace_ints (left zero, as the GEMV's)
  float* partials;      // fp32 scratch, exl3_moe_plan's partial_floats (may be NULL when that is 0)
  int in_features, out_features;
  int k2, codebook;     // the (k2, codebook) this launch runs (sel = 4 * k2 + codebook)
  int act_in;           // -1: x is the input as it is; else the down projection's activation, see EXL3_MOE_ACT_*
  int ksplit;           // 0 = automatic (chosen for slots * nproj GEMVs at once)
} Exl3MoeParams;

enum { EXL3_MOE_ACT_SILU = 0, EXL3_MOE_ACT_GELU = 1, EXL3_MOE_ACT_GELU_TANH = 2, EXL3_MOE_GATED = 4 };

// EXL3_OK when the fused MoE takes this (k2, codebook) and shape (today: the mul1 codebook, every rate, which every
// exllamav3 model since 1.0 uses; others take the per-expert path), else why not.
int exl3_moe_supports(int in_features, int out_features, int k2, int codebook);
int exl3_moe_plan(const Exl3MoeParams* p, int* ksplit, size_t* partial_floats, size_t* workspace_ints);
int exl3_moe_launch(const Exl3MoeParams* p, cudaStream_t stream);

// out[t, n] = sum_j w[t, j] * y[t * topk + j, n] over the slots whose expert is held (lookup >= 0), in slot order,
// in fp32; out_dtype 0 = fp16, 1 = bf16, 2 = fp32.
int exl3_moe_reduce_launch(const void* y, const int* ids, const int* lookup, int n_global, int n_local,
                           const float* weights, int tokens, int topk, int hidden, void* out, int out_dtype,
                           cudaStream_t stream);

// A one-line description of a status code, including the last CUDA error for EXL3_ERR_CUDA.
const char* exl3_gemv_error_string(int status);

#ifdef __cplusplus
}
#endif
