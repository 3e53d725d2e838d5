// plan_resume_batches (train/resume.h): the batch shape and data position of a run resumed at
// another world size or batch shape. The end-to-end checks (losses against the uninterrupted run) are
// tests/python/test_resume_world.py and test_zero.py; these pin the choice itself.
#include <gtest/gtest.h>

#include "config/config.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "train/resume.h"

using namespace nlp;

namespace {

TrainState written_by(int64_t world, int64_t b, int64_t a, int64_t next_batch) {
  TrainState st;
  st.step = 10;
  st.world_size = world;
  st.batch_size = b;
  st.grad_accum = a;
  st.next_batch = next_batch;
  return st;
}

Config with(int b, int a) {
  Config c;
  c.train.batch_size = b;
  c.train.grad_accum = a;
  return c;
}

}  // namespace

TEST(ResumePlan, SameShapeChangesNothing) {
  const BatchPlan p = plan_resume_batches(written_by(2, 4, 2, 7), 2, 1000, with(4, 2));
  EXPECT_FALSE(p.changed);
  EXPECT_EQ(p.batch_size, 4);
  EXPECT_EQ(p.grad_accum, 2);
  EXPECT_EQ(p.next_batch, 7);
}

TEST(ResumePlan, KeepsTheGlobalBatchWithAccumulationFirst) {
  // 2 x 4 x 2 = 16 on 1 rank: batch 4 kept, accum 4; on 4 ranks: batch 4, accum 1.
  BatchPlan p = plan_resume_batches(written_by(2, 4, 2, 6), 1, 1000, with(4, 2));
  EXPECT_TRUE(p.changed);
  EXPECT_EQ(p.batch_size, 4);
  EXPECT_EQ(p.grad_accum, 4);
  p = plan_resume_batches(written_by(2, 4, 2, 6), 4, 1000, with(4, 2));
  EXPECT_EQ(p.batch_size, 4);
  EXPECT_EQ(p.grad_accum, 1);
}

TEST(ResumePlan, SmallerPerRankBatchWhenTheShareIsBelowTheOldBatch) {
  // 2 ranks x batch 2 = 4 on 4 ranks: 1 example per rank. (The per-rank share itself was once skipped
  // when it was smaller than the old batch, so this case was refused.)
  const BatchPlan p = plan_resume_batches(written_by(2, 2, 1, 10), 4, 256, with(2, 1));
  EXPECT_TRUE(p.changed);
  EXPECT_EQ(p.batch_size, 1);
  EXPECT_EQ(p.grad_accum, 1);
  // 10 global batches of 2 x 2 = 40 examples of the epoch seen: 10 batches of 4 x 1
  EXPECT_EQ(p.next_batch, 10);
  ASSERT_FALSE(p.info.empty());
}

TEST(ResumePlan, IndivisibleGlobalBatchNamesTheKeys) {
  try {
    plan_resume_batches(written_by(2, 2, 1, 10), 3, 256, with(2, 1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4 is not divisible by 3"), std::string::npos) << m;
    EXPECT_NE(m.find("train.batch_size"), std::string::npos) << m;
    EXPECT_NE(m.find("train.grad_accum"), std::string::npos) << m;
  }
}

TEST(ResumePlan, KeysGivenForTheRunAreUsedAsGivenWithAWarning) {
  Config c = with(3, 1);
  c.set_on_command_line = {"train.batch_size", "train.grad_accum"};
  const BatchPlan p = plan_resume_batches(written_by(2, 2, 1, 10), 3, 256, c);
  EXPECT_EQ(p.batch_size, 3);
  EXPECT_EQ(p.grad_accum, 1);
  EXPECT_FALSE(p.warnings.empty());
}
