// bf16 activation storage (run.bf16_activations, core/tensor.h views) on the CPU backend, the reference
// the GPU's bf16 stores are compared with:
//  - op by op, a bf16 view stores exactly round_bf16 of what the fp32 op computes from the widened
//    inputs (a load is exact, a store rounds to nearest even once), an accumulated bf16 gradient adds
//    the op's fp32 result to its widened prior value and rounds once, and mixed fp32/bf16 arguments
//    work; the expected bits are computed here from fp32 views and cpu::round_bf16;
//  - the residual + layer norm stores res rounded and normalises the stored (rounded) value;
//  - overwrite(): a backward op that is a gradient's only writer ignores the prior contents (NaN
//    here) and gives the bits of zero-then-accumulate, in fp32 and bf16;
//  - whole models (GPT-2 clm and BERT doc_cls, dropout on, bf16 GEMM operands): bf16 activations
//    against fp32 activations on the same weights and batches: losses within 2e-2 relative and
//    gradients within 5e-2 of their norm per tensor (or 1e-2 of the whole gradient's norm when that
//    is larger: tiny tensors), the same tolerances as the GPU's bf16 model checks
//    (test_ops_cuda.cpp kFusedModel*); two runs bitwise equal; the activation arena about halved;
//  - run.bf16_activations without train.precision = bf16 is an error naming both keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/round.h"
#include "config/config.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/batches.h"
#include "small_models.h"

