// Elementwise ops: add, accumulate, scale, and dropout (mask from core/rng.h, regenerated in backward).
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/rng.h"

namespace nlp::cpu {
namespace {
constexpr size_t kParallelMin = 1 << 15;
}

// out[N] = a + b (out may alias a or b)
void add(float* out, const float* a, const float* b, size_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (size_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

// dst[N] += src
void accumulate(float* dst, const float* src, size_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (size_t i = 0; i < N; ++i) dst[i] += src[i];
}

// x[N] *= s
void scale(float* x, float s, size_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (size_t i = 0; i < N; ++i) x[i] *= s;
}

// out[N] = inp * keep(i) / (1-p), keep(i) = uniform01(seed, key(i)) >= p, key(i) = keyed_index(i,
// row, row_key) (Backend's DropRows); p == 0 copies (out may alias inp)
void dropout_forward(float* out, const float* inp, size_t N, float p, uint64_t seed, size_t row,
                     size_t row_key) {
  if (p <= 0.0f) {
    if (out != inp) std::memmove(out, inp, N * sizeof(float));
    return;
  }
  const float s = dropout_scale(p);
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
  for (size_t i = 0; i < N; ++i)
    out[i] = uniform01(seed, keyed_index(i, row, row_key)) >= p ? inp[i] * s : 0.0f;
}

// dinp[N] += dout * keep(i) / (1-p)
void dropout_backward(float* dinp, const float* dout, size_t N, float p, uint64_t seed, size_t row,
                      size_t row_key) {
  if (p <= 0.0f) {
    accumulate(dinp, dout, N);
    return;
  }
  const float s = dropout_scale(p);
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
  for (size_t i = 0; i < N; ++i)
    if (uniform01(seed, keyed_index(i, row, row_key)) >= p) dinp[i] += dout[i] * s;
}

}  // namespace nlp::cpu
