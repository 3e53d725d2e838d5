// The CUDA backend's class, CudaBackend (internal to src/backend/cuda/; the rest of the program sees
// make_cuda_backend in cuda_backend.h). Its members are defined by concern, one file each:
//   cuda_backend_cuda.cpp     construction, details, profiling, path counts, the op launch check,
//                             the factory
//   memory_cuda.cpp           device memory (the stream-ordered pool), copies, the workspace
//   weights_bf16_cuda.cpp     the persistent bf16 copy of the weights (run.bf16_weights)
//   capture_cuda.cpp          replayed micro-batches: recording a CUDA graph, replaying it
//   staging_cuda.cpp          the dispatch of typed views: fp32, native bf16, or staged through fp32
//   ops_<family>_cuda.cpp     the ops of one family, the typed-view dispatch and the fp32 op side by
//                             side: embedding (and rows), dense, layernorm, elementwise (and
//                             dropout), attention, lm_head (and cross-entropy), optimizer (and
//                             reductions)
// One stream per backend, every op enqueued on it in call order; fp32 throughout but where a view or
// train.precision says otherwise; no float atomics, so every op is deterministic run to run.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_workspace.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/op_profile.h"
#include "core/backend.h"
#include "core/error.h"

namespace nlp::cuda {

// Throws nlp::Error naming `what` and the CUDA error (clearing a non-sticky one first).
void ck(cudaError_t e, const char* what);

// The environment switches read at construction (cuda_backend_cuda.cpp; each refuses any other
// value, naming the variable): NLPTRAIN_CUDA_FUSED_LN, _BF16_CAST, _SEGMENT_CE, _BF16_ACTS.
bool fused_layernorm_from_env();
Bf16Operands bf16_operands_from_env();
bool segment_ce_rows_from_env();
bool native_bf16_acts_from_env();

// Row statistics of the last crossentropy_forward (CudaBackend::ce_stats_), and the pending
// cross-entropy target check (CudaBackend::ce_).
struct CeStats {
  const void* logits = nullptr;
  int M = 0, V = 0;
  float* mx = nullptr;
  double* se = nullptr;
  int cap = 0;
};
struct CeFlag {
  bool armed = false;  // a flag is pending (set since the last check)
  const int32_t* targets = nullptr;
  int M = 0, V = 0;
};

// A recorded micro-batch (Backend::Recording): the instantiated CUDA graph, its value table (device,
// `slots` words, read by the recorded kernels through their seed/dloss slots) and the pinned staging
// copy a replay fills, and what the recorded ops do to the backend's host-side state.
class CudaRecording final : public Backend::Recording {
 public:
  CudaRecording(const void* owner, size_t slots) : owner(owner), slots(slots) {}
  ~CudaRecording() override;  // capture_cuda.cpp
  CudaRecording(const CudaRecording&) = delete;
  CudaRecording& operator=(const CudaRecording&) = delete;

  const void* owner;  // the backend that recorded it (replayed only there)
  size_t slots;
  uint64_t* table = nullptr;    // device [max(slots, 1)]
  uint64_t* staging = nullptr;  // pinned host [max(slots, 1)]
  cudaEvent_t copied = nullptr;  // recorded after the last replay's table copy (staging reusable)
  cudaEvent_t done = nullptr;    // recorded after the last launch
  bool launched = false;
  cudaGraphExec_t exec = nullptr;
  size_t generation = 0;  // CudaBackend::memory_generation() when recorded
  // Cross-entropy state after the recorded ops: has_ce = they check targets (ce_flag: the last
  // op's); stats_set = they ran crossentropy_forward (stats_end: its identity after the rest),
  // else `written` lists the buffers they wrote (each forgets stats kept for it).
  bool has_ce = false;
  CeFlag ce_flag;
  bool stats_set = false;
  CeStats stats_end;
  std::vector<const void*> written;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& options);
  ~CudaBackend() override;
  std::string details() const override;
  bool path_counts(PathCounts* out) const override;
  void set_profiling(bool on) override;
  void profile_label(const char* label) override;
  std::vector<ProfileTime> profile_times() override;
  std::string name() const override { return "cuda"; }
  std::string profile_report() override { return prof_ ? prof_->report() : std::string(); }
  cudaStream_t stream() const { return stream_; }
  // bf16 activation views: the native bf16 kernels (true) or the staged fp32 ops (the ops on views)
  bool native_bf16() const { return native_bf16_acts_; }

