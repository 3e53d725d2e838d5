// GELU, both forms, forward and backward (one thread per element):
//   Tanh (HF gelu_new, GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   Erf  (exact, BERT):        0.5 x (1 + erf(x / sqrt(2)))
// out[N] = gelu(inp[N]);  dinp[N] += gelu'(inp) * dout[N]
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kCoef = 0.044715f;

template <bool kTanh>
__global__ void gelu_fwd_k(float* __restrict__ out, const float* __restrict__ inp, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float x = inp[i];
    if (kTanh)
      out[i] = 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCoef * x * x * x)));
    else
      out[i] = 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  }
}

// Tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(...)
// Erf:  0.5 (1 + erf(x/sqrt2)) + x exp(-x^2/2) / sqrt(2 pi)
template <bool kTanh>
__global__ void gelu_bwd_k(float* __restrict__ dinp, const float* __restrict__ inp,
                           const float* __restrict__ dout, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float x = inp[i];
    float d;
    if (kTanh) {
      const float t = tanhf(kSqrt2OverPi * (x + kCoef * x * x * x));
      d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCoef * x * x);
    } else {
      d = 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * expf(-0.5f * x * x) * kInvSqrt2Pi;
    }
    dinp[i] += d * dout[i];
  }
}

}  // namespace

cudaError_t gelu_forward(float* out, const float* inp, size_t n, bool tanh_form, cudaStream_t s) {
  if (!n) return cudaGetLastError();
  if (tanh_form)
    gelu_fwd_k<true><<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, n);
  else
    gelu_fwd_k<false><<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                          bool tanh_form, cudaStream_t s) {
  if (!n) return cudaGetLastError();
  if (tanh_form)
    gelu_bwd_k<true><<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n);
  else
    gelu_bwd_k<false><<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
