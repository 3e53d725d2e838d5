// Branch-free float32 exp and erfc for loops the compiler vectorises (std::exp / std::erf are
// library calls that keep a loop scalar), used by the cross-entropy, GELU and attention kernels; and
// lane_sum, a reduction the compiler vectorises without reassociating anything itself.
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

// sum over c in [0, n) of f(c), accumulated in Acc: kLanes interleaved partial sums (c mod kLanes;
// the tail past the last full group goes to lane 0), combined pairwise in a fixed order. Independent
// chains the compiler keeps in vector registers, where a single accumulator is bound by the add
// latency (a vectorising compiler may not reorder a float sum itself); the order depends only on n.
template <class Acc, int kLanes = 16, class F>
inline Acc lane_sum(int n, F f) {
  static_assert(kLanes > 0 && (kLanes & (kLanes - 1)) == 0, "kLanes: a power of two");
  Acc s[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int k = 0; k < kLanes; ++k) s[k] += f(c + k);
  for (; c < n; ++c) s[0] += f(c);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) s[k] += s[k + w];
  return s[0];
}

}  // namespace nlp::cpu
