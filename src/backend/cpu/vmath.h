// Branch-free float32 exp and erfc for loops the compiler vectorises (std::exp / std::erf are
// library calls that keep a loop scalar). Used by the cross-entropy and GELU kernels.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace nlp::cpu {

// exp(x) for x <= 0: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact n ln2), e^r by
// its Taylor series to r^6/720 (truncation below 1.2e-7 relative), times 2^n built in the exponent
// bits. Below -87 the result is clamped to e^-87 (~1.6e-38).
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// erfc(a) for a >= 0, given e = exp(-a^2): Abramowitz & Stegun 7.1.26, erfc(a) = e * t * P(t) with
// t = 1 / (1 + 0.3275911 a); absolute error below 1.5e-7 (as an approximation of erf = 1 - erfc).
inline float erfc_nonneg(float a, float e) {
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  return p * t * e;
}

}  // namespace nlp::cpu
