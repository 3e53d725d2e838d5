// Layer norm over the last dimension: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps); and
// fused with the residual add and dropout before it (forward) and the dropout gradient after it
// (backward), one pass over the rows instead of three to five.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/column_blocks.h"
#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/staged.h"
#include "backend/cpu/vmath.h"
#include "core/rng.h"

namespace nlp::cpu {

namespace {

// One row of the forward: y[C] = (x - mu) * rs * w + b; *mu, *rs as layernorm_forward stores them
inline void ln_row(float* __restrict y, const float* __restrict x, const float* w, const float* b, int C,
                   float eps, float* mu_out, float* rs_out) {
  const double s = lane_sum<double>(C, [x](int c) { return double(x[c]); });
  const float mu = static_cast<float>(s / C);
  const double ss = lane_sum<double>(C, [x, mu](int c) {
    const double d = x[c] - mu;
    return d * d;
  });
  const float rs = static_cast<float>(1.0 / std::sqrt(ss / C + (double)eps));
  for (int c = 0; c < C; ++c) y[c] = (x[c] - mu) * rs * w[c] + b[c];
  *mu_out = mu;
  *rs_out = rs;
}

// One row of the backward's input gradient: g[c] = rs * (dy w - mean(dy w) - xhat mean(dy w xhat)),
// written to out (kAccumulate: added to it)
template <bool kAccumulate>
inline void ln_backward_row(float* __restrict out, const float* __restrict x, const float* __restrict dy,
                            const float* __restrict w, float mu, float rs, int C) {
  const float sg = lane_sum<float>(C, [dy, w](int c) { return dy[c] * w[c]; }) / C;
  const float sgx = lane_sum<float>(C, [dy, w, x, mu, rs](int c) { return dy[c] * w[c] * (x[c] - mu) * rs; }) / C;
  for (int c = 0; c < C; ++c) {
    const float xhat = (x[c] - mu) * rs;
    const float g = rs * (dy[c] * w[c] - sg - xhat * sgx);
    if (kAccumulate)
      out[c] += g;
    else
      out[c] = g;
  }
}

// The first dropout key of row n of C elements (backend.h DropRows; row is a multiple of C)
inline uint64_t row_key0(size_t n, int C, size_t row, size_t row_key, const int32_t* token_key) {
  return token_key ? uint64_t(token_key[n]) * C : keyed_index(n * size_t(C), row, row_key);
}

// dw[C] += sum_n dout * xhat;  db[C] += sum_n dout (nullable)
inline void layernorm_param_grads(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                           const float* rstd, int N, int C) {
  if (dw || db) {
    // Parameter gradients: column blocks per thread, rows summed in order.
    for_column_blocks(C, [&](int c0, int c1) {
      float aw[kColumnBlock], ab[kColumnBlock];
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
    });
  }
}

}  // namespace

// out[N,C], mean[N], rstd[N] from inp[N,C], w[C], b[C] (biased variance, two-pass)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float mu, rs;
    ln_row(out + (size_t)n * C, inp + (size_t)n * C, w, b, C, eps, &mu, &rs);
    if (mean) mean[n] = mu;
    if (rstd) rstd[n] = rs;
  }
}

// res[N,C] = x + dropout(delta) (delta may alias res), then out = layernorm(res): row by row, one
// pass, bitwise what dropout_forward, add and layernorm_forward give in turn. The fused residual forms
// of Backend (core/backend.h): rows keyed as DropRows {row, row_key, token_key, C}.
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* x,
                                const float* delta, const float* w, const float* b, int N, int C,
                                float eps, float p, uint64_t seed, size_t row, size_t row_key,
                                const int32_t* token_key) {
  const float s = dropout_scale(p);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* xr = x + (size_t)n * C;
    const float* dr = delta + (size_t)n * C;
    float* rr = res + (size_t)n * C;
    // omp simd: rr may be dr (in place), which GCC's alias check would send to the scalar loop;
    // each element is read before it is written, so the vector loop is right
    if (p > 0.0f) {
      const uint64_t k0 = row_key0(size_t(n), C, row, row_key, token_key);
#pragma omp simd
      for (int c = 0; c < C; ++c) {  // dropout_forward's element, then add's
        const float v = dr[c] * s;
        rr[c] = (uniform01(seed, k0 + c) >= p ? v : 0.0f) + xr[c];
      }
    } else {
#pragma omp simd
      for (int c = 0; c < C; ++c) rr[c] = dr[c] + xr[c];
    }
    float mu, rs;
    ln_row(out + (size_t)n * C, rr, w, b, C, eps, &mu, &rs);
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
    for (int n = 0; n < N; ++n)
      ln_backward_row<true>(dinp + (size_t)n * C, inp + (size_t)n * C, dout + (size_t)n * C, w, mean[n],
                            rstd[n], C);
  }
  layernorm_param_grads(dw, db, dout, inp, mean, rstd, N, C);
}

