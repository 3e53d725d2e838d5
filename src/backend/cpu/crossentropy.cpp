// Fused softmax + cross-entropy over logits[M,V], or over segments of one vector (packed qa: each
// example's positions), max-shifted log-sum-exp; ignore index -100.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/staged.h"
#include "backend/cpu/vmath.h"
#include "core/error.h"

namespace nlp::cpu {
namespace {

void check_targets(const int32_t* targets, int M, int V) {
  for (int m = 0; m < M; ++m) {
    const int32_t t = targets[m];
    if (t != kIgnoreIndex && (t < 0 || t >= V))
      throw Error(cat("crossentropy: target ", t, " at row ", m, " is outside the vocabulary [0, ",
                      V, ") and is not the ignore index ", kIgnoreIndex));
  }
}

// max over the row and sum of exp(x - max) (accumulated in double)
// exp(x - max) by exp_nonpositive (vmath.h), which the compiler vectorises.
inline float row_max(const float* x, int V) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int v = 1; v < V; ++v) m = x[v] > m ? x[v] : m;
  return m;
}

// sum_v exp(x[v] - mx): float lanes within blocks of 512, double across blocks, so the sum of 50k
// terms keeps ~1e-7 relative accuracy.
inline double row_exp_sum(const float* x, int V, float mx) {
  double total = 0.0;
  for (int v0 = 0; v0 < V; v0 += 512) {
    const int v1 = v0 + 512 < V ? v0 + 512 : V;
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int v = v0; v < v1; ++v) part += exp_nonpositive(x[v] - mx);
    total += part;
  }
  return total;
}

inline void row_stats(const float* x, int V, float* mx, double* se) {
  *mx = row_max(x, V);
  *se = row_exp_sum(x, V, *mx);
}

// One row's loss and gradient (the same arithmetic for rows of logits[M,V] and for segments).
inline float row_loss(const float* x, int V, int32_t t, float* mx_out, double* se_out) {
  float mx;
  double se;
  row_stats(x, V, &mx, &se);
  if (mx_out) *mx_out = mx, *se_out = se;
  return static_cast<float>(std::log(se) + ((double)mx - (double)x[t]));
}
inline void row_grad(float* __restrict g, const float* __restrict x, int V, int32_t t, float dloss,
                     float mx, double se) {
  const float f = static_cast<float>((double)dloss / se);
#pragma omp simd
  for (int v = 0; v < V; ++v) g[v] += exp_nonpositive(x[v] - mx) * f;
  g[t] -= dloss;
}

void check_segments(const int32_t* len, const int32_t* targets, int E) {
  for (int e = 0; e < E; ++e) {
    if (len[e] < 1)
      throw Error(cat("crossentropy: segment ", e, " has length ", len[e], " (at least 1)"));
    const int32_t t = targets[e];
    if (t != kIgnoreIndex && (t < 0 || t >= len[e]))
      throw Error(cat("crossentropy: target ", t, " of segment ", e, " is outside its ", len[e],
                      " positions and is not the ignore index ", kIgnoreIndex));
  }
}

}  // namespace

// losses[M] = logsumexp(logits[m,:]) - logits[m, target[m]]; 0 for ignored rows.
// row_mx / row_se (optional, [M]): each row's max and sum of exp(x - max), for crossentropy_backward.
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                          int V, float* row_mx, double* row_se) {
  check_targets(targets, M, V);
#pragma omp parallel for schedule(static)
  for (int m = 0; m < M; ++m) {
    const int32_t t = targets[m];
    if (t == kIgnoreIndex) {
      losses[m] = 0.0f;
      continue;
    }
    losses[m] = row_loss(logits + (size_t)m * V, V, t, row_mx ? row_mx + m : nullptr,
                         row_mx ? row_se + m : nullptr);
  }
}

// dlogits[M,V] += (softmax(logits) - onehot(target)) * dloss; ignored rows untouched.
// row_mx / row_se (optional): the forward's statistics of these logits. With them, one read of each row
// instead of three, and the same values bit for bit (the same max, sum and exp as row_stats).
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           float dloss, int M, int V, const float* row_mx, const double* row_se) {
  check_targets(targets, M, V);
#pragma omp parallel for schedule(static)
  for (int m = 0; m < M; ++m) {
    const int32_t t = targets[m];
    if (t == kIgnoreIndex) continue;
    const float* x = logits + (size_t)m * V;
    float mx;
    double se;
    if (row_mx) mx = row_mx[m], se = row_se[m];
    else row_stats(x, V, &mx, &se);
    row_grad(dlogits + (size_t)m * V, x, V, t, dloss, mx, se);
  }
}

// The fused head's loss (lm_head_crossentropy): rows of logits[M, ld] (V real columns), each row's
// loss as crossentropy_forward, and with `grad` the row's (softmax - onehot) * dloss written over its
// V columns (ignored rows: 0), the same arithmetic as crossentropy_backward onto a zeroed buffer
// (0 + a == a), so the same bits. Columns V..ld are neither read nor written.
void crossentropy_rows(float* losses, float* logits, int ld, const int32_t* targets, float dloss,
                       int M, int V, bool grad) {
  check_targets(targets, M, V);
#pragma omp parallel for schedule(static)
  for (int m = 0; m < M; ++m) {
    float* x = logits + (size_t)m * ld;
    const int32_t t = targets[m];
    if (t == kIgnoreIndex) {
      losses[m] = 0.0f;
      if (grad) std::memset(x, 0, sizeof(float) * (size_t)V);
      continue;
    }
    float mx;
    double se;
    losses[m] = row_loss(x, V, t, &mx, &se);
    if (!grad) continue;
    const float f = static_cast<float>((double)dloss / se);
#pragma omp simd
    for (int v = 0; v < V; ++v) x[v] = 0.0f + exp_nonpositive(x[v] - mx) * f;
    x[t] -= dloss;
  }
}

