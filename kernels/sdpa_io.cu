// Glue kernels of the cuDNN fused-attention path (src/backend/cuda/attention_cudnn.cpp): the key
// padding mask as an additive bias plus each sequence's first unmasked key, the output and incoming
// gradient conversions that zero the query rows whose keys are all masked, and the Philox seed/offset
// pair cuDNN's dropout reads from device memory.
//
// A query row (b, i) is dead when no key is visible to it: first[b] > i under the causal mask, or
// first[b] == T (every key of sequence b masked) without it. cuDNN would give such a row the uniform
// average of the (all masked) keys; the native path gives zeros, and so do these conversions
// (out = 0; dO = 0, which makes every gradient contribution of the row zero).
#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kThreads = 256;
constexpr float kMaskedBias = -1e9f;  // finite: exp underflows to 0, no inf - inf = NaN in the softmax

#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// bias[B, rows, ld] (bf16) for j < T: 0 where query r sees key j, kMaskedBias where not, by backend.h's
// segment rule (key j real, and query r padding or of j's segment); rows == 1 (one row broadcast over
// the queries): the key padding rule, as for a padding query. For a 0/1 mask the two agree, so a
// materialised bias (rows == T) serves key padding and packed rows alike. 0 in the padding columns
// j >= T (never read: the tensor's logical width is T).
__global__ void mask_bias_k(__nv_bfloat16* __restrict__ bias, const int32_t* __restrict__ mask,
                            int T, int rows, int ld, size_t n) {
  GRID_STRIDE(i, n) {
    const int j = int(i % ld);
    const size_t b = i / (size_t(ld) * rows);
    const int r = int((i / ld) % rows);
    float v = 0.0f;
    if (j < T) {
      const int32_t sj = mask[b * T + j], si = rows == T ? mask[b * T + r] : 0;
      v = (sj != 0 && (si == 0 || si == sj)) ? 0.0f : kMaskedBias;
    }
    bias[i] = __float2bfloat16_rn(v);
  }
}

// first[b] = min { j : mask[b, j] != 0 }, T when none; one block per sequence b
__global__ void first_key_k(int32_t* __restrict__ first, const int32_t* __restrict__ mask, int T) {
  __shared__ int m;
  if (threadIdx.x == 0) m = T;
  __syncthreads();
  const int32_t* row = mask + size_t(blockIdx.x) * T;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    if (row[j] != 0) atomicMin(&m, j);  // integer min: the same result in any order
  __syncthreads();
  if (threadIdx.x == 0) first[blockIdx.x] = m;
}

__device__ __forceinline__ bool dead_row(const int32_t* first, bool causal, int T, size_t row) {
  const int b = int(row / T), i = int(row % T);
  return first[b] > (causal ? i : T - 1);
}

// out[B,T,C] = dead(b,t) ? 0 : float(o[b,t,c])
__global__ void out_from_bf16_k(float* __restrict__ out, const __nv_bfloat16* __restrict__ o,
                                const int32_t* __restrict__ first, bool causal, int T, int C,
                                size_t n) {
  GRID_STRIDE(i, n) out[i] = dead_row(first, causal, T, i / C) ? 0.0f : __bfloat162float(o[i]);
}

// dst[B,T,C] = dead(b,t) ? 0 : bf16(dout[b,t,c])
__global__ void dout_to_bf16_k(__nv_bfloat16* __restrict__ dst, const float* __restrict__ dout,
                               const int32_t* __restrict__ first, bool causal, int T, int C,
                               size_t n) {
  GRID_STRIDE(i, n) {
    const float v = dead_row(first, causal, T, i / C) ? 0.0f : dout[i];
    dst[i] = __float2bfloat16_rn(v);
  }
}

__global__ void philox_args_k(int64_t* dst, int64_t seed, int64_t offset) {
  dst[0] = seed;
  dst[1] = offset;
}

}  // namespace

cudaError_t sdpa_mask_bias(void* bias, int32_t* first, const int32_t* mask, int B, int T, int rows,
                           int ld, cudaStream_t s) {
  if (B <= 0 || T <= 0) return cudaSuccess;
  const size_t n = size_t(B) * rows * ld;
  mask_bias_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(bias), mask, T,
                                                         rows, ld, n);
  first_key_k<<<B, kThreads, 0, s>>>(first, mask, T);
  return cudaGetLastError();
}

cudaError_t sdpa_out_from_bf16(float* out, const void* o, const int32_t* first, bool causal, int B,
                               int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (!first) return from_bf16(out, o, n, s);
  if (n)
    out_from_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        out, static_cast<const __nv_bfloat16*>(o), first, causal, T, C, n);
  return cudaGetLastError();
}

cudaError_t sdpa_dout_to_bf16(void* dst, const float* dout, const int32_t* first, bool causal,
                              int B, int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (!first) return to_bf16(dst, dout, n, s);
  if (n)
    dout_to_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst),
                                                              dout, first, causal, T, C, n);
  return cudaGetLastError();
}

cudaError_t sdpa_philox_args(int64_t* dst, uint64_t seed, uint64_t offset, cudaStream_t s) {
  philox_args_k<<<1, 1, 0, s>>>(dst, static_cast<int64_t>(seed), static_cast<int64_t>(offset));
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
