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
#include "backend/forwarding_backend.h"
#include "core/backend.h"

namespace nlp {

class AccountBackend final : public ForwardingBackend {
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

  // on: start() with a copy and a GEMM sized for the device (the trainer turns profiling on after
  // the first step).
  void set_profiling(bool on) override;
  std::string profile_report() override { return report(1, 0, nullptr); }
  void register_weights(const float* arena, size_t n) override;

  // ---- the ops: core/backend_ops.def's COUNT entries, each under its label with its cost ----
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  NLP_ACCOUNT_DECLARE_##account(name, ret, params)
#define NLP_ACCOUNT_DECLARE_COUNT(name, ret, params) ret name params override;
#define NLP_ACCOUNT_DECLARE_UNCOUNTED(name, ret, params)
#define NLP_ACCOUNT_DECLARE_OWN(name, ret, params)
#include "core/backend_ops.def"
#undef NLP_ACCOUNT_DECLARE_COUNT
#undef NLP_ACCOUNT_DECLARE_UNCOUNTED
#undef NLP_ACCOUNT_DECLARE_OWN

  // ---- and its OWN entries ----
  // the token embedding: notes wte (a GEMM with that weight is the LM head's)
  void embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                         const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                         const int32_t* pos_ids) override;
  // The dense layer: under the LM head's or the blocks' GEMM label, forward or backward.
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
  // GPT-2's LM head fused with its loss (model.fused_head): its GEMMs, loss and dlogits counted
  // together under "gemm (lm head)"; the bf16 operand casts inside it are in its time
  account::Cost lm_head_cost(int M, int C, int V, bool dx, bool dw) const;
  account::Cost adamw_spans_cost(const float* param, const std::vector<AdamWSpan>& spans,
                                 bool zero_grad) const;

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
