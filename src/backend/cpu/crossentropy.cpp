// Fused softmax + cross-entropy over logits[M,V] (max-shifted log-sum-exp; ignore index -100).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
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
    const float* x = logits + (size_t)m * V;
    float mx;
    double se;
    row_stats(x, V, &mx, &se);
    if (row_mx) row_mx[m] = mx, row_se[m] = se;
    losses[m] = static_cast<float>(std::log(se) + ((double)mx - (double)x[t]));
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
    const float* __restrict x = logits + (size_t)m * V;
    float* __restrict g = dlogits + (size_t)m * V;
    float mx;
    double se;
    if (row_mx) mx = row_mx[m], se = row_se[m];
    else row_stats(x, V, &mx, &se);
    const float f = static_cast<float>((double)dloss / se);
#pragma omp simd
    for (int v = 0; v < V; ++v) g[v] += exp_nonpositive(x[v] - mx) * f;
    g[t] -= dloss;
  }
}

}  // namespace nlp::cpu
