// Replayed micro-batches (backend/step_graph.h; run.cuda_graph), checked on the CPU with
// the recording emulated (the CPU backend records no CUDA graphs: StepGraph keeps the calls and makes
// them again with each replay's values). What the CUDA path shares with this emulation is all of the
// bookkeeping: the check of each micro-batch's calls against the recorded ones, the values a
// replay must supply (every dropout seed and the loss scale dloss, in call order), and when a
// micro-batch falls back to eager launches. So:
//  - packed doc_cls, pair_cls, qa and ner steps with data.pack_fixed_examples make one shape: after a
//    first eager micro-batch of it, one recording serves every later micro-batch, and the gradients
//    and the loss are bitwise those of eager launches, although every micro-batch has other
//    examples, dropout seeds and dloss (a replay that kept the recorded values would differ);
//  - shapes that vary (no fixed examples: the example count, ner's labelled rows) never replay, and
//    still give the eager bits;
//  - a micro-batch that synchronises or reads back runs eagerly, saying so; a recording whose calls
//    differ from the check's fails once and is not tried again; values reach the ops they belong to;
//  - with a backend that records as the CUDA backend does (a CPU stand-in: FakeRecorder), each value
//    reaches its op through the slot bound to it, a failed capture runs eagerly with the backend's
//    reason, and a replay the backend refuses (a buffer grew) runs eagerly and is recorded again.
// tests/unit/test_ops_cuda.cpp (CudaOps.CapturedOpsReplayWithTheirSlotValues) checks the CUDA
// backend's own recording on a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/forwarding_backend.h"
#include "backend/step_graph.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/batches.h"
#include "small_models.h"

