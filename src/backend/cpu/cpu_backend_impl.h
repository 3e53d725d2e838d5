// The CPU backend's class, CpuBackend (internal to src/backend/cpu/; the rest of the program sees
// make_cpu_backend in cpu_backend.h). Its members are defined by concern:
//   cpu_backend.cpp   construction, details, host memory, run.profile's cast times, the persistent
//                     bf16 copy of the weights, the GEMM operands' casts, the factory
//   <family>.cpp      each op beside the fp32 function it calls (its views as fp32 stand-ins,
//                     cpu/staged.h, then the function): embedding, matmul, layernorm, gelu,
//                     elementwise (and dropout), rows (and tanh), attention, crossentropy (and the
//                     LM head fused with its loss), optimizer (and the reductions)
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/round.h"
#include "core/backend.h"

namespace nlp::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, Precision precision, CpuGemm gemm, CpuBf16 bf16, bool bf16_weights);

  std::string name() const override { return "cpu"; }
  std::string details() const override;

  // ---- run.profile's account (backend/op_account_backend.h): the GEMMs' operand casts timed apart ----
  void profile_label(const char* label) override;
  std::vector<ProfileTime> profile_times() override { return cast_times_; }

  // ---- the persistent bf16 copy of the weights (core/backend.h) ----
  void register_weights(const float* arena, size_t n) override;
  void weights_written(const float* p, size_t n) override;
  const uint16_t* bf16_weights() const override {
    return warena_ ? reinterpret_cast<const uint16_t*>(wcopy_.data()) : nullptr;
  }

  // Every PURE op of core/backend_ops.def, declared from the list: the memory ops in
  // cpu_backend.cpp, the others in their family's file (above). An op added to the list is defined
  // in one of those files and declared nowhere else. Each op hands its function fp32 stand-ins of
  // its views (cpu/staged.h): fp32 views are their own memory; bf16 ones are widened on entry and
  // rounded where the op stores them.
#define NLP_ARG_DEFAULT(value)
#define NLP_CPU_OP_PURE(name, ret, params) ret name params override;
#define NLP_CPU_OP_DEFAULT(name, ret, params)
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) NLP_CPU_OP_##impl(name, ret, params)
#include "core/backend_ops.def"
#undef NLP_CPU_OP_PURE
#undef NLP_CPU_OP_DEFAULT

  // The DEFAULT ops this backend implements itself (the others keep Backend's: host_alloc,
  // host_release, synchronize, and the fused matmul_gelu_forward / matmul_dgelu_backward as the
  // unfused ops in turn).
  // layernorm.cpp
  void residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x, CAct delta,
                                  const float* w, const float* b, int N, int C, float eps, float p,
                                  uint64_t seed, DropRows rows) override;
  void layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db, CAct dout,
                                  CAct inp, const float* w, const float* mean, const float* rstd, int N,
                                  int C, float p, uint64_t seed, DropRows rows) override;
  // attention.cpp
  size_t attention_saved_floats(int B, int T, int NH, int HS, DType) override;
  size_t attention_scratch_floats(int B, int T, int NH, int HS, DType) override;
  // crossentropy.cpp
  size_t lm_head_scratch_floats(int chunk, int C, int V, int Vp) override;
  void lm_head_crossentropy(float* losses, Act dx_v, float* dw, CAct x_v, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                            int chunk, float* scratch) override;
  // optimizer.cpp
  void adamw_update_spans(float* param, float* grad, float* m, float* v, const std::vector<AdamWSpan>& spans,
                          float lr, float beta1, float beta2, float eps, float grad_scale, int t,
                          bool zero_grad) override;

 private:
  // With a profile label set, an operand cast's host time is added to "cast: <label>".
  struct CastTimer {
    CpuBackend& b;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    explicit CastTimer(CpuBackend& be) : b(be) {}
    ~CastTimer();
  };

  // cpu_backend.cpp: zero's memset in parallel pieces, and its streaming stores
  void zero_bytes(void* p, size_t bytes);
  static void stream_zero(char* dst, size_t n);
  // cpu_backend.cpp: the GEMM operands' casts into scratch slot `slot` (0..2), each timed by a
  // CastTimer: x[n] (bf16) widened to fp32, x[n] rounded to the operand precision, x[n] as bf16
  const float* widened(int slot, const cpu::bf16* x, size_t n);
  const float* rounded(int slot, const float* x, size_t n);
  const cpu::bf16* to_bf16(int slot, const float* x, size_t n);

  // rows.cpp: elements of a [rows, stride] tensor that a row op over n rows of width C touches
  static size_t strided_extent(int n, int C, size_t stride, const int32_t* idx);

  // The persistent copy of the weight w[n] when w lies inside the registered arena, else null.
  const cpu::bf16* persistent(const float* w, size_t n) const {
    if (!warena_ || w < warena_ || w + n > warena_ + wn_) return nullptr;
    return wcopy_.data() + (w - warena_);
  }
  uint16_t* copy_of(const float* p, size_t n) {
    return reinterpret_cast<uint16_t*>(const_cast<cpu::bf16*>(persistent(p, n)));
  }

  void forget_ce_stats(const void* p) {
    if (p == ce_logits_) ce_logits_ = nullptr;
  }

  Precision precision_;
  const void* ce_logits_ = nullptr;  // the logits of the last crossentropy_forward
  int ce_M_ = 0, ce_V_ = 0;
  std::vector<float> ce_mx_;
  std::vector<double> ce_se_;
  cpu::GemmLib lib_ = cpu::GemmLib::OpenBlas;
  bool native_bf16_ = false;
  std::string bf16_isa_;
  std::string bf16_auto_;  // run.cpu_bf16 = auto: what it picked and why (cpu::auto_native_bf16)
  std::vector<float> round_buf_[3];
  std::vector<cpu::bf16> bf16_buf_[3];
  bool wcopy_on_ = false;             // run.bf16_weights with Precision::Bf16
  const float* warena_ = nullptr;     // the registered weights (register_weights)
  size_t wn_ = 0;
  std::vector<cpu::bf16> wcopy_;      // their bf16 rounding
  std::string cast_label_;                  // run.profile: "cast: <label>" of the op running
  std::vector<ProfileTime> cast_times_;     // the casts' time per such label
};

}  // namespace nlp::cpu
