// GPT-2's LM head fused with its cross-entropy (Backend::lm_head_crossentropy, model.fused_head) and
// the padded vocabulary of its GEMMs (model.pad_vocab), on the CPU backend:
//  - the op against a float64 reference computed here, and against the unfused ops (matmul_forward,
//    crossentropy_forward/backward, matmul_backward): losses, dx and dW to ~1e-6, in fp32 and with
//    bf16 operands (the bf16 backend's unfused ops; both within the bf16 tolerance of fp32);
//  - finite differences of the summed loss with respect to x and w on a tiny case;
//  - the padded row stride (Vp = 384 for V = 300) bitwise equal to Vp = V, for every chunking;
//  - a whole GPT-2 (V = 300) trained a few AdamW steps as the trainer runs them (forward_into, whose
//    loss the fused head adds in the backward; the same as forward()'s): the fused head's losses and
//    weights against the unfused head's (relative 1e-6; the chunks only reorder dW's sum), and pad_vocab = 128 bitwise
//    equal to off (losses, gradients, updated weights); the activation arena drops the [B*T, V]
//    logits and their gradient for one chunk;
//  - the configuration: auto resolves to off (fused) and 128 / off (pad) per backend, and to off in
//    the run modes that read the logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/lm_head.h"
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

VF randn(size_t n, uint64_t seed, float sd) {
  VF v(n);
  nlp::Rng(seed).fill_normal(v.data(), n, sd);
  return v;
}

double norm(const VF& a) {
  double s = 0;
  for (float x : a) s += double(x) * x;
  return std::sqrt(s);
}
double rel(const VF& a, const VF& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(d) / norm(b);
}

struct Case {
  int M, C, V;
  VF x, w, dx0, dw0;
  std::vector<int32_t> targets;
};

// rows x[M,C] and w[V,C] of a trained head's scale; every 5th target ignored; dx and dW start
// non-zero (the op accumulates)
Case make_case(int M, int C, int V) {
  Case c{M, C, V, randn(size_t(M) * C, 1, 1.0f), randn(size_t(V) * C, 2, 0.5f),
         randn(size_t(M) * C, 3, 0.1f), randn(size_t(V) * C, 4, 0.1f), {}};
  nlp::Rng r(5);
  for (int m = 0; m < M; ++m)
    c.targets.push_back(m % 5 == 3 ? nlp::kIgnoreIndex : int32_t(r.uniform() * V) % V);
  return c;
}

struct Out {
  VF losses, dx, dw;
};

Out fused(Backend& b, const Case& c, float dloss, int Vp, int chunk, bool backward = true) {
  Out o{VF(c.M, -1.0f), c.dx0, c.dw0};
  VF scratch(b.lm_head_scratch_floats(chunk, c.C, c.V, Vp), 7.0f);  // contents do not matter
  b.lm_head_crossentropy(o.losses.data(), backward ? o.dx.data() : nullptr,
                         backward ? o.dw.data() : nullptr, c.x.data(), c.w.data(), c.targets.data(),
                         dloss, c.M, c.C, c.V, Vp, chunk, scratch.data());
  return o;
}

Out unfused(Backend& b, const Case& c, float dloss) {
  Out o{VF(c.M), c.dx0, c.dw0};
  VF logits(size_t(c.M) * c.V), dlogits(size_t(c.M) * c.V, 0.0f);
  b.matmul_forward(logits.data(), c.x.data(), c.w.data(), nullptr, c.M, c.C, c.V, nlp::WLayout::OutIn);
  b.crossentropy_forward(o.losses.data(), logits.data(), c.targets.data(), c.M, c.V);
  b.crossentropy_backward(dlogits.data(), logits.data(), c.targets.data(), dloss, c.M, c.V);
  b.matmul_backward(o.dx.data(), o.dw.data(), nullptr, dlogits.data(), c.x.data(), c.w.data(), c.M,
                    c.C, c.V, nlp::WLayout::OutIn);
  return o;
}