namespace {

using nlp::Backend;
using nlp::DropRows;
using nlp::ForwardingBackend;
using nlp::StepGraph;

Backend& cpu() {
  static std::unique_ptr<Backend> b = nlp::make_cpu_backend(2);
  return *b;
}

using nlp::test::small_bert;

constexpr int kT = 32, kRows = 4, kPerRow = 8;

// Examples of the given lengths (rows of kT), labelled for `task`, packed first-fit into kRows rows
// of kT as a PackedSampler would plan them; fixed: data.pack_fixed_examples (kPerRow to a row).
nlp::HostBatch packed(const std::vector<int>& len, const std::string& task, bool fixed, uint64_t seed) {
  nlp::Rng r(seed);
  nlp::HostBatch hb;
  hb.B = static_cast<int>(len.size());
  hb.T = hb.T_key = kT;
  const size_t n = size_t(hb.B) * kT;
  hb.ids.assign(n, 0);
  hb.mask.assign(n, 0);
  hb.targets.assign(n, nlp::kIgnoreIndex);
  hb.type_ids.assign(n, 0);
  for (int b = 0; b < hb.B; ++b) {
    for (int t = 0; t < len[b]; ++t) {
      const size_t i = size_t(b) * kT + t;
      hb.ids[i] = 5 + static_cast<int32_t>(r.uniform() * 90);
      hb.mask[i] = 1;
      if (task == "ner" && t % 3 == 1) hb.targets[i] = (b + t) % 3;
    }
    hb.labels.push_back(b % 3);
    hb.start.push_back(task == "qa" ? 1 : nlp::kIgnoreIndex);
    hb.end.push_back(task == "qa" ? len[b] - 1 : nlp::kIgnoreIndex);
  }
  for (size_t i = 0; i < n; ++i)
    if (hb.targets[i] != nlp::kIgnoreIndex) {
      hb.rows.push_back(static_cast<int32_t>(i));
      hb.row_targets.push_back(hb.targets[i]);
    }
  hb.has_padding = true;
  std::vector<int32_t> row_of;
  std::vector<int> fill(kRows, 0), count(kRows, 0);
  for (int b = 0; b < hb.B; ++b) {
    int k = 0;
    while (k < kRows && (fill[k] + len[b] > kT || count[k] == kPerRow)) ++k;
    if (k == kRows) throw std::logic_error("test_step_shape: the lengths do not fit the rows");
    fill[k] += len[b];
    ++count[k];
    row_of.push_back(k);
  }
  nlp::pack_rows(hb, 0, &row_of, kRows, fixed ? kPerRow : 0);
  if (fixed && task == "ner") nlp::score_every_position(hb);  // as the trainer does
  return hb;
}

struct Result {
  std::vector<float> grad;
  double loss = 0;
  StepGraph::Stats stats;
};

// Training micro-batches of `task` (forward_into and backward; each its own examples, seed and
// dloss) on a fresh model, through an emulating StepGraph when `graph`: the gradient arena and the
// loss sum after them.
Result micro_batches(const std::string& task, bool fixed, bool graph) {
  std::unique_ptr<StepGraph> g = graph ? std::make_unique<StepGraph>(cpu(), /*emulate=*/true) : nullptr;
  Backend& be = g ? static_cast<Backend&>(*g) : cpu();
  auto m = nlp::make_model(small_bert(), be, task);
  m->init_weights(3);
  m->reserve(kRows, kT);
  nlp::DeviceBatchBuffer dbuf(be);  // uploads between micro-batches
  double* acc = static_cast<double*>(be.alloc(sizeof(double)));
  const std::vector<std::vector<int>> lengths = {
      {9, 23, 4, 17, 12, 5, 20, 8, 11},         // 9 examples
      {3, 7, 30, 6, 5, 9, 14, 2, 6, 10, 4, 8},  // 12
      {12, 12, 12, 12, 12, 12, 12, 5, 5, 3},    // 10
      {31, 31, 31, 31},                         // one to a row
      {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};    // 11
  // (every micro-batch another example count, and ner another count of labelled positions)
  for (size_t s = 0; s < lengths.size(); ++s) {
    const nlp::HostBatch hb = packed(lengths[s], task, fixed, 40 + s);
    const nlp::DeviceBatch db = dbuf.upload(hb);
    const float dloss = 1.0f / static_cast<float>(hb.loss_units(nlp::Task::DocCls) + 1 + s);
    const uint64_t seed = nlp::derive_seed(77, s);
    auto body = [&] {
      m->forward_into(db, /*training=*/true, seed, acc);
      m->backward(db, dloss, /*training=*/true, seed);
    };
    if (g)
      g->run(body);
    else
      body();
  }
  Result r;
  r.grad.resize(m->params().total());
  be.to_host(r.grad.data(), m->params().grad(), r.grad.size() * sizeof(float));
  be.to_host(&r.loss, acc, sizeof(double));
  be.release(acc);
  if (g) r.stats = g->stats();
  return r;
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(StepGraph, PackedStepsWithFixedExamplesReplayOneRecordingBitwise) {
  for (const std::string task : {"doc_cls", "pair_cls", "qa", "ner"}) {
    SCOPED_TRACE(task);
    const Result eager = micro_batches(task, /*fixed=*/true, /*graph=*/false);
    const Result replayed = micro_batches(task, /*fixed=*/true, /*graph=*/true);
    const StepGraph::Stats& st = replayed.stats;
    // the first micro-batch of the shape eagerly, the second recorded (and run from the recording),
    // the other three replayed
    EXPECT_EQ(st.eager, 1) << st.last_why;
    EXPECT_EQ(st.recorded, 1);
    EXPECT_EQ(st.replayed, 3);
    EXPECT_EQ(st.failed, 0);
    EXPECT_EQ(st.eager_why.count("the first micro-batch of its shape"), 1u);
    EXPECT_TRUE(bitwise(eager.grad, replayed.grad));
    EXPECT_EQ(std::memcmp(&eager.loss, &replayed.loss, sizeof(double)), 0) << eager.loss << " " << replayed.loss;
  }
}

TEST(StepGraph, ShapesThatVaryRunEagerlyWithTheSameBits) {
  // without fixed examples the heads' example count changes the calls, and ner's count of labelled
  // rows (which it then trains on alone)
  for (const auto& [task, fixed] : std::vector<std::pair<std::string, bool>>{
           {"doc_cls", false}, {"qa", false}, {"ner", false}}) {
    SCOPED_TRACE(task);
    const Result eager = micro_batches(task, fixed, /*graph=*/false);
    const Result g = micro_batches(task, fixed, /*graph=*/true);
    EXPECT_EQ(g.stats.replayed, 0);
    EXPECT_EQ(g.stats.recorded, 0);
    EXPECT_EQ(g.stats.eager, 5);
    EXPECT_TRUE(bitwise(eager.grad, g.grad));
    EXPECT_EQ(eager.loss, g.loss);
  }
}

// A few ops on buffers of n floats, with per-call values: out = dropout(x, seed) * f; grad +=
// crossentropy_backward(dloss).
struct Ops {
  static constexpr int n = 64, V = 8, M = 8;
  Backend& be;
  float *x, *out, *logits, *dlogits, *losses;
  int32_t* targets;
  explicit Ops(Backend& b) : be(b) {
    x = static_cast<float*>(be.alloc(n * sizeof(float)));
    out = static_cast<float*>(be.alloc(n * sizeof(float)));
    logits = static_cast<float*>(be.alloc(M * V * sizeof(float)));
    dlogits = static_cast<float*>(be.alloc(M * V * sizeof(float)));
    losses = static_cast<float*>(be.alloc(M * sizeof(float)));
    targets = static_cast<int32_t*>(be.alloc(M * sizeof(int32_t)));
    std::vector<float> h(n);
    for (int i = 0; i < n; ++i) h[i] = 0.25f + 0.01f * i;
    be.to_device(x, h.data(), n * sizeof(float));
    be.to_device(logits, h.data(), M * V * sizeof(float));
    std::vector<int32_t> t(M);
    for (int i = 0; i < M; ++i) t[i] = i % V;
    be.to_device(targets, t.data(), M * sizeof(int32_t));
  }
  ~Ops() {
    for (void* p : {static_cast<void*>(x), static_cast<void*>(out), static_cast<void*>(logits),
                    static_cast<void*>(dlogits), static_cast<void*>(losses), static_cast<void*>(targets)})
      be.release(p);
  }
  void run(uint64_t seed, float dloss) {
    be.dropout_forward(out, x, n, 0.5f, seed);
    be.scale(out, 3.0f, n);
    be.crossentropy_forward(losses, logits, targets, M, V);
    be.crossentropy_backward(dlogits, logits, targets, dloss, M, V);
  }
  std::vector<float> read() {
    std::vector<float> r(n + M * V);
    be.to_host(r.data(), out, n * sizeof(float));
    be.to_host(r.data() + n, dlogits, M * V * sizeof(float));
    return r;
  }
};

TEST(StepGraph, EachReplayUsesItsOwnValuesInCallOrder) {
  StepGraph g(cpu(), /*emulate=*/true);
  Ops ops(g), ref(cpu());
  const std::vector<std::pair<uint64_t, float>> values = {{11, 0.5f}, {12, 0.25f}, {13, 2.0f}, {14, 1.0f}};
  std::vector<StepGraph::How> how;
  for (const auto& [seed, dloss] : values) {
    how.push_back(g.run([&, seed = seed, dloss = dloss] { ops.run(seed, dloss); }));
    ref.run(seed, dloss);
    EXPECT_TRUE(bitwise(ops.read(), ref.read())) << "seed " << seed;
  }
  EXPECT_EQ(how, (std::vector<StepGraph::How>{StepGraph::How::Eager, StepGraph::How::Recorded,
                                              StepGraph::How::Replayed, StepGraph::How::Replayed}));
  // and the seeds matter: another seed gives another mask
  ops.run(15, 1.0f);
  ref.run(11, 1.0f);
  EXPECT_FALSE(bitwise(ops.read(), ref.read()));
}

TEST(StepGraph, MicroBatchesThatReadBackRunEagerly) {
  StepGraph g(cpu(), /*emulate=*/true);
  Ops ops(g);
  for (int i = 0; i < 3; ++i) {
    double s = 0;
    EXPECT_EQ(g.run([&] {
                ops.run(1, 1.0f);
                s = g.sum(ops.out, Ops::n);
              }),
              StepGraph::How::Eager);
    EXPECT_NE(s, 0.0);  // the eager run's sum
  }
  EXPECT_EQ(g.stats().eager_why.at("the micro-batch calls sum"), 3);
}

TEST(StepGraph, ARecordingThatDiffersFromItsCheckFailsOnceAndIsNotRetried) {
  StepGraph g(cpu(), /*emulate=*/true);
  Ops ops(g), ref(cpu());
  int calls = 0;
  // the fourth invocation of the body (the recording's, after the first micro-batch's eager run and
  // the second one's check) scales by another factor
  auto body = [&] {
    ++calls;
    ops.run(5, 1.0f);
    g.scale(ops.out, calls == 4 ? 2.0f : 1.0f, Ops::n);
  };
  EXPECT_EQ(g.run(body), StepGraph::How::Eager);  // check, then eager (first of its shape)
  EXPECT_EQ(g.run(body), StepGraph::How::Eager);  // check, record (differs), then eager
  EXPECT_EQ(g.stats().failed, 1);
  EXPECT_NE(g.stats().last_why.find("recording failed: the recorded calls differ"), std::string::npos)
      << g.stats().last_why;
  EXPECT_EQ(g.run(body), StepGraph::How::Eager);  // not tried again
  EXPECT_EQ(g.stats().last_why, "its shape's recording failed");
  EXPECT_EQ(g.stats().recorded, 0);
}

TEST(StepGraph, ABackendThatCannotRecordPassesEverythingThrough) {
  StepGraph g(cpu(), /*emulate=*/false);
  EXPECT_FALSE(g.records());
  Ops ops(g), ref(cpu());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(g.run([&] { ops.run(7, 0.5f); }), StepGraph::How::Eager);
    ref.run(7, 0.5f);
  }
  EXPECT_TRUE(bitwise(ops.read(), ref.read()));
  EXPECT_EQ(g.stats().last_why, "the backend records no graphs");
}

// Every op without a default in core/backend_ops.def, as a failure naming it (the ops with a default
// compose these): what FakeRecorder passes on, the ops Ops does not make.
template <class T>
T none() {
  if constexpr (!std::is_void_v<T>) return T{};
}
// (the list's types, unqualified)
using nlp::Act, nlp::CAct, nlp::DType, nlp::Gelu, nlp::WLayout;
class Unused final : public Backend {
 public:
  std::string name() const override { return "unused"; }
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) NLP_UNUSED_##impl(name, ret, params)
#define NLP_UNUSED_PURE(name, ret, params)                                  \
  ret name params override {                                                \
    ADD_FAILURE() << "FakeRecorder: " #name ", an op Ops does not make";    \
    return none<ret>();                                                     \
  }
#define NLP_UNUSED_DEFAULT(name, ret, params)
#include "core/backend_ops.def"
#undef NLP_UNUSED_PURE
#undef NLP_UNUSED_DEFAULT
};
Unused& unused() {
  static Unused u;
  return u;
}

// A backend that records as the CUDA backend does, but on the CPU: between capture_begin and
// capture_end it keeps each call instead of making it, with the slot bound to it, and a replay
// makes the calls with the table's values. Only the ops of Ops are implemented; the others go to
// Unused. Knobs make a capture fail or a replay be refused, as the CUDA backend does when a buffer
// grew.
class FakeRecorder final : public ForwardingBackend {
 public:
  FakeRecorder() : ForwardingBackend(unused()) {}
  bool fail_capture = false, refuse_replay = false;
  std::vector<int> bound;  // every bind_slot while recording

