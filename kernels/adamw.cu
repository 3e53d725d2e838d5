// AdamW step (torch.optim.AdamW semantics) on one tensor, one thread per element:
//   g = grad * grad_scale;  p *= decay (= 1 - lr*wd);  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps),  step_size = lr / (1 - b1^t)
// The bias corrections are computed on the host in double (CudaBackend::adamw_update), exactly as
// the CPU backend does; the per-element arithmetic is the CPU's, in float (adamw_elem).
#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

// The per-element update of both kernels below, in the CPU backend's order of operations, with no
// fused multiply-add: the __f*_rn intrinsics are never contracted, and their division and square root
// are correctly rounded. Left to itself nvcc contracted the expressions differently in the two
// kernels, and the spans kernel differed from the per-tensor one in the last bit (the H200 run of
// 2026-11-28). (The CPU's loop is contracted by GCC where the host has FMA, so the two backends agree
// to rounding, not bitwise.)
// p16 (nullable): also the updated weight rounded to bf16 (to nearest even), in the same pass: the
// persistent bf16 copy of the weights (core/backend.h register_weights).
__device__ __forceinline__ void adamw_elem(float* __restrict__ param, const float* __restrict__ grad,
                                           float* __restrict__ m, float* __restrict__ v,
                                           __nv_bfloat16* __restrict__ p16, size_t i,
                                           float step_size, float bc2_sqrt, float decay, float beta1,
                                           float beta2, float eps, float grad_scale) {
  const float omb1 = __fsub_rn(1.0f, beta1), omb2 = __fsub_rn(1.0f, beta2);
  const float g = __fmul_rn(grad[i], grad_scale);
  const float p = __fmul_rn(param[i], decay);
  const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(omb1, g));
  const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(omb2, g), g));
  m[i] = mi;
  v[i] = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
  const float pn = __fsub_rn(p, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
  param[i] = pn;
  if (p16) p16[i] = __float2bfloat16_rn(pn);
}

__global__ void adamw_k(float* __restrict__ param, const float* __restrict__ grad,
                        float* __restrict__ m, float* __restrict__ v, __nv_bfloat16* __restrict__ p16,
                        size_t n, float step_size,
                        float bc2_sqrt, float decay, float beta1, float beta2, float eps,
                        float grad_scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    adamw_elem(param, grad, m, v, p16, i, step_size, bc2_sqrt, decay, beta1, beta2, eps, grad_scale);
}

// One launch over many tensors: each element finds its span by binary search over the span ends
// (a few hundred, cached in L1), then does adamw_elem's arithmetic with its span's decay factor.
__global__ void adamw_spans_k(float* __restrict__ param, const float* __restrict__ grad,
                              float* __restrict__ m, float* __restrict__ v,
                              __nv_bfloat16* __restrict__ p16, const uint64_t* __restrict__ start, const uint64_t* __restrict__ end,
                              const uint8_t* __restrict__ decays, int nspans, size_t n,
                              float step_size, float bc2_sqrt, float decay_on, float decay_off,
                              float beta1, float beta2, float eps, float grad_scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int lo = 0, hi = nspans - 1;  // first span with end > i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (end[mid] > i) hi = mid;
      else lo = mid + 1;
    }
    if (i < start[lo] || i >= end[lo]) continue;  // an alignment gap between tensors
    adamw_elem(param, grad, m, v, p16, i, step_size, bc2_sqrt, decays[lo] ? decay_on : decay_off, beta1,
               beta2, eps, grad_scale);
  }
}

}  // namespace

cudaError_t adamw_update_spans(float* param, const float* grad, float* m, float* v,
                               const uint64_t* start, const uint64_t* end, const uint8_t* decays,
                               int nspans, size_t n_total, float step_size, float bc2_sqrt,
                               float decay_on, float decay_off, float beta1, float beta2,
                               float eps, float grad_scale, cudaStream_t s, void* bf16_param) {
  if (n_total && nspans > 0)
    adamw_spans_k<<<grid_for(n_total, 256), 256, 0, s>>>(param, grad, m, v,
                                                         static_cast<__nv_bfloat16*>(bf16_param),
                                                         start, end, decays,
                                                         nspans, n_total, step_size, bc2_sqrt,
                                                         decay_on, decay_off, beta1, beta2, eps,
                                                         grad_scale);
  return cudaGetLastError();
}

cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                         float step_size, float bc2_sqrt, float decay, float beta1, float beta2,
                         float eps, float grad_scale, cudaStream_t s, void* bf16_param) {
  if (n)
    adamw_k<<<grid_for(n, 256), 256, 0, s>>>(param, grad, m, v,
                                             static_cast<__nv_bfloat16*>(bf16_param), n, step_size,
                                             bc2_sqrt, decay,
                                             beta1, beta2, eps, grad_scale);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
