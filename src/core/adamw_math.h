#pragma once
// AdamW's per-element update, shared by the CPU backend (backend/cpu/optimizer.cpp) and the host
// AdamW of train.offload (train/host_adamw.cpp), which must agree bit for bit. Step t (1-based),
// g = grad * grad_scale:
//   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
// Bias corrections in double as torch does (python floats), the per-element update in float.
#include <cmath>

namespace nlp {

struct AdamWScalars {
  float step_size, bc2_sqrt, decay, beta1, beta2, one_minus_b1, one_minus_b2, eps, grad_scale;
};

// The step's scalars; decay = 1 - lr * weight_decay in float.
inline AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay,
                                  float grad_scale, int t) {
  const double bc1 = 1.0 - std::pow((double)beta1, t);
  const double bc2 = 1.0 - std::pow((double)beta2, t);
  return {static_cast<float>((double)lr / bc1), static_cast<float>(std::sqrt(bc2)), 1.0f - lr * weight_decay,
          beta1, beta2, 1.0f - beta1, 1.0f - beta2, eps, grad_scale};
}

// One element: reads the raw gradient g_raw, updates m and v in place, returns the new parameter.
inline float adamw_element(float p_in, float g_raw, float& m, float& v, const AdamWScalars& s) {
  const float g = g_raw * s.grad_scale;
  float p = p_in * s.decay;
  const float mi = s.beta1 * m + s.one_minus_b1 * g;
  const float vi = s.beta2 * v + s.one_minus_b2 * g * g;
  m = mi;
  v = vi;
  const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
  p -= s.step_size * (mi / denom);
  return p;
}

}  // namespace nlp
