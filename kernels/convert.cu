// bf16 -> fp32 conversions for buffers that a bf16 library call (cuDNN's fused attention) produced:
// a plain copy and an accumulation into an fp32 gradient (backward ops accumulate). The fp32 -> bf16
// direction is to_bf16 in elementwise.cu. One thread per element, grid-stride.
#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

// dst[n] = float(src[n])
__global__ void from_bf16_k(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}

// dst[n] += float(src[n])
__global__ void accumulate_bf16_k(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src,
                                  size_t n) {
  GRID_STRIDE(i, n) dst[i] += __bfloat162float(src[i]);
}

}  // namespace

cudaError_t from_bf16(float* dst, const void* src, size_t n, cudaStream_t s) {
  if (n)
    from_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        dst, static_cast<const __nv_bfloat16*>(src), n);
  return cudaGetLastError();
}

cudaError_t accumulate_bf16(float* dst, const void* src, size_t n, cudaStream_t s) {
  if (n)
    accumulate_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        dst, static_cast<const __nv_bfloat16*>(src), n);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
