// StepGraph: see step_graph.h. Every op override (made from core/backend_ops.def below) notes its
// by-value arguments (the signature) and hands the call itself to op() or, for ops with a per-replay
// value, op_with_value().
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
    : ForwardingBackend(inner),
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

// One argument's signature words: w(), a DropRows by its fields.
template <class... A>
void StepGraph::sign_args(const A&... a) {
  auto put = [this](const auto& x) {
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, DropRows>)
      sig_.insert(sig_.end(), {x.row, x.row_key, w(x.token_key), x.width});
    else
      sig_.push_back(w(x));
  };
  (put(a), ...);
}

// The op's name, the count of its words (and whether it has a value), then the words.
template <class S>
void StepGraph::note(const char* name, bool has_value, S&& sign) {
  sig_.push_back(w(name));
  const size_t count = sig_.size();
  sig_.push_back(0);
  sign();
  sig_[count] = (sig_.size() - count - 1) * 2 + (has_value ? 1 : 0);
}

template <class S, class F>
void StepGraph::op(const char* name, S&& sign, F&& f) {
  if (mode_ == Mode::Pass) {
    f(in_, 0);
    return;
  }
  note(name, false, sign);
  if (mode_ != Mode::Record) return;
  if (native_)
    f(in_, 0);
  else
    calls_.emplace_back(Call(std::forward<F>(f)), -1);
}

template <class S, class F>
void StepGraph::op_with_value(const char* name, uint64_t value, S&& sign, F&& f) {
  if (mode_ == Mode::Pass) {
    f(in_, value);
    return;
  }
  note(name, true, sign);
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

// ---- the ops, from core/backend_ops.def's graph column -------------------------------------------
// RECORDED: the signature is every argument; `to` is the backend a call is made on (no op has a
// parameter of that name). SEED and DLOSS: the lambdas' parameter named `seed`
// (or the local `dloss`) stands for the op's own, so that the signature has a constant in its place
// and the call made at a replay the recording table's value.
#define NLP_ARG_DEFAULT(value)
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  NLP_STEP_GRAPH_##graph(name, ret, params, args)
#define NLP_STEP_GRAPH_RECORDED(name, ret, params, args)                                 \
  ret StepGraph::name params {                                                           \
    op(#name, [&] { sign_args args; }, [=](Backend& to, uint64_t) { to.name args; });    \
  }
#define NLP_STEP_GRAPH_SEED(name, ret, params, args)                                     \
  ret StepGraph::name params {                                                           \
    op_with_value(#name, seed, [&] { [&](uint64_t seed) { sign_args args; }(0); },       \
                  [=](Backend& to, uint64_t seed) { to.name args; });                    \
  }
#define NLP_STEP_GRAPH_DLOSS(name, ret, params, args)                                    \
  ret StepGraph::name params {                                                           \
    op_with_value(#name, slot_word(dloss), [&] { [&](float dloss) { sign_args args; }(0.0f); }, \
                  [=](Backend& to, uint64_t word) {                                      \
                    const float dloss = slot_float(word);                                \
                    to.name args;                                                        \
                  });                                                                    \
  }
#define NLP_STEP_GRAPH_BETWEEN(name, ret, params, args)                                  \
  ret StepGraph::name params {                                                           \
    unsafe(#name);                                                                       \
    return in_.name args;                                                                \
  }
#define NLP_STEP_GRAPH_QUERY(name, ret, params, args)
#define NLP_STEP_GRAPH_OWN(name, ret, params, args)
#include "core/backend_ops.def"
#undef NLP_STEP_GRAPH_RECORDED
#undef NLP_STEP_GRAPH_SEED
#undef NLP_STEP_GRAPH_DLOSS
#undef NLP_STEP_GRAPH_BETWEEN
#undef NLP_STEP_GRAPH_QUERY
#undef NLP_STEP_GRAPH_OWN

// The fused head: the backward reads dloss from the recording's table; the forward has none.
void StepGraph::lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* wt,
                                     const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                                     int chunk, float* scratch) {
  auto f = [=](Backend& b, uint64_t v) {
    b.lm_head_crossentropy(losses, dx, dw, x, wt, targets, slot_float(v), M, C, V, Vp, chunk, scratch);
  };
  auto sign = [&] { sign_args(losses, dx, dw, x, wt, targets, M, C, V, Vp, chunk, scratch); };
  if (dx || dw)
    op_with_value("lm_head_crossentropy", slot_word(dloss), sign, f);
  else
    op("lm_head_crossentropy", sign, [=](Backend& b, uint64_t) { f(b, 0); });
}

}  // namespace nlp
