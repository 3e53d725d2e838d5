// BERT's last block at the rows its head reads only (block.h OutRows: the [CLS] rows for doc_cls and
// pair_cls, the masked positions for mlm, the labelled positions for ner in training) against the
// same model computing every row
// (Model::set_last_block_all_rows(true), what transformers computes): the loss, the outputs and every
// parameter gradient agree to fp32 rounding, in training mode with dropout on (so the rows' dropout
// keys must be those of their positions), for batches at the file's length, trimmed below it and
// packed, with and without block recompute, the [CLS] rows uploaded with the batch or copied by the
// model. last_block_rows() shows that the rows path ran.
// The reference is the full computation, never a value taken from the path under test. Also here,
// on the same batches: the trainer's forward_into adds the loss sum that forward() returns.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "config/config.h"
#include "core/backend.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/batches.h"
#include "small_models.h"

namespace {

using nlp::Backend;
using VF = std::vector<float>;

Backend& be() {
  static std::unique_ptr<Backend> b = nlp::make_cpu_backend(2);
  return *b;
}

using nlp::test::small_bert;

nlp::ModelConfig small_gpt2() {  // the same size, for the loss-sum test
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.vocab_size = 97;
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 32;
  mc.n_positions = 64;
  return mc;
}

// B rows of T positions, row b real for its first len[b]: random ids, labels, and (mlm, ner) targets
// at every third real position after [CLS] (ner: one of the 3 labels).
nlp::HostBatch batch(const std::vector<int>& len, int T, const std::string& task) {
  const bool mlm = task == "mlm", ner = task == "ner";
  nlp::Rng r(7);
  nlp::HostBatch hb;
  hb.B = static_cast<int>(len.size());
  hb.T = hb.T_key = T;
  const size_t n = size_t(hb.B) * T;
  hb.ids.assign(n, 0);
  hb.mask.assign(n, 0);
  hb.targets.assign(n, nlp::kIgnoreIndex);
  hb.type_ids.assign(n, 0);
  for (int b = 0; b < hb.B; ++b)
    for (int t = 0; t < len[b]; ++t) {
      const size_t i = size_t(b) * T + t;
      hb.ids[i] = 5 + static_cast<int32_t>(r.uniform() * 90);
      hb.mask[i] = 1;
      hb.type_ids[i] = t >= len[b] / 2;
      if (mlm && t % 3 == 1) hb.targets[i] = 5 + (7 * b + t) % 90;
      if (ner && t % 3 == 1) hb.targets[i] = (b + t) % 3;
    }
  for (int b = 0; b < hb.B; ++b) hb.labels.push_back(b % 3);
  hb.start.assign(hb.B, nlp::kIgnoreIndex);
  hb.end.assign(hb.B, nlp::kIgnoreIndex);
  for (size_t i = 0; i < n; ++i)
    if ((mlm || ner) && hb.targets[i] != nlp::kIgnoreIndex) {
      hb.rows.push_back(static_cast<int32_t>(i));
      hb.row_targets.push_back(hb.targets[i]);
    }
  hb.has_padding = true;
  return hb;
}

struct Result {
  double loss = 0;
  VF grads, out;
  int rows = -1;
};

// One training forward + backward (dropout on), from weights seeded the same way every time.
Result run(nlp::Model& m, const nlp::DeviceBatch& db, bool all_rows) {
  m.set_last_block_all_rows(all_rows);
  m.init_weights(11);
  nlp::ParamStore& ps = m.params();
  be().zero(ps.grad(), ps.total() * sizeof(float));
  Result r;
  r.loss = m.forward(db, /*training=*/true, 1234);
  r.rows = m.last_block_rows();
  for (const nlp::OutputView& o : m.outputs()) {
    size_t k = 1;
    for (auto d : o.shape) k *= size_t(d);
    const size_t at = r.out.size();
    r.out.resize(at + k);
    be().to_host(r.out.data() + at, o.data, k * sizeof(float));
  }
  m.backward(db, 0.25f, /*training=*/true, 1234);
  r.grads.resize(ps.total());
  be().to_host(r.grads.data(), ps.grad(), ps.total() * sizeof(float));
  return r;
}

double norm(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}
double dist(const float* a, const float* b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(d);
}
double rel(const VF& a, const VF& b) { return dist(a.data(), b.data(), b.size()) / norm(b.data(), b.size()); }

enum class Shape { Padded, Trimmed, Packed };

void check(const std::string& task, Shape shape, bool recompute) {
  SCOPED_TRACE(task + (shape == Shape::Padded ? " padded" : shape == Shape::Trimmed ? " trimmed" : " packed") +
               (recompute ? " recompute" : ""));
  const bool rows = task == "mlm" || task == "ner";
  nlp::HostBatch hb = batch({9, 23, 4, 17, 12}, 32, task);
  if (shape == Shape::Trimmed) nlp::trim_to_longest(hb, 8);
  if (shape == Shape::Packed) nlp::pack_rows(hb, 16);
  // the shape under test is the one asked for
  if (shape == Shape::Trimmed) ASSERT_LT(hb.T, 32);
  if (shape == Shape::Packed) ASSERT_LT(hb.B, hb.E);
  nlp::DeviceBatchBuffer dbuf(be());
  const nlp::DeviceBatch db = dbuf.upload(hb);
  auto m = nlp::make_model(small_bert(), be(), task);
  m->set_recompute(recompute);
  const Result full = run(*m, db, true);
  const Result part = run(*m, db, false);
  EXPECT_EQ(full.rows, 0);
  EXPECT_EQ(part.rows, rows ? int(hb.rows.size()) : hb.E > 0 ? hb.E : hb.B);
  EXPECT_NEAR(part.loss, full.loss, 1e-6 * std::abs(full.loss));
  VF ref = full.out;
  if (task == "ner") {  // training logits at the labelled rows only ([M,NL]); the full run's [B,T,NL]
    const size_t NL = 3;
    ASSERT_EQ(full.out.size(), size_t(hb.B) * hb.T * NL);
    ref.clear();
    for (int32_t at : hb.rows) ref.insert(ref.end(), full.out.begin() + at * NL, full.out.begin() + (at + 1) * NL);
  }
  ASSERT_EQ(part.out.size(), ref.size());
  EXPECT_LT(rel(part.out, ref), 1e-6);
  // every tensor's gradient within 1e-5 of its norm, or (the key biases, whose exact gradient is
  // zero: softmax ignores a constant added to every score) within 1e-6 of the whole gradient's norm
  const double total = norm(full.grads.data(), full.grads.size());
  for (const auto& sp : m->params().specs()) {
    const float* a = part.grads.data() + sp.offset;
    const float* b = full.grads.data() + sp.offset;
    const double d = dist(a, b, sp.numel), e = d / norm(b, sp.numel);
    EXPECT_TRUE(e < 1e-5 || d < 1e-6 * total)
        << sp.name << ": relative " << e << ", absolute " << d << " against a gradient norm " << total;
  }
  // doc_cls, pair_cls: the [CLS] rows came with the batch's upload (DeviceBatch::cls_rows); a batch
  // without them (built by hand) has the model copy them itself, to the same bits
  if (!rows) {
    ASSERT_NE(db.cls_rows, nullptr);
    nlp::DeviceBatch own = db;
    own.cls_rows = nullptr;
    const Result self = run(*m, own, false);
    EXPECT_EQ(self.rows, part.rows);
    EXPECT_EQ(self.loss, part.loss);
    EXPECT_EQ(self.out, part.out);
    EXPECT_EQ(self.grads, part.grads);
  }
  // the last block's parameters do get a gradient (the comparison is not of zeros)
  const auto& last = m->params().specs()[m->params().index("bert.encoder.layer.1.output.dense.weight")];
  double s = 0;
  for (size_t i = 0; i < last.numel; ++i) s += std::abs(full.grads[last.offset + i]);
  EXPECT_GT(s, 0);
}

TEST(LastBlockRows, DocClsEqualsEveryRow) {
  for (Shape sh : {Shape::Padded, Shape::Trimmed, Shape::Packed}) check("doc_cls", sh, false);
}
TEST(LastBlockRows, PairClsWithRecomputeEqualsEveryRow) {
  for (Shape sh : {Shape::Padded, Shape::Packed}) check("pair_cls", sh, true);
}
TEST(LastBlockRows, MlmEqualsEveryRow) {
  for (Shape sh : {Shape::Padded, Shape::Trimmed, Shape::Packed}) check("mlm", sh, false);
  check("mlm", Shape::Trimmed, true);
}
TEST(LastBlockRows, NerTrainingEqualsEveryRow) {
  for (Shape sh : {Shape::Padded, Shape::Trimmed, Shape::Packed}) check("ner", sh, false);
  check("ner", Shape::Packed, true);
}
// Model::forward_into, the trainer's forward (the loss added up in backend memory, read once per
// step), adds bitwise what forward() returns, for every head (qa's 0.5 scale included) and for GPT-2,
// training and evaluation, padded and packed, over two micro-batches into one sum.
TEST(LossSum, ForwardIntoAddsWhatForwardReturns) {
  for (const char* task : {"doc_cls", "pair_cls", "ner", "qa", "mlm", "clm"}) {
    for (bool packed : {false, true}) {
      const std::string t = task;
      if (t == "clm" && packed) continue;  // packing is for the BERT tasks
      SCOPED_TRACE(t + (packed ? " packed" : ""));
      nlp::HostBatch hb = batch({9, 23, 4, 17}, 32, t == "clm" ? "mlm" : t);
      if (t == "qa") {
        hb.start = {1, 2, 1, 3};
        hb.end = {3, 5, 2, 4};
      }
      if (packed) nlp::pack_rows(hb, 16);
      nlp::DeviceBatchBuffer dbuf(be());
      const nlp::DeviceBatch db = dbuf.upload(hb);
      auto m = nlp::make_model(t == "clm" ? small_gpt2() : small_bert(), be(), t);
      m->init_weights(5);
      for (bool training : {true, false}) {
        double want = 1.0 / 3.0;  // an earlier micro-batch's sum
        want += m->forward(db, training, 77);
        ASSERT_GT(want, 1.0 / 3.0);  // a loss was computed
        want += m->forward(db, training, 78);
        auto* acc = static_cast<double*>(be().alloc(sizeof(double)));
        const double start = 1.0 / 3.0;
        be().to_device(acc, &start, sizeof start);
        m->forward_into(db, training, 77, acc);
        m->forward_into(db, training, 78, acc);
        double got = 0;
        be().to_host(&got, acc, sizeof got);
        be().release(acc);
        EXPECT_EQ(got, want) << (training ? "training" : "evaluation");
      }
    }
  }
}

// qa reads every row, and ner's evaluation and prediction output every row's logits: the last block
// computes them all
TEST(LastBlockRows, QaAndNerEvaluationComputeEveryRow) {
  for (const char* task : {"ner", "qa"}) {
    nlp::HostBatch hb = batch({9, 23, 4}, 32, task);
    hb.start = {1, 2, 1};
    hb.end = {3, 5, 2};
    nlp::DeviceBatchBuffer dbuf(be());
    const nlp::DeviceBatch db = dbuf.upload(hb);
    auto m = nlp::make_model(small_bert(), be(), task);
    m->init_weights(3);
    const bool ner = std::string(task) == "ner";
    if (ner) {  // training: the labelled rows
      m->forward(db, true, 5);
      EXPECT_EQ(m->last_block_rows(), int(hb.rows.size()));
      ASSERT_GT(hb.rows.size(), 0u);
    }
    m->forward(db, /*training=*/!ner, 5);
    EXPECT_EQ(m->last_block_rows(), 0) << task;
    const auto outs = m->outputs();
    ASSERT_GE(outs[0].shape.size(), 2u);  // ner: [B,T,NL]; qa: [B,T] start logits
    EXPECT_EQ(outs[0].shape[0], 3) << task;
    EXPECT_EQ(outs[0].shape[1], 32) << task;
  }
}

}  // namespace
