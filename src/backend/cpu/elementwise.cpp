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

// The keyed dropout loop: f(i, key) for every element, the key of element i being keyed_index(i,
// row, row_key) (core/rng.h). Rows of `row` elements are walked one by one so that the key is a base
// plus the offset (no division per element) and the inner loop is plain enough to vectorise.
template <class F>
void for_each_keyed(size_t N, size_t row, size_t row_key, F f) {
  if (row == 0 || row == row_key) row = row_key = N;  // one row: the key is the flat index
  const size_t rows = row ? (N + row - 1) / row : 0;
  if (rows == 1) {  // split the single row between the threads
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
    for (size_t i = 0; i < N; ++i) f(i, uint64_t(i));
    return;
  }
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
  for (size_t r = 0; r < rows; ++r) {
    const size_t i0 = r * row, n = i0 + row < N ? row : N - i0;
    const uint64_t k0 = uint64_t(r) * row_key;
    for (size_t k = 0; k < n; ++k) f(i0 + k, k0 + k);
  }
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
  for_each_keyed(N, row, row_key, [=](size_t i, uint64_t key) {
    out[i] = uniform01(seed, key) >= p ? inp[i] * s : 0.0f;
  });
}

// dinp[N] += dout * keep(i) / (1-p)
void dropout_backward(float* dinp, const float* dout, size_t N, float p, uint64_t seed, size_t row,
                      size_t row_key) {
  if (p <= 0.0f) {
    accumulate(dinp, dout, N);
    return;
  }
  const float s = dropout_scale(p);
  for_each_keyed(N, row, row_key, [=](size_t i, uint64_t key) {
    if (uniform01(seed, key) >= p) dinp[i] += dout[i] * s;
  });
}

}  // namespace nlp::cpu