// Segments of x: segment e is x[first[e] .. first[e] + len[e]), its target relative to first[e].
// losses[E] as above, per segment; dx[segment e] += (softmax - onehot) * dloss (ignored: untouched).
void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                  const int32_t* len, const int32_t* targets, int E) {
  check_segments(len, targets, E);
#pragma omp parallel for schedule(static)
  for (int e = 0; e < E; ++e)
    losses[e] = targets[e] == kIgnoreIndex ? 0.0f
                                           : row_loss(x + first[e], len[e], targets[e], nullptr, nullptr);
}

void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first, const int32_t* len,
                                   const int32_t* targets, float dloss, int E) {
  check_segments(len, targets, E);
#pragma omp parallel for schedule(static)
  for (int e = 0; e < E; ++e) {
    if (targets[e] == kIgnoreIndex) continue;
    float mx;
    double se;
    row_stats(x + first[e], len[e], &mx, &se);
    row_grad(dx + first[e], x + first[e], len[e], targets[e], dloss, mx, se);
  }
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

// The forward keeps each row's max and sum of exp; a backward on the same logits (pointer, M, V,
// unchanged since: the contract of core/backend.h; forgotten when this backend writes that buffer)
// reuses them: one read of the [M,V] logits instead of three, bitwise the same gradient.
void CpuBackend::crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                      int M, int V) {
  if (ce_mx_.size() < size_t(std::max(M, 0))) ce_mx_.resize(M), ce_se_.resize(M);
  cpu::crossentropy_forward(losses, logits, targets, M, V, ce_mx_.data(), ce_se_.data());
  ce_logits_ = logits, ce_M_ = M, ce_V_ = V;
}

void CpuBackend::crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                       float dloss, int M, int V) {
  const bool reuse = ce_logits_ == logits && ce_M_ == M && ce_V_ == V;
  cpu::crossentropy_backward(dlogits, logits, targets, dloss, M, V, reuse ? ce_mx_.data() : nullptr,
                             reuse ? ce_se_.data() : nullptr);
}

void CpuBackend::segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                              const int32_t* len, const int32_t* targets, int E) {
  cpu::segment_crossentropy_forward(losses, x, first, len, targets, E);
}

void CpuBackend::segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                               const int32_t* len, const int32_t* targets,
                                               float dloss, int E) {
  cpu::segment_crossentropy_backward(dx, x, first, len, targets, dloss, E);
}

// ---- the LM head fused with its loss ----
// The chunk's logits live in scratch [chunk, Vp]; every GEMM runs over the V real columns with
// leading dimension Vp, so the padding changes strides only: the same products, the same bits
// as Vp = V. The operands are rounded (or converted to bf16) once per call, as matmul_* round them.
size_t CpuBackend::lm_head_scratch_floats(int chunk, int C, int V, int Vp) {
  (void)C, (void)V;
  return size_t(chunk) * Vp;
}

void CpuBackend::lm_head_crossentropy(float* losses, Act dx_v, float* dw, CAct x_v, const float* w,
                                      const int32_t* targets, float dloss, int M, int C, int V,
                                      int Vp, int chunk, float* scratch) {
  NLP_ASSERT(Vp >= V && chunk > 0);
  if (M <= 0) return;
  forget_ce_stats(scratch);
  const bool bwd = bool(dx_v) || dw;
  const size_t nx = size_t(M) * C, nw = size_t(V) * C;
  cpu::In x(x_v, nx);
  cpu::Acc dxs(dx_v, nx);
  float* dx = dxs.get();
  const float *xf = x, *wf = w;
  const cpu::bf16 *xb = nullptr, *wb = nullptr;
  if (native_bf16_) {
    xb = to_bf16(1, x, nx);
    wb = to_bf16(2, w, nw);
  } else if (precision_ != Precision::Fp32) {
    xf = rounded(1, x, nx);
    wf = rounded(2, w, nw);
  }
  for (int r0 = 0; r0 < M; r0 += chunk) {
    const int rows = std::min(chunk, M - r0);
    const size_t xo = size_t(r0) * C;
    // logits[rows, V] (row stride Vp) = x[r0.., C] @ w[V, C]^T
    if (native_bf16_)
      cpu::gemm(lib_, false, true, rows, V, C, xb + xo, C, wb, C, 0.0f, scratch, Vp);
    else
      cpu::gemm(lib_, false, true, rows, V, C, xf + xo, C, wf, C, 0.0f, scratch, Vp);
    cpu::crossentropy_rows(losses + r0, scratch, Vp, targets + r0, dloss, rows, V, bwd);
    if (!bwd) continue;
    // dx[rows, C] += dlogits @ w;  dw[V, C] += dlogits^T @ x (matmul_backward's OutIn products)
    if (native_bf16_) {
      const cpu::bf16* db = to_bf16(0, scratch, size_t(rows) * Vp);
      if (dx) cpu::gemm(lib_, false, false, rows, C, V, db, Vp, wb, C, 1.0f, dx + xo, C);
      if (dw) cpu::gemm(lib_, true, false, V, C, rows, db, Vp, xb + xo, C, 1.0f, dw, C);
    } else {
      const float* d = precision_ == Precision::Fp32 ? scratch : rounded(0, scratch, size_t(rows) * Vp);
      if (dx) cpu::gemm(lib_, false, false, rows, C, V, d, Vp, wf, C, 1.0f, dx + xo, C);
      if (dw) cpu::gemm(lib_, true, false, V, C, rows, d, Vp, xf + xo, C, 1.0f, dw, C);
    }
  }
}

}  // namespace nlp::cpu
