// Replayed micro-batches (run.cuda_graph): a Backend that sits between the model and the
// real backend and runs each training micro-batch's forward and backward as one recorded graph
// whenever the micro-batch makes the same op calls as one recorded before.
//
// How a micro-batch runs (run()):
//  1. check: the model's host code runs against this proxy, which only notes each op and its
//     by-value arguments (the signature) and the values a recording reads from its table instead
//     (every dropout seed, the loss scale dloss; Backend::bind_slot). Nothing runs on the backend.
//  2. a recording of the same signature exists: it is replayed with this micro-batch's values (when
//     the backend refuses, because a buffer the recording points into has been reallocated since,
//     the micro-batch runs eagerly and the recording is dropped, to be made again);
//  3. else, when this signature has run eagerly before (so that every grow-only buffer has grown):
//     it is recorded (Backend::capture_begin .. capture_end) and then replayed, or, when the
//     recording fails (an op that synchronised or grew a buffer), run eagerly and not tried again;
//  4. else it runs eagerly, its signature noted.
// A micro-batch whose ops synchronise, allocate or read back during the check runs eagerly. So a
// replay runs exactly the ops the eager path would, with the same arguments and values, and the
// results are bitwise the eager ones. Shapes that vary (trimmed lengths, example counts) each get
// their recording, up to `max_recordings` (then they run eagerly).
//
// A backend that cannot record (Backend::can_capture false: the CPU) is emulated when `emulate`
// is set: the recording keeps the calls themselves and a replay makes them again with the table's
// values. That is how the CPU tests check this bookkeeping (tests/unit/test_step_graph.cpp), and
// how NLPTRAIN_STEP_GRAPH_EMULATE=1 lets a CPU run take the trainer's graph path.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/backend.h"

namespace nlp {

class StepGraph final : public Backend {
 public:
  enum class How { Eager, Recorded, Replayed };
  struct Stats {
    long eager = 0, recorded = 0, replayed = 0;
    long failed = 0;         // recordings that failed (their signatures then run eagerly)
    long dropped = 0;        // recordings the backend refused to replay (recorded again later)
    std::string last_why;    // why the last micro-batch ran eagerly, or the last recording failed
    std::map<std::string, long> eager_why;  // micro-batches run eagerly, by reason
    long checks = 0;            // check passes (the host's walk of a micro-batch's calls, step 1)
    double check_seconds = 0;   // their host time, in total (the GPU waits for it before a replay)
  };

  // inner: the backend that runs the ops. emulate: record by keeping the calls when inner cannot
  // record itself (else such a StepGraph only passes every call through).
  StepGraph(Backend& inner, bool emulate, size_t max_recordings = 8);
  ~StepGraph() override;

  // Runs one micro-batch: body() makes its op calls on *this (Model::forward_into and backward).
  // body may run up to three times (check, record, eager), so it must do nothing else.
  How run(const std::function<void()>& body);
  const Stats& stats() const { return stats_; }
  Backend& inner() { return in_; }
  bool records() const { return native_ || emulate_; }

  // ---- Backend: everything goes to inner, noted as the mode says ----
  std::string name() const override { return in_.name(); }
  std::string details() const override { return in_.details(); }
  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void zero(void* p, size_t bytes) override;
  void to_device(void* dst, const void* host_src, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void* host_alloc(size_t bytes) override;
  void host_release(void* p) override;
  void synchronize() override;
  void set_profiling(bool on) override { in_.set_profiling(on); }
  std::string profile_report() override { return in_.profile_report(); }
  void profile_label(const char* label) override { in_.profile_label(label); }
  std::vector<ProfileTime> profile_times() override { return in_.profile_times(); }
  bool path_counts(PathCounts* out) const override { return in_.path_counts(out); }
  void register_weights(const float* arena, size_t n) override { in_.register_weights(arena, n); }
  void weights_written(const float* p, size_t n) override { in_.weights_written(p, n); }
  const uint16_t* bf16_weights() const override { return in_.bf16_weights(); }

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
  void gelu_backward(Act dinp, CAct inp, CAct dout, size_t N,
                     Gelu form) override;
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
  void lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                            int chunk, float* scratch) override;
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
  enum class Mode { Pass, Check, Record };
  // One op call: f makes it on a backend, given its value (seed or slot_word(dloss); 0 for ops
  // without one). `args` are the call's by-value arguments (pointers, sizes, flags, scalars).
  using Call = std::function<void(Backend&, uint64_t)>;
  template <class F>
  void op(const char* name, std::initializer_list<uint64_t> args, F&& f);
  template <class F>
  void op_with_value(const char* name, std::initializer_list<uint64_t> args, uint64_t value, F&& f);
  void note(const char* name, std::initializer_list<uint64_t> args, bool has_value);
  struct Entry;  // a recording and the signature it was made of
  void launch(const Entry& e);
  // A call that synchronises, allocates or reads back: allowed only between micro-batches.
  void unsafe(const char* name);
  How eager(const std::function<void()>& body, const std::string& why);

  Backend& in_;
  const bool native_, emulate_;
  const size_t max_recordings_;
  Mode mode_ = Mode::Pass;
  std::vector<uint64_t> sig_;     // the signature of the micro-batch being checked or recorded
  std::vector<uint64_t> values_;  // its values, in call order (slot k = the k-th value)
  std::string unsafe_;            // the first unsafe call of the check, if any
  std::vector<std::pair<Call, int>> calls_;  // emulated recording: each call and its slot (-1: none)
  int slot_ = 0;                             // the next slot of the recording
  std::map<uint64_t, std::unique_ptr<Entry>> recordings_;  // by the signature's hash
  std::set<uint64_t> seen_, failed_;  // hashes of signatures run eagerly / whose recording failed
  Stats stats_;
};

}  // namespace nlp
