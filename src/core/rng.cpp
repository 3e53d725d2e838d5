#include "core/rng.h"

#include <cmath>

namespace nlp {

namespace {
// Box-Muller from the draws at counters c (radius) and c + 1 (angle) of the stream `seed`
float normal_at(uint64_t seed, uint64_t c) {
  double u1 = Rng::uniform_double_at(seed, c);
  const double u2 = Rng::uniform_double_at(seed, c + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
}  // namespace

float Rng::normal() {
  const float v = normal_at(seed, counter);
  counter += 2;
  return v;
}

void Rng::fill_normal(float* out, int64_t n, float scale) {
  const uint64_t c0 = counter, s = seed;
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = scale * normal_at(s, c0 + 2 * uint64_t(i));
  counter = c0 + 2 * uint64_t(n > 0 ? n : 0);
}

}  // namespace nlp
