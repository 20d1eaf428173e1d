// n-gram (PLE) table lookup: decode only the looked-up rows of a packed exl3_ngram_trellis table.
//
// A row is one tail-biting ring of `dim` positions over the mul1 codebook: int16 word 0 is the row's fp16 scale,
// words 1.. a little-endian bit stream whose bits [i*K, (i+1)*K) are position i's symbol. Position i's 16-bit
// state is its symbol, then the symbols of positions i-1, i-2, ... (mod dim), K bits each, truncated to 16 bits.
//   value[i] = fp16( fp32(mul1(state_i)) * fp32(scale) + fp32(head_bias[head, i]) )
// exactly as the reference (sparkctl_exl3/ngram.py: dequant_rows): the product of two fp16 values is exact in
// fp32, so fused or not, one fp32 rounding of the sum and one fp16 rounding follow, the same bits.
//
// One block per looked-up row, one thread per position: the block stages the row's words in shared memory, each
// thread cuts its own symbol, then builds its state from its neighbours' symbols. A forward pass looks up a few
// thousand rows at most, so the kernel is bound by its row reads (102 bytes at K=5), never by the decode.
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_common.cuh"
#include "exl3_ngram.h"

namespace exl3_ngram {

constexpr int kMaxWords = 1 + EXL3_NGRAM_MAX_DIM * 8 / 16;

// mul1 codebook (SPEC 2.3): hash, byte sum s, then (1024 + s) * k_inv + k_bias rounded to fp16 once. In fp32 the
// product (11 x 11 significant bits) and the sum (a multiple of 2^-18 below 16) are exact.
__device__ __forceinline__ float mul1_value(uint32_t state) {
  const uint32_t x = exl3::cb_mix<2>(state);
  const uint32_t s = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
  const float k_inv = __half2float(__ushort_as_half(exl3::kMul1InvBits));
  const float k_bias = __half2float(__ushort_as_half(exl3::kMul1BiasBits));
  return __half2float(__float2half_rn(static_cast<float>(1024u + s) * k_inv + k_bias));
}

__global__ void __launch_bounds__(EXL3_NGRAM_MAX_DIM)
    ngram_lookup_kernel(const int64_t* __restrict__ rows, int64_t n, const uint16_t* __restrict__ table,
                        int64_t row_base, int64_t table_rows, int words, int bits,
                        const int64_t* __restrict__ head_offsets, int heads, const __half* __restrict__ head_bias,
                        int dim, __half* __restrict__ out) {
  __shared__ uint16_t w[kMaxWords];
  __shared__ uint32_t sym[EXL3_NGRAM_MAX_DIM];
  const int i = threadIdx.x;
  const uint32_t mask = (1u << bits) - 1u;
  const int span = (16 + bits - 1) / bits;  // symbols that reach into a 16-bit state
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t g = rows[r];
    const int64_t local = g - row_base;
    if (local < 0 || local >= table_rows) continue;  // uniform across the block: another shard's row
    const uint16_t* src = table + local * static_cast<int64_t>(words);
    __syncthreads();  // the previous row's readers are done with w and sym
    for (int k = i; k < words; k += blockDim.x) w[k] = src[k];
    __syncthreads();
    if (i < dim) {
      const int b0 = i * bits;
      const int q = 1 + (b0 >> 4);
      const uint32_t lo = w[q];
      const uint32_t hi = (q + 1 < words) ? static_cast<uint32_t>(w[q + 1]) : 0u;
      sym[i] = ((lo | (hi << 16)) >> (b0 & 15)) & mask;
    }
    __syncthreads();
    if (i < dim) {
      uint32_t state = 0;
      for (int j = 0; j < span; ++j) {
        int p = i - j;
        if (p < 0) p += dim;
        state |= sym[p] << (j * bits);
      }
      state &= 0xFFFFu;
      int h = -1;  // searchsorted(head_offsets, g, right=True) - 1, clamped to [0, heads - 1]
      for (int k = 0; k < heads; ++k) h += head_offsets[k] <= g;
      h = h < 0 ? 0 : h;
      const float scale = __half2float(__ushort_as_half(w[0]));
      const float bias = __half2float(head_bias[static_cast<int64_t>(h) * dim + i]);
      out[r * dim + i] = __float2half_rn(__fadd_rn(__fmul_rn(mul1_value(state), scale), bias));
    }
  }
}

}  // namespace exl3_ngram

extern "C" int exl3_ngram_bits(int dim, int words) {
  if (dim < 1 || dim > EXL3_NGRAM_MAX_DIM) return 0;
  for (int k = 1; k <= 8; ++k)
    if ((dim * k) % 16 == 0 && 1 + dim * k / 16 == words) return k;
  return 0;
}

extern "C" int exl3_ngram_lookup_launch(const int64_t* rows, int64_t n, const int16_t* table, int64_t row_base,
                                        int64_t table_rows, int words, const int64_t* head_offsets, int heads,
                                        const void* head_bias, int dim, void* out, cudaStream_t stream) {
  if (dim < 1 || dim > EXL3_NGRAM_MAX_DIM) return EXL3_NGRAM_ERR_DIM;
  const int bits = exl3_ngram_bits(dim, words);
  if (bits == 0) return EXL3_NGRAM_ERR_WORDS;
  if (heads < 1) return EXL3_NGRAM_ERR_HEADS;
  if (n <= 0 || table_rows <= 0) return EXL3_NGRAM_OK;
  const int threads = (dim + 31) / 32 * 32;
  const int64_t max_grid = 1 << 20;
  const unsigned grid = static_cast<unsigned>(n < max_grid ? n : max_grid);
  exl3_ngram::ngram_lookup_kernel<<<grid, threads, 0, stream>>>(
      rows, n, reinterpret_cast<const uint16_t*>(table), row_base, table_rows, words, bits, head_offsets, heads,
      static_cast<const __half*>(head_bias), dim, static_cast<__half*>(out));
  return cudaGetLastError() == cudaSuccess ? EXL3_NGRAM_OK : EXL3_NGRAM_ERR_CUDA;
}

extern "C" const char* exl3_ngram_error_string(int status) {
  switch (status) {
    case EXL3_NGRAM_OK: return "ok";
    case EXL3_NGRAM_ERR_DIM: return "n-gram lookup: row width must be 1..256 positions";
    case EXL3_NGRAM_ERR_WORDS: return "n-gram lookup: words per row is not 1 + dim * K / 16 for any K in 1..8";
    case EXL3_NGRAM_ERR_HEADS: return "n-gram lookup: the table needs at least one hash head";
    case EXL3_NGRAM_ERR_CUDA: return "n-gram lookup: the kernel launch failed";
    default: return "n-gram lookup: unknown status";
  }
}