// The same in float64, written here from the definitions.
struct OutD {
  std::vector<double> losses, dx, dw;
};
OutD reference(const Case& c, double dloss) {
  OutD o{std::vector<double>(c.M), std::vector<double>(c.dx0.begin(), c.dx0.end()),
         std::vector<double>(c.dw0.begin(), c.dw0.end())};
  std::vector<double> z(c.V), p(c.V);
  for (int m = 0; m < c.M; ++m) {
    const int32_t t = c.targets[m];
    if (t == nlp::kIgnoreIndex) continue;
    double mx = -1e300;
    for (int v = 0; v < c.V; ++v) {
      double s = 0;
      for (int k = 0; k < c.C; ++k) s += double(c.x[size_t(m) * c.C + k]) * c.w[size_t(v) * c.C + k];
      z[v] = s;
      mx = std::max(mx, s);
    }
    double se = 0;
    for (int v = 0; v < c.V; ++v) se += std::exp(z[v] - mx);
    o.losses[m] = std::log(se) + mx - z[t];
    for (int v = 0; v < c.V; ++v) p[v] = (std::exp(z[v] - mx) / se - (v == t)) * dloss;
    for (int v = 0; v < c.V; ++v)
      for (int k = 0; k < c.C; ++k) {
        o.dx[size_t(m) * c.C + k] += p[v] * c.w[size_t(v) * c.C + k];
        o.dw[size_t(v) * c.C + k] += p[v] * c.x[size_t(m) * c.C + k];
      }
  }
  return o;
}
double rel(const VF& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
  return std::sqrt(d / n);
}

TEST(LmHead, FusedMatchesFloat64AndTheUnfusedOps) {
  const Case c = make_case(37, 24, 300);
  const float dloss = 0.37f;
  const OutD ref = reference(c, dloss);
  const Out un = unfused(be(), c, dloss);
  for (int chunk : {37, 16, 1}) {
    SCOPED_TRACE(testing::Message() << "chunk " << chunk);
    const Out f = fused(be(), c, dloss, c.V, chunk);
    EXPECT_LT(rel(f.losses, ref.losses), 1e-6);
    EXPECT_LT(rel(f.dx, ref.dx), 1e-6);
    EXPECT_LT(rel(f.dw, ref.dw), 1e-6);
    EXPECT_LT(rel(f.losses, un.losses), 1e-6);
    EXPECT_LT(rel(f.dx, un.dx), 1e-6);
    EXPECT_LT(rel(f.dw, un.dw), 1e-6);
    for (int m = 0; m < c.M; ++m)
      if (c.targets[m] == nlp::kIgnoreIndex) EXPECT_EQ(f.losses[m], 0.0f);
    // the forward alone: the same losses, nothing else written
    const Out fw = fused(be(), c, dloss, c.V, chunk, /*backward=*/false);
    EXPECT_EQ(fw.losses, f.losses);
  }
  // the reference is not trivially met: the gradients move
  EXPECT_GT(rel(un.dw, std::vector<double>(c.dw0.begin(), c.dw0.end())), 1e-2);
}

TEST(LmHead, PaddedRowStrideIsBitwiseTheSame) {
  const Case c = make_case(29, 16, 300);
  const int Vp = nlp::padded_vocab(300, 128);
  ASSERT_EQ(Vp, 384);
  for (int chunk : {29, 8, 3}) {
    SCOPED_TRACE(testing::Message() << "chunk " << chunk);
    const Out a = fused(be(), c, 0.5f, c.V, chunk);
    const Out p = fused(be(), c, 0.5f, Vp, chunk);
    EXPECT_EQ(a.losses, p.losses);
    EXPECT_EQ(a.dx, p.dx);
    EXPECT_EQ(a.dw, p.dw);
  }
  EXPECT_EQ(nlp::padded_vocab(50257, 128), 50304);
  EXPECT_EQ(nlp::padded_vocab(256, 128), 256);
  EXPECT_EQ(nlp::padded_vocab(300, 0), 300);
}

TEST(LmHead, Bf16OperandsMatchTheUnfusedBf16Ops) {
  auto b16 = nlp::make_cpu_backend(2, nlp::Precision::Bf16, nlp::CpuGemm::Auto, nlp::CpuBf16::Emulate);
  const Case c = make_case(33, 32, 260);
  const Out ref32 = unfused(be(), c, 0.25f);
  const Out un = unfused(*b16, c, 0.25f);
  for (int Vp : {260, 384}) {
    const Out f = fused(*b16, c, 0.25f, Vp, 10);
    EXPECT_LT(rel(f.losses, un.losses), 1e-6);
    EXPECT_LT(rel(f.dx, un.dx), 1e-6);
    EXPECT_LT(rel(f.dw, un.dw), 1e-6);
    // bf16 operands: within bf16's tolerance of fp32 (test_precision.cpp's 2e-2), and not equal to it
    EXPECT_LT(rel(f.losses, ref32.losses), 2e-2);
    EXPECT_LT(rel(f.dx, ref32.dx), 2e-2);
    EXPECT_LT(rel(f.dw, ref32.dw), 2e-2);
    EXPECT_NE(f.losses, ref32.losses);
  }
}

