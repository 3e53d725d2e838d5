// CudaBackend (cuda_backend_impl.h): the elementwise ops and dropout (kernels/elementwise.cu,
// kernels/gelu.cu; bf16 storage: kernels/bf16_elementwise.cu) and copy_view's conversions
// (kernels/convert.cu).
#include "backend/cuda/cuda_backend_impl.h"

namespace nlp::cuda {

void CudaBackend::gelu_forward(Act out, CAct inp, size_t N, Gelu form) {
  const auto f32 = [&](float* o, const float* i) {
    op(kern::gelu_forward(o, i, N, form == Gelu::Tanh, stream_), "gelu_forward");
  };
  if (out.f32() && inp.f32()) return f32(out.fp(), inp.fp());
  if (native_bf16_views({out, inp})) {
    forget_ce_stats(out.p);
    op(kern::gelu_forward_bf16(out.p, inp.p, N, form == Gelu::Tanh, stream_), "gelu_forward (bf16)");
    return;
  }
  Stage st(*this, "gelu_forward (staged)");
  const float* i = st.in(inp, N);
  f32(st.out(out, N), i);
  st.finish();
}

void CudaBackend::gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) {
  const auto f32 = [&](float* di, const float* i, const float* d) {
    op(kern::gelu_backward(di, i, d, N, form == Gelu::Tanh, stream_), "gelu_backward");
  };
  if (dinp.f32() && inp.f32() && dout.f32()) return f32(acc_f32(dinp, N), inp.fp(), dout.fp());
  if (native_bf16_views({dinp, inp, dout})) {
    forget_ce_stats(dinp.p);
    op(kern::gelu_backward_bf16(dinp.p, !dinp.write, inp.p, dout.p, N, form == Gelu::Tanh, stream_),
       "gelu_backward (bf16)");
    return;
  }
  Stage st(*this, "gelu_backward (staged)");
  const float* i = st.in(inp, N);
  const float* d = st.in(dout, N);
  f32(st.acc(dinp, N), i, d);
  st.finish();
}

void CudaBackend::add(Act out, CAct a, CAct b, size_t N) {
  if (out.f32() && a.f32() && b.f32()) return add_f32(out.fp(), a.fp(), b.fp(), N);
  if (native_bf16_views({out, a, b})) {
    forget_ce_stats(out.p);
    op(kern::add_bf16(out.p, a.p, b.p, N, stream_), "add (bf16)");
    return;
  }
  Stage st(*this, "add (staged)");
  const float* ia = st.in(a, N);
  const float* ib = st.in(b, N);
  add_f32(st.out(out, N), ia, ib, N);
  st.finish();
}

void CudaBackend::accumulate(Act dst, CAct src, size_t N) {
  const auto f32 = [&](float* d, const float* s) {
    op(kern::accumulate(d, s, N, stream_), "accumulate");
  };
  if (dst.f32() && src.f32()) return f32(dst.fp(), src.fp());
  if (native_bf16() && dst.p && src.p) {  // an accumulation whatever the flag, any mix of dtypes
    forget_ce_stats(dst.p);
    if (!dst.f32() && !src.f32())
      op(kern::accumulate_bf16_bf16(dst.p, src.p, N, stream_), "accumulate (bf16)");
    else if (!dst.f32())
      op(kern::accumulate_f32_into_bf16(dst.p, src.fp(), N, stream_), "accumulate (bf16 += fp32)");
    else
      op(kern::accumulate_bf16(dst.fp(), src.p, N, stream_), "accumulate (fp32 += bf16)");
    return;
  }
  Act d = dst;
  d.write = false;  // an accumulation whatever the flag
  Stage st(*this, "accumulate (staged)");
  const float* s = st.in(src, N);
  f32(st.acc(d, N), s);
  st.finish();
}

void CudaBackend::scale(Act x, float s, size_t N) {
  const auto f32 = [&](float* v) { op(kern::scale(v, s, N, stream_), "scale"); };
  if (x.f32()) return f32(x.fp());
  if (native_bf16_views({x})) {
    forget_ce_stats(x.p);
    op(kern::scale_bf16(x.p, s, N, stream_), "scale (bf16)");
    return;
  }
  Act d = x;
  d.write = false;
  Stage st(*this, "scale (staged)");
  f32(st.acc(d, N));
  st.finish();
}