namespace {

using nlp::Act;
using nlp::Backend;
using nlp::CAct;
using nlp::DType;
using VF = std::vector<float>;
using VB = std::vector<uint16_t>;

Backend& be() {
  static std::unique_ptr<Backend> b = nlp::make_cpu_backend(2);
  return *b;
}

VF randn(size_t n, uint64_t seed, float sd = 1.0f) {
  VF v(n);
  nlp::Rng(seed).fill_normal(v.data(), n, sd);
  return v;
}
VB to_bf(const VF& v) {
  VB b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = nlp::cpu::to_bf16_bits(v[i]);
  return b;
}
VF widen(const VB& b) {
  VF v(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const uint32_t u = uint32_t(b[i]) << 16;
    std::memcpy(&v[i], &u, sizeof u);
  }
  return v;
}
Act view(VB& b) { return Act(b.data(), DType::BF16); }
CAct cview(const VB& b) { return CAct(b.data(), DType::BF16); }

// The bf16 bits of v, element by element equal to `want` (bf16 bits); names the first mismatch.
::testing::AssertionResult same_bits(const VB& got, const VF& want_fp32, const char* what) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != nlp::cpu::to_bf16_bits(want_fp32[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " is 0x" << std::hex << got[i]
                                           << ", expected round_bf16(" << want_fp32[i] << ") = 0x"
                                           << nlp::cpu::to_bf16_bits(want_fp32[i]);
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(Bf16Activations, ForwardOpsStoreTheRoundingOfTheFp32Result) {
  Backend& b = be();
  const int N = 6, C = 40, FF = 64;
  const size_t n = size_t(N) * C;
  // inputs stored bf16; the fp32 reference reads their exact values
  const VB x = to_bf(randn(n, 1)), y = to_bf(randn(n, 2)), h = to_bf(randn(size_t(N) * FF, 3, 2.0f));
  const VF xf = widen(x), yf = widen(y), hf = widen(h);
  const VF w = randn(size_t(C) * FF, 4, 0.2f), bias = randn(FF, 5), lw = randn(C, 6), lb = randn(C, 7);
  {  // gelu (both forms)
    for (nlp::Gelu g : {nlp::Gelu::Tanh, nlp::Gelu::Erf}) {
      VB out(h.size(), 0xFFFF);
      VF ref(h.size());
      b.gelu_forward(view(out), cview(h), h.size(), g);
      b.gelu_forward(ref.data(), hf.data(), h.size(), g);
      EXPECT_TRUE(same_bits(out, ref, "gelu_forward"));
    }
  }
  {  // add, with the output aliasing an input
    VB out = x;
    VF ref(n);
    b.add(view(out), cview(out), cview(y), n);
    b.add(ref.data(), xf.data(), yf.data(), n);
    EXPECT_TRUE(same_bits(out, ref, "add (aliased)"));
  }
  {  // dense layer: bf16 input and output, fp32 weights; and a bf16 input into fp32 logits
    VB out(size_t(N) * FF);
    VF ref(size_t(N) * FF), logits(size_t(N) * FF);
    b.matmul_forward(view(out), cview(x), w.data(), bias.data(), N, C, FF, nlp::WLayout::InOut);
    b.matmul_forward(ref.data(), xf.data(), w.data(), bias.data(), N, C, FF, nlp::WLayout::InOut);
    b.matmul_forward(logits.data(), cview(x), w.data(), bias.data(), N, C, FF, nlp::WLayout::InOut);
    EXPECT_TRUE(same_bits(out, ref, "matmul_forward"));
    EXPECT_EQ(logits, ref);  // an fp32 output of a bf16 input: no rounding at all
  }
  {  // layer norm: bf16 out, fp32 statistics
    VB out(n);
    VF ref(n), m1(N), r1(N), m2(N), r2(N);
    b.layernorm_forward(view(out), m1.data(), r1.data(), cview(x), lw.data(), lb.data(), N, C, 1e-5f);
    b.layernorm_forward(ref.data(), m2.data(), r2.data(), xf.data(), lw.data(), lb.data(), N, C, 1e-5f);
    EXPECT_TRUE(same_bits(out, ref, "layernorm_forward"));
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(r1, r2);
  }
  {  // dropout, and rows_gather of strided rows (the [CLS] rows of each sequence)
    VB out(n);
    VF ref(n);
    b.dropout_forward(view(out), cview(x), n, 0.3f, 99);
    b.dropout_forward(ref.data(), xf.data(), n, 0.3f, 99);
    EXPECT_TRUE(same_bits(out, ref, "dropout_forward"));
    VB rows(size_t(2) * C);
    VF rref(size_t(2) * C);
    b.rows_gather(view(rows), cview(x), 2, C, size_t(3) * C);
    b.rows_gather(rref.data(), xf.data(), 2, C, size_t(3) * C);
    EXPECT_TRUE(same_bits(rows, rref, "rows_gather"));
  }
  {  // conversion both ways
    VB out(n);
    VF back(n);
    b.copy_view(view(out), yf.data(), n);
    EXPECT_TRUE(same_bits(out, yf, "copy_view fp32 -> bf16"));
    b.copy_view(back.data(), cview(out), n);
    EXPECT_EQ(back, yf);  // yf holds bf16 values: exact both ways
  }
}

TEST(Bf16Activations, ResidualLayerNormNormalisesTheStoredResidual) {
  Backend& b = be();
  const int N = 5, C = 48;
  const size_t n = size_t(N) * C;
  const VB x = to_bf(randn(n, 11)), d = to_bf(randn(n, 12));
  const VF lw = randn(C, 13), lb = randn(C, 14);
  VB res = d, out(n);  // delta aliases res, as the blocks call it
  VF mean(N), rstd(N);
  b.residual_layernorm_forward(view(res), view(out), mean.data(), rstd.data(), cview(x), cview(res),
                               lw.data(), lb.data(), N, C, 1e-5f, 0.25f, 7, {});
  // expected: r = x + dropout(delta) in fp32, stored rounded; the norm of the rounded r
  VF r(n), rr(n), ref(n), m2(N), s2(N);
  b.dropout_forward(r.data(), widen(d).data(), n, 0.25f, 7);
  b.add(r.data(), r.data(), widen(x).data(), n);
  EXPECT_TRUE(same_bits(res, r, "res"));
  for (size_t i = 0; i < n; ++i) rr[i] = nlp::cpu::round_bf16(r[i]);
  b.layernorm_forward(ref.data(), m2.data(), s2.data(), rr.data(), lw.data(), lb.data(), N, C, 1e-5f);
  EXPECT_TRUE(same_bits(out, ref, "out"));
  EXPECT_EQ(mean, m2);
  EXPECT_EQ(rstd, s2);
}

TEST(Bf16Activations, AccumulatedGradientsRoundOnceOntoTheirPriorValue) {
  Backend& b = be();
  const int M = 7, K = 24, N = 40;
  const VB dout = to_bf(randn(size_t(M) * N, 21)), inp = to_bf(randn(size_t(M) * K, 22));
  const VF w = randn(size_t(K) * N, 23, 0.3f);
  const VB prior = to_bf(randn(size_t(M) * K, 24));
  // dinp += dout @ W^T: bf16 prior + fp32 product, rounded once
  VB dinp = prior;
  VF dw(w.size(), 0.0f), db(N, 0.0f), dw2(w.size(), 0.0f), db2(N, 0.0f);
  b.matmul_backward(view(dinp), dw.data(), db.data(), cview(dout), cview(inp), w.data(), M, K, N,
                    nlp::WLayout::InOut);
  VF ref = widen(prior);
  b.matmul_backward(ref.data(), dw2.data(), db2.data(), widen(dout).data(), widen(inp).data(), w.data(),
                    M, K, N, nlp::WLayout::InOut);
  EXPECT_TRUE(same_bits(dinp, ref, "matmul_backward dinp"));
  EXPECT_EQ(dw, dw2);  // weight and bias gradients stay fp32, from the same exact inputs
  EXPECT_EQ(db, db2);
  // gelu_backward onto a prior value
  const VB pre = to_bf(randn(size_t(M) * N, 25));
  VB g = to_bf(randn(size_t(M) * N, 26));
  VF gref = widen(g);
  b.gelu_backward(view(g), cview(pre), cview(dout), g.size(), nlp::Gelu::Tanh);
  b.gelu_backward(gref.data(), widen(pre).data(), widen(dout).data(), g.size(), nlp::Gelu::Tanh);
  EXPECT_TRUE(same_bits(g, gref, "gelu_backward"));
}

// Every backward op given overwrite(gradient) on a NaN-filled buffer: the bits of zero + accumulate.
TEST(Bf16Activations, OverwriteIgnoresPriorContents) {
  Backend& b = be();
  const int B = 2, T = 8, NH = 2, HS = 8, C = NH * HS, FF = 24;
  const int M = B * T;
  const size_t n = size_t(M) * C;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const VF dout = randn(size_t(M) * FF, 31), inp = randn(n, 32), w = randn(size_t(C) * FF, 33, 0.2f);
  const VF pre = randn(size_t(M) * FF, 34), lw = randn(C, 35), dn = randn(n, 36);
  const VF qkv = randn(3 * n, 37), dA = randn(n, 38);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(nlp::dtype_name(dt));
    // a gradient buffer of m elements in dt: NaN-filled (overwrite) or zero (accumulate)
    struct Buf {
      VF f;
      VB h;
      DType dt;
      Buf(size_t m, DType d, float fill) : f(m, fill), h(m, fill == 0 ? 0 : 0x7FC0), dt(d) {}
      Act act() { return dt == DType::F32 ? Act(f.data()) : Act(h.data(), DType::BF16); }
      VF value() const { return dt == DType::F32 ? f : widen(h); }
    };
    auto check = [&](const char* what, size_t m, auto&& op) {
      Buf a(m, dt, nan), z(m, dt, 0.0f);
      op(nlp::overwrite(a.act()));
      op(z.act());
      const VF av = a.value(), zv = z.value();
      for (size_t i = 0; i < m; ++i)
        ASSERT_EQ(std::memcmp(&av[i], &zv[i], sizeof(float)), 0)
            << what << ": element " << i << " " << av[i] << " vs " << zv[i];
    };
    VF dw(w.size()), dbias(FF), lg(C), lb(C);
    check("matmul_backward", n, [&](Act g) {
      b.matmul_backward(g, dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), M, C, FF,
                        nlp::WLayout::InOut);
    });
    check("gelu_backward", pre.size(),
          [&](Act g) { b.gelu_backward(g, pre.data(), dout.data(), pre.size(), nlp::Gelu::Erf); });
    check("dropout_backward", n, [&](Act g) { b.dropout_backward(g, dn.data(), n, 0.2f, 5); });
    check("tanh_backward", n, [&](Act g) { b.tanh_backward(g, inp.data(), dn.data(), n); });
    VF mean(M), rstd(M), tmp(n);
    b.layernorm_forward(tmp.data(), mean.data(), rstd.data(), inp.data(), lw.data(), lw.data(), M, C, 1e-5f);
    check("layernorm_backward", n, [&](Act g) {
      b.layernorm_backward(g, lg.data(), lb.data(), dn.data(), inp.data(), lw.data(), mean.data(),
                           rstd.data(), M, C);
    });
    VF dd(n);
    check("layernorm_dropout_backward", n, [&](Act g) {
      b.layernorm_dropout_backward(g, dd.data(), VF(n).data(), lg.data(), lb.data(), dn.data(), inp.data(),
                                   lw.data(), mean.data(), rstd.data(), M, C, 0.2f, 5, {});
    });
    VF att(b.attention_saved_floats(B, T, NH, HS)), out(n);
    VF scr(b.attention_scratch_floats(B, T, NH, HS) + 1);
    b.attention_forward(out.data(), att.data(), qkv.data(), nullptr, true, 0.1f, 9, B, T, NH, HS);
    check("attention_backward", 3 * n, [&](Act g) {
      b.attention_backward(g, scr.data(), dA.data(), out.data(), qkv.data(), att.data(), nullptr, true,
                           0.1f, 9, B, T, NH, HS);
    });
  }
}

namespace {

nlp::ModelConfig tiny_gpt2(bool bf16_acts) {
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.vocab_size = 300;
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 32;
  mc.n_positions = 64;
  mc.bf16_activations = bf16_acts;
  return mc;
}
nlp::ModelConfig tiny_bert(bool bf16_acts) {
  nlp::ModelConfig mc = nlp::test::small_bert();
  mc.vocab_size = 300;
  mc.bf16_activations = bf16_acts;
  return mc;
}

// clm: next-token targets; else doc_cls: a label per row and padding in the first row
nlp::HostBatch batch(int B, int T, uint64_t seed, bool clm) {
  nlp::HostBatch hb = nlp::test::clm_batch(B, T, seed);
  if (clm) return hb;
  hb.targets.assign(hb.targets.size(), nlp::kIgnoreIndex);
  for (int b = 0; b < B; ++b) hb.labels[b] = b % 3;
  for (int t = T - 3; t < T; ++t) hb.mask[t] = 0;
  return hb;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<VF> grads;  // per tensor, after the last step
  size_t act_bytes = 0;
};

// Three AdamW steps (dropout on) on a bf16-precision CPU backend, weights from one seed.
TrainRun train(const nlp::ModelConfig& mc, const std::string& task, bool clm) {
  static std::unique_ptr<Backend> bb =
      nlp::make_cpu_backend(2, nlp::Precision::Bf16, nlp::CpuGemm::Auto, nlp::CpuBf16::Emulate);
  Backend& b = *bb;
  const int B = 3, T = 16;
  auto m = nlp::make_model(mc, b, task);
  m->init_weights(5);
  nlp::ParamStore& ps = m->params();
  const size_t P = ps.total();
  VF mom(P, 0.0f), var(P, 0.0f);
  TrainRun r;
  r.act_bytes = m->activation_bytes(B, T);
  for (int s = 0; s < 3; ++s) {
    nlp::DeviceBatchBuffer dbuf(b);
    const nlp::DeviceBatch db = dbuf.upload(batch(B, T, 40 + s, clm));
    b.zero(ps.grad(), P * sizeof(float));
    r.losses.push_back(m->forward(db, true, 600 + s));
    m->backward(db, 1.0f / float(B * T), true, 600 + s);
    r.grads.clear();
    for (const auto& sp : ps.specs()) r.grads.emplace_back(ps.grad() + sp.offset, ps.grad() + sp.offset + sp.numel);
    b.adamw_update(ps.data(), ps.grad(), mom.data(), var.data(), P, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f,
                   s + 1);
  }
  return r;
}

double sq(const VF& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return s;
}

void compare(const TrainRun& f32, const TrainRun& bf, const char* what) {
  ASSERT_EQ(f32.losses.size(), bf.losses.size());
  for (size_t i = 0; i < f32.losses.size(); ++i) {
    EXPECT_NEAR(bf.losses[i], f32.losses[i], 2e-2 * std::abs(f32.losses[i])) << what << " step " << i;
    std::printf("%s step %zu loss fp32 acts %.7f bf16 acts %.7f rel %.2e\n", what, i, f32.losses[i],
                bf.losses[i], std::abs(bf.losses[i] - f32.losses[i]) / f32.losses[i]);
  }
  double total = 0, worst = 0;
  for (const VF& g : f32.grads) total += sq(g);
  total = std::sqrt(total);
  ASSERT_EQ(f32.grads.size(), bf.grads.size());
  for (size_t k = 0; k < f32.grads.size(); ++k) {
    VF d(f32.grads[k].size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = bf.grads[k][i] - f32.grads[k][i];
    const double scale = std::max(std::sqrt(sq(f32.grads[k])), 1e-2 * total / 5e-2);
    const double e = std::sqrt(sq(d)) / scale;
    worst = std::max(worst, e);
    EXPECT_LT(e, 5e-2) << what << " gradient of tensor " << k;
  }
  std::printf("%s worst gradient error %.2e (of the tolerance's scale)\n", what, worst);
}

}  // namespace

TEST(Bf16Activations, Gpt2AgreesWithFp32ActivationsAndHalvesTheArena) {
  const TrainRun f = train(tiny_gpt2(false), "clm", true);
  const TrainRun h = train(tiny_gpt2(true), "clm", true);
  const TrainRun h2 = train(tiny_gpt2(true), "clm", true);
  compare(f, h, "gpt2");
  EXPECT_EQ(h.losses, h2.losses);  // deterministic
  EXPECT_EQ(h.grads, h2.grads);
  EXPECT_NE(f.losses, h.losses);  // the bf16 path did run (its stores rounded something)
  EXPECT_LT(double(h.act_bytes), 0.7 * double(f.act_bytes));
  std::printf("gpt2 activation bytes fp32 %zu bf16 %zu\n", f.act_bytes, h.act_bytes);
}

TEST(Bf16Activations, BertDocClsAgreesWithFp32Activations) {
  const TrainRun f = train(tiny_bert(false), "doc_cls", false);
  const TrainRun h = train(tiny_bert(true), "doc_cls", false);
  compare(f, h, "bert doc_cls");
  EXPECT_NE(f.losses, h.losses);
  EXPECT_LT(h.act_bytes, f.act_bytes);
}

TEST(Bf16Activations, NeedsBf16Precision) {
  nlp::Config cfg;
  cfg.run.bf16_activations = true;
  cfg.train.precision = "fp32";
  try {
    nlp::resolve_model_config(cfg);
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("run.bf16_activations"), std::string::npos) << m;
    EXPECT_NE(m.find("train.precision"), std::string::npos) << m;
  }
  cfg.train.precision = "bf16";
  EXPECT_TRUE(nlp::resolve_model_config(cfg).bf16_activations);
}

// A view's stated extent (core/tensor.h): an op whose shape needs more of it is refused before it
// reads or writes anything; at() shrinks the extent; an unstated extent (a raw pointer) is not checked.
TEST(Bf16Activations, ViewsRefuseOpsLargerThanTheirExtent) {
  Backend& b = be();
  VB small(10, 0), big(20, 0x3F80);  // bf16 1.0
  const VF f(20, 1.0f);
  try {
    b.gelu_forward(Act(small.data(), DType::BF16, small.size()), CAct(big.data(), DType::BF16, big.size()), 20,
                   nlp::Gelu::Tanh);
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 20 elements of a view that holds 10"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(small, VB(10, 0));  // nothing written
  const Act whole(big.data(), DType::BF16, big.size());
  EXPECT_EQ(whole.at(15).n, 5u);
  EXPECT_THROW(b.add(whole.at(15), f.data(), f.data(), 6), nlp::Error);
  b.add(whole.at(15), f.data(), f.data(), 5);  // fits
  EXPECT_EQ(widen(big)[19], 2.0f);
  VF raw(4);
  EXPECT_NO_THROW(b.gelu_forward(raw.data(), f.data(), 4, nlp::Gelu::Erf));  // float*: no extent stated
}
