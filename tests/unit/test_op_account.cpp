// run.profile's account (backend/op_account.h): the bytes and FLOPs of each op kind from its shapes and
// dtypes against values worked out by hand for small shapes, the floor, the aggregation into families
// and the report; the rates measured on the CPU backend; and the accounting backend's labels (the LM
// head's GEMMs apart from the blocks', the bf16 casts apart and timed apart, fewer casts with the
// persistent weight copy) on a CPU run of a few ops; PathCounts (core/path_counts.h) and its absence
// from the CPU backend's account.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_account.h"
#include "backend/op_account_backend.h"
#include "model/params.h"

using namespace nlp;
using namespace nlp::account;

TEST(OpAccount, GemmBytesAndFlopsByHand) {
  // out[2,3] = A[2,4] @ B[4,3], bf16 operands, fp32 out: 2*2*3*4 = 48 FLOPs;
  // read 2*4*2 + 4*3*2 = 40 bytes; written 2*3*4 = 24 bytes
  Cost c = gemm(2, 3, 4, account::DType::BF16, account::DType::BF16, account::DType::F32, false);
  EXPECT_EQ(c.flops, 48);
  EXPECT_EQ(c.read, 40);
  EXPECT_EQ(c.written, 24);
  // fp32, accumulating: the output is read too: 32 + 48 + 24 = 104
  c = gemm(2, 3, 4, account::DType::F32, account::DType::F32, account::DType::F32, true);
  EXPECT_EQ(c.flops, 48);
  EXPECT_EQ(c.read, 104);
  EXPECT_EQ(c.written, 24);
  // with the bias: + M*N = 6 FLOPs, + N*4 = 12 bytes read
  c = gemm(2, 3, 4, account::DType::BF16, account::DType::BF16, account::DType::F32, false, true);
  EXPECT_EQ(c.flops, 54);
  EXPECT_EQ(c.read, 52);
  EXPECT_EQ(c.written, 24);
  // GPT-2 124M's LM head forward at B=16, T=1024: 2 * 16384 * 50257 * 768 FLOPs = 1.2648e12
  c = gemm(16384, 50257, 768, account::DType::BF16, account::DType::BF16, account::DType::F32, false);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 16384 * 50257 * 768);
  EXPECT_DOUBLE_EQ(c.written, 4.0 * 16384 * 50257);  // the fp32 logits, 3.29 GB
}

TEST(OpAccount, LayerNormCrossEntropyCastMemsetByHand) {
  // layer norm N=3, C=5: read inp 60 + w,b 40 = 100; written out 60 + mean,rstd 24 = 84; 8*15 FLOPs
  Cost c = layernorm_forward(3, 5);
  EXPECT_EQ(c.read, 100);
  EXPECT_EQ(c.written, 84);
  EXPECT_EQ(c.flops, 120);
  // backward: read dout, inp, dinp 180 + mean, rstd 24 + w, dw, db 60 = 264; written dinp 60 + dw, db 40
  c = layernorm_backward(3, 5);
  EXPECT_EQ(c.read, 264);
  EXPECT_EQ(c.written, 100);
  EXPECT_EQ(c.flops, 150);
  // cross-entropy M=2, V=7: read logits 56 + targets 8 = 64, written losses 8; 4*14 FLOPs
  c = crossentropy_forward(2, 7);
  EXPECT_EQ(c.read, 64);
  EXPECT_EQ(c.written, 8);
  EXPECT_EQ(c.flops, 56);
  // backward: read logits and dlogits 112 + targets 8, written dlogits 56
  c = crossentropy_backward(2, 7);
  EXPECT_EQ(c.read, 120);
  EXPECT_EQ(c.written, 56);
  // a cast of 10 fp32 to bf16: read 40, written 20, no FLOPs
  c = cast(10, account::DType::F32, account::DType::BF16);
  EXPECT_EQ(c.read, 40);
  EXPECT_EQ(c.written, 20);
  EXPECT_EQ(c.flops, 0);
  c = memset(4096);
  EXPECT_EQ(c.read, 0);
  EXPECT_EQ(c.written, 4096);
  // AdamW over 10 weights: read p, g, m, v 160; written p, m, v 120 (+ 20 with the bf16 copy)
  EXPECT_EQ(adamw(10, false).written, 120);
  EXPECT_EQ(adamw(10, true).written, 140);
  EXPECT_EQ(adamw(10, true).read, 160);
  // causal attention B=1, T=4, NH=2, HS=3: 4*1*2*4*4*3 / 2 = 192 FLOPs; qkv read 4*4*18 = 288 bytes
  c = attention_forward(1, 4, 2, 3, true);
  EXPECT_EQ(c.flops, 192);
  EXPECT_EQ(c.read, 288);
  EXPECT_EQ(c.written, 96);
}

