// Reductions in double precision and the AdamW step (torch.optim.AdamW semantics).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/round.h"
#include "backend/cpu/staged.h"
#include "backend/cpu/vmath.h"
#include "core/adamw_math.h"
#include "core/error.h"

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

namespace {

// kZero: write 0 over the gradient element once it is read, in the same pass (the gradient's cache
// line is already there; a separate zeroing pass would stream the whole gradient again). Every
// pointer is restrict (the gradient is read and zeroed through the same one), so the loop vectorises.
// kBf16: also write the updated weight's bf16 rounding (to_bf16_bits) to p16, in the same pass
// (the persistent bf16 copy of the weights, Backend::register_weights).
template <bool kZero, bool kBf16>
void adamw_loop(float* __restrict param, float* __restrict grad, float* __restrict m, float* __restrict v,
                uint16_t* __restrict p16, size_t N, const AdamWScalars s) {
#pragma omp parallel for schedule(static) if (N >= 16384)
  for (size_t i = 0; i < N; ++i) {
    const float p = adamw_element(param[i], grad[i], m[i], v[i], s);
    if constexpr (kZero) grad[i] = 0.0f;
    param[i] = p;
    if constexpr (kBf16) p16[i] = to_bf16_bits(p);
  }
}

}  // namespace

// AdamW step t (1-based), g = grad * grad_scale:
//   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
// Bias corrections in double as torch does (python floats), the per-element update in float.
// zero_grad: nullptr, or grad itself (writable), whose elements are set to 0 as they are read.
// bf16_param: nullptr, or N bf16 patterns that receive the updated weights rounded (to_bf16_bits).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                  int t, float* zero_grad, uint16_t* bf16_param) {
  const AdamWScalars s = adamw_scalars(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  NLP_ASSERT(zero_grad == nullptr || zero_grad == grad);
  float* g = zero_grad ? zero_grad : const_cast<float*>(grad);  // read only unless zero_grad
  if (zero_grad && bf16_param) adamw_loop<true, true>(param, g, m, v, bf16_param, N, s);
  else if (zero_grad) adamw_loop<true, false>(param, g, m, v, nullptr, N, s);
  else if (bf16_param) adamw_loop<false, true>(param, g, m, v, bf16_param, N, s);
  else adamw_loop<false, false>(param, g, m, v, nullptr, N, s);
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

double CpuBackend::sum(const float* x, size_t N) { return cpu::sum(x, N); }

double CpuBackend::sumsq(const float* x, size_t N) { return cpu::sumsq(x, N); }

void CpuBackend::sum_into(double* acc, const float* x, size_t N, double scale) {
  *acc += scale * cpu::sum(x, N);
}

void CpuBackend::adamw_update(float* param, const float* grad, float* m, float* v, size_t N,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_scale, int t) {
  cpu::adamw_update(param, grad, m, v, N, lr, beta1, beta2, eps, weight_decay, grad_scale, t,
                    nullptr, copy_of(param, N));
}

void CpuBackend::adamw_update_spans(float* param, float* grad, float* m, float* v,
                                    const std::vector<AdamWSpan>& spans, float lr, float beta1,
                                    float beta2, float eps, float grad_scale, int t,
                                    bool zero_grad) {
  for (const AdamWSpan& sp : spans)
    cpu::adamw_update(param + sp.offset, grad + sp.offset, m + sp.offset, v + sp.offset, sp.numel, lr, beta1,
                      beta2, eps, sp.weight_decay, grad_scale, t, zero_grad ? grad + sp.offset : nullptr,
                      copy_of(param + sp.offset, sp.numel));
}

}  // namespace nlp::cpu
