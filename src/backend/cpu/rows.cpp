// Small head ops: tanh (BERT pooler) and strided row gather / scatter-add (the [CLS] rows).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/staged.h"

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

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

void CpuBackend::tanh_forward(Act out, CAct inp, size_t N) {
  cpu::In i(inp, N);
  cpu::Out o(out, N);
  cpu::tanh_forward(o, i, N);
}

void CpuBackend::tanh_backward(Act dinp, CAct out, CAct dout, size_t N) {
  cpu::In o(out, N), d(dout, N);
  cpu::Acc g(dinp, N);
  cpu::tanh_backward(g, o, d, N);
}

// The strided tensor a row op reads or writes spans strided_extent elements (a bf16 one is
// staged whole).
void CpuBackend::rows_gather(Act out, CAct inp, int n, int C, size_t stride, const int32_t* idx) {
  cpu::In i(inp, strided_extent(n, C, stride, idx));
  cpu::Out o(out, size_t(n) * C);
  cpu::rows_gather(o, i, n, C, stride, idx);
}

void CpuBackend::rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                                  const int32_t* idx) {
  NLP_ASSERT(!dinp.write);  // only its rows are written: never the tensor's only writer
  cpu::In d(dout, size_t(n) * C);
  cpu::Acc g(dinp, strided_extent(n, C, stride, idx));
  cpu::rows_scatter_add(g, d, n, C, stride, idx);
}

// Elements of a [rows, stride] tensor that a row op over n rows of width C touches: up to row
// r(i) = idx[i] (host memory on this backend), or i without idx.
size_t CpuBackend::strided_extent(int n, int C, size_t stride, const int32_t* idx) {
  if (n <= 0) return 0;
  size_t rows = size_t(n);
  if (idx)
    for (int i = 0; i < n; ++i) rows = std::max(rows, size_t(idx[i]) + 1);
  return (rows - 1) * stride + size_t(C);
}

}  // namespace nlp::cpu
