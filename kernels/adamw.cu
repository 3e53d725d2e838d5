// AdamW step (torch.optim.AdamW semantics) on one tensor, one thread per element:
//   g = grad * grad_scale;  p *= decay (= 1 - lr*wd);  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps),  step_size = lr / (1 - b1^t)
// The bias corrections are computed on the host in double (CudaBackend::adamw_update), exactly as
// the CPU backend does; the per-element arithmetic is the CPU's, in float.
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

__global__ void adamw_k(float* __restrict__ param, const float* __restrict__ grad,
                        float* __restrict__ m, float* __restrict__ v, size_t n, float step_size,
                        float bc2_sqrt, float decay, float beta1, float beta2, float eps,
                        float grad_scale) {
  const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float g = grad[i] * grad_scale;
    float p = param[i] * decay;
    const float mi = beta1 * m[i] + omb1 * g;
    const float vi = beta2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    p -= step_size * (mi / denom);
    param[i] = p;
  }
}

}  // namespace

cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                         float step_size, float bc2_sqrt, float decay, float beta1, float beta2,
                         float eps, float grad_scale, cudaStream_t s) {
  if (n)
    adamw_k<<<grid_for(n, 256), 256, 0, s>>>(param, grad, m, v, n, step_size, bc2_sqrt, decay,
                                             beta1, beta2, eps, grad_scale);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