TEST(OpAccount, FloorIsTheBindingLimit) {
  Rates r;
  r.bytes_per_s = 1e12;
  r.flops_per_s = 1e15;
  Cost c;
  c.read = 1.5e9;
  c.written = 0.5e9;  // 2 GB at 1 TB/s: 2 ms
  c.flops = 1e12;     // 1 TFLOP at 1 PFLOP/s: 1 ms
  EXPECT_DOUBLE_EQ(floor_ms(c, r), 2.0);
  c.flops = 5e12;  // 5 ms
  EXPECT_DOUBLE_EQ(floor_ms(c, r), 5.0);
  EXPECT_EQ(floor_ms(c, Rates{}), 0.0);  // unknown rates: no floor
}

TEST(OpAccount, FamiliesSumTheirOpsAndTheReportPredictsTheStep) {
  Rates r;
  r.bytes_per_s = 1e9;  // 1 GB/s: 1 byte = 1e-6 ms
  r.flops_per_s = 1e12;
  r.how = "by hand";
  Account a;
  Cost g;
  g.flops = 2e9;  // 2 ms a call at 1 TFLOP/s
  Cost m = memset(1000000);  // 1 ms a call at 1 GB/s
  for (int step = 0; step < 2; ++step) {
    a.add("gemm lm head (forward)", "gemm (lm head)", g);
    a.add("gemm blocks (forward)", "gemm (blocks)", g);
    a.add("gemm blocks (forward)", "gemm (blocks)", g);
    a.add("memset", "memset", m);
  }
  a.time("gemm lm head (forward)", 8.0, 2);  // 4 ms a step against a floor of 2
  a.time("gemm blocks (forward)", 8.0, 4);
  a.time("memset", 2.0, 2);
  const std::vector<Row> f = a.families();
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].family, "gemm (lm head)");
  EXPECT_EQ(f[1].family, "gemm (blocks)");
  EXPECT_EQ(f[1].calls, 4);
  EXPECT_DOUBLE_EQ(f[1].cost.flops, 8e9);
  EXPECT_DOUBLE_EQ(f[1].ms, 8.0);
  const std::string js = a.json(r, 2, 11.0);
  // per step: floors 2 (head) + 4 (blocks) + 1 (memset) = 7 ms; measured 4 + 4 + 1 = 9 ms
  EXPECT_NE(js.find("\"predicted_step_ms\": 7,"), std::string::npos) << js;
  EXPECT_NE(js.find("\"measured_ops_ms\": 9,"), std::string::npos) << js;
  EXPECT_NE(js.find("\"measured_step_ms\": 11,"), std::string::npos) << js;
  EXPECT_NE(js.find("{\"family\": \"gemm (lm head)\", \"bytes\": 0, \"flops\": 2e+09, \"floor_ms\": 2, \"ms\": 4, "
                    "\"ratio\": 2, \"calls\": 1}"),
            std::string::npos)
      << js;
  const std::string t = a.table(r, 2, 11.0);
  EXPECT_NE(t.find("predicted step (sum of floors) 7.000 ms | measured: ops 9.000 ms (ratio 1.29), step 11 ms"),
            std::string::npos)
      << t;
  // an op with a cost but no time (the CPU's casts inside a GEMM) shows no ratio
  a.add("cast: gemm blocks (forward)", "cast (bf16 operands)", cast(1000, account::DType::F32, account::DType::BF16));
  EXPECT_NE(a.json(r, 1, 0).find("\"ms\": null, \"ratio\": null"), std::string::npos);
}

