// The Backend's default ops (those core/backend_ops.def marks DEFAULT): the unfused ops in turn, the
// plain host memory and the native kernels' sizes. A backend overrides what it does better.
#include "core/backend.h"

namespace nlp {

// ---- memory ----
void* Backend::host_alloc(size_t bytes) { return ::operator new(bytes); }
void Backend::host_release(void* p) { ::operator delete(p); }
void Backend::synchronize() {}

// ---- dense layer: the GEMM, then the GELU ----
void Backend::matmul_gelu_forward(Act out, Act pre, CAct inp, const float* w, const float* bias,
                                  int M, int K, int N, WLayout layout, Gelu form) {
  matmul_forward(pre, inp, w, bias, M, K, N, layout);
  gelu_forward(out, pre, size_t(M) * N, form);
}
void Backend::matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h, CAct pre,
                                    const float* w, int M, int K, int N, WLayout layout, Gelu form,
                                    Act scratch) {
  matmul_backward(overwrite(scratch), dw, dbias, dout, h, w, M, K, N, layout);
  gelu_backward(dpre, pre, scratch, size_t(M) * K, form);
}

// ---- layer norm with the residual add and dropout ----
void Backend::residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x,
                                         CAct delta, const float* w, const float* b, int N, int C,
                                         float eps, float p, uint64_t seed, DropRows rows) {
  dropout_forward(res, delta, size_t(N) * C, p, seed, rows);
  add(res, res, x, size_t(N) * C);
  layernorm_forward(out, mean, rstd, res, w, b, N, C, eps);
}
void Backend::layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db,
                                         CAct dout, CAct inp, const float* w, const float* mean,
                                         const float* rstd, int N, int C, float p, uint64_t seed,
                                         DropRows rows) {
  const size_t n = size_t(N) * C;
  zero_act(scratch, n);
  layernorm_backward(scratch, dw, db, dout, inp, w, mean, rstd, N, C);
  if (dinp.write)
    copy_view(dinp, scratch, n);
  else
    accumulate(dinp, scratch, n);
  zero_act(ddelta, n);
  dropout_backward(ddelta, scratch, n, p, seed, rows);
}

// ---- attention: the native kernels keep the probabilities and their gradient ----
size_t Backend::attention_saved_floats(int B, int T, int NH, int HS, DType act) {
  (void)HS, (void)act;
  return size_t(B) * NH * T * T;
}
size_t Backend::attention_scratch_floats(int B, int T, int NH, int HS, DType act) {
  (void)HS, (void)act;
  return size_t(B) * NH * T * T;
}

// ---- the LM head: per chunk of rows, the logits, their loss, dlogits and the two GEMMs ----
size_t Backend::lm_head_scratch_floats(int chunk, int C, int V, int Vp) {
  (void)C, (void)Vp;
  return 2 * size_t(chunk) * V;
}
void Backend::lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w,
                                   const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                                   int chunk, float* scratch) {
  (void)Vp;
  const bool bwd = bool(dx) || dw;
  for (int r0 = 0; r0 < M; r0 += chunk) {
    const int rows = M - r0 < chunk ? M - r0 : chunk;
    float* logits = scratch;
    float* dlogits = scratch + size_t(chunk) * V;
    const CAct xr = x.at(size_t(r0) * C);
    matmul_forward(logits, xr, w, nullptr, rows, C, V, WLayout::OutIn);
    crossentropy_forward(losses + r0, logits, targets + r0, rows, V);
    if (!bwd) continue;
    zero(dlogits, size_t(rows) * V * sizeof(float));
    crossentropy_backward(dlogits, logits, targets + r0, dloss, rows, V);
    matmul_backward(dx.at(size_t(r0) * C), dw, nullptr, dlogits, xr, w, rows, C, V,
                    WLayout::OutIn);
  }
}

// ---- the optimizer: one update per span ----
void Backend::adamw_update_spans(float* param, float* grad, float* m, float* v,
                                 const std::vector<AdamWSpan>& spans, float lr, float beta1,
                                 float beta2, float eps, float grad_scale, int t, bool zero_grad) {
  for (const AdamWSpan& sp : spans) {
    adamw_update(param + sp.offset, grad + sp.offset, m + sp.offset, v + sp.offset, sp.numel, lr,
                 beta1, beta2, eps, sp.weight_decay, grad_scale, t);
    if (zero_grad) zero(grad + sp.offset, sp.numel * sizeof(float));
  }
}

}  // namespace nlp
