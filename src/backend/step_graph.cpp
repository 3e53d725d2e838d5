// StepGraph: see step_graph.h. Every op override below notes its by-value arguments (the signature)
// and hands the call itself to op() or, for ops with a per-replay value, op_with_value().
#include "backend/step_graph.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace nlp {
namespace {

// One argument as a signature word: pointers by address, floats by their double's bits.
template <class T>
uint64_t w(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    const double d = v;
    uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    return u;
  } else {
    return static_cast<uint64_t>(v);
  }
}

// A view: its address, with its dtype and overwrite flag in the top bits.
uint64_t w(CAct v) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(v.p)) ^ (uint64_t(v.dt) << 60);
}
uint64_t w(Act v) { return w(CAct(v)) ^ (uint64_t(v.write) << 62); }

uint64_t hash_words(const std::vector<uint64_t>& v) {
  uint64_t h = mix64(v.size());
  for (uint64_t x : v) h = mix64(h ^ x);
  return h;
}

}  // namespace

struct StepGraph::Entry {
  std::vector<uint64_t> sig;
  size_t slots = 0;
  std::shared_ptr<Recording> native;       // the backend's recording
  std::vector<std::pair<Call, int>> calls;  // or the calls themselves (emulated)
};

StepGraph::StepGraph(Backend& inner, bool emulate, size_t max_recordings)
    : in_(inner),
      native_(inner.can_capture(nullptr)),
      emulate_(emulate && !native_),
      max_recordings_(max_recordings) {}

StepGraph::~StepGraph() = default;

StepGraph::How StepGraph::eager(const std::function<void()>& body, const std::string& why) {
  mode_ = Mode::Pass;
  stats_.last_why = why;
  ++stats_.eager;
  ++stats_.eager_why[why];
  body();
  return How::Eager;
}

void StepGraph::launch(const Entry& e) {
  NLP_ASSERT(values_.size() == e.slots);
  if (e.native) {
    in_.replay(*e.native, values_.data(), values_.size());
    return;
  }
  for (const auto& [call, k] : e.calls) call(in_, k >= 0 ? values_[static_cast<size_t>(k)] : 0);
}

StepGraph::How StepGraph::run(const std::function<void()>& body) {
  if (!records()) return eager(body, "the backend records no graphs");
  std::string why;
  if (native_ && !in_.can_capture(&why)) return eager(body, why);

  // 1. the check: the signature and the values, nothing run
  const auto t0 = std::chrono::steady_clock::now();
  mode_ = Mode::Check;
  sig_.clear();
  values_.clear();
  unsafe_.clear();
  try {
    body();
  } catch (...) {
    mode_ = Mode::Pass;
    throw;
  }
  mode_ = Mode::Pass;
  const uint64_t h = hash_words(sig_);
  ++stats_.checks;
  stats_.check_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!unsafe_.empty()) return eager(body, cat("the micro-batch calls ", unsafe_));

  // 2. a recording of this signature: replay it with this micro-batch's values
  if (auto it = recordings_.find(h); it != recordings_.end()) {
    if (it->second->sig != sig_) return eager(body, "another shape's recording has its hash");
    try {
      launch(*it->second);
    } catch (const Error& ex) {
      if (!it->second->native) throw;  // emulated: the calls themselves failed
      // the backend refused before launching: a scratch buffer it points into has been reallocated
      // since (an eager micro-batch of a larger shape, an evaluation): dropped, to be recorded again
      recordings_.erase(it);
      ++stats_.dropped;
      return eager(body, cat("its recording was dropped: ", ex.what()));
    }
    ++stats_.replayed;
    return How::Replayed;
  }
  if (failed_.count(h)) return eager(body, "its shape's recording failed");
  if (seen_.insert(h).second) return eager(body, "the first micro-batch of its shape");
  if (recordings_.size() >= max_recordings_)
    return eager(body, cat("more than ", max_recordings_, " shapes"));

  // 3. record it (the same calls again, now kept), then replay the recording
  auto e = std::make_unique<Entry>();
  e->sig = std::move(sig_);
  e->slots = values_.size();
  const std::vector<uint64_t> values = values_;
  sig_.clear();
  calls_.clear();
  slot_ = 0;
  std::string fail;
  try {
    if (native_) in_.capture_begin(e->slots);
    mode_ = Mode::Record;
    body();
  } catch (const std::exception& ex) {
    fail = ex.what();
  }
  mode_ = Mode::Pass;
  if (native_) {
    std::string end_why;
    e->native = in_.capture_end(&end_why);
    if (!e->native && fail.empty()) fail = end_why.empty() ? "the backend kept no recording" : end_why;
  } else {
    e->calls = std::move(calls_);
    calls_.clear();
  }
  if (fail.empty() && sig_ != e->sig) fail = "the recorded calls differ from the checked ones";
  if (fail.empty() && static_cast<size_t>(slot_) != e->slots) fail = "the recording's values differ in number";
  if (!fail.empty()) {
    failed_.insert(h);
    ++stats_.failed;
    return eager(body, cat("recording failed: ", fail));
  }
  values_ = values;
  launch(*e);
  recordings_.emplace(h, std::move(e));
  ++stats_.recorded;
  return How::Recorded;
}

