// Rounding of fp32 values to the operand formats of the GPU's tensor cores, for the CPU backend's
// emulation of train.precision = tf32 | bf16 (the GPU rounds the same operands; see core/backend.h).
//   bf16: 8-bit exponent, 7-bit mantissa; tf32: 8-bit exponent, 10-bit mantissa.
// Round to nearest, ties to even, as __float2bfloat16_rn; NaN stays NaN, infinities stay infinite.
#pragma once
#include <cstdint>
#include <cstring>

namespace nlp::cpu {

// Keep the top (32 - drop) bits of x's pattern, rounding to nearest even at bit `drop`.
inline float round_mantissa(float x, int drop) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf or NaN: unchanged
  const uint32_t half = (1u << (drop - 1)) - 1u;
  u += half + ((u >> drop) & 1u);
  u &= ~((1u << drop) - 1u);
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

inline float round_bf16(float x) { return round_mantissa(x, 16); }
inline float round_tf32(float x) { return round_mantissa(x, 13); }

}  // namespace nlp::cpu

namespace nlp::cpu {

// x rounded to bf16 (as round_bf16) and kept as its 16-bit pattern: the native bf16 GEMM's operand.
// Branch-free, so that conversion loops vectorise: infinities round to themselves (their low half is
// zero), a NaN keeps its sign and top payload bits with the quiet bit set (never rounds to infinity).
inline uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace nlp::cpu