TEST(OpAccount, RatesMeasuredOnTheCpuBackend) {
  auto be = make_cpu_backend(1);
  const Rates r = measure_rates(*be, size_t(8) << 20, 128, false, 2);
  EXPECT_GT(r.bytes_per_s, 1e8);   // any machine copies 8 MiB faster than 100 MB/s
  EXPECT_LT(r.bytes_per_s, 1e13);
  EXPECT_GT(r.flops_per_s, 1e7);
  EXPECT_LT(r.flops_per_s, 1e14);
  EXPECT_NE(r.how.find("128x128x128 fp32 GEMM"), std::string::npos) << r.how;
}

// The accounting backend on the CPU: labels, families and costs of a small bf16 model's GEMMs.
TEST(OpAccount, BackendLabelsHeadBlocksAndCasts) {
  const int V = 50, C = 16, M = 6, H = 24;
  for (bool copy : {false, true}) {
    auto cpu = make_cpu_backend(1, Precision::Bf16, CpuGemm::Auto, CpuBf16::Emulate, copy);
    AccountBackend be(*cpu, V, Precision::Bf16);
    ParamStore ps;
    ps.add("wte", {V, C}, true);
    ps.add("fc", {C, H}, true);
    ps.allocate(be);
    be.start(size_t(1) << 20, 64);
    std::vector<float> x(size_t(M) * C, 0.5f), h(size_t(M) * H), logits(size_t(M) * V);
    be.matmul_forward(h.data(), x.data(), ps.p(1), nullptr, M, C, H, WLayout::InOut);
    be.matmul_forward(logits.data(), x.data(), ps.p(0), nullptr, M, C, V, WLayout::OutIn);
    std::vector<float> dx(x.size());
    be.matmul_backward(dx.data(), ps.g(0), nullptr, logits.data(), x.data(), ps.p(0), M, C, V, WLayout::OutIn);
    std::vector<float> losses(M);
    std::vector<int32_t> tg(M, 3);
    be.crossentropy_forward(losses.data(), logits.data(), tg.data(), M, V);
    be.zero(h.data(), h.size() * sizeof(float));
    std::string js;
    be.report(1, 0, &js);
    auto find = [&](const std::string& label) -> const Row* {
      for (const Row& r : be.account().rows())
        if (r.label == label) return &r;
      return nullptr;
    };
    const Row* blocks = find("gemm blocks (forward)");
    const Row* head = find("gemm lm head (forward)");
    const Row* head_b = find("gemm lm head (backward)");
    ASSERT_TRUE(blocks && head && head_b) << js;
    EXPECT_EQ(blocks->family, "gemm (blocks)");
    EXPECT_EQ(head->family, "gemm (lm head)");
    EXPECT_EQ(blocks->cost.flops, 2.0 * M * H * C);
    EXPECT_EQ(blocks->cost.read, 2.0 * (M * C + C * H));  // bf16 operands
    EXPECT_EQ(head_b->cost.flops, 2 * 2.0 * M * V * C);    // dX and dW
    EXPECT_GT(blocks->timed, 0);
    // the casts: the activation always, the weight only without the persistent copy
    const Row* cb = find("cast: gemm blocks (forward)");
    const Row* cbh = find("cast: gemm lm head (backward)");
    ASSERT_TRUE(cb && cbh);
    EXPECT_EQ(cb->family, "cast (bf16 operands)");
    EXPECT_EQ(cb->cost.written, 2.0 * (M * C + (copy ? 0 : C * H))) << copy;
    EXPECT_EQ(cbh->cost.written, 2.0 * (M * V + M * C + (copy ? 0 : V * C))) << copy;
    // timed apart by the CPU backend and taken out of the GEMM's host time
    EXPECT_GT(cb->timed, 0);
    EXPECT_GT(cb->ms, 0.0);
    EXPECT_GE(blocks->ms, 0.0);
    const Row* ce = find("crossentropy_forward");
    ASSERT_TRUE(ce);
    EXPECT_EQ(ce->cost.read, crossentropy_forward(M, V).read);
    const Row* ms = find("memset");
    ASSERT_TRUE(ms);
    EXPECT_EQ(ms->cost.written, double(h.size() * sizeof(float)));
    EXPECT_NE(js.find("\"families\""), std::string::npos);
  }
}

