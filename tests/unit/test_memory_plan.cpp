// Tests of the memory plan's batch advice (train/memory_plan.h suggest_batch): the suggested
// train.batch_size fits, and train.batch_size x train.grad_accum stays within one sequence of the
// original, checked against an enumeration of every (batch_size, grad_accum) pair.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

#include "backend/factory.h"
#include "core/backend.h"
#include "model/model.h"
#include "train/memory_plan.h"

using nlp::BatchSuggestion;
using nlp::suggest_batch;

TEST(SuggestBatch, ExamplesFromTheAdvice) {
  // batch 8 does not fit, 7 does: 4 x 2 keeps the 8 sequences of a step
  BatchSuggestion s = suggest_batch(8, 1, 7);
  EXPECT_EQ(s.batch_size, 4);
  EXPECT_EQ(s.grad_accum, 2);
  EXPECT_EQ(s.product(), 8);
  // 16 x 2 with up to 11 fitting: 8 x 4 = 32
  s = suggest_batch(16, 2, 11);
  EXPECT_EQ(s.batch_size, 8);
  EXPECT_EQ(s.grad_accum, 4);
  // a prime product whose only exact split is 1 x 7: the largest batch within one sequence
  s = suggest_batch(7, 1, 6);
  EXPECT_EQ(s.batch_size, 6);
  EXPECT_EQ(s.grad_accum, 1);
  // 13 x 1 with 12 fitting: 12 x 1 = 12 (within one); the exact 1 x 13 would be far slower
  s = suggest_batch(13, 1, 12);
  EXPECT_EQ(s.batch_size, 12);
  EXPECT_EQ(s.grad_accum, 1);
  // 13 x 1 with 5 fitting: 5 x 3 = 15 is two off, 4 x 3 = 12 is within one
  s = suggest_batch(13, 1, 5);
  EXPECT_LE(s.batch_size, 5);
  EXPECT_LE(std::llabs(s.product() - 13), 1);
  EXPECT_EQ(s.batch_size, 4);
  // only batch_size 1 fits: 1 x (batch x accum)
  s = suggest_batch(8, 3, 1);
  EXPECT_EQ(s.batch_size, 1);
  EXPECT_EQ(s.grad_accum, 24);
  // nothing fits
  EXPECT_EQ(suggest_batch(8, 1, 0).batch_size, 0);
}

// Every case of a range against an enumeration: the suggestion fits, keeps the product within one,
// and no batch_size larger than the suggestion (with any grad_accum) would keep it within one when
// the suggestion is not exact; when it is exact, no larger exact split exists.
TEST(SuggestBatch, MatchesEnumeration) {
  for (int batch = 2; batch <= 48; ++batch)
    for (int accum = 1; accum <= 4; ++accum)
      for (int fit = 1; fit < batch; ++fit) {
        const int64_t target = int64_t(batch) * accum;
        const BatchSuggestion s = suggest_batch(batch, accum, fit);
        ASSERT_GE(s.batch_size, 1);
        ASSERT_LE(s.batch_size, fit) << batch << " x " << accum << " fit " << fit;
        ASSERT_LE(std::llabs(s.product() - target), 1) << batch << " x " << accum << " fit " << fit;
        int best_exact = 0, best_near = 0;
        for (int b = 1; b <= fit; ++b)
          for (int a = 1; a <= target + 1; ++a) {
            const int64_t d = int64_t(a) * b - target;
            if (d == 0) best_exact = std::max(best_exact, b);
            if (d >= -1 && d <= 1) best_near = std::max(best_near, b);
          }
        const int expect = 2 * best_exact >= fit ? best_exact : best_near;
        ASSERT_EQ(s.batch_size, expect) << batch << " x " << accum << " fit " << fit;
        if (expect == best_exact) ASSERT_EQ(s.product(), target);
      }
}

