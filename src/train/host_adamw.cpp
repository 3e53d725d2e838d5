#include "train/host_adamw.h"

#include <algorithm>
#include <cmath>

namespace nlp {
namespace {

struct Scalars {
  float step_size, bc2_sqrt, decay, beta1, beta2, one_minus_b1, one_minus_b2, eps, grad_scale;
};

// One contiguous piece of one span: the expression of backend/cpu/optimizer.cpp's adamw_loop,
// operation for operation.
void update_piece(float* __restrict p, const float* __restrict g_in, float* __restrict m, float* __restrict v,
                  size_t n, const Scalars s) {
  for (size_t i = 0; i < n; ++i) {
    const float g = g_in[i] * s.grad_scale;
    float x = p[i] * s.decay;
    const float mi = s.beta1 * m[i] + s.one_minus_b1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    x -= s.step_size * (mi / denom);
    p[i] = x;
  }
}

// Elements per chunk: large enough that a chunk's loop runs at memory speed, small enough that a
// shard of a small model still spreads over the threads.
constexpr size_t kChunk = 16384;

}  // namespace

void host_adamw_update(float* param, const float* grad, float* m, float* v,
                       const std::vector<Backend::AdamWSpan>& spans, float lr, float beta1, float beta2,
                       float eps, float grad_scale, int t) {
  // Bias corrections as the CPU backend computes them (torch's python floats: double).
  const double bc1 = 1.0 - std::pow((double)beta1, t);
  const double bc2 = 1.0 - std::pow((double)beta2, t);
  // Each span's decay factor: 1 - lr * weight_decay in float, as the backend's.
  struct Piece {
    size_t offset, numel;
    float decay;
  };
  std::vector<Piece> pieces;
  for (const auto& sp : spans)
    for (size_t a = 0; a < sp.numel; a += kChunk)
      pieces.push_back({sp.offset + a, std::min(kChunk, sp.numel - a), 1.0f - lr * sp.weight_decay});
  const long np = static_cast<long>(pieces.size());
#pragma omp parallel for schedule(dynamic, 1) if (np > 1)
  for (long k = 0; k < np; ++k) {
    const Piece& pc = pieces[k];
    const Scalars s{static_cast<float>((double)lr / bc1), static_cast<float>(std::sqrt(bc2)), pc.decay, beta1,
                    beta2, 1.0f - beta1, 1.0f - beta2, eps, grad_scale};
    update_piece(param + pc.offset, grad + pc.offset, m + pc.offset, v + pc.offset, pc.numel, s);
  }
}

}  // namespace nlp