  std::string name() const override { return "fake"; }
  void* alloc(size_t bytes) override { return cpu().alloc(bytes); }
  void release(void* p) override { cpu().release(p); }
  void zero(void* p, size_t bytes) override { keep([=](uint64_t) { cpu().zero(p, bytes); }); }
  void to_device(void* d, const void* s, size_t n) override { cpu().to_device(d, s, n); }
  void to_host(void* d, const void* s, size_t n) override { cpu().to_host(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { keep([=](uint64_t) { cpu().copy(d, s, n); }); }
  void scale(nlp::Act x, float f, size_t N) override { keep([=](uint64_t) { cpu().scale(x, f, N); }); }
  void dropout_forward(nlp::Act out, nlp::CAct inp, size_t N, float p, uint64_t seed, DropRows r) override {
    keep([=](uint64_t s) { cpu().dropout_forward(out, inp, N, p, s, r); }, seed);
  }
  void crossentropy_forward(float* losses, const float* logits, const int32_t* t, int M, int V) override {
    keep([=](uint64_t) { cpu().crossentropy_forward(losses, logits, t, M, V); });
  }
  void crossentropy_backward(float* dl, const float* logits, const int32_t* t, float dloss, int M, int V) override {
    keep([=](uint64_t v) { cpu().crossentropy_backward(dl, logits, t, nlp::slot_float(v), M, V); },
         nlp::slot_word(dloss));
  }

  bool can_capture(std::string*) const override { return true; }
  void capture_begin(size_t slots) override {
    capturing_ = true;
    slots_ = slots;
    calls_.clear();
  }
  void bind_slot(int k) override {
    ASSERT_TRUE(capturing_);
    ASSERT_LT(k, static_cast<int>(slots_));
    bound.push_back(k);
    slot_ = k;
  }
  std::shared_ptr<Recording> capture_end(std::string* why) override {
    capturing_ = false;
    if (fail_capture) {
      *why = "fake: the capture failed";
      return nullptr;
    }
    auto r = std::make_shared<Rec>();
    r->calls = std::move(calls_);
    r->slots = slots_;
    return r;
  }
  void replay(Recording& rec, const uint64_t* values, size_t n) override {
    if (refuse_replay) throw nlp::Error("fake: a buffer grew");
    auto& r = dynamic_cast<Rec&>(rec);
    EXPECT_EQ(n, r.slots);
    for (const auto& [call, k] : r.calls) call(k >= 0 ? values[k] : 0);
  }


 private:
  struct Rec final : Recording {
    std::vector<std::pair<std::function<void(uint64_t)>, int>> calls;
    size_t slots = 0;
  };
  // makes the call now, or keeps it with the bound slot while recording
  void keep(std::function<void(uint64_t)> f, uint64_t value = 0) {
    if (!capturing_) {
      f(value);
      return;
    }
    calls_.emplace_back(std::move(f), slot_);
  }
  bool capturing_ = false;
  size_t slots_ = 0;
  int slot_ = -1;
  std::vector<std::pair<std::function<void(uint64_t)>, int>> calls_;
};

TEST(StepGraph, ARecordingBackendReadsEachValueFromItsSlot) {
  FakeRecorder fake;
  StepGraph g(fake, /*emulate=*/false);
  ASSERT_TRUE(g.records());
  Ops ops(g), ref(cpu());
  std::vector<StepGraph::How> how;
  for (const auto& [seed, dloss] : std::vector<std::pair<uint64_t, float>>{{21, 0.5f}, {22, 0.25f}, {23, 4.0f}}) {
    how.push_back(g.run([&, seed = seed, dloss = dloss] { ops.run(seed, dloss); }));
    ref.run(seed, dloss);
    EXPECT_TRUE(bitwise(ops.read(), ref.read())) << "seed " << seed;
  }
  EXPECT_EQ(how, (std::vector<StepGraph::How>{StepGraph::How::Eager, StepGraph::How::Recorded,
                                              StepGraph::How::Replayed}));
  // the seed of the dropout to slot 0, the loss scale to slot 1, each unbound after its op
  EXPECT_EQ(fake.bound, (std::vector<int>{0, -1, 1, -1}));
}

TEST(StepGraph, ARefusedReplayRunsEagerlyAndIsRecordedAgain) {
  FakeRecorder fake;
  StepGraph g(fake, /*emulate=*/false);
  Ops ops(g), ref(cpu());
  auto step = [&](uint64_t seed) {
    const StepGraph::How h = g.run([&] { ops.run(seed, 0.5f); });
    ref.run(seed, 0.5f);
    EXPECT_TRUE(bitwise(ops.read(), ref.read())) << "seed " << seed;
    return h;
  };
  EXPECT_EQ(step(1), StepGraph::How::Eager);
  EXPECT_EQ(step(2), StepGraph::How::Recorded);
  fake.refuse_replay = true;
  EXPECT_EQ(step(3), StepGraph::How::Eager);
  EXPECT_EQ(g.stats().last_why, "its recording was dropped: fake: a buffer grew");
  EXPECT_EQ(g.stats().dropped, 1);
  fake.refuse_replay = false;
  EXPECT_EQ(step(4), StepGraph::How::Recorded);
  EXPECT_EQ(step(5), StepGraph::How::Replayed);
}

TEST(StepGraph, AFailedCaptureRunsEagerlyWithTheBackendsReason) {
  FakeRecorder fake;
  fake.fail_capture = true;
  StepGraph g(fake, /*emulate=*/false);
  Ops ops(g), ref(cpu());
  for (uint64_t seed : {1, 2, 3}) {
    EXPECT_EQ(g.run([&] { ops.run(seed, 2.0f); }), StepGraph::How::Eager);
    ref.run(seed, 2.0f);
    EXPECT_TRUE(bitwise(ops.read(), ref.read()));
  }
  EXPECT_EQ(g.stats().failed, 1);
  EXPECT_EQ(g.stats().eager_why.at("recording failed: fake: the capture failed"), 1);
  EXPECT_EQ(g.stats().eager_why.at("its shape's recording failed"), 1);
}

}  // namespace