void StepGraph::note(const char* name, std::initializer_list<uint64_t> args, bool has_value) {
  sig_.push_back(w(name));
  sig_.push_back(args.size() * 2 + (has_value ? 1 : 0));
  sig_.insert(sig_.end(), args.begin(), args.end());
}

template <class F>
void StepGraph::op(const char* name, std::initializer_list<uint64_t> args, F&& f) {
  if (mode_ == Mode::Pass) {
    f(in_, 0);
    return;
  }
  note(name, args, false);
  if (mode_ != Mode::Record) return;
  if (native_)
    f(in_, 0);
  else
    calls_.emplace_back(Call(std::forward<F>(f)), -1);
}

template <class F>
void StepGraph::op_with_value(const char* name, std::initializer_list<uint64_t> args, uint64_t value,
                              F&& f) {
  if (mode_ == Mode::Pass) {
    f(in_, value);
    return;
  }
  note(name, args, true);
  if (mode_ == Mode::Check) {
    values_.push_back(value);
    return;
  }
  const int k = slot_++;
  if (!native_) {
    calls_.emplace_back(Call(std::forward<F>(f)), k);
    return;
  }
  in_.bind_slot(k);
  try {
    f(in_, value);
  } catch (...) {
    in_.bind_slot(-1);
    throw;
  }
  in_.bind_slot(-1);
}

void StepGraph::unsafe(const char* name) {
  if (mode_ == Mode::Check && unsafe_.empty()) unsafe_ = name;
  if (mode_ == Mode::Record)
    throw Error(cat("step graph: ", name, " while recording a micro-batch"));
}

// ---- memory: between micro-batches only, except zero and copy (ops like any other) ----------------
void* StepGraph::alloc(size_t bytes) {
  unsafe("alloc");
  return in_.alloc(bytes);
}
void StepGraph::release(void* p) {
  unsafe("release");
  in_.release(p);
}
void StepGraph::zero(void* p, size_t bytes) {
  op("zero", {w(p), bytes}, [=](Backend& b, uint64_t) { b.zero(p, bytes); });
}
void StepGraph::to_device(void* dst, const void* host_src, size_t bytes) {
  unsafe("to_device");
  in_.to_device(dst, host_src, bytes);
}
void StepGraph::to_host(void* host_dst, const void* src, size_t bytes) {
  unsafe("to_host");
  in_.to_host(host_dst, src, bytes);
}
void StepGraph::copy(void* dst, const void* src, size_t bytes) {
  op("copy", {w(dst), w(src), bytes}, [=](Backend& b, uint64_t) { b.copy(dst, src, bytes); });
}
void* StepGraph::host_alloc(size_t bytes) {
  unsafe("host_alloc");
  return in_.host_alloc(bytes);
}
void StepGraph::host_release(void* p) {
  unsafe("host_release");
  in_.host_release(p);
}
void StepGraph::synchronize() {
  unsafe("synchronize");
  in_.synchronize();
}

