// Reductions in double precision and the AdamW step (torch.optim.AdamW semantics).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vmath.h"

namespace nlp::cpu {
namespace {

// Fixed-size blocks summed in parallel, then the block sums added in order: the result does not
// depend on the number of threads.
constexpr size_t kBlock = 8192;

template <bool kSquare>
double blocked_sum(const float* x, size_t N) {
  if (N == 0) return 0.0;
  const size_t nblocks = (N + kBlock - 1) / kBlock;
  std::vector<double> part(nblocks);
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (size_t blk = 0; blk < nblocks; ++blk) {
    const size_t i0 = blk * kBlock;
    const size_t i1 = i0 + kBlock < N ? i0 + kBlock : N;
    // 32 interleaved partial sums (vmath.h's lane_sum): vectorised, and a fixed order, so the
    // result does not depend on the thread count
    const float* xb = x + i0;
    part[blk] = lane_sum<double, 32>(static_cast<int>(i1 - i0), [xb](int i) {
      const double v = xb[i];
      return kSquare ? v * v : v;
    });
  }
  double total = 0.0;
  for (size_t blk = 0; blk < nblocks; ++blk) total += part[blk];
  return total;
}

}  // namespace

double sum(const float* x, size_t N) { return blocked_sum<false>(x, N); }
double sumsq(const float* x, size_t N) { return blocked_sum<true>(x, N); }

// AdamW step t (1-based), g = grad * grad_scale:
//   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
// Bias corrections in double as torch does (python floats), the per-element update in float.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                  int t) {
  const double bc1 = 1.0 - std::pow((double)beta1, t);
  const double bc2 = 1.0 - std::pow((double)beta2, t);
  const float step_size = static_cast<float>((double)lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - lr * weight_decay;
  const float one_minus_b1 = 1.0f - beta1;
  const float one_minus_b2 = 1.0f - beta2;
#pragma omp parallel for schedule(static) if (N >= 16384)
  for (size_t i = 0; i < N; ++i) {
    const float g = grad[i] * grad_scale;
    float p = param[i] * decay;
    const float mi = beta1 * m[i] + one_minus_b1 * g;
    const float vi = beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p -= step_size * (mi / denom);
    param[i] = p;
  }
}

}  // namespace nlp::cpu
