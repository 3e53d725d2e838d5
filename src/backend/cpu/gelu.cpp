// GELU, both forms:
//   Tanh (HF gelu_new): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   Erf  (exact):       0.5 x (1 + erf(x / sqrt(2)))
#include <cmath>

#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/staged.h"
#include "backend/cpu/vmath.h"

namespace nlp::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kCoef = 0.044715f;
constexpr size_t kParallelMin = 1 << 14;

// Erf form, vectorisable: with z = x/sqrt2, E = exp(-z^2) = exp(-x^2/2) and q = erfc(|z|),
// 1 + erf(z) = 2 - q for z >= 0 and q for z < 0 (no cancellation for negative x).
inline float one_plus_erf(float x, float E) {
  const float q = erfc_nonneg(std::fabs(x) * kInvSqrt2, E);
  return x >= 0.0f ? 2.0f - q : q;
}
inline float gauss(float x) { return exp_nonpositive(-0.5f * x * x); }  // exp(-x^2/2)

// Tanh form, vectorisable (libm's tanhf kept the loop scalar: 11% of GPT-2 124M's CPU step). With
// u = sqrt(2/pi) (x + 0.044715 x^3) and e = exp(-2|u|) in (0, 1]:
//   1 + tanh(u) = 2 / (1 + e) for u >= 0, 2 e / (1 + e) for u < 0;   1 - tanh(u)^2 = 4 e / (1 + e)^2,
// so neither has the cancellation of 1 + tanhf(u) for very negative u.
struct TanhParts {
  float one_plus_t, one_minus_t2;
};
inline TanhParts tanh_parts(float x) {
  const float u = kSqrt2OverPi * (x + kCoef * x * x * x);
  const float e = exp_nonpositive(-2.0f * std::fabs(u));
  const float r = 1.0f / (1.0f + e);
  return {2.0f * r * (u >= 0.0f ? 1.0f : e), 4.0f * e * r * r};
}
}  // namespace

// out[N] = gelu(inp[N])
void gelu_forward(float* out, const float* inp, size_t N, Gelu form) {
  if (form == Gelu::Tanh) {
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * tanh_parts(x).one_plus_t;
    }
  } else {
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * one_plus_erf(x, gauss(x));
    }
  }
}

// dinp[N] += gelu'(inp) * dout
//   Tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(...)
//   Erf:  0.5 (1 + erf(x/sqrt2)) + x exp(-x^2/2) / sqrt(2 pi)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, Gelu form) {
  if (form == Gelu::Tanh) {
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      const TanhParts t = tanh_parts(x);
      const float d = 0.5f * t.one_plus_t +
                      0.5f * x * t.one_minus_t2 * kSqrt2OverPi * (1.0f + 3.0f * kCoef * x * x);
      dinp[i] += d * dout[i];
    }
  } else {
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
    for (size_t i = 0; i < N; ++i) {
      const float x = inp[i];
      const float E = gauss(x);  // shared by erf and the density term
      const float d = 0.5f * one_plus_erf(x, E) + x * E * kInvSqrt2Pi;
      dinp[i] += d * dout[i];
    }
  }
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

void CpuBackend::gelu_forward(Act out, CAct inp, size_t N, Gelu form) {
  cpu::In i(inp, N);
  cpu::Out o(out, N);
  cpu::gelu_forward(o, i, N, form);
}

void CpuBackend::gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) {
  cpu::In i(inp, N), d(dout, N);
  cpu::Acc g(dinp, N);
  cpu::gelu_backward(g, i, d, N, form);
}

}  // namespace nlp::cpu