// ---- ops ----------------------------------------------------------------------------------------
void StepGraph::embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids,
                                  const float* wte, const float* wpe, const float* wtt, int B, int T,
                                  int C, int pos_offset, const int32_t* pos_ids) {
  op("embedding_forward",
     {w(out), w(ids), w(type_ids), w(wte), w(wpe), w(wtt), w(B), w(T), w(C), w(pos_offset), w(pos_ids)},
     [=](Backend& b, uint64_t) {
       b.embedding_forward(out, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids);
     });
}
void StepGraph::embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout,
                                   const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                                   int pos_offset, const int32_t* pos_ids) {
  op("embedding_backward",
     {w(dwte), w(dwpe), w(dwtt), w(dout), w(ids), w(type_ids), w(B), w(T), w(C), w(pos_offset),
      w(pos_ids)},
     [=](Backend& b, uint64_t) {
       b.embedding_backward(dwte, dwpe, dwtt, dout, ids, type_ids, B, T, C, pos_offset, pos_ids);
     });
}
void StepGraph::matmul_forward(Act out, CAct inp, const float* wt, const float* bias,
                               int M, int K, int N, WLayout layout) {
  op("matmul_forward", {w(out), w(inp), w(wt), w(bias), w(M), w(K), w(N), w(layout)},
     [=](Backend& b, uint64_t) { b.matmul_forward(out, inp, wt, bias, M, K, N, layout); });
}
void StepGraph::matmul_backward(Act dinp, float* dw, float* dbias, CAct dout,
                                CAct inp, const float* wt, int M, int K, int N,
                                WLayout layout) {
  op("matmul_backward",
     {w(dinp), w(dw), w(dbias), w(dout), w(inp), w(wt), w(M), w(K), w(N), w(layout)},
     [=](Backend& b, uint64_t) { b.matmul_backward(dinp, dw, dbias, dout, inp, wt, M, K, N, layout); });
}
void StepGraph::matmul_gelu_forward(Act out, Act pre, CAct inp, const float* wt, const float* bias,
                                    int M, int K, int N, WLayout layout, Gelu form) {
  op("matmul_gelu_forward",
     {w(out), w(pre), w(inp), w(wt), w(bias), w(M), w(K), w(N), w(layout), w(form)},
     [=](Backend& b, uint64_t) {
       b.matmul_gelu_forward(out, pre, inp, wt, bias, M, K, N, layout, form);
     });
}
void StepGraph::matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h,
                                      CAct pre, const float* wt, int M, int K, int N,
                                      WLayout layout, Gelu form, Act scratch) {
  op("matmul_dgelu_backward",
     {w(dpre), w(dw), w(dbias), w(dout), w(h), w(pre), w(wt), w(M), w(K), w(N), w(layout), w(form),
      w(scratch)},
     [=](Backend& b, uint64_t) {
       b.matmul_dgelu_backward(dpre, dw, dbias, dout, h, pre, wt, M, K, N, layout, form, scratch);
     });
}
void StepGraph::layernorm_forward(Act out, float* mean, float* rstd, CAct inp,
                                  const float* wt, const float* bb, int N, int C, float eps) {
  op("layernorm_forward", {w(out), w(mean), w(rstd), w(inp), w(wt), w(bb), w(N), w(C), w(eps)},
     [=](Backend& b, uint64_t) { b.layernorm_forward(out, mean, rstd, inp, wt, bb, N, C, eps); });
}
void StepGraph::layernorm_backward(Act dinp, float* dw, float* db, CAct dout,
                                   CAct inp, const float* wt, const float* mean,
                                   const float* rstd, int N, int C) {
  op("layernorm_backward",
     {w(dinp), w(dw), w(db), w(dout), w(inp), w(wt), w(mean), w(rstd), w(N), w(C)},
     [=](Backend& b, uint64_t) { b.layernorm_backward(dinp, dw, db, dout, inp, wt, mean, rstd, N, C); });
}
void StepGraph::residual_layernorm_forward(Act res, Act out, float* mean, float* rstd,
                                           CAct x, CAct delta, const float* wt,
                                           const float* bb, int N, int C, float eps, float p,
                                           uint64_t seed, DropRows r) {
  op_with_value("residual_layernorm_forward",
                {w(res), w(out), w(mean), w(rstd), w(x), w(delta), w(wt), w(bb), w(N), w(C), w(eps),
                 w(p), r.row, r.row_key, w(r.token_key), r.width},
                seed, [=](Backend& b, uint64_t s) {
                  b.residual_layernorm_forward(res, out, mean, rstd, x, delta, wt, bb, N, C, eps, p, s, r);
                });
}
void StepGraph::layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw,
                                           float* db, CAct dout, CAct inp,
                                           const float* wt, const float* mean, const float* rstd,
                                           int N, int C, float p, uint64_t seed, DropRows r) {
  op_with_value("layernorm_dropout_backward",
                {w(dinp), w(ddelta), w(scratch), w(dw), w(db), w(dout), w(inp), w(wt), w(mean),
                 w(rstd), w(N), w(C), w(p), r.row, r.row_key, w(r.token_key), r.width},
                seed, [=](Backend& b, uint64_t s) {
                  b.layernorm_dropout_backward(dinp, ddelta, scratch, dw, db, dout, inp, wt, mean, rstd,
                                               N, C, p, s, r);
                });
}
void StepGraph::gelu_forward(Act out, CAct inp, size_t N, Gelu form) {
  op("gelu_forward", {w(out), w(inp), N, w(form)},
     [=](Backend& b, uint64_t) { b.gelu_forward(out, inp, N, form); });
}
void StepGraph::gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) {
  op("gelu_backward", {w(dinp), w(inp), w(dout), N, w(form)},
     [=](Backend& b, uint64_t) { b.gelu_backward(dinp, inp, dout, N, form); });
}
void StepGraph::add(Act out, CAct a, CAct bb, size_t N) {
  op("add", {w(out), w(a), w(bb), N}, [=](Backend& b, uint64_t) { b.add(out, a, bb, N); });
}
void StepGraph::accumulate(Act dst, CAct src, size_t N) {
  op("accumulate", {w(dst), w(src), N}, [=](Backend& b, uint64_t) { b.accumulate(dst, src, N); });
}
void StepGraph::copy_view(Act dst, CAct src, size_t N) {
  op("copy_view", {w(dst), w(src), N}, [=](Backend& b, uint64_t) { b.copy_view(dst, src, N); });
}
void StepGraph::scale(Act x, float s, size_t N) {
  op("scale", {w(x), w(s), N}, [=](Backend& b, uint64_t) { b.scale(x, s, N); });
}
void StepGraph::tanh_forward(Act out, CAct inp, size_t N) {
  op("tanh_forward", {w(out), w(inp), N}, [=](Backend& b, uint64_t) { b.tanh_forward(out, inp, N); });
}
void StepGraph::tanh_backward(Act dinp, CAct out, CAct dout, size_t N) {
  op("tanh_backward", {w(dinp), w(out), w(dout), N},
     [=](Backend& b, uint64_t) { b.tanh_backward(dinp, out, dout, N); });
}
void StepGraph::rows_gather(Act out, CAct inp, int n, int C, size_t stride,
                            const int32_t* idx) {
  op("rows_gather", {w(out), w(inp), w(n), w(C), stride, w(idx)},
     [=](Backend& b, uint64_t) { b.rows_gather(out, inp, n, C, stride, idx); });
}
void StepGraph::rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                                 const int32_t* idx) {
  op("rows_scatter_add", {w(dinp), w(dout), w(n), w(C), stride, w(idx)},
     [=](Backend& b, uint64_t) { b.rows_scatter_add(dinp, dout, n, C, stride, idx); });
}
void StepGraph::dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed,
                                DropRows r) {
  op_with_value("dropout_forward", {w(out), w(inp), N, w(p), r.row, r.row_key, w(r.token_key), r.width},
                seed, [=](Backend& b, uint64_t s) { b.dropout_forward(out, inp, N, p, s, r); });
}
void StepGraph::dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                                 DropRows r) {
  op_with_value("dropout_backward", {w(dinp), w(dout), N, w(p), r.row, r.row_key, w(r.token_key), r.width},
                seed, [=](Backend& b, uint64_t s) { b.dropout_backward(dinp, dout, N, p, s, r); });
}
void StepGraph::attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask,
                                  bool causal, float dropout_p, uint64_t seed, int B, int T, int NH,
                                  int HS, int T_key, const int32_t* token_key, int examples) {
  op_with_value("attention_forward",
                {w(out), w(att), w(qkv), w(attn_mask), w(causal), w(dropout_p), w(B), w(T), w(NH), w(HS),
                 w(T_key), w(token_key), w(examples)},
                seed, [=](Backend& b, uint64_t s) {
                  b.attention_forward(out, att, qkv, attn_mask, causal, dropout_p, s, B, T, NH, HS, T_key,
                                      token_key, examples);
                });
}
void StepGraph::attention_backward(Act dqkv, float* scratch, CAct dout, CAct out, CAct qkv,
                                   const float* att, const int32_t* attn_mask, bool causal,
                                   float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                                   int T_key, const int32_t* token_key, int examples) {
  op_with_value("attention_backward",
                {w(dqkv), w(scratch), w(dout), w(out), w(qkv), w(att), w(attn_mask), w(causal), w(dropout_p), w(B),
                 w(T), w(NH), w(HS), w(T_key), w(token_key), w(examples)},
                seed, [=](Backend& b, uint64_t s) {
                  b.attention_backward(dqkv, scratch, dout, out, qkv, att, attn_mask, causal, dropout_p, s, B, T,
                                       NH, HS, T_key, token_key, examples);
                });
}
void StepGraph::attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                                 int pos, int Tmax, int NH, int HS) {
  op("attention_decode", {w(out), w(qkv_new), w(kcache), w(vcache), w(B), w(pos), w(Tmax), w(NH), w(HS)},
     [=](Backend& b, uint64_t) { b.attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS); });
}
void StepGraph::crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                                     int V) {
  op("crossentropy_forward", {w(losses), w(logits), w(targets), w(M), w(V)},
     [=](Backend& b, uint64_t) { b.crossentropy_forward(losses, logits, targets, M, V); });
}
void StepGraph::crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                      float dloss, int M, int V) {
  op_with_value("crossentropy_backward", {w(dlogits), w(logits), w(targets), w(M), w(V)}, slot_word(dloss),
                [=](Backend& b, uint64_t v) {
                  b.crossentropy_backward(dlogits, logits, targets, slot_float(v), M, V);
                });
}
void StepGraph::lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x,
                                     const float* wt, const int32_t* targets, float dloss, int M,
                                     int C, int V, int Vp, int chunk, float* scratch) {
  auto f = [=](Backend& b, uint64_t v) {
    b.lm_head_crossentropy(losses, dx, dw, x, wt, targets, slot_float(v), M, C, V, Vp, chunk, scratch);
  };
  if (dx || dw)  // the backward reads dloss from the recording's table
    op_with_value("lm_head_crossentropy", {w(losses), w(dx), w(dw), w(x), w(wt), w(targets), w(M), w(C),
                                           w(V), w(Vp), w(chunk), w(scratch)},
                  slot_word(dloss), f);
  else  // the forward: no dloss
    op("lm_head_crossentropy", {w(losses), w(dx), w(dw), w(x), w(wt), w(targets), w(M), w(C), w(V),
                                w(Vp), w(chunk), w(scratch)},
       [=](Backend& b, uint64_t) { f(b, 0); });
}
void StepGraph::segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                             const int32_t* len, const int32_t* targets, int E) {
  op("segment_crossentropy_forward", {w(losses), w(x), w(first), w(len), w(targets), w(E)},
     [=](Backend& b, uint64_t) { b.segment_crossentropy_forward(losses, x, first, len, targets, E); });
}
void StepGraph::segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                              const int32_t* len, const int32_t* targets, float dloss,
                                              int E) {
  op_with_value("segment_crossentropy_backward", {w(dx), w(x), w(first), w(len), w(targets), w(E)},
                slot_word(dloss), [=](Backend& b, uint64_t v) {
                  b.segment_crossentropy_backward(dx, x, first, len, targets, slot_float(v), E);
                });
}

// ---- reductions (read back) and the optimizer: between micro-batches only --------------------------
double StepGraph::sum(const float* x, size_t N) {
  unsafe("sum");
  return in_.sum(x, N);
}
double StepGraph::sumsq(const float* x, size_t N) {
  unsafe("sumsq");
  return in_.sumsq(x, N);
}
void StepGraph::sum_into(double* acc, const float* x, size_t N, double scale) {
  op("sum_into", {w(acc), w(x), N, w(scale)}, [=](Backend& b, uint64_t) { b.sum_into(acc, x, N, scale); });
}
void StepGraph::adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                             int t) {
  unsafe("adamw_update");
  in_.adamw_update(param, grad, m, v, N, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
}
void StepGraph::adamw_update_spans(float* param, float* grad, float* m, float* v,
                                   const std::vector<AdamWSpan>& spans, float lr, float beta1, float beta2,
                                   float eps, float grad_scale, int t, bool zero_grad) {
  unsafe("adamw_update");
  in_.adamw_update_spans(param, grad, m, v, spans, lr, beta1, beta2, eps, grad_scale, t, zero_grad);
}

}  // namespace nlp