// The dense layer with its GELU: one call under the GEMM's label, costed as the fused op (the GEMM,
// out written, the GELU's FLOPs; backward: both GEMMs, the bias sums, pre read, the GELU derivative).
TEST(OpAccount, MatmulGeluCountedAsTheFusedOp) {
  const int V = 50, C = 16, M = 6, H = 24;
  auto cpu = make_cpu_backend(1);
  AccountBackend be(*cpu, V, Precision::Fp32);
  ParamStore ps;
  ps.add("fc", {C, H}, true);
  ps.add("fc_b", {H}, true);
  ps.add("fcp", {H, C}, true);
  ps.add("fcp_b", {C}, true);
  ps.allocate(be);
  be.start(size_t(1) << 20, 32);
  std::vector<float> x(size_t(M) * C, 0.5f), pre(size_t(M) * H), out(size_t(M) * H);
  be.matmul_gelu_forward(out.data(), pre.data(), x.data(), ps.p(0), ps.p(1), M, C, H, WLayout::InOut,
                         nlp::Gelu::Tanh);
  std::vector<float> dy(size_t(M) * C, 0.25f), dpre(pre.size()), scratch(pre.size());
  be.matmul_dgelu_backward(nlp::overwrite(dpre.data()), ps.g(2), ps.g(3), dy.data(), out.data(),
                           pre.data(), ps.p(2), M, H, C, WLayout::InOut, nlp::Gelu::Tanh, scratch.data());
  be.report(1, 0, nullptr);
  const Row *fwd = nullptr, *bwd = nullptr;
  size_t others = 0;
  for (const Row& r : be.account().rows()) {
    if (r.label == "gemm blocks (forward)") fwd = &r;
    else if (r.label == "gemm blocks (backward)") bwd = &r;
    else others += r.calls;
  }
  ASSERT_TRUE(fwd && bwd);
  EXPECT_EQ(others, 0u) << "the inner ops were counted again";
  EXPECT_EQ(fwd->calls, 1);
  EXPECT_EQ(fwd->cost.flops, 2.0 * M * H * C + M * H + 10.0 * M * H);  // product, bias, gelu
  EXPECT_EQ(fwd->cost.read, 4.0 * (M * C + C * H + H));                // x, W, bias
  EXPECT_EQ(fwd->cost.written, 4.0 * 2 * M * H);                       // pre, out
  EXPECT_EQ(bwd->calls, 1);
  EXPECT_EQ(bwd->cost.flops, 4.0 * M * H * C + M * C + 15.0 * M * H);  // dpre, dW; dbias; gelu'
  // dpre's product (dy, W), dW's (h, dy, dW), dbias (dy, dbias), pre
  EXPECT_EQ(bwd->cost.read, 4.0 * ((M * C + C * H) + (H * M + M * C + H * C) + (M * C + C) + M * H));
  EXPECT_EQ(bwd->cost.written, 4.0 * (M * H + H * C + C));
  // the values: those of the ops in turn (the CPU's defaults)
  std::vector<float> pre2(pre.size()), out2(out.size());
  cpu->matmul_forward(pre2.data(), x.data(), ps.p(0), ps.p(1), M, C, H, WLayout::InOut);
  cpu->gelu_forward(out2.data(), pre2.data(), out2.size(), nlp::Gelu::Tanh);
  EXPECT_EQ(pre, pre2);
  EXPECT_EQ(out, out2);
}