// run.mode = generate: no batch forward runs; the plan counts the KV-cache decoder of one sequence
// (k and v of every layer at every position dominate), weights and the gradient arena, no AdamW.
TEST(MemoryPlanGenerate, CountsTheDecoderNotTrainingActivations) {
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.n_layer = 3;
  mc.n_head = 4;
  mc.n_embd = 64;
  mc.vocab_size = 101;
  mc.n_positions = 128;
  auto be = nlp::make_backend("cpu", 1, 0, nlp::BackendOptions{});
  auto shell = nlp::make_model(mc, *be, "clm", /*allocate=*/false);
  nlp::Config cfg;
  cfg.model = mc;
  cfg.run.mode = "generate";
  cfg.train.batch_size = 8;
  const nlp::MemoryPlan g = nlp::plan_memory(cfg, *shell, 128, 1);
  const size_t P = shell->params().total() * sizeof(float);
  const size_t kv = size_t(2) * mc.n_layer * mc.n_positions * mc.n_embd * sizeof(float);
  EXPECT_TRUE(g.decoder);
  EXPECT_EQ(g.B, 1);
  EXPECT_EQ(g.T, mc.n_positions);
  EXPECT_EQ(g.weights, P);
  EXPECT_EQ(g.grads, P);
  EXPECT_EQ(g.optimizer, 0u);
  EXPECT_EQ(g.activations, nlp::decoder_bytes(*shell, 1));
  // the cache plus one position's buffers and logits (a few rows of width C, one of V)
  EXPECT_GE(g.activations, kv);
  EXPECT_LE(g.activations, kv + (64 * mc.n_embd + 2 * mc.vocab_size) * sizeof(float));
  EXPECT_LT(g.activations, shell->activation_bytes(8, 128));
  EXPECT_EQ(g.workspace, P);  // cpu: the parameters' host copy; no batch buffers
  EXPECT_NE(g.table().find("KV cache (1 sequence, T=128)"), std::string::npos) << g.table();
  // training the same model plans its activations for train.batch_size x T
  cfg.run.mode = "train";
  const nlp::MemoryPlan t = nlp::plan_memory(cfg, *shell, 128, 1);
  EXPECT_FALSE(t.decoder);
  EXPECT_EQ(t.activations, shell->activation_bytes(8, 128));
  EXPECT_EQ(t.optimizer, 2 * P);
}

// Training on several ranks with comm.overlap: the workspace counts MPI's temporaries of the largest
// gradient sum handed to it at once (rank 0 of Open MPI's non-blocking reduce-scatter holds one on 2
// ranks, two on more; the
// peak resident memory of GPT-2 124M shows it: tests/python/test_zero_peak_rss.py). GPT-2's embeddings
// (wte, wpe: before the blocks in the arena) are summed as one piece at every stage, however small
// the buckets; with buckets larger than the arena, stages 0 and 1 sum it whole.
TEST(MemoryPlanTrain, MpiWorkspaceIsTheLargestGradientSum) {
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.n_layer = 3;
  mc.n_head = 2;
  mc.n_embd = 32;
  mc.vocab_size = 1000;  // the embeddings (1000 x 32 + 64 x 32) outweigh a block (~12.7K floats)
  mc.n_positions = 64;
  auto be = nlp::make_backend("cpu", 1, 0, nlp::BackendOptions{});
  auto shell = nlp::make_model(mc, *be, "clm", /*allocate=*/false);
  const auto& specs = shell->params().specs();
  size_t blocks_lo = shell->params().total(), block = 0;
  for (const auto& s : specs) {
    if (s.name.find(".h.") != std::string::npos) blocks_lo = std::min(blocks_lo, s.offset);
    if (s.name.find(".h.0.") != std::string::npos) block += s.numel;  // a block's floats
  }
  ASSERT_LT(block, blocks_lo);
  nlp::Config cfg;
  cfg.model = mc;
  cfg.run.mode = "train";
  cfg.train.batch_size = 2;
  cfg.comm.bucket_mb = 0.001f;  // 262 floats: every block its own bucket
  const size_t batch_buffers = size_t(2) * 4 * 2 * 16 * sizeof(int32_t);
  for (int zero : {0, 1, 2, 3}) {
    cfg.train.zero = zero;
    // train.zero = 3 sums the embeddings in pieces of a block's size (train/grad_shards.h)
    const size_t sum = zero == 3 ? block : blocks_lo;
    const nlp::MemoryPlan p = nlp::plan_memory(cfg, *shell, 16, 2);
    EXPECT_EQ(p.workspace - batch_buffers, sum * sizeof(float)) << "train.zero = " << zero;
    // rank 0 of 3 or more ranks reduces in two buffers of the sum
    EXPECT_EQ(nlp::plan_memory(cfg, *shell, 16, 4).workspace - batch_buffers, 2 * sum * sizeof(float));
  }
  cfg.comm.bucket_mb = 100.f;  // one bucket holds everything: stages 0 and 1 sum the arena at once
  for (int zero : {0, 1}) {
    cfg.train.zero = zero;
    const nlp::MemoryPlan p = nlp::plan_memory(cfg, *shell, 16, 2);
    EXPECT_EQ(p.workspace - batch_buffers, shell->params().total() * sizeof(float)) << "train.zero = " << zero;
  }
  cfg.comm.overlap = false;  // one blocking sum of the whole arena
  cfg.train.zero = 1;
  EXPECT_EQ(nlp::plan_memory(cfg, *shell, 16, 2).workspace - batch_buffers, shell->params().total() * sizeof(float));
}
