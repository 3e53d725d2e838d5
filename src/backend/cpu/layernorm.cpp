// Layer norm over the last dimension: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps).
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vmath.h"

namespace nlp::cpu {

// out[N,C], mean[N], rstd[N] from inp[N,C], w[C], b[C] (biased variance, two-pass)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* __restrict x = inp + (size_t)n * C;
    float* __restrict y = out + (size_t)n * C;
    const double s = lane_sum<double>(C, [x](int c) { return double(x[c]); });
    const float mu = static_cast<float>(s / C);
    const double ss = lane_sum<double>(C, [x, mu](int c) {
      const double d = x[c] - mu;
      return d * d;
    });
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / C + (double)eps));
    for (int c = 0; c < C; ++c) y[c] = (x[c] - mu) * rs * w[c] + b[c];
    if (mean) mean[n] = mu;
    if (rstd) rstd[n] = rs;
  }
}

// dinp[N,C] += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w
// dw[C] += sum_n dout * xhat;  db[C] += sum_n dout
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  if (dinp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* __restrict x = inp + (size_t)n * C;
      const float* __restrict dy = dout + (size_t)n * C;
      float* __restrict dx = dinp + (size_t)n * C;
      const float mu = mean[n], rs = rstd[n];
      const float sg = lane_sum<float>(C, [dy, w](int c) { return dy[c] * w[c]; }) / C;
      const float sgx = lane_sum<float>(C, [dy, w, x, mu, rs](int c) { return dy[c] * w[c] * (x[c] - mu) * rs; }) / C;
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - mu) * rs;
        dx[c] += rs * (dy[c] * w[c] - sg - xhat * sgx);
      }
    }
  }
  if (dw || db) {
    // Parameter gradients: column blocks per thread, rows summed in order.
    constexpr int kBlock = 64;
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int c0 = blk * kBlock;
      const int c1 = c0 + kBlock < C ? c0 + kBlock : C;
      float aw[kBlock], ab[kBlock];
      for (int c = c0; c < c1; ++c) aw[c - c0] = ab[c - c0] = 0.0f;
      for (int n = 0; n < N; ++n) {
        const float* __restrict x = inp + (size_t)n * C;
        const float* __restrict dy = dout + (size_t)n * C;
        const float mu = mean[n], rs = rstd[n];
        for (int c = c0; c < c1; ++c) {
          aw[c - c0] += dy[c] * ((x[c] - mu) * rs);
          ab[c - c0] += dy[c];
        }
      }
      for (int c = c0; c < c1; ++c) {
        if (dw) dw[c] += aw[c - c0];
        if (db) db[c] += ab[c - c0];
      }
    }
  }
}

}  // namespace nlp::cpu
