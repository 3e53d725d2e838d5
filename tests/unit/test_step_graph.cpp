// One shape for every packed step: what a replayed CUDA graph of a micro-batch's forward and backward
// needs (issue 20; the plan in bench/NOTES.md). A recording backend sits between the model and the
// CPU backend and notes every call of two training micro-batches with different examples: the op,
// and each argument it takes by value (pointers, sizes, flags, probabilities), apart from the values
// a graph would read from backend memory at each replay (the dropout seeds and the loss scale dloss,
// kept separately). For packed rows planned by data.pack_batch = rows with data.pack_fixed_examples:
//  - doc_cls, pair_cls and qa make the same calls with the same arguments at both steps, and no call
//    that synchronises or allocates (after a first micro-batch has carved the arenas);
//  - the seeds and dloss do differ (what the replay must supply);
//  - without fixed examples the calls differ (the example count sizes the heads and the batch's
//    upload, so even the embedding's pointers into it move), and ner's differ with them (its
//    labelled rows, as many as the batch has): the comparison can fail, and says what is not yet one
//    shape.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/backend.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/batches.h"
#include "small_models.h"

namespace {

using nlp::Backend;
using nlp::DropRows;

struct Call {
  std::string op;
  std::vector<uint64_t> fixed;    // arguments a captured graph keeps
  std::vector<uint64_t> varying;  // seeds and dloss: a replay would read them from backend memory
  bool operator==(const Call&) const = default;
};

template <class T>
uint64_t word(T v) {
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

// Forwards every call to the CPU backend and notes it.
class Recorder final : public Backend {
 public:
  explicit Recorder(Backend& inner) : in_(inner) {}
  std::vector<Call> calls;

  std::string name() const override { return in_.name(); }
  void* alloc(size_t bytes) override {
    note("alloc", {bytes});
    return in_.alloc(bytes);
  }
  void release(void* p) override {
    note("release", {word(p)});
    in_.release(p);
  }
  void zero(void* p, size_t bytes) override {
    note("zero", {word(p), bytes});
    in_.zero(p, bytes);
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    note("to_device", {word(dst), bytes});
    in_.to_device(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    note("to_host", {word(src), bytes});
    in_.to_host(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    note("copy", {word(dst), word(src), bytes});
    in_.copy(dst, src, bytes);
  }
  void* host_alloc(size_t bytes) override {
    note("host_alloc", {bytes});
    return in_.host_alloc(bytes);
  }
  void host_release(void* p) override { in_.host_release(p); }
  void synchronize() override {
    note("synchronize", {});
    in_.synchronize();
  }

  void embedding_forward(float* out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                         const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                         const int32_t* pos_ids) override {
    note("embedding_forward", {word(out), word(ids), word(type_ids), word(wte), word(wpe), word(wtt), word(B),
                               word(T), word(C), word(pos_offset), word(pos_ids)});
    in_.embedding_forward(out, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids);
  }
  void embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout, const int32_t* ids,
                          const int32_t* type_ids, int B, int T, int C, int pos_offset,
                          const int32_t* pos_ids) override {
    note("embedding_backward", {word(dwte), word(dwpe), word(dwtt), word(dout), word(ids), word(type_ids),
                                word(B), word(T), word(C), word(pos_offset), word(pos_ids)});
    in_.embedding_backward(dwte, dwpe, dwtt, dout, ids, type_ids, B, T, C, pos_offset, pos_ids);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K, int N,
                      nlp::WLayout layout) override {
    note("matmul_forward", {word(out), word(inp), word(w), word(bias), word(M), word(K), word(N), word(layout)});
    in_.matmul_forward(out, inp, w, bias, M, K, N, layout);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int M, int K, int N, nlp::WLayout layout) override {
    note("matmul_backward", {word(dinp), word(dw), word(dbias), word(dout), word(inp), word(w), word(M),
                             word(K), word(N), word(layout)});
    in_.matmul_backward(dinp, dw, dbias, dout, inp, w, M, K, N, layout);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C, float eps) override {
    note("layernorm_forward", {word(out), word(mean), word(rstd), word(inp), word(w), word(b), word(N),
                               word(C), word(eps)});
    in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N, int C) override {
    note("layernorm_backward", {word(dinp), word(dw), word(db), word(dout), word(inp), word(w), word(mean),
                                word(rstd), word(N), word(C)});
    in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* x,
                                  const float* delta, const float* w, const float* b, int N, int C,
                                  float eps, float p, uint64_t seed, DropRows rows) override {
    note("residual_layernorm_forward",
         with_rows({word(res), word(out), word(mean), word(rstd), word(x), word(delta), word(w), word(b), word(N),
                    word(C), word(eps), word(p)},
                   rows),
         {seed});
    in_.residual_layernorm_forward(res, out, mean, rstd, x, delta, w, b, N, C, eps, p, seed, rows);
  }
  void layernorm_dropout_backward(float* dinp, float* ddelta, float* scratch, float* dw, float* db,
                                  const float* dout, const float* inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C, float p, uint64_t seed,
                                  DropRows rows) override {
    note("layernorm_dropout_backward",
         with_rows({word(dinp), word(ddelta), word(scratch), word(dw), word(db), word(dout), word(inp), word(w),
                    word(mean), word(rstd), word(N), word(C), word(p)},
                   rows),
         {seed});
    in_.layernorm_dropout_backward(dinp, ddelta, scratch, dw, db, dout, inp, w, mean, rstd, N, C, p, seed, rows);
  }
  void gelu_forward(float* out, const float* inp, size_t N, nlp::Gelu form) override {
    note("gelu_forward", {word(out), word(inp), N, word(form)});
    in_.gelu_forward(out, inp, N, form);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, nlp::Gelu form) override {
    note("gelu_backward", {word(dinp), word(inp), word(dout), N, word(form)});
    in_.gelu_backward(dinp, inp, dout, N, form);
  }
  void add(float* out, const float* a, const float* b, size_t N) override {
    note("add", {word(out), word(a), word(b), N});
    in_.add(out, a, b, N);
  }
  void accumulate(float* dst, const float* src, size_t N) override {
    note("accumulate", {word(dst), word(src), N});
    in_.accumulate(dst, src, N);
  }
  void scale(float* x, float s, size_t N) override {
    note("scale", {word(x), word(s), N});
    in_.scale(x, s, N);
  }
  void tanh_forward(float* out, const float* inp, size_t N) override {
    note("tanh_forward", {word(out), word(inp), N});
    in_.tanh_forward(out, inp, N);
  }
  void tanh_backward(float* dinp, const float* out, const float* dout, size_t N) override {
    note("tanh_backward", {word(dinp), word(out), word(dout), N});
    in_.tanh_backward(dinp, out, dout, N);
  }
  void rows_gather(float* out, const float* inp, int n, int C, size_t stride, const int32_t* idx) override {
    note("rows_gather", {word(out), word(inp), word(n), word(C), stride, word(idx)});
    in_.rows_gather(out, inp, n, C, stride, idx);
  }
  void rows_scatter_add(float* dinp, const float* dout, int n, int C, size_t stride, const int32_t* idx) override {
    note("rows_scatter_add", {word(dinp), word(dout), word(n), word(C), stride, word(idx)});
    in_.rows_scatter_add(dinp, dout, n, C, stride, idx);
  }
  void dropout_forward(float* out, const float* inp, size_t N, float p, uint64_t seed, DropRows rows) override {
    note("dropout_forward", with_rows({word(out), word(inp), N, word(p)}, rows),
         {seed});
    in_.dropout_forward(out, inp, N, p, seed, rows);
  }
  void dropout_backward(float* dinp, const float* dout, size_t N, float p, uint64_t seed, DropRows rows) override {
    note("dropout_backward", with_rows({word(dinp), word(dout), N, word(p)}, rows),
         {seed});
    in_.dropout_backward(dinp, dout, N, p, seed, rows);
  }
  void attention_forward(float* out, float* att, const float* qkv, const int32_t* attn_mask, bool causal,
                         float dropout_p, uint64_t seed, int B, int T, int NH, int HS, int T_key,
                         const int32_t* token_key, int examples) override {
    note("attention_forward", {word(out), word(att), word(qkv), word(attn_mask), word(causal), word(dropout_p),
                               word(B), word(T), word(NH), word(HS), word(T_key), word(token_key), word(examples)},
         {seed});
    in_.attention_forward(out, att, qkv, attn_mask, causal, dropout_p, seed, B, T, NH, HS, T_key, token_key,
                          examples);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                          const int32_t* attn_mask, bool causal, float dropout_p, uint64_t seed, int B, int T,
                          int NH, int HS, int T_key, const int32_t* token_key, int examples) override {
    note("attention_backward", {word(dqkv), word(scratch), word(dout), word(qkv), word(att), word(attn_mask),
                                word(causal), word(dropout_p), word(B), word(T), word(NH), word(HS), word(T_key),
                                word(token_key), word(examples)},
         {seed});
    in_.attention_backward(dqkv, scratch, dout, qkv, att, attn_mask, causal, dropout_p, seed, B, T, NH, HS, T_key,
                           token_key, examples);
  }
  size_t attention_saved_floats(int B, int T, int NH, int HS) override {
    return in_.attention_saved_floats(B, T, NH, HS);
  }
  size_t attention_scratch_floats(int B, int T, int NH, int HS) override {
    return in_.attention_scratch_floats(B, T, NH, HS);
  }
  void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B, int pos, int Tmax,
                        int NH, int HS) override {
    note("attention_decode", {});
    in_.attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS);
  }
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M, int V) override {
    note("crossentropy_forward", {word(losses), word(logits), word(targets), word(M), word(V)});
    in_.crossentropy_forward(losses, logits, targets, M, V);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, float dloss, int M,
                             int V) override {
    note("crossentropy_backward", {word(dlogits), word(logits), word(targets), word(M), word(V)}, {word(dloss)});
    in_.crossentropy_backward(dlogits, logits, targets, dloss, M, V);
  }
  void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first, const int32_t* len,
                                    const int32_t* targets, int E) override {
    note("segment_crossentropy_forward", {word(losses), word(x), word(first), word(len), word(targets), word(E)});
    in_.segment_crossentropy_forward(losses, x, first, len, targets, E);
  }
  void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first, const int32_t* len,
                                     const int32_t* targets, float dloss, int E) override {
    note("segment_crossentropy_backward", {word(dx), word(x), word(first), word(len), word(targets), word(E)},
         {word(dloss)});
    in_.segment_crossentropy_backward(dx, x, first, len, targets, dloss, E);
  }
  double sum(const float* x, size_t N) override {
    note("sum", {word(x), N});
    return in_.sum(x, N);
  }
  double sumsq(const float* x, size_t N) override {
    note("sumsq", {word(x), N});
    return in_.sumsq(x, N);
  }
  void sum_into(double* acc, const float* x, size_t N, double scale) override {
    note("sum_into", {word(acc), word(x), N, word(scale)});
    in_.sum_into(acc, x, N, scale);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr, float beta1,
                    float beta2, float eps, float weight_decay, float grad_scale, int t) override {
    note("adamw_update", {});
    in_.adamw_update(param, grad, m, v, N, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  }

 private:
  // the arguments, then the dropout keying's four fields
  static std::vector<uint64_t> with_rows(std::vector<uint64_t> v, const DropRows& r) {
    v.insert(v.end(), {r.row, r.row_key, word(r.token_key), r.width});
    return v;
  }
  void note(const char* op, std::vector<uint64_t> fixed, std::vector<uint64_t> varying = {}) {
    calls.push_back(Call{op, std::move(fixed), std::move(varying)});
  }
  Backend& in_;
};

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
  return hb;
}

