// The plain (unfused) forms of the cuBLASLt epilogues that the typed GEMM (src/backend/cuda/gemm.h)
// asks for, used where no cuBLASLt algorithm takes the epilogue (shape, alignment, types) or where
// the epilogue is switched off. Each reads the GEMM's fp32 result from scratch, so that a bf16
// output is rounded once, as the epilogue rounds it. One thread per element, grid-stride.
//   gemm_store_bf16:     y = bf16(r)  or  bf16(float(y) + r)          (beta 0 or 1)
//   gemm_gelu_aux_bf16:  y = gelu_tanh(r), aux = r                    (GELU_AUX_BIAS)
//   gemm_dgelu_aux_bf16: d = r * gelu_tanh'(float(aux))               (DGELU)
//   gemm_colsum_bf16:    dbias += column sums of a bf16 matrix        (BGRADA / BGRADB)
// GELU is the tanh form, cuBLASLt's (gelu_math.cuh).
#include <cuda_bf16.h>

#include "bf16_io.cuh"
#include "common.cuh"
#include "gelu_math.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

template <typename T>
__device__ __forceinline__ float load(const T* p, size_t i) { return to_f(p[i]); }
template <typename T>
__device__ __forceinline__ void store(T* p, size_t i, float v) { put_f(p[i], v); }

__global__ void store_bf16_k(__nv_bfloat16* __restrict__ y, const float* __restrict__ r, size_t n,
                             bool accumulate) {
  GRID_STRIDE(i, n) {
    const float v = accumulate ? __bfloat162float(y[i]) + r[i] : r[i];
    y[i] = __float2bfloat16_rn(v);
  }
}

template <typename T>
__global__ void gelu_aux_k(T* __restrict__ y, T* __restrict__ aux, const float* __restrict__ r,
                           size_t n) {
  GRID_STRIDE(i, n) {
    const float x = r[i];
    store(aux, i, x);
    store(y, i, gelu_f<true>(x));
  }
}

template <typename T>
__global__ void dgelu_aux_k(T* __restrict__ d, const float* __restrict__ r, const T* __restrict__ aux,
                            size_t n) {
  GRID_STRIDE(i, n) {
    const float x = load(aux, i);
    store(d, i, r[i] * gelu_grad_f<true>(x));
  }
}

// partial[chunk, c] = sum of x[m, c] over the chunk's kColsumChunk rows, in row order (one thread a
// column; neighbouring threads read neighbouring columns)
__global__ void colsum_partial_bf16_k(float* __restrict__ partial, const __nv_bfloat16* __restrict__ x,
                                      int M, int N) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= N) return;
  const int m0 = blockIdx.y * kColsumChunk;
  const int m1 = min(M, m0 + kColsumChunk);
  float acc = 0.f;
  for (int m = m0; m < m1; ++m) acc += __bfloat162float(x[(size_t)m * N + c]);
  partial[(size_t)blockIdx.y * N + c] = acc;
}

}  // namespace

cudaError_t gemm_colsum_bf16(float* dst, const void* x, int M, int N, void* ws, cudaStream_t s) {
  if (M <= 0 || N <= 0) return cudaGetLastError();
  const int nchunks = (M + kColsumChunk - 1) / kColsumChunk;
  float* partial = static_cast<float*>(ws);
  colsum_partial_bf16_k<<<dim3((N + kThreads - 1) / kThreads, nchunks), kThreads, 0, s>>>(
      partial, static_cast<const __nv_bfloat16*>(x), M, N);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return colsum_finish(dst, partial, nchunks, N, s);
}

cudaError_t gemm_store_bf16(void* y, const float* r, size_t n, bool accumulate,
                            cudaStream_t s) {
  if (n)
    store_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(y), r, n,
                                                             accumulate);
  return cudaGetLastError();
}

cudaError_t gemm_gelu_aux_bf16(void* y, void* aux, const float* r, size_t n, bool bf16,
                               cudaStream_t s) {
  if (!n) return cudaGetLastError();
  if (bf16)
    gelu_aux_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<__nv_bfloat16*>(y), static_cast<__nv_bfloat16*>(aux), r, n);
  else
    gelu_aux_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<float*>(y),
                                                           static_cast<float*>(aux), r, n);
  return cudaGetLastError();
}

cudaError_t gemm_dgelu_aux_bf16(void* d, const float* r, const void* aux, size_t n, bool bf16,
                                cudaStream_t s) {
  if (!n) return cudaGetLastError();
  if (bf16)
    dgelu_aux_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<__nv_bfloat16*>(d), r, static_cast<const __nv_bfloat16*>(aux), n);
  else
    dgelu_aux_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<float*>(d), r,
                                                            static_cast<const float*>(aux), n);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
