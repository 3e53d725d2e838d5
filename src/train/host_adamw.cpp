#include "train/host_adamw.h"

#include "core/adamw_math.h"

#include <algorithm>

namespace nlp {
namespace {

// One contiguous piece of one span: the CPU backend's element update (core/adamw_math.h).
void update_piece(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                  size_t n, const AdamWScalars s) {
  for (size_t i = 0; i < n; ++i) p[i] = adamw_element(p[i], g[i], m[i], v[i], s);
}

// Elements per chunk: large enough that a chunk's loop runs at memory speed, small enough that a
// shard of a small model still spreads over the threads.
constexpr size_t kChunk = 16384;

}  // namespace

void host_adamw_update(float* param, const float* grad, float* m, float* v,
                       const std::vector<Backend::AdamWSpan>& spans, float lr, float beta1, float beta2,
                       float eps, float grad_scale, int t) {
  // The step's scalars as the CPU backend computes them; each span has its own decay factor.
  const AdamWScalars step = adamw_scalars(lr, beta1, beta2, eps, 0.0f, grad_scale, t);
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
    AdamWScalars s = step;
    s.decay = pc.decay;
    update_piece(param + pc.offset, grad + pc.offset, m + pc.offset, v + pc.offset, pc.numel, s);
  }
}

}  // namespace nlp