// Two micro-batches of different examples, each a training forward_into and backward, recorded;
// a first micro-batch before them carves the arenas.
std::pair<std::vector<Call>, std::vector<Call>> two_steps(const std::string& task, bool fixed) {
  Recorder rec(cpu());
  auto m = nlp::make_model(small_bert(), rec, task);
  m->init_weights(3);
  nlp::DeviceBatchBuffer dbuf(cpu());  // the upload is not part of the step a graph would hold
  double* acc = static_cast<double*>(cpu().alloc(sizeof(double)));
  const std::vector<std::vector<int>> lengths = {
      {9, 23, 4, 17, 12, 5, 20, 8, 11},           // 9 examples
      {3, 7, 30, 6, 5, 9, 14, 2, 6, 10, 4, 8},     // 12
      {12, 12, 12, 12, 12, 12, 12, 5, 5}};         // 9 again, other lengths
  std::vector<std::vector<Call>> steps;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const nlp::HostBatch hb = packed(lengths[s], task, fixed, 40 + s);
    const nlp::DeviceBatch db = dbuf.upload(hb);
    const float dloss = 1.0f / static_cast<float>(hb.loss_units(nlp::Task::DocCls) + 1);
    rec.calls.clear();
    m->forward_into(db, /*training=*/true, nlp::derive_seed(77, s), acc);
    m->backward(db, dloss * (1 + float(s)), /*training=*/true, nlp::derive_seed(77, s));
    steps.push_back(rec.calls);
  }
  cpu().release(acc);
  return {steps[1], steps[2]};
}