// Once an embedding call names the token embedding, the head is the layer that reads it, whatever the
// widths: a block layer as wide as the vocabulary (a toy model with n_embd = vocab_size) is not.
TEST(OpAccount, HeadIsTheLayerOfTheTokenEmbedding) {
  const int V = 16, C = 16, M = 4;
  auto cpu = make_cpu_backend(1);
  AccountBackend be(*cpu, V, Precision::Fp32);
  ParamStore ps;
  ps.add("wte", {V, C}, true);
  ps.add("wpe", {M, C}, true);
  ps.add("proj", {C, C}, true);
  ps.allocate(be);
  be.start(size_t(1) << 20, 32);
  std::vector<int32_t> ids(M, 1);
  std::vector<float> x(size_t(M) * C), y(size_t(M) * C), logits(size_t(M) * V);
  be.embedding_forward(x.data(), ids.data(), nullptr, ps.p(0), ps.p(1), nullptr, 1, M, C, 0, nullptr);
  be.matmul_forward(y.data(), x.data(), ps.p(2), nullptr, M, C, C, WLayout::InOut);  // N == V, a block
  be.matmul_forward(logits.data(), y.data(), ps.p(0), nullptr, M, C, V, WLayout::OutIn);
  be.report(1, 0, nullptr);
  long head = 0, blocks = 0;
  for (const Row& r : be.account().rows()) {
    if (r.label == "gemm lm head (forward)") head = r.calls;
    if (r.label == "gemm blocks (forward)") blocks = r.calls;
  }
  EXPECT_EQ(head, 1);
  EXPECT_EQ(blocks, 1);
}

// What a GPU backend ran (core/path_counts.h): the difference of two snapshots, summary.json's
// "gpu_paths" object and the log's "paths:" line, every count in its place.
TEST(PathCounts, DifferenceAndPrintedForms) {
  PathCounts a, b;
  b.gemm_fused = {11, 12, 13, 14};
  b.gemm_fallback = {21, 22, 23, 24};
  b.staged_ops = 31;
  b.fp32_to_bf16 = 41;
  b.bf16_to_fp32 = 51;
  a.gemm_fused = {1, 2, 3, 4};
  a.gemm_fallback = {1, 2, 3, 4};
  a.staged_ops = 1;
  a.fp32_to_bf16 = 1;
  a.bf16_to_fp32 = 1;
  const PathCounts d = b - a;
  EXPECT_EQ(d.gemm_fused, (PathCounts::Epilogues{10, 10, 10, 10}));
  EXPECT_EQ(d.gemm_fallback, (PathCounts::Epilogues{20, 20, 20, 20}));
  EXPECT_EQ(d.staged_ops, 30);
  EXPECT_EQ(d.fp32_to_bf16, 40);
  EXPECT_EQ(d.bf16_to_fp32, 50);
  EXPECT_EQ(b - PathCounts{}, b);
  EXPECT_EQ(path_counts_json(b),
            "{\"gemm_fused\": {\"bias\": 11, \"gelu_aux\": 12, \"dgelu\": 13, \"bgrad\": 14}, "
            "\"gemm_fallback\": {\"bias\": 21, \"gelu_aux\": 22, \"dgelu\": 23, \"bgrad\": 24}, "
            "\"staged_ops\": 31, \"casts\": {\"fp32_to_bf16\": 41, \"bf16_to_fp32\": 51}}");
  EXPECT_EQ(path_counts_line(b, "over the last 9 steps"),
            "paths: over the last 9 steps, gemm fused (bias 11, gelu_aux 12, dgelu 13, bgrad 14); gemm "
            "fallback (bias 21, gelu_aux 22, dgelu 23, bgrad 24); staged ops 31; casts fp32->bf16 41, "
            "bf16->fp32 51");
}

// The CPU backend keeps no path counts: the account has no "paths" line and its object no
// "gpu_paths" (nor does summary.json on the cpu backend).
TEST(OpAccount, NoPathCountsOnTheCpu) {
  auto cpu = make_cpu_backend(1, Precision::Bf16);
  PathCounts p;
  EXPECT_FALSE(cpu->path_counts(&p));
  AccountBackend be(*cpu, 50, Precision::Bf16);
  EXPECT_FALSE(be.path_counts(&p));
  be.start(size_t(1) << 20, 64);
  std::vector<float> x(6 * 16, 0.5f), w(16 * 24, 0.25f), h(6 * 24);
  be.matmul_forward(h.data(), x.data(), w.data(), nullptr, 6, 16, 24, WLayout::InOut);
  std::string js;
  const std::string table = be.report(1, 0, &js);
  EXPECT_EQ(table.find("paths"), std::string::npos) << table;
  EXPECT_EQ(js.find("gpu_paths"), std::string::npos) << js;
  EXPECT_FALSE(js.empty());
}
