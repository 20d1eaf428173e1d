// C ABI of the EXL3 GEMV kernel (kernels/csrc/exl3_gemv.cu).
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

// Fills *ksplit (the split that will be used: p->ksplit if non-zero, else the automatic choice for the current
// device), *partial_floats (fp32 scratch elements the caller must provide in p->partials), *xprep_halfs (fp16
// scratch for the input transform done once per call, used from SPARKCTL_EXL3_XPREP_MIN_ROWS rows on, default 2;
// 0 = the transform is fused into every block) and *workspace_ints (the int32 elements of the zeroed workspace
// p->counters: a split-K counter per column chunk, then the slots of the ticket or fixed-point hand-over when the
// call uses one; a workspace sized for a bigger call serves a smaller one).
int exl3_gemv_plan(const Exl3GemvParams* p, int* ksplit, size_t* partial_floats, size_t* xprep_halfs,
                   size_t* workspace_ints);

// Launches the kernel on `stream`. Returns EXL3_OK or an Exl3GemvStatus code.
int exl3_gemv_launch(const Exl3GemvParams* p, cudaStream_t stream);

// A one-line description of a status code, including the last CUDA error for EXL3_ERR_CUDA.
const char* exl3_gemv_error_string(int status);

#ifdef __cplusplus
}
#endif
