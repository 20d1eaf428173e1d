// C ABI of the n-gram (PLE) table lookup (kernels/csrc/exl3_ngram.cu).
//
// The table stays packed on the device (exllamav3's exl3_ngram_trellis rows, see sparkctl_exl3/ngram.py for the
// format); a lookup decodes only the rows asked for. Plain C so the kernel builds with nvcc alone (`make kernels`).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum Exl3NgramStatus {
  EXL3_NGRAM_OK = 0,
  EXL3_NGRAM_ERR_DIM = 1,    // row width outside 1..EXL3_NGRAM_MAX_DIM
  EXL3_NGRAM_ERR_WORDS = 2,  // words per row is not 1 + dim * K / 16 for a K in 1..8
  EXL3_NGRAM_ERR_HEADS = 3,  // no hash head
  EXL3_NGRAM_ERR_CUDA = 4,   // the launch failed (cudaGetLastError)
};

#define EXL3_NGRAM_MAX_DIM 256

// K (bits per position) of a row of `words` int16 for `dim` positions, or 0 when no K in 1..8 fits.
int exl3_ngram_bits(int dim, int words);

// out[r, :] = fp16 row rows[r] of the table, for every r whose global row lies in [row_base, row_base + table_rows)
// (one launch per shard of a sharded table; rows outside are left untouched). Decoding: see exl3_ngram.cu.
//   rows         int64 [n] global row indices (device)
//   table        int16 [table_rows, words] packed rows (device, contiguous)
//   head_offsets int64 [heads] ascending starts of each hash head's rows (device)
//   head_bias    fp16 [heads, dim] (device)
//   out          fp16 [n, dim] (device)
int exl3_ngram_lookup_launch(const int64_t* rows, int64_t n, const int16_t* table, int64_t row_base,
                             int64_t table_rows, int words, const int64_t* head_offsets, int heads,
                             const void* head_bias, int dim, void* out, cudaStream_t stream);

const char* exl3_ngram_error_string(int status);

#ifdef __cplusplus
}
#endif
