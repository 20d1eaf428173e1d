// C ABI of the EXL3 weight reconstruction (kernels/csrc/exl3_recon.cu): W = diag(suh) . H . W_hat . H . diag(svh)
// (SPEC 4) into a dense fp16 [I, O] buffer, the first half of the prefill path (reconstruct, then an fp16 GEMM).
//
// Plain C for the same reason as exl3_gemv.h: the .cu files build with nvcc alone (no torch headers), so
// `make kernels` and CI check them on a machine without torch's CUDA build.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#include "exl3_gemv.h"  // the status codes (Exl3GemvStatus) and the one shape rule (exl3_gemv_supports)

#ifdef __cplusplus
extern "C" {
#endif

// The reconstruction's own status code, past the GEMV's (Exl3GemvStatus): a column range or row stride out of range,
// or no layers.
enum { EXL3_RECON_ERR_COLUMNS = 32 };

// One layer of a launch. Every layer of one launch shares I, O, the rate and the codebook (a grouped launch of a
// MoE layer's experts sorts them into such groups on the host).
typedef struct Exl3ReconLayer {
  const void* trellis;  // int16 [I/16, O/16, 8*k2], contiguous, 16-byte aligned
  const void* suh;      // fp16 [I]
  const void* svh;      // fp16 [O], 4-byte aligned
  void* w;              // fp16 output: element (k, j) at w[k * ldw + j] is W[k][col0 + j], j < cols; 4-byte aligned
} Exl3ReconLayer;

typedef struct Exl3ReconParams {
  const Exl3ReconLayer* layers;  // host array of n_layers entries (copied into the launch's arguments)
  int n_layers;                  // >= 1
  int in_features;               // I, multiple of 128
  int out_features;              // O, multiple of 128
  int k2;                        // twice the bits per weight (2..16, or 3, 5, 7 with mul1)
  int codebook;                  // 0 = 3INST, 1 = MCG, 2 = mul1
  int col0;                      // first column of W written (multiple of 128; 0 for the whole weight)
  int cols;                      // columns written (multiple of 128, col0 + cols <= O; O for the whole weight)
  long long ldw;                 // row stride of every w, in elements (even, >= cols)
} Exl3ReconParams;

// Whether a layer of this shape, rate and codebook can be reconstructed: the GEMV's shape rule with one row
// (I and O positive multiples of 128, a codebook 0..2, a compiled rate; half-integer rates with mul1 only), so the
// two paths take exactly the same layers. Returns EXL3_OK or the status saying why not.
int exl3_recon_supports(int in_features, int out_features, int k2, int codebook);

// Launches the reconstruction of every layer (in launches of at most 32 layers) on `stream`. No host sync, no
// device allocation, no cooperative launch: safe inside a CUDA graph capture. Returns EXL3_OK or a status code.
int exl3_recon_launch(const Exl3ReconParams* p, cudaStream_t stream);

// A one-line description of a status code, including the last CUDA error for EXL3_ERR_CUDA.
const char* exl3_recon_error_string(int status);

#ifdef __cplusplus
}
#endif