void CudaBackend::copy_view(Act dst, CAct src, size_t N) {
  if (dst.dt == src.dt) return copy(dst.p, src.p, N * dtype_bytes(dst.dt));
  forget_ce_stats(dst.p);
  if (dst.f32()) {
    op(kern::from_bf16(dst.fp(), src.p, N, stream_), "copy_view");
    ++to32_;
  } else {
    op(kern::to_bf16(dst.p, src.fp(), N, stream_), "copy_view");
    ++to16_;
  }
}

// An op without a native bf16 kernel, in the form an added op takes (docs/design.md, "Adding an
// op"): the fp32 launch, run on the views' own buffers when they are fp32, else on fp32 stand-ins.
void CudaBackend::tanh_forward(Act out, CAct inp, size_t N) {
  const auto f32 = [&](float* o, const float* i) {
    op(kern::tanh_forward(o, i, N, stream_), "tanh_forward");
  };
  if (out.f32() && inp.f32()) return f32(out.fp(), inp.fp());
  Stage st(*this, "tanh_forward (staged)");
  const float* i = st.in(inp, N);
  f32(st.out(out, N), i);
  st.finish();
}

void CudaBackend::tanh_backward(Act dinp, CAct out, CAct dout, size_t N) {
  const auto f32 = [&](float* di, const float* o, const float* d) {
    op(kern::tanh_backward(di, o, d, N, stream_), "tanh_backward");
  };
  if (dinp.f32() && out.f32() && dout.f32()) return f32(acc_f32(dinp, N), out.fp(), dout.fp());
  Stage st(*this, "tanh_backward (staged)");
  const float* o = st.in(out, N);
  const float* d = st.in(dout, N);
  f32(st.acc(dinp, N), o, d);
  st.finish();
}

void CudaBackend::dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed,
                                  DropRows rows) {
  if (out.f32() && inp.f32()) return dropout_forward_f32(out.fp(), inp.fp(), N, p, seed, rows);
  if (native_bf16_views({out, inp})) {
    if (p <= 0.0f) return copy(out.p, inp.p, N * dtype_bytes(DType::BF16));
    forget_ce_stats(out.p);
    op(kern::dropout_forward_bf16(out.p, inp.p, N, p, seed, slot_, rows.row, rows.row_key,
                                  rows.token_key, rows.width, stream_),
       "dropout_forward (bf16)");
    return;
  }
  Stage st(*this, "dropout_forward (staged)");
  const float* i = st.in(inp, N);
  dropout_forward_f32(st.out(out, N), i, N, p, seed, rows);
  st.finish();
}

void CudaBackend::dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                                   DropRows rows) {
  if (dinp.f32() && dout.f32()) {
    return dropout_backward_f32(acc_f32(dinp, N), dout.fp(), N, p, seed, rows);
  }
  if (native_bf16_views({dinp, dout})) {
    if (p <= 0.0f) {
      if (dinp.write) return copy(dinp.p, dout.p, N * dtype_bytes(DType::BF16));
      return accumulate(dinp, dout, N);
    }
    forget_ce_stats(dinp.p);
    op(kern::dropout_backward_bf16(dinp.p, !dinp.write, dout.p, N, p, seed, slot_, rows.row,
                                   rows.row_key, rows.token_key, rows.width, stream_),
       "dropout_backward (bf16)");
    return;
  }
  Stage st(*this, "dropout_backward (staged)");
  const float* d = st.in(dout, N);
  dropout_backward_f32(st.acc(dinp, N), d, N, p, seed, rows);
  st.finish();
}

// ---- the fp32 ops the fused layer norm's fallback also runs (ops_layernorm_cuda.cpp) ----
void CudaBackend::add_f32(float* out, const float* a, const float* b, size_t N) {
  op(kern::add(out, a, b, N, stream_), "add");
}

void CudaBackend::dropout_forward_f32(float* out, const float* inp, size_t N, float p,
                                      uint64_t seed, DropRows rows) {
  if (p <= 0.0f) {
    copy(out, inp, N * sizeof(float));
    return;
  }
  op(kern::dropout_forward(out, inp, N, p, seed, slot_, rows.row, rows.row_key, rows.token_key,
                           rows.width, stream_),
     "dropout_forward");
}

void CudaBackend::dropout_backward_f32(float* dinp, const float* dout, size_t N, float p,
                                       uint64_t seed, DropRows rows) {
  if (p <= 0.0f) {
    accumulate(dinp, dout, N);
    return;
  }
  op(kern::dropout_backward(dinp, dout, N, p, seed, slot_, rows.row, rows.row_key, rows.token_key,
                            rows.width, stream_),
     "dropout_backward");
}

}  // namespace nlp::cuda
