// Dense layer out = inp @ W + bias through the backend's GEMM library (gemm.h), for both weight layouts:
//   WLayout::InOut  W [K,N] (HF Conv1D)     WLayout::OutIn  W [N,K] (torch nn.Linear)
// The operands are fp32, or bf16 (the native bf16 path; fp32 accumulation and outputs either way).
#include <cstring>
#include <type_traits>

#include "backend/cpu/column_blocks.h"
#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/staged.h"

namespace nlp::cpu {

// out[M,N] = inp[M,K] @ W + bias[N]  (T = float, or bf16 for native bf16 operands; outputs and
// gradients fp32)
template <class T>
void matmul_forward(GemmLib lib, float* out, const T* inp, const T* w, const float* bias, int M,
                    int K, int N, WLayout layout) {
  if (M <= 0 || N <= 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    if (K > 0) {  // the bias added by the GEMM's output pass (no broadcast copy first)
      if (layout == WLayout::InOut)
        gemm(lib, false, false, M, N, K, inp, K, w, N, 0.0f, out, N, bias);
      else
        gemm(lib, false, true, M, N, K, inp, K, w, K, 0.0f, out, N, bias);
      return;
    }
  }
  float beta = 0.0f;
  if (bias) {
    // out starts as the broadcast bias, the GEMM adds onto it
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; ++m) std::memcpy(out + (size_t)m * N, bias, sizeof(float) * N);
    beta = 1.0f;
  }
  if (K <= 0) {
    if (!bias) std::memset(out, 0, sizeof(float) * (size_t)M * N);
    return;
  }
  if (layout == WLayout::InOut)  // inp[M,K] @ W[K,N]
    gemm(lib, false, false, M, N, K, inp, K, w, N, beta, out, N);
  else  // inp[M,K] @ W[N,K]^T
    gemm(lib, false, true, M, N, K, inp, K, w, K, beta, out, N);
}

// dinp[M,K] += dout[M,N] @ W^T;  dw (W's layout) += inp^T @ dout
template <class T>
void matmul_backward(GemmLib lib, float* dinp, float* dw, const T* dout, const T* inp, const T* w,
                     int M, int K, int N, WLayout layout) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  if (dinp) {
    if (layout == WLayout::InOut)  // dout[M,N] @ W[K,N]^T
      gemm(lib, false, true, M, K, N, dout, N, w, N, 1.0f, dinp, K);
    else  // dout[M,N] @ W[N,K]
      gemm(lib, false, false, M, K, N, dout, N, w, K, 1.0f, dinp, K);
  }
  if (dw) {
    if (layout == WLayout::InOut)  // dW[K,N] += inp[M,K]^T @ dout[M,N]
      gemm(lib, true, false, K, N, M, inp, K, dout, N, 1.0f, dw, N);
    else  // dW[N,K] += dout[M,N]^T @ inp[M,K]
      gemm(lib, true, false, N, K, M, dout, N, inp, K, 1.0f, dw, K);
  }
}

template void matmul_forward<float>(GemmLib, float*, const float*, const float*, const float*, int,
                                    int, int, WLayout);
template void matmul_forward<bf16>(GemmLib, float*, const bf16*, const bf16*, const float*, int,
                                   int, int, WLayout);
template void matmul_backward<float>(GemmLib, float*, float*, const float*, const float*,
                                     const float*, int, int, int, WLayout);
template void matmul_backward<bf16>(GemmLib, float*, float*, const bf16*, const bf16*, const bf16*,
                                    int, int, int, WLayout);

// dbias[N] += colsum(dout[M,N])
void matmul_dbias(float* dbias, const float* dout, int M, int N) {
  if (M <= 0 || N <= 0) return;
  // Column blocks per thread; each column sums its rows in order m = 0..M-1.
  for_column_blocks(N, [&](int n0, int n1) {
    float acc[kColumnBlock];
    for (int n = n0; n < n1; ++n) acc[n - n0] = 0.0f;
    for (int m = 0; m < M; ++m) {
      const float* __restrict row = dout + (size_t)m * N;
      for (int n = n0; n < n1; ++n) acc[n - n0] += row[n];
    }
    for (int n = n0; n < n1; ++n) dbias[n] += acc[n - n0];
  });
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

// Tf32/Bf16: the operands are rounded as the GPU's tensor cores read them (cpu/round.h); the bias,
// the accumulation and the outputs stay fp32, and dbias sums the unrounded dout as the GPU does.
// Native bf16 rounds the same way into bf16 copies that the GEMM library multiplies in hardware.
void CpuBackend::matmul_forward(Act out_v, CAct inp_v, const float* w, const float* bias, int M,
                                int K, int N, WLayout layout) {
  forget_ce_stats(out_v.p);
  cpu::Out out_s(out_v, size_t(M) * N);
  cpu::In inp_s(inp_v, size_t(M) * K);
  float* out = out_s.get();
  const float* inp = inp_s.get();
  const cpu::bf16* w16 = persistent(w, size_t(K) * N);
  if (native_bf16_) {
    cpu::matmul_forward(lib_, out, to_bf16(0, inp, size_t(M) * K),
                        w16 ? w16 : to_bf16(1, w, size_t(K) * N), bias, M, K, N, layout);
  } else if (precision_ == Precision::Fp32) {
    cpu::matmul_forward(lib_, out, inp, w, bias, M, K, N, layout);
  } else {
    cpu::matmul_forward(lib_, out, rounded(0, inp, size_t(M) * K),
                        w16 ? widened(1, w16, size_t(K) * N) : rounded(1, w, size_t(K) * N), bias,
                        M, K, N, layout);
  }
}

void CpuBackend::matmul_backward(Act dinp_v, float* dw, float* dbias, CAct dout_v, CAct inp_v,
                                 const float* w, int M, int K, int N, WLayout layout) {
  cpu::Acc dinp_s(dinp_v, size_t(M) * K);
  cpu::In dout_s(dout_v, size_t(M) * N);
  cpu::In inp_s(dw ? inp_v : CAct(), size_t(M) * K);
  float* dinp = dinp_s.get();
  const float* dout = dout_s.get();
  const float* inp = inp_s.get();
  if (native_bf16_) {
    const cpu::bf16* bd = to_bf16(0, dout, size_t(M) * N);
    const cpu::bf16* bi = dw ? to_bf16(1, inp, size_t(M) * K) : nullptr;
    const cpu::bf16* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
    const cpu::bf16* bw = w16 ? w16 : dinp ? to_bf16(2, w, size_t(K) * N) : nullptr;
    cpu::matmul_backward(lib_, dinp, dw, bd, bi, bw, M, K, N, layout);
  } else if (precision_ == Precision::Fp32) {
    cpu::matmul_backward(lib_, dinp, dw, dout, inp, w, M, K, N, layout);
  } else {
    const float* rd = rounded(0, dout, size_t(M) * N);
    const float* ri = dw ? rounded(1, inp, size_t(M) * K) : nullptr;
    const cpu::bf16* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
    const float* rw = w16 ? widened(2, w16, size_t(K) * N) : dinp ? rounded(2, w, size_t(K) * N) : nullptr;
    cpu::matmul_backward(lib_, dinp, dw, rd, ri, rw, M, K, N, layout);
  }
  if (dbias) cpu::matmul_dbias(dbias, dout, M, N);
}

}  // namespace nlp::cpu
