// run.profile's account (op_account.h) as a Backend that sits between the model and the real backend:
// every op call is passed on under a label of its own (the LM head's GEMMs apart from the blocks',
// the bf16 operand casts apart from their GEMMs, the cross-entropy, the memsets) with its cost worked
// out from its shapes and dtypes. A backend that times ops itself (Backend::profile_times: the CUDA
// backend's events, stream order) supplies the times per label; for any other (the CPU, whose ops
// are synchronous) each call is timed on the host, and the casts inside its GEMMs, which the CPU
// backend times under "cast: <label>", are taken out of the GEMM's time.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/op_account.h"
#include "core/backend.h"

namespace nlp {

class AccountBackend final : public Backend {
 public:
  // vocab: the model's vocabulary size (a GEMM with that output width counts as the LM head's until
  // an embedding call names the token embedding, whose GEMMs are then the head's);
  // precision: the GEMM arithmetic of `inner` (bf16 operands and their casts when Bf16).
  AccountBackend(Backend& inner, int vocab, Precision precision);

  // Starts counting (after the run's set-up and first step): measures the rates, then accounts
  // every op until report().
  void start(size_t copy_bytes, int gemm_n);
  // The account over `steps` steps of measured wall time step_ms each: the log table; json (nullable)
  // receives summary.json's "profile" object.
  std::string report(long steps, double step_ms, std::string* json);
  const account::Account& account() const { return acct_; }
  const account::Rates& rates() const { return rates_; }

