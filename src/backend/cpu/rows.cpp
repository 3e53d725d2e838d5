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

// out[n,C] = inp[r(i)*stride + c], r(i) = idx ? idx[i] : i
void rows_gather(float* out, const float* inp, int n, int C, size_t stride, const int32_t* idx) {
#pragma omp parallel for schedule(static) if (size_t(n) * C >= (1u << 16))
  for (int i = 0; i < n; ++i) {
    const float* src = inp + size_t(idx ? idx[i] : i) * stride;
    for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = src[c];
  }
}

// dinp[r(i)*stride + c] += dout[i,C]; distinct rows, so the parallel loop has no conflicts
void rows_scatter_add(float* dinp, const float* dout, int n, int C, size_t stride,
                      const int32_t* idx) {
#pragma omp parallel for schedule(static) if (size_t(n) * C >= (1u << 16))
  for (int i = 0; i < n; ++i) {
    float* dst = dinp + size_t(idx ? idx[i] : i) * stride;
    for (int c = 0; c < C; ++c) dst[c] += dout[size_t(i) * C + c];
  }
}

}  // namespace nlp::cpu