bool same_fixed(const std::vector<Call>& a, const std::vector<Call>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].op != b[i].op || a[i].fixed != b[i].fixed) return false;
  return true;
}

const char* first_difference(const std::vector<Call>& a, const std::vector<Call>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i].op != b[i].op || a[i].fixed != b[i].fixed) return a[i].op.c_str();
  return a.size() == b.size() ? "none" : "the call count";
}

TEST(StepShape, PackedStepsWithFixedExamplesMakeTheSameCalls) {
  for (const std::string task : {"doc_cls", "pair_cls", "qa"}) {
    SCOPED_TRACE(task);
    const auto [a, b] = two_steps(task, /*fixed=*/true);
    ASSERT_GT(a.size(), 50u);  // the whole model ran through the recorder
    EXPECT_TRUE(same_fixed(a, b)) << "first difference at " << first_difference(a, b);
    // nothing that synchronises or allocates inside the micro-batch
    for (const Call& c : a)
      for (const char* bad : {"alloc", "release", "to_device", "to_host", "synchronize", "sum", "sumsq",
                              "host_alloc"})
        EXPECT_NE(c.op, bad);
    // what a replay must supply: the seeds and dloss differ between the steps
    size_t varying = 0, differ = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      varying += !a[i].varying.empty();
      differ += a[i].varying != b[i].varying;
    }
    EXPECT_GT(varying, 10u);
    EXPECT_EQ(differ, varying);
  }
}

TEST(StepShape, WithoutFixedExamplesOrWithLabelledRowsTheCallsDiffer) {
  for (const std::string task : {"doc_cls", "qa"}) {  // the heads' example count
    SCOPED_TRACE(task);
    const auto [a, b] = two_steps(task, /*fixed=*/false);
    EXPECT_FALSE(same_fixed(a, b));
  }
  // ner trains on its labelled rows, as many as the batch has: not yet one shape
  const auto [a, b] = two_steps("ner", /*fixed=*/true);
  EXPECT_FALSE(same_fixed(a, b));
}

}  // namespace
