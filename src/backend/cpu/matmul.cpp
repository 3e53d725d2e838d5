// Dense layer out = inp @ W + bias with OpenBLAS sgemm, for both weight layouts:
//   WLayout::InOut  W [K,N] (HF Conv1D)     WLayout::OutIn  W [N,K] (torch nn.Linear)
#include <cblas.h>

#include <cstring>

#include "backend/cpu/cpu_ops.h"

namespace nlp::cpu {

// out[M,N] = inp[M,K] @ W + bias[N]
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K,
                    int N, WLayout layout) {
  if (M <= 0 || N <= 0) return;
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
  if (layout == WLayout::InOut) {  // inp[M,K] @ W[K,N]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, inp, K, w, N, beta, out,
                N);
  } else {  // inp[M,K] @ W[N,K]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, inp, K, w, K, beta, out,
                N);
  }
}

// dinp[M,K] += dout[M,N] @ W^T;  dw (W's layout) += inp^T @ dout;  dbias[N] += colsum(dout)
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int M, int K, int N, WLayout layout) {
  if (M <= 0 || N <= 0) return;
  if (K > 0 && dinp) {
    if (layout == WLayout::InOut) {  // dout[M,N] @ W[K,N]^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, K, N, 1.0f, dout, N, w, N, 1.0f,
                  dinp, K);
    } else {  // dout[M,N] @ W[N,K]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dout, N, w, K, 1.0f,
                  dinp, K);
    }
  }
  if (K > 0 && dw) {
    if (layout == WLayout::InOut) {  // dW[K,N] += inp[M,K]^T @ dout[M,N]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, M, 1.0f, inp, K, dout, N, 1.0f,
                  dw, N);
    } else {  // dW[N,K] += dout[M,N]^T @ inp[M,K]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, inp, K, 1.0f,
                  dw, K);
    }
  }
  if (dbias) {
    // Column blocks per thread; each column sums its rows in order m = 0..M-1.
    constexpr int kBlock = 64;
    const int nblocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int n0 = blk * kBlock;
      const int n1 = n0 + kBlock < N ? n0 + kBlock : N;
      float acc[kBlock];
      for (int n = n0; n < n1; ++n) acc[n - n0] = 0.0f;
      for (int m = 0; m < M; ++m) {
        const float* __restrict row = dout + (size_t)m * N;
        for (int n = n0; n < n1; ++n) acc[n - n0] += row[n];
      }
      for (int n = n0; n < n1; ++n) dbias[n] += acc[n - n0];
    }
  }
}

}  // namespace nlp::cpu