// d(sum of losses)/dx and /dw by central differences (float64 sums of the fp32 op's losses)
TEST(LmHead, GradientMatchesFiniteDifferences) {
  Case c = make_case(4, 5, 7);
  c.dx0.assign(c.dx0.size(), 0.0f);
  c.dw0.assign(c.dw0.size(), 0.0f);
  const Out g = fused(be(), c, 1.0f, nlp::padded_vocab(7, 128), 3);
  auto loss = [&](const Case& k) {
    const Out o = fused(be(), k, 1.0f, 7, 3, false);
    double s = 0;
    for (float l : o.losses) s += l;
    return s;
  };
  const float h = 1e-2f;
  for (int which = 0; which < 2; ++which) {
    VF& p = which == 0 ? c.x : c.w;
    const VF& an = which == 0 ? g.dx : g.dw;
    for (size_t i = 0; i < p.size(); ++i) {
      const float keep = p[i];
      p[i] = keep + h;
      const double up = loss(c);
      p[i] = keep - h;
      const double down = loss(c);
      p[i] = keep;
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(an[i], fd, 2e-3 * std::max(1.0, std::abs(fd))) << (which ? "w" : "x") << "[" << i << "]";
    }
  }
}

TEST(LmHead, TargetOutsideTheVocabularyIsAnError) {
  Case c = make_case(6, 4, 10);
  c.targets[2] = 10;
  try {
    fused(be(), c, 1.0f, 128, 4);
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 10"), std::string::npos) << e.what();
  }
}

// ---- the whole model --------------------------------------------------------------------------

nlp::ModelConfig gpt2(const std::string& fused, const std::string& pad) {
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.vocab_size = 300;  // not a multiple of 128
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 32;
  mc.n_positions = 64;
  mc.fused_head = fused;
  mc.pad_vocab = pad;
  mc.head_chunk = 20;  // 48 rows: chunks of 20, 20, 8
  return mc;
}

struct TrainRun {
  std::vector<double> losses;
  VF grads, weights;
  size_t act_bytes = 0;
};

// `steps` AdamW steps on fresh batches, dropout on; the last step's gradient kept
TrainRun train(const nlp::ModelConfig& mc, int steps) {
  const int B = 3, T = 16;
  auto m = nlp::make_model(mc, be(), "clm");
  m->init_weights(21);
  nlp::ParamStore& ps = m->params();
  const size_t P = ps.total();
  VF mom(P, 0.0f), var(P, 0.0f);
  TrainRun r;
  r.act_bytes = m->activation_bytes(B, T);
  for (int s = 0; s < steps; ++s) {
    const nlp::HostBatch hb = nlp::test::clm_batch(B, T, 100 + s);
    nlp::DeviceBatchBuffer dbuf(be());
    const nlp::DeviceBatch db = dbuf.upload(hb);
    be().zero(ps.grad(), P * sizeof(float));
    // as the trainer runs a micro-batch: the loss sum added in backend memory, read after the
    // backward (the fused head adds it in the backward); forward() gives the same sum at once
    const double eager = m->forward(db, /*training=*/true, 900 + s);
    auto* acc = static_cast<double*>(be().alloc(sizeof(double)));
    m->forward_into(db, /*training=*/true, 900 + s, acc);
    m->backward(db, 1.0f / float(B * T), /*training=*/true, 900 + s);
    double loss = 0;
    be().to_host(&loss, acc, sizeof loss);
    be().release(acc);
    EXPECT_EQ(loss, eager) << "step " << s;
    r.losses.push_back(loss);
    r.grads.assign(ps.grad(), ps.grad() + P);
    be().adamw_update(ps.data(), ps.grad(), mom.data(), var.data(), P, 1e-2f, 0.9f, 0.999f, 1e-8f,
                      0.01f, 1.0f, s + 1);
  }
  // an evaluation forward (losses only) after training
  const nlp::HostBatch hb = nlp::test::clm_batch(B, T, 77);
  nlp::DeviceBatchBuffer dbuf(be());
  r.losses.push_back(m->forward(dbuf.upload(hb), /*training=*/false, 0));
  r.weights.assign(ps.data(), ps.data() + P);
  return r;
}

