// Fused softmax + cross-entropy over logits[M,V] (max-shifted log-sum-exp; ignore index -100).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
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
inline void row_stats(const float* x, int V, float* mx, double* se) {
  float m = x[0];
  for (int v = 1; v < V; ++v) m = x[v] > m ? x[v] : m;
  double s = 0.0;
  for (int v = 0; v < V; ++v) s += std::exp(x[v] - m);
  *mx = m;
  *se = s;
}

}  // namespace

// losses[M] = logsumexp(logits[m,:]) - logits[m, target[m]]; 0 for ignored rows
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                          int V) {
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
    losses[m] = static_cast<float>(std::log(se) + ((double)mx - (double)x[t]));
  }
}

// dlogits[M,V] += (softmax(logits) - onehot(target)) * dloss; ignored rows untouched
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           float dloss, int M, int V) {
  check_targets(targets, M, V);
#pragma omp parallel
  {
    std::vector<float> e(V);  // exp(x - max) of the row, computed once
#pragma omp for schedule(static)
    for (int m = 0; m < M; ++m) {
      const int32_t t = targets[m];
      if (t == kIgnoreIndex) continue;
      const float* __restrict x = logits + (size_t)m * V;
      float* __restrict g = dlogits + (size_t)m * V;
      float mx = x[0];
      for (int v = 1; v < V; ++v) mx = x[v] > mx ? x[v] : mx;
      double se = 0.0;
      for (int v = 0; v < V; ++v) {
        e[v] = std::exp(x[v] - mx);
        se += e[v];
      }
      const float f = static_cast<float>((double)dloss / se);
      for (int v = 0; v < V; ++v) g[v] += e[v] * f;
      g[t] -= dloss;
    }
  }
}

}  // namespace nlp::cpu
