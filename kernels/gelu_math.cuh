// GELU and its derivative for one fp32 value, both forms (device code: include from .cu files only),
// shared by the bf16-storage kernels (bf16_elementwise.cu) and the GEMM epilogues' fallbacks
// (gemm_epilogue.cu); kernels/gelu.cu, the fp32 kernels every GPU run verified, writes the same
// formulas inline.
//   Tanh (HF gelu_new, GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//     derivative: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(...)
//   Erf  (exact, BERT):        0.5 x (1 + erf(x / sqrt(2)))
//     derivative: 0.5 (1 + erf(x / sqrt(2))) + x exp(-x^2 / 2) / sqrt(2 pi)
#pragma once
#include <cuda_runtime.h>

namespace nlp {
namespace kern {

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluInvSqrt2 = 0.7071067811865476f;
constexpr float kGeluInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCoef = 0.044715f;

template <bool kTanh>
__device__ __forceinline__ float gelu_f(float x) {
  if (kTanh) return 0.5f * x * (1.0f + tanhf(kGeluSqrt2OverPi * (x + kGeluCoef * x * x * x)));
  return 0.5f * x * (1.0f + erff(x * kGeluInvSqrt2));
}

template <bool kTanh>
__device__ __forceinline__ float gelu_grad_f(float x) {
  if (kTanh) {
    const float t = tanhf(kGeluSqrt2OverPi * (x + kGeluCoef * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * x * x);
  }
  return 0.5f * (1.0f + erff(x * kGeluInvSqrt2)) + x * expf(-0.5f * x * x) * kGeluInvSqrt2Pi;
}

}  // namespace kern
}  // namespace nlp
