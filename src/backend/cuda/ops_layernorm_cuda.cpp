// CudaBackend (cuda_backend_impl.h): layer norm, and a block's residual add + dropout + layer norm
// (kernels/layernorm.cu; bf16 storage: kernels/bf16_layernorm.cu).
#include "backend/cuda/cuda_backend_impl.h"

namespace nlp::cuda {

void CudaBackend::layernorm_forward(Act out, float* mean, float* rstd, CAct inp, const float* w,
                                    const float* b, int N, int C, float eps) {
  if (out.f32() && inp.f32())
    return layernorm_forward_f32(out.fp(), mean, rstd, inp.fp(), w, b, N, C, eps);
  if (native_bf16_views({out, inp})) {
    forget_ce_stats(out.p);
    op(kern::layernorm_forward_bf16(out.p, mean, rstd, inp.p, w, b, N, C, eps, stream_),
       "layernorm_forward (bf16)");
    return;
  }
  Stage st(*this, "layernorm_forward (staged)");
  const float* i = st.in(inp, size_t(N) * C);
  layernorm_forward_f32(st.out(out, size_t(N) * C), mean, rstd, i, w, b, N, C, eps);
  st.finish();
}

void CudaBackend::layernorm_backward(Act dinp, float* dw, float* db, CAct dout, CAct inp,
                                     const float* w, const float* mean, const float* rstd, int N,
                                     int C) {
  const size_t n = size_t(N) * C;
  if (dinp.f32() && dout.f32() && inp.f32()) {
    return layernorm_backward_f32(acc_f32(dinp, n), dw, db, dout.fp(), inp.fp(), w, mean, rstd, N, C);
  }
  if (native_bf16_views({dinp, dout, inp})) {
    void* ws = (dw || db) ? workspace(kern::layernorm_backward_bf16_ws_bytes(N, C)) : nullptr;
    op(kern::layernorm_backward_bf16(dinp.p, !dinp.write, dw, db, dout.p, inp.p, w, mean, rstd, N,
                                     C, ws, stream_),
       "layernorm_backward (bf16)");
    return;
  }
  Stage st(*this, "layernorm_backward (staged)");
  const float* d = st.in(dout, n);
  const float* i = st.in(inp, n);
  layernorm_backward_f32(st.acc(dinp, n), dw, db, d, i, w, mean, rstd, N, C);
  st.finish();
}

// bf16 res: res = x + dropout(delta) in fp32, stored rounded, and the norm of the stored (rounded)
// value, as the CPU backend computes it: staged as the unfused fp32 dropout and add, the rounding
// of res, then the layer norm of its bf16 view.
void CudaBackend::residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x,
                                             CAct delta, const float* w, const float* b, int N,
                                             int C, float eps, float p, uint64_t seed,
                                             DropRows rows) {
  const size_t n = size_t(N) * C;
  if (res.f32() && out.f32() && x.f32() && delta.f32())
    return residual_layernorm_forward_f32(res.fp(), out.fp(), mean, rstd, x.fp(), delta.fp(), w, b,
                                          N, C, eps, p, seed, rows);
  if (native_bf16_views({res, out, x, delta})) {  // one launch, the same rounding points
    forget_ce_stats(res.p);
    forget_ce_stats(out.p);
    op(kern::residual_layernorm_forward_bf16(res.p, out.p, mean, rstd, x.p, delta.p, w, b, N, C, eps,
                                             p, seed, slot_, rows.row, rows.row_key,
                                             rows.token_key, rows.width, stream_),
       "residual_layernorm_forward (bf16)");
    return;
  }
  {
    Stage st(*this, "residual_layernorm_forward (staged)");
    const float* xi = st.in(x, n);
    const float* di = st.in(delta, n);
    float* r = st.out(res, n);
    dropout_forward_f32(r, di, n, p, seed, rows);
    add_f32(r, r, xi, n);
    st.finish();
  }
  layernorm_forward(out, mean, rstd, res, w, b, N, C, eps);
}