TEST(LmHead, Gpt2TrainingWithTheFusedHeadEqualsTheUnfusedHead) {
  const TrainRun off = train(gpt2("off", "off"), 4);
  const TrainRun on = train(gpt2("on", "off"), 4);
  const TrainRun on_pad = train(gpt2("on", "128"), 4);
  ASSERT_EQ(off.losses.size(), 5u);
  for (size_t i = 0; i < off.losses.size(); ++i)
    EXPECT_NEAR(on.losses[i], off.losses[i], 1e-6 * off.losses[i]) << "step " << i;
  EXPECT_LT(rel(on.grads, off.grads), 1e-5);
  // AdamW divides each gradient by its own running magnitude, so the dW summation order's ~1e-7
  // differences grow in the small-gradient elements (measured 5.7e-6 after 4 steps at lr 1e-2)
  EXPECT_LT(rel(on.weights, off.weights), 2e-5);
  for (size_t i = 0; i < off.losses.size(); ++i)
    std::printf("step %zu loss unfused %.9g fused %.9g rel %.2e\n", i, off.losses[i], on.losses[i],
                std::abs(on.losses[i] - off.losses[i]) / off.losses[i]);
  std::printf("gradients rel %.2e weights rel %.2e\n", rel(on.grads, off.grads), rel(on.weights, off.weights));
  // training moved the weights and the loss (the comparison is not of a model that stands still)
  EXPECT_NE(off.losses[0], off.losses[3]);
  // pad_vocab = 128: bitwise
  EXPECT_EQ(on_pad.losses, on.losses);
  EXPECT_EQ(on_pad.grads, on.grads);
  EXPECT_EQ(on_pad.weights, on.weights);
  // the arena: logits and dlogits [48, 300] replaced by one chunk [20, Vp]
  const size_t BT = 48;
  EXPECT_EQ(off.act_bytes - on.act_bytes, (2 * BT * 300 - 20 * 300) * sizeof(float));
  EXPECT_EQ(off.act_bytes - on_pad.act_bytes, (2 * BT * 300 - 20 * 384) * sizeof(float));
}

TEST(LmHead, FusedModelKeepsNoLogits) {
  auto m = nlp::make_model(gpt2("on", "auto"), be(), "clm");
  m->init_weights(3);
  nlp::HostBatch hb = nlp::test::clm_batch(2, 8, 1);
  nlp::DeviceBatchBuffer dbuf(be());
  nlp::DeviceBatch db = dbuf.upload(hb);
  m->forward(db, false, 0);
  EXPECT_TRUE(m->outputs().empty());
  EXPECT_EQ(m->logits(), nullptr);
  db.targets = nullptr;
  EXPECT_THROW(m->forward(db, false, 0), nlp::Error);
  // the weights keep vocab_size rows whatever the padding
  const auto& wte = m->params().specs()[m->params().index("transformer.wte.weight")];
  EXPECT_EQ(wte.shape, (std::vector<int64_t>{300, 32}));
}

TEST(LmHead, ConfigurationResolves) {
  for (const std::string be_name : {"cpu", "cuda"}) {
    nlp::ModelConfig mc = gpt2("auto", "auto");
    nlp::resolve_lm_head(mc, be_name, nlp::RunMode::Train);
    EXPECT_EQ(mc.fused_head, "off") << be_name;
    EXPECT_EQ(mc.pad_vocab, be_name == "cpu" ? "128" : "off");
    for (const std::string mode : {"train", "eval", "gradients", "predict", "generate"}) {
      nlp::ModelConfig on = gpt2("on", "128");
      nlp::Config modes;
      modes.run.mode = mode;
      nlp::resolve_lm_head(on, be_name, modes.mode());
      EXPECT_EQ(on.fused_head, mode == "train" || mode == "eval" ? "on" : "off") << mode;
      EXPECT_EQ(on.pad_vocab, "128");
    }
  }
  nlp::ModelConfig bad = gpt2("maybe", "off");
  EXPECT_THROW(nlp::resolve_lm_head(bad, "cpu", nlp::RunMode::Train), nlp::Error);
  // the plan: chunk clamped to the rows; auto: at most ~1 GiB of fp32 logits a chunk, the rows split
  // evenly in multiples of 128
  nlp::ModelConfig mc = gpt2("on", "128");
  mc.head_chunk = 0;
  mc.vocab_size = 50257;
  const nlp::LmHeadPlan p = nlp::lm_head_plan(mc, "cuda", 50257, 16384);
  EXPECT_TRUE(p.fused);
  EXPECT_EQ(p.Vp, 50304);
  EXPECT_EQ(p.chunk, 4096);
  EXPECT_EQ(nlp::lm_head_plan(mc, "cuda", 50257, 8 * 1024).chunk, 4096);  // 2 chunks
  EXPECT_EQ(nlp::lm_head_plan(mc, "cuda", 50257, 6000).chunk, 3072);       // 2 chunks, even
  EXPECT_EQ(nlp::lm_head_plan(mc, "cuda", 50257, 5000).chunk, 5000);       // 1 chunk
  EXPECT_EQ(nlp::lm_head_plan(mc, "cuda", 50257, 100).chunk, 100);
}

}  // namespace
