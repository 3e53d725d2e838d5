// CudaBackend (cuda_backend_impl.h): attention, native (kernels/attention.cu) or through cuDNN's
// fused SDPA (attention_cudnn.h), and the decode step with a KV cache.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <string>

namespace nlp::cuda {

void CudaBackend::attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask,
                                    bool causal, float dropout_p, uint64_t seed, int B, int T,
                                    int NH, int HS, int T_key, const int32_t* token_key,
                                    int examples) {
  if (out.f32() && qkv.f32())
    return attention_forward_f32(out.fp(), att, qkv.fp(), attn_mask, causal, dropout_p, seed, B, T,
                                 NH, HS, T_key, token_key, examples);
  // native: cuDNN reads q|k|v and writes O in bf16 in place (attention_cudnn.h, bf16 I/O); the
  // saved state is the stats alone (attention_saved_floats with act = BF16)
  if (native_bf16() && !out.f32() && !qkv.f32() && noted([&] { return fused(B, T, NH, HS); })) {
    noted([&] {
      fused_->forward_bf16(out.p, att, qkv.p, attn_mask, token_key != nullptr, examples, causal,
                           dropout_p, seed, slot_, B, T, NH, HS);
    });
    op(cudaGetLastError(), "attention_forward (cuDNN, bf16 I/O)");
    return;
  }
  const size_t n = size_t(std::max(B, examples)) * T * NH * HS;
  Stage st(*this, "attention_forward (staged)");
  const float* q = st.in(qkv, 3 * n);
  attention_forward_f32(st.out(out, n), att, q, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                        T_key, token_key, examples);
  st.finish();
}

void CudaBackend::attention_backward(Act dqkv, float* scratch, CAct dout, CAct out, CAct qkv,
                                     const float* att, const int32_t* attn_mask, bool causal,
                                     float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                                     int T_key, const int32_t* token_key, int examples) {
  if (dqkv.f32() && dout.f32() && qkv.f32())
    return attention_backward_f32(acc_f32(dqkv, 3 * size_t(B) * T * NH * HS), scratch, dout.fp(),
                                  qkv.fp(), att, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                                  T_key, token_key, examples);
  // native: the forward's bf16-I/O state (stats only) with O read from `out`, the forward's bf16
  // output; dq|dk|dv written straight into dqkv (overwrite) or added to it. A saved state sized for
  // bf16 I/O cannot go to the staged fp32 path below (which would read it as the larger fp32 state).
  if (native_bf16() && !qkv.f32() && noted([&] { return fused(B, T, NH, HS); })) {
    if (!out || out.f32() || dqkv.f32() || dout.f32())
      throw Error(cat("attention_backward (cuDNN, bf16 I/O): the forward ran with bf16 I/O but "
                      "out is ", out ? dtype_name(out.dt) : "null", ", dqkv ", dtype_name(dqkv.dt),
                      " and dout ", dtype_name(dout.dt),
                      "; all three must be bf16 (or set NLPTRAIN_CUDA_BF16_ACTS=staged)"));
    noted([&] {
      fused_->backward_bf16(dqkv.p, !dqkv.write, scratch, dout.p, qkv.p, out.p, att, attn_mask,
                            token_key != nullptr, examples, causal, dropout_p, seed, slot_, B, T,
                            NH, HS);
    });
    op(cudaGetLastError(), "attention_backward (cuDNN, bf16 I/O)");
    return;
  }
  const size_t n = size_t(B) * T * NH * HS;
  Stage st(*this, "attention_backward (staged)");
  const float* d = st.in(dout, n);
  const float* q = st.in(qkv, 3 * n);
  attention_backward_f32(st.acc(dqkv, 3 * n), scratch, d, q, att, attn_mask, causal, dropout_p, seed,
                         B, T, NH, HS, T_key, token_key, examples);
  st.finish();
}

// ---- the fp32 path, cuDNN or native (float* views) ----
// With fused attention, every shape cuDNN supports (decided once per (NH, HS), the same answer for
// sizing and dispatch) runs through cuDNN's SDPA and saves/uses the small state of
// attention_cudnn.h; any other shape, and every shape without it, runs the native kernels with
// att[B,NH,T,T] probabilities.
// (act: bf16 views with native_bf16() run cuDNN's bf16-I/O entry points, whose state is the stats
// alone and whose scratch is one bf16 dO; staged bf16 views go through the fp32 path below, which
// saves the same state as fp32. The fp32 sizes are the larger, so either path fits in them.)
size_t CudaBackend::attention_saved_floats(int B, int T, int NH, int HS, DType act) {
  if (!fused(B, T, NH, HS)) return Backend::attention_saved_floats(B, T, NH, HS, act);
  return act == DType::BF16 && native_bf16() ? cuda::sdpa_saved_floats_bf16(B, T, NH, HS)
                                             : cuda::sdpa_saved_floats(B, T, NH, HS);
}

size_t CudaBackend::attention_scratch_floats(int B, int T, int NH, int HS, DType act) {
  if (!fused(B, T, NH, HS)) return Backend::attention_scratch_floats(B, T, NH, HS, act);
  return act == DType::BF16 && native_bf16() ? cuda::sdpa_scratch_floats_bf16(B, T, NH, HS)
                                             : cuda::sdpa_scratch_floats(B, T, NH, HS);
}

void CudaBackend::attention_forward_f32(float* out, float* att, const float* qkv,
                                        const int32_t* attn_mask, bool causal, float dropout_p,
                                        uint64_t seed, int B, int T, int NH, int HS, int T_key,
                                        const int32_t* token_key, int examples) {
  // packed rows (they carry token_key, model.h) take cuDNN's ragged layout or its segment-mask
  // bias (attention_cudnn.h); cuDNN draws its own dropout mask (backend.h): T_key and token_key
  // do not apply to it
  if (noted([&] { return fused(B, T, NH, HS); })) {
    noted([&] {
      fused_->forward(out, att, qkv, attn_mask, token_key != nullptr, examples, causal, dropout_p,
                      seed, slot_, B, T, NH, HS);
    });
    op(cudaGetLastError(), "attention_forward (cuDNN)");
    return;
  }
  op(kern::attention_forward(out, att, qkv, attn_mask, causal, dropout_p, seed, slot_, B, T, NH,
                             HS, T_key, token_key, stream_),
     "attention_forward");
}

void CudaBackend::attention_backward_f32(float* dqkv, float* scratch, const float* dout,
                                         const float* qkv, const float* att,
                                         const int32_t* attn_mask, bool causal, float dropout_p,
                                         uint64_t seed, int B, int T, int NH, int HS, int T_key,
                                         const int32_t* token_key, int examples) {
  if (noted([&] { return fused(B, T, NH, HS); })) {  // q, k, v come from the bf16 copy in att
    noted([&] {
      fused_->backward(dqkv, scratch, dout, att, attn_mask, token_key != nullptr, examples, causal,
                       dropout_p, seed, slot_, B, T, NH, HS);
    });
    op(cudaGetLastError(), "attention_backward (cuDNN)");
    return;
  }
  op(kern::attention_backward(dqkv, scratch, dout, qkv, att, attn_mask, causal, dropout_p, seed,
                              slot_, B, T, NH, HS, T_key, token_key, stream_),
     "attention_backward");
}

void CudaBackend::attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache,
                                   int B, int pos, int Tmax, int NH, int HS) {
  NLP_ASSERT(pos >= 0 && pos < Tmax);
  void* ws = workspace(kern::attention_decode_ws_bytes(B, pos, NH));
  op(kern::attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS, ws, stream_),
     "attention_decode");
}

}  // namespace nlp::cuda
