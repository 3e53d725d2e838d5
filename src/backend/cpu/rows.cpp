// Small head ops: tanh (BERT pooler) and strided row gather / scatter-add (the [CLS] rows).
#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace nlp::cpu {

// out[N] = tanh(inp)
void tanh_forward(float* out, const float* inp, size_t N) {
#pragma omp parallel for schedule(static) if (N >= (1u << 15))
  for (size_t i = 0; i < N; ++i) out[i] = std::tanh(inp[i]);
}

// dinp[N] += (1 - out^2) * dout
void tanh_backward(float* dinp, const float* out, const float* dout, size_t N) {
#pragma omp parallel for schedule(static) if (N >= (1u << 15))
  for (size_t i = 0; i < N; ++i) dinp[i] += (1.f - out[i] * out[i]) * dout[i];
}

// out[n,C] = inp[i*stride + c]
void rows_gather(float* out, const float* inp, int n, int C, size_t stride) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = inp[size_t(i) * stride + c];
}

// dinp[i*stride + c] += dout[i,C]
void rows_scatter_add(float* dinp, const float* dout, int n, int C, size_t stride) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < C; ++c) dinp[size_t(i) * stride + c] += dout[size_t(i) * C + c];
}

}  // namespace nlp::cpu
