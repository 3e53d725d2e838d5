// CudaBackend (cuda_backend_impl.h): embeddings and row gathers/scatters (kernels/embedding.cu,
// kernels/elementwise.cu's rows; bf16 storage: kernels/bf16_embedding.cu, bf16_elementwise.cu).
#include "backend/cuda/cuda_backend_impl.h"

namespace nlp::cuda {

void CudaBackend::embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids,
                                    const float* wte, const float* wpe, const float* wtt, int B,
                                    int T, int C, int pos_offset, const int32_t* pos_ids) {
  if (out.f32())
    return embedding_forward_f32(out.fp(), ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids);
  if (native_bf16_views({out})) {
    forget_ce_stats(out.p);
    op(kern::embedding_forward_bf16(out.p, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset,
                                    pos_ids, stream_),
       "embedding_forward (bf16)");
    return;
  }
  Stage st(*this, "embedding_forward (staged)");
  embedding_forward_f32(st.out(out, size_t(B) * T * C), ids, type_ids, wte, wpe, wtt, B, T, C,
                        pos_offset, pos_ids);
  st.finish();
}

void CudaBackend::embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout,
                                     const int32_t* ids, const int32_t* type_ids, int B, int T,
                                     int C, int pos_offset, const int32_t* pos_ids) {
  if (dout.f32())
    return embedding_backward_f32(dwte, dwpe, dwtt, dout.fp(), ids, type_ids, B, T, C, pos_offset,
                                  pos_ids);
  if (native_bf16_views({dout})) {
    const size_t need = kern::embedding_backward_bf16_ws_bytes(B * T, C);
    void* ws = workspace(need);
    op(kern::embedding_backward_bf16(dwte, dwpe, dwtt, dout.p, ids, type_ids, B, T, C, pos_offset,
                                     pos_ids, ws, need, stream_),
       "embedding_backward (bf16)");
    return;
  }
  Stage st(*this, "embedding_backward (staged)");
  embedding_backward_f32(dwte, dwpe, dwtt, st.in(dout, size_t(B) * T * C), ids, type_ids, B, T, C,
                         pos_offset, pos_ids);
}

// The staged row ops widen the strided tensor up to its last row read: (rows - 1) * stride + C
// elements, where rows = n, or with idx the largest index + 1 (read back: a synchronisation).
void CudaBackend::rows_gather(Act out, CAct inp, int n, int C, size_t stride, const int32_t* idx) {
  if (out.f32() && inp.f32()) return rows_gather_f32(out.fp(), inp.fp(), n, C, stride, idx);
  if (native_bf16_views({out, inp})) {  // no staging, so no read-back of idx
    forget_ce_stats(out.p);
    op(kern::rows_gather_bf16(out.p, inp.p, n, C, stride, idx, stream_), "rows_gather (bf16)");
    return;
  }
  Stage st(*this, "rows_gather (staged)");
  const float* i = st.in(inp, strided_extent(n, C, stride, idx));
  rows_gather_f32(st.out(out, size_t(n) * C), i, n, C, stride, idx);
  st.finish();
}

void CudaBackend::rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                                   const int32_t* idx) {
  NLP_ASSERT(!dinp.write);  // only its rows are written: never the tensor's only writer
  if (dinp.f32() && dout.f32()) return rows_scatter_add_f32(dinp.fp(), dout.fp(), n, C, stride, idx);
  if (native_bf16_views({dinp, dout})) {
    forget_ce_stats(dinp.p);
    op(kern::rows_scatter_add_bf16(dinp.p, true, dout.p, n, C, stride, idx, stream_),
       "rows_scatter_add (bf16)");
    return;
  }
  Stage st(*this, "rows_scatter_add (staged)");
  const float* d = st.in(dout, size_t(n) * C);
  rows_scatter_add_f32(st.acc(dinp, strided_extent(n, C, stride, idx)), d, n, C, stride, idx);
  st.finish();
}

// ---- the fp32 ops (float* views) ----
void CudaBackend::embedding_forward_f32(float* out, const int32_t* ids, const int32_t* type_ids,
                                        const float* wte, const float* wpe, const float* wtt, int B,
                                        int T, int C, int pos_offset, const int32_t* pos_ids) {
  op(kern::embedding_forward(out, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids, stream_),
     "embedding_forward");
}

void CudaBackend::embedding_backward_f32(float* dwte, float* dwpe, float* dwtt, const float* dout,
                                         const int32_t* ids, const int32_t* type_ids, int B, int T,
                                         int C, int pos_offset, const int32_t* pos_ids) {
  const size_t need = kern::embedding_backward_ws_bytes(B * T, C);
  void* w = workspace(need);
  op(kern::embedding_backward(dwte, dwpe, dwtt, dout, ids, type_ids, B, T, C, pos_offset, pos_ids,
                              w, need, stream_),
     "embedding_backward");
}

void CudaBackend::rows_gather_f32(float* out, const float* inp, int n, int C, size_t stride,
                                  const int32_t* idx) {
  op(kern::rows_gather(out, inp, n, C, stride, idx, stream_), "rows_gather");
}

void CudaBackend::rows_scatter_add_f32(float* dinp, const float* dout, int n, int C, size_t stride,
                                       const int32_t* idx) {
  op(kern::rows_scatter_add(dinp, dout, n, C, stride, idx, stream_), "rows_scatter_add");
}

}  // namespace nlp::cuda