// The input gradient g of layernorm_backward and the dropout gradient behind it, in one pass:
// dinp[N,C] += g; ddelta[N,C] = dropout_backward of g (overwritten); dw, db as layernorm_backward.
// Bitwise what zero + layernorm_backward, accumulate (or copy) and zero + dropout_backward give.
void layernorm_dropout_backward(float* dinp, float* ddelta, float* dw, float* db, const float* dout,
                                const float* inp, const float* w, const float* mean, const float* rstd,
                                int N, int C, float p, uint64_t seed, size_t row, size_t row_key,
                                const int32_t* token_key) {
  const float s = dropout_scale(p);
#pragma omp parallel
  {
    std::vector<float> grow(C);  // the row's g
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      float* __restrict dx = dinp + (size_t)n * C;
      float* __restrict dd = ddelta + (size_t)n * C;
      float* __restrict g = grow.data();
      ln_backward_row<false>(g, inp + (size_t)n * C, dout + (size_t)n * C, w, mean[n], rstd[n], C);
      // 0 + g: the value a zeroed buffer holds after layernorm_backward adds g
      if (p > 0.0f) {
        const uint64_t k0 = row_key0(size_t(n), C, row, row_key, token_key);
#pragma omp simd
        for (int c = 0; c < C; ++c) {
          const float gv = 0.0f + g[c];
          dx[c] += gv;
          dd[c] = uniform01(seed, k0 + c) >= p ? 0.0f + gv * s : 0.0f;
        }
      } else {
#pragma omp simd
        for (int c = 0; c < C; ++c) {
          const float gv = 0.0f + g[c];
          dx[c] += gv;
          dd[c] = 0.0f + gv;
        }
      }
    }
  }
  layernorm_param_grads(dw, db, dout, inp, mean, rstd, N, C);
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

void CpuBackend::layernorm_forward(Act out, float* mean, float* rstd, CAct inp, const float* w,
                                   const float* b, int N, int C, float eps) {
  const size_t n = size_t(N) * C;
  cpu::In i(inp, n);
  cpu::Out o(out, n);
  cpu::layernorm_forward(o, mean, rstd, i, w, b, N, C, eps);
}

void CpuBackend::layernorm_backward(Act dinp, float* dw, float* db, CAct dout, CAct inp,
                                    const float* w, const float* mean, const float* rstd, int N,
                                    int C) {
  const size_t n = size_t(N) * C;
  cpu::In d(dout, n), i(inp, n);
  cpu::Acc g(dinp, n);
  cpu::layernorm_backward(g, dw, db, d, i, w, mean, rstd, N, C);
}

// A bf16 res is stored rounded, and the layer norm reads the rounded value, as the GPU's
// bf16 kernel does: the statistics belong to the residual stream the backward reads.
void CpuBackend::residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x,
                                            CAct delta, const float* w, const float* b, int N,
                                            int C, float eps, float p, uint64_t seed,
                                            DropRows rows) {
  NLP_ASSERT(!rows.token_key || rows.width == size_t(C));
  const size_t n = size_t(N) * C;
  if (!res.f32()) {  // res = x + dropout(delta) in fp32, rounded once; the norm of the rounded res
    std::vector<float> r(n);
    {
      cpu::In xi(x, n), di(delta, n);
      cpu::dropout_forward(r.data(), di, n, p, seed, rows.row, rows.row_key, rows.token_key,
                           rows.width);
      cpu::add(r.data(), r.data(), xi, n);
    }
    {
      cpu::Out ro(res, n);
      std::memcpy(ro.get(), r.data(), n * sizeof(float));
    }
    cpu::widen_bf16(r.data(), res.bf(), n);
    cpu::Out o(out, n);
    cpu::layernorm_forward(o, mean, rstd, r.data(), w, b, N, C, eps);
    return;
  }
  cpu::In xi(x, n), di(delta, n);
  cpu::Out o(out, n);
  cpu::residual_layernorm_forward(res.fp(), o, mean, rstd, xi, di, w, b, N, C, eps, p, seed,
                                  rows.row, rows.row_key, rows.token_key);
}

void CpuBackend::layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db,
                                            CAct dout, CAct inp, const float* w, const float* mean,
                                            const float* rstd, int N, int C, float p, uint64_t seed,
                                            DropRows rows) {
  (void)scratch;
  NLP_ASSERT(!rows.token_key || rows.width == size_t(C));
  const size_t n = size_t(N) * C;
  if (!dinp.f32() || !ddelta.f32()) {  // the bf16 GPU path's stores: the gradient, then each output
    std::vector<float> g(n, 0.0f);
    {
      cpu::In d(dout, n), i(inp, n);
      cpu::layernorm_backward(g.data(), dw, db, d, i, w, mean, rstd, N, C);
    }
    {
      cpu::Acc di(dinp, n);
      cpu::accumulate(di, g.data(), n);
    }
    cpu::Out dd(ddelta, n);
    std::memset(dd.get(), 0, n * sizeof(float));
    cpu::dropout_backward(dd, g.data(), n, p, seed, rows.row, rows.row_key, rows.token_key, rows.width);
    return;
  }
  cpu::In d(dout, n), i(inp, n);
  cpu::Acc di(dinp, n);
  cpu::layernorm_dropout_backward(di, ddelta.fp(), dw, db, d, i, w, mean, rstd, N, C, p, seed,
                                  rows.row, rows.row_key, rows.token_key);
}

}  // namespace nlp::cpu