  // weights_bf16_cuda.cpp
  void register_weights(const float* arena, size_t n) override;
  void weights_written(const float* p, size_t n) override;
  const uint16_t* bf16_weights() const override { return warena_ ? wcopy_ : nullptr; }

  // capture_cuda.cpp
  bool can_capture(std::string* why) const override;
  void capture_begin(size_t slots) override;
  void bind_slot(int k) override;
  std::shared_ptr<Recording> capture_end(std::string* why) override;
  void replay(Recording& recording, const uint64_t* values, size_t n) override;

  // Every op of core/backend_ops.def, declared from the list (CudaBackend implements all of them):
  // the memory ops in memory_cuda.cpp, synchronize in cuda_backend_cuda.cpp, the others in their
  // family's ops_<family>_cuda.cpp (the files above). An op added to the list is defined in one of
  // those files and declared nowhere else.
#define NLP_ARG_DEFAULT(value)
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) ret name params override;
#include "core/backend_ops.def"

 private:
  // fp32 stand-ins for one op's views (staging_cuda.cpp): in() an input, out() a written output,
  // acc() an accumulated gradient (zeros when the view says overwrite), scratch() a plain buffer;
  // finish() rounds every out/acc stand-in of a bf16 view back into it. fp32 views are their own
  // stand-ins.
  class Stage {
   public:
    Stage(CudaBackend& b, const char* what) : b_(b), what_(what) { ++b_.staged_ops_; }
    const float* in(CAct v, size_t n);
    float* out(Act v, size_t n) { return stand_in(v, n, false); }
    float* acc(Act v, size_t n) { return stand_in(v, n, true); }
    float* scratch(size_t n) { return b_.stage_buf(k_++, n); }
    void finish();

   private:
    float* stand_in(Act v, size_t n, bool accumulate);
    struct Back {
      void* dst;
      const float* src;
      size_t n;
    };
    CudaBackend& b_;
    const char* what_;
    size_t k_ = 0;
    std::vector<Back> back_;
  };

  // cuda_backend_cuda.cpp: every launch goes through op() (its error, run.sync_check, run.profile)
  void op(cudaError_t e, const char* what);
  void gemm(const char* what, float* Y, const float* X, bool trans_x, const float* Z, bool trans_z,
            int M, int P, int Q, float beta, const float* bias, const void* z16 = nullptr);
  // memory_cuda.cpp
  void* workspace(size_t bytes);
  void after_sync();
  // weights_bf16_cuda.cpp
  const uint16_t* persistent(const float* w, size_t n) const;
  void* copy_of(const float* p, size_t n) { return const_cast<uint16_t*>(persistent(p, n)); }
  // capture_cuda.cpp
  size_t memory_generation() const;
  void no_capture(const char* what);
  long cudnn_builds() const { return fused_ ? fused_->builds() : 0; }
  // dloss from the bound slot: the float in the word's low 32 bits (little-endian: its first 4 bytes)
  const float* dloss_slot() const { return reinterpret_cast<const float*>(slot_); }
  // Runs f; while recording, an exception it throws is noted for capture_end first.
  template <typename F>
  auto noted(F&& f) -> decltype(f()) {
    if (!cap_) return f();
    try {
      return f();
    } catch (const std::exception& e) {
      if (cap_ && cap_->failure.empty()) cap_->failure = e.what();
      throw;
    }
  }
  // staging_cuda.cpp
  float* acc_f32(Act v, size_t n);
  bool native_bf16_views(std::initializer_list<CAct> views) const;
  float* stage_buf(size_t k, size_t n);
  size_t strided_extent(int n, int C, size_t stride, const int32_t* idx);
  // ops_*_cuda.cpp: the fp32 ops (float* views), the verified path the typed views fall back on (an
  // op whose fp32 path is one launch that no other op runs keeps it inside the op, as tanh_forward)
  void embedding_forward_f32(float* out, const int32_t* ids, const int32_t* type_ids,
                             const float* wte, const float* wpe, const float* wtt, int B, int T,
                             int C, int pos_offset, const int32_t* pos_ids);
  void embedding_backward_f32(float* dwte, float* dwpe, float* dwtt, const float* dout,
                              const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                              int pos_offset, const int32_t* pos_ids);
  void rows_gather_f32(float* out, const float* inp, int n, int C, size_t stride,
                       const int32_t* idx);
  void rows_scatter_add_f32(float* dinp, const float* dout, int n, int C, size_t stride,
                            const int32_t* idx);
  void matmul_forward_f32(float* out, const float* inp, const float* w, const float* bias, int M,
                          int K, int N, WLayout layout);
  void matmul_backward_f32(float* dinp, float* dw, float* dbias, const float* dout,
                           const float* inp, const float* w, int M, int K, int N, WLayout layout);
  void layernorm_forward_f32(float* out, float* mean, float* rstd, const float* inp, const float* w,
                             const float* b, int N, int C, float eps);
  void layernorm_backward_f32(float* dinp, float* dw, float* db, const float* dout,
                              const float* inp, const float* w, const float* mean,
                              const float* rstd, int N, int C);
  void residual_layernorm_forward_f32(float* res, float* out, float* mean, float* rstd,
                                      const float* x, const float* delta, const float* w,
                                      const float* b, int N, int C, float eps, float p,
                                      uint64_t seed, DropRows rows);
  void layernorm_dropout_backward_f32(float* dinp, float* ddelta, float* scratch, float* dw,
                                      float* db, const float* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, int N,
                                      int C, float p, uint64_t seed, DropRows rows);
  void add_f32(float* out, const float* a, const float* b, size_t N);
  void dropout_forward_f32(float* out, const float* inp, size_t N, float p, uint64_t seed,
                           DropRows rows);
  void dropout_backward_f32(float* dinp, const float* dout, size_t N, float p, uint64_t seed,
                            DropRows rows);
  void attention_forward_f32(float* out, float* att, const float* qkv, const int32_t* attn_mask,
                             bool causal, float dropout_p, uint64_t seed, int B, int T, int NH,
                             int HS, int T_key, const int32_t* token_key, int examples);
  void attention_backward_f32(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* att, const int32_t* attn_mask, bool causal,
                              float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                              int T_key, const int32_t* token_key, int examples);
  bool fused(int B, int T, int NH, int HS) { return fused_ && fused_->supports(B, T, NH, HS); }
  size_t padded_floats(int C, int V, int Vp) const;
  void* head_dlogits16(float* scratch, int chunk, int C, int V, int Vp) const;
  void lm_head_crossentropy_f32(float* losses, float* dx, float* dw, const float* x, const float* w,
                                const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                                int chunk, float* scratch);
  const uint16_t* head_wte(const float* w, int C, int V, int Vp);
  void forget_head_wte(const float* p, size_t n);
  std::pair<std::vector<int32_t>, std::vector<int32_t>> segments_on_host(
      const int32_t* first, const int32_t* len, int E);
  void forget_ce_stats(const void* written);
  void ce_stats_capacity(int M);
  int* bad_row(const int32_t* targets, int M, int V);
  void copy_bad_row();
  void check_targets();
  double reduce(const float* x, size_t N, bool square);
  bool same_spans(const std::vector<AdamWSpan>& spans) const;
  void upload_spans(const std::vector<AdamWSpan>& spans);

  // ---- state (in this order: it is constructed and destroyed in it) ----
  static constexpr size_t kAlignFloats = 64;  // 256 bytes
  // The recording in progress (capture_begin .. capture_end) and what it must restore.
  struct Capture {
    std::shared_ptr<CudaRecording> rec;
    size_t generation = 0;
    long builds = 0;
    CeFlag ce;       // at capture_begin
    CeStats stats;   // at capture_begin
    bool has_ce = false;     // a recorded op checks cross-entropy targets
    bool stats_set = false;  // a recorded crossentropy_forward set ce_stats_
    std::vector<const void*> written;  // buffers written by recorded ops before stats_set
    std::string failure;     // the first op that failed or was refused while recording
  };
  std::unique_ptr<Capture> cap_;
  const uint64_t* slot_ = nullptr;  // bind_slot: the word of cap_'s table the next ops read
  size_t grows_ = 0;  // reallocations of ce_stats_, the staging buffers and the head's padded wte
  std::vector<AdamWSpan> spans_;  // the table on the device
  uint64_t* span_start_ = nullptr;
  uint64_t* span_end_ = nullptr;
  uint8_t* span_decay_ = nullptr;
  // path_counts(): ops staged, and conversions launched outside the GEMM (Stage, copy_view, the
  // persistent bf16 copy, the fused head's padded wte)
  int64_t staged_ops_ = 0, to16_ = 0, to32_ = 0;
  // Staging buffers: slot k of an op's stand-ins, grown as needed (between recordings only, like the
  // workspace) and reused by the next op (stream order makes that safe).
  std::vector<std::pair<float*, size_t>> stage_;  // pointer, floats
  // Row statistics of the last crossentropy_forward (max and sum of exp per row), reused by a
  // crossentropy_backward on the same logits (pointer, M, V): one read of the [M,V] logits instead of
  // three. Forgotten when an op writes that buffer (matmul_forward, copy, zero, to_device): the
  // backend contract (core/backend.h) is that the logits are unchanged in between.
  CeStats ce_stats_;
  CeFlag ce_;
  int device_;
  bool sync_check_ = false;
  bool fused_ln_ = fused_layernorm_from_env();  // NLPTRAIN_CUDA_FUSED_LN (default 1)
  cuda::Bf16Operands bf16_operands_ = bf16_operands_from_env();  // NLPTRAIN_CUDA_BF16_CAST
  bool segment_ce_rows_ = segment_ce_rows_from_env();           // NLPTRAIN_CUDA_SEGMENT_CE
  bool native_bf16_acts_ = native_bf16_acts_from_env();         // NLPTRAIN_CUDA_BF16_ACTS
  std::unique_ptr<cuda::OpProfile> prof_;  // run.profile
  const char* label_ = nullptr;            // profile_label
  const char* cast_label_ = "cast: bf16 operands";
  std::set<std::string> labels_;
  std::map<const char*, std::pair<const char*, const char*>> label_ptrs_;  // caller's -> interned
  bool wcopy_on_ = false;          // run.bf16_weights with Precision::Bf16
  bool bf16_prec_ = false;         // Precision::Bf16
  bool head_dl16_ = false;         // NLPTRAIN_CUDA_HEAD_DLOGITS=bf16 (default) with Precision::Bf16
  bool head_w16_ = false;          // NLPTRAIN_CUDA_HEAD_WTE=bf16 (default) with Precision::Bf16
  bool head_online_ = true;        // NLPTRAIN_CUDA_HEAD_SOFTMAX=online (default)
  const float* warena_ = nullptr;  // the registered weights (register_weights)
  size_t wn_ = 0;
  uint16_t* wcopy_ = nullptr;      // their bf16 rounding (device)
  struct HeadWte {                 // the fused head's padded bf16 wte (head_wte)
    uint16_t* p = nullptr;         // device [cap]
    size_t cap = 0;
    const float* w = nullptr;      // the wte it holds, kept across calls; null: remade at the next
    int C = 0, V = 0, Vp = 0;
  } hw_;
  int64_t head_wte_builds_ = 0;    // padded copies made (recorded ones once, not per replay)
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::CudnnAttention> fused_;  // BackendOptions::fused_attention
  cuda::DeviceWorkspace ws_{"workspace"};
  void* small_ = nullptr;       // device: [0] double reduction result, [64] int bad row
  void* host_small_ = nullptr;  // pinned mirror
};

}  // namespace nlp::cuda