  std::string name() const override { return in_.name(); }
  std::string details() const override { return in_.details(); }
  void* alloc(size_t bytes) override { return in_.alloc(bytes); }
  void release(void* p) override { in_.release(p); }
  void zero(void* p, size_t bytes) override;
  void to_device(void* dst, const void* host_src, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void* host_alloc(size_t bytes) override { return in_.host_alloc(bytes); }
  void host_release(void* p) override { in_.host_release(p); }
  void synchronize() override { in_.synchronize(); }
  // on: start() with a copy and a GEMM sized for the device (the trainer turns profiling on after
  // the first step).
  void set_profiling(bool on) override;
  std::string profile_report() override { return report(1, 0, nullptr); }
  void register_weights(const float* arena, size_t n) override;
  void weights_written(const float* p, size_t n) override { in_.weights_written(p, n); }
  const uint16_t* bf16_weights() const override { return in_.bf16_weights(); }
  bool path_counts(PathCounts* out) const override { return in_.path_counts(out); }

  void embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                         const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                         const int32_t* pos_ids) override;
  void embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout,
                          const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                          int pos_offset, const int32_t* pos_ids) override;
  void matmul_forward(Act out, CAct inp, const float* w, const float* bias, int M, int K,
                      int N, WLayout layout) override;
  void matmul_backward(Act dinp, float* dw, float* dbias, CAct dout, CAct inp,
                       const float* w, int M, int K, int N, WLayout layout) override;
  // The dense layer with its GELU: one call under the GEMM's label, its cost that of the fused op,
  // the least it must move: the GEMM plus out written and the GELU's FLOPs; the backward: the GEMMs
  // plus pre read and the GELU derivative's FLOPs. (The default's two passes also move the product
  // through memory once more; their time is measured against this floor.)
  void matmul_gelu_forward(Act out, Act pre, CAct inp, const float* w, const float* bias, int M,
                           int K, int N, WLayout layout, Gelu form) override;
  void matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h, CAct pre,
                             const float* w, int M, int K, int N, WLayout layout, Gelu form,
                             Act scratch) override;
  void layernorm_forward(Act out, float* mean, float* rstd, CAct inp, const float* w,
                         const float* b, int N, int C, float eps) override;
  void layernorm_backward(Act dinp, float* dw, float* db, CAct dout, CAct inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override;
  void residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x,
                                  CAct delta, const float* w, const float* b, int N, int C,
                                  float eps, float p, uint64_t seed, DropRows rows) override;
  void layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db,
                                  CAct dout, CAct inp, const float* w,
                                  const float* mean, const float* rstd, int N, int C, float p,
                                  uint64_t seed, DropRows rows) override;
  void gelu_forward(Act out, CAct inp, size_t N, Gelu form) override;
  void gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) override;
  void add(Act out, CAct a, CAct b, size_t N) override;
  void accumulate(Act dst, CAct src, size_t N) override;
  void copy_view(Act dst, CAct src, size_t N) override;
  void scale(Act x, float s, size_t N) override;
  void tanh_forward(Act out, CAct inp, size_t N) override;
  void tanh_backward(Act dinp, CAct out, CAct dout, size_t N) override;
  void rows_gather(Act out, CAct inp, int n, int C, size_t stride,
                   const int32_t* idx) override;
  void rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                        const int32_t* idx) override;
  void dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed,
                       DropRows rows) override;
  void dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                        DropRows rows) override;
  void attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask,
                         bool causal, float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                         int T_key, const int32_t* token_key, int examples) override;
  void attention_backward(Act dqkv, float* scratch, CAct dout, CAct out, CAct qkv,
                          const float* att, const int32_t* attn_mask, bool causal, float dropout_p,
                          uint64_t seed, int B, int T, int NH, int HS, int T_key,
                          const int32_t* token_key, int examples) override;
  size_t attention_saved_floats(int B, int T, int NH, int HS, DType act) override {
    return in_.attention_saved_floats(B, T, NH, HS, act);
  }
  size_t attention_scratch_floats(int B, int T, int NH, int HS, DType act) override {
    return in_.attention_scratch_floats(B, T, NH, HS, act);
  }
  void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                        int pos, int Tmax, int NH, int HS) override;
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                            int V) override;
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                             float dloss, int M, int V) override;
  void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                    const int32_t* len, const int32_t* targets, int E) override;
  void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                     const int32_t* len, const int32_t* targets, float dloss,
                                     int E) override;
  size_t lm_head_scratch_floats(int chunk, int C, int V, int Vp) override {
    return in_.lm_head_scratch_floats(chunk, C, V, Vp);
  }
  // GPT-2's LM head fused with its loss (model.fused_head): one call, its GEMMs, loss and dlogits
  // counted together under "gemm (lm head)"; the bf16 operand casts inside it are in its time
  void lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp, int chunk,
                            float* scratch) override;
  double sum(const float* x, size_t N) override;
  double sumsq(const float* x, size_t N) override;
  void sum_into(double* acc, const float* x, size_t N, double scale) override;
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int t) override;
  void adamw_update_spans(float* param, float* grad, float* m, float* v,
                          const std::vector<AdamWSpan>& spans, float lr, float beta1, float beta2,
                          float eps, float grad_scale, int t, bool zero_grad) override;

 private:
  // One call: its label and family, its cost; f runs it on the inner backend under the label.
  template <class F>
  auto op(const char* label, const char* family, const account::Cost& c, F&& f) -> decltype(f());
  // Whether a dense layer with weight w and output width N is the LM head: its weight is the token
  // embedding (tied: GPT-2, and BERT's MLM decoder), the wte of the last embedding_forward; before
  // any embedding call, a layer whose output is the vocabulary.
  bool head(const float* w, int N) const { return wte_ ? w == wte_ : vocab_ > 0 && N == vocab_; }
  bool has_copy(const float* w, size_t n) const;
  // A dense layer's label and GEMM costs (the casts of a bf16 backend added under "cast: <label>")
  const char* gemm_label(const float* w, int N, bool backward) const;
  account::Cost gemm_forward_cost(const char* label, CAct out, CAct inp, const float* w,
                                  const float* bias, int M, int K, int N);
  account::Cost gemm_backward_cost(const char* label, CAct dinp, bool dinp_write, const float* dw,
                                   const float* dbias, CAct dout, CAct inp, const float* w, int M,
                                   int K, int N);
  void cast_cost(const char* gemm_label, int64_t n);

  Backend& in_;
  const int vocab_;
  const bool bf16_;
  bool on_ = false;
  bool host_timed_ = true;  // the inner backend keeps no times of its own (the CPU)
  account::Account acct_;
  account::Rates rates_;
  const float* arena_ = nullptr;
  size_t arena_n_ = 0;
  const float* wte_ = nullptr;  // the token embedding of the last embedding_forward
  PathCounts paths0_;       // the inner backend's path counts at start()
  bool has_paths_ = false;  // it keeps them
};

}  // namespace nlp
