// GELU, both forms:
//   Tanh (HF gelu_new): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   Erf  (exact):       0.5 x (1 + erf(x / sqrt(2)))
#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace nlp::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kCoef = 0.044715f;
constexpr size_t kParallelMin = 1 << 14;
}  // namespace

// out[N] = gelu(inp[N])
void gelu_forward(float* out, const float* inp, size_t N, Gelu form) {
  if (form == Gelu::Tanh) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCoef * x * x * x)));
    }
  } else {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
    }
  }
}

// dinp[N] += gelu'(inp) * dout
//   Tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(...)
//   Erf:  0.5 (1 + erf(x/sqrt2)) + x exp(-x^2/2) / sqrt(2 pi)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, Gelu form) {
  if (form == Gelu::Tanh) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      const float t = std::tanh(kSqrt2OverPi * (x + kCoef * x * x * x));
      const float d = 0.5f * (1.0f + t) +
                      0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCoef * x * x);
      dinp[i] += d * dout[i];
    }
  } else {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      const float d = 0.5f * (1.0f + std::erf(x * kInvSqrt2)) + x * std::exp(-0.5f * x * x) * kInvSqrt2Pi;
      dinp[i] += d * dout[i];
    }
  }
}

}  // namespace nlp::cpu