void CudaBackend::layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw,
                                             float* db, CAct dout, CAct inp, const float* w,
                                             const float* mean, const float* rstd, int N, int C,
                                             float p, uint64_t seed, DropRows rows) {
  const size_t n = size_t(N) * C;
  if (dinp.f32() && ddelta.f32() && scratch.f32() && dout.f32() && inp.f32()) {
    return layernorm_dropout_backward_f32(acc_f32(dinp, n), ddelta.fp(), scratch.fp(), dw, db, dout.fp(),
                                          inp.fp(), w, mean, rstd, N, C, p, seed, rows);
  }
  // staged: the fp32 op keeps the layer norm's gradient in fp32 (as the CPU backend does); its
  // scratch is a staging buffer, the bf16 scratch view goes unused
  Stage st(*this, "layernorm_dropout_backward (staged)");
  const float* d = st.in(dout, n);
  const float* i = st.in(inp, n);
  float* g = st.acc(dinp, n);
  float* dd = st.out(ddelta, n);
  layernorm_dropout_backward_f32(g, dd, st.scratch(n), dw, db, d, i, w, mean, rstd, N, C, p, seed,
                                 rows);
  st.finish();
}

// ---- the fp32 ops (float* views) ----
void CudaBackend::layernorm_forward_f32(float* out, float* mean, float* rstd, const float* inp,
                                        const float* w, const float* b, int N, int C, float eps) {
  op(kern::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, stream_),
     "layernorm_forward");
}

void CudaBackend::layernorm_backward_f32(float* dinp, float* dw, float* db, const float* dout,
                                         const float* inp, const float* w, const float* mean,
                                         const float* rstd, int N, int C) {
  void* ws = (dw || db) ? workspace(kern::layernorm_backward_ws_bytes(N, C)) : nullptr;
  op(kern::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, ws, stream_),
     "layernorm_backward");
}

// A block's residual add + dropout + layer norm in one launch, and its backward in one row kernel
// (plus the dw/db column sums): the bits of Backend's defaults (dropout, add and layer norm in
// turn), which NLPTRAIN_CUDA_FUSED_LN=0 selects instead.
void CudaBackend::residual_layernorm_forward_f32(float* res, float* out, float* mean, float* rstd,
                                                 const float* x, const float* delta, const float* w,
                                                 const float* b, int N, int C, float eps, float p,
                                                 uint64_t seed, DropRows rows) {
  if (!fused_ln_) {
    Backend::residual_layernorm_forward(res, out, mean, rstd, x, delta, w, b, N, C, eps, p, seed, rows);
    return;
  }
  forget_ce_stats(res);
  forget_ce_stats(out);
  op(kern::residual_layernorm_forward(res, out, mean, rstd, x, delta, w, b, N, C, eps, p, seed, slot_,
                                      rows.row, rows.row_key, rows.token_key, rows.width, stream_),
     "residual_layernorm_forward");
}

void CudaBackend::layernorm_dropout_backward_f32(float* dinp, float* ddelta, float* scratch,
                                                 float* dw, float* db, const float* dout,
                                                 const float* inp, const float* w,
                                                 const float* mean, const float* rstd, int N, int C,
                                                 float p, uint64_t seed, DropRows rows) {
  if (!fused_ln_) {
    Backend::layernorm_dropout_backward(dinp, ddelta, scratch, dw, db, dout, inp, w, mean, rstd, N, C,
                                        p, seed, rows);
    return;
  }
  forget_ce_stats(ddelta);
  void* ws = (dw || db) ? workspace(kern::layernorm_backward_ws_bytes(N, C)) : nullptr;
  op(kern::layernorm_dropout_backward(dinp, ddelta, dw, db, dout, inp, w, mean, rstd, N, C, p, seed,
                                      slot_, rows.row, rows.row_key, rows.token_key, rows.width, ws,
                                      stream_),
     "layernorm_dropout_backward");
}

}  // namespace nlp::cuda
