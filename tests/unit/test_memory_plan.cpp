// Tests of the memory plan's batch advice (train/memory_plan.h suggest_batch): the suggested
// train.batch_size fits, and train.batch_size x train.grad_accum stays within one sequence of the
// original, checked against an enumeration of every (batch_size, grad_accum) pair.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

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
