// Tests of the learning-rate schedule (train/schedule.h): warmup, decay ends, and the warning for a
// warmup that covers the whole run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "train/schedule.h"

using nlp::learning_rate;
using nlp::warmup_warning;

TEST(Schedule, WarmupThenDecay) {
  // warmup 4 of 10: (step + 1) / 4 x lr, then cosine from lr to lr x min_lr_ratio
  EXPECT_FLOAT_EQ(learning_rate(nlp::Schedule::Cosine, 1e-3f, 0.f, 4, 10, 0), 0.25e-3f);
  EXPECT_FLOAT_EQ(learning_rate(nlp::Schedule::Cosine, 1e-3f, 0.f, 4, 10, 3), 1e-3f);
  EXPECT_FLOAT_EQ(learning_rate(nlp::Schedule::Cosine, 1e-3f, 0.f, 4, 10, 4), 1e-3f);
  EXPECT_NEAR(learning_rate(nlp::Schedule::Cosine, 1e-3f, 0.f, 4, 10, 7), 1e-3 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-9);
  EXPECT_NEAR(learning_rate(nlp::Schedule::Linear, 1e-3f, 0.1f, 0, 10, 5), 1e-4 + 9e-4 * 0.5, 1e-9);
  EXPECT_FLOAT_EQ(learning_rate(nlp::Schedule::Constant, 1e-3f, 0.f, 0, 10, 9), 1e-3f);
}

TEST(Schedule, WarmupCoveringTheRunWarns) {
  EXPECT_EQ(warmup_warning("cosine", 5e-5f, 0.f, 39, "config file 'a.ini', line 3", 40, "command line"), "");
  // 40 steps of a 100-step warmup: the lr reaches 40/100 of train.lr at the last step
  const std::string w = warmup_warning("linear", 5e-5f, 0.f, 100, "config file 'a.ini', line 3", 40, "command line");
  EXPECT_NE(w.find("warning: train.warmup_steps = 100 (config file 'a.ini', line 3) >= train.steps = 40 "
                   "(command line): the learning rate rises linearly during all 40 steps and reaches 2e-05 "
                   "(train.lr = 5e-05 x 40/100) only at the last step; the linear schedule after the warmup "
                   "never starts"),
            std::string::npos)
      << w;
  EXPECT_NEAR(learning_rate(nlp::Schedule::Linear, 5e-5f, 0.f, 100, 40, 39), 2e-5, 1e-12);
  // equal: the peak is reached at the last step
  const std::string eq = warmup_warning("cosine", 1e-3f, 0.f, 10, "default", 10, "from train.epochs");
  EXPECT_NE(eq.find("reaches 0.001 (train.lr) only at the last step"), std::string::npos) << eq;
  EXPECT_NE(eq.find("(from train.epochs)"), std::string::npos) << eq;
}

TEST(Schedule, ScheduleStepsAndTheResumeNote) {
  EXPECT_EQ(nlp::schedule_length(0, 50), 50);  // 0: train.steps
  EXPECT_EQ(nlp::schedule_length(40, 50), 40);
  // past its length a linear or cosine schedule stays at lr x min_lr_ratio
  EXPECT_FLOAT_EQ(learning_rate(nlp::Schedule::Cosine, 1e-3f, 0.1f, 0, 40, 45), 1e-4f);
  // the same length, or none recorded (older checkpoints): nothing to say
  EXPECT_EQ(nlp::resume_schedule_note("cosine", 1e-3f, 0.f, 0, 40, 40, "train.steps = 40, command line", 40), "");
  EXPECT_EQ(nlp::resume_schedule_note("cosine", 1e-3f, 0.f, 0, 0, 50, "train.steps = 50, command line", 40), "");
  // 40 -> 50 steps, resuming before step 41: cosine at progress 40/50 against the ended schedule's 0
  const std::string note =
      nlp::resume_schedule_note("cosine", 1e-3f, 0.f, 0, 40, 50, "train.steps = 50, command line", 40);
  char now[32];
  std::snprintf(now, sizeof now, "%.4g", 1e-3 * 0.5 * (1 + std::cos(M_PI * 0.8)));
  EXPECT_EQ(note, std::string("train.resume: the lr schedule now ends at step 50 (train.steps = 50, command line), "
                              "not at step 40 as in the run that wrote the checkpoint: the cosine schedule is "
                              "stretched; lr at step 41 is ") + now +
                      " on this schedule, 0 on the checkpoint's (to keep that one: train.schedule_steps = 40)");
  EXPECT_NE(nlp::resume_schedule_note("linear", 1e-3f, 0.f, 0, 50, 40, "w", 10).find("shortened"), std::string::npos);
}
