#include "train/schedule.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace nlp {

float learning_rate(Schedule schedule, float lr, float min_lr_ratio, int warmup_steps,
                    int total_steps, int step) {
  // Warmup multiplier (step+1)/warmup: unlike HF's step/warmup, the first update is not taken at lr 0.
  if (warmup_steps > 0 && step < warmup_steps)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (schedule == Schedule::Constant) return lr;
  const float min_lr = lr * min_lr_ratio;
  const int decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return lr;
  float progress = static_cast<float>(step - warmup_steps) / static_cast<float>(decay_steps);
  progress = std::min(std::max(progress, 0.f), 1.f);
  if (schedule == Schedule::Linear) return min_lr + (lr - min_lr) * (1.f - progress);
  return min_lr + (lr - min_lr) * 0.5f * (1.f + std::cos(3.14159265358979f * progress));  // Cosine
}

std::string resume_schedule_note(const std::string& schedule, float lr, float min_lr_ratio, int warmup_steps,
                                 int checkpoint_length, int length, const std::string& length_where, int step) {
  if (checkpoint_length <= 0 || checkpoint_length == length) return "";
  char now[32], was[32];
  std::snprintf(now, sizeof now, "%.4g", learning_rate(parse_schedule(schedule), lr, min_lr_ratio, warmup_steps, length, step));
  std::snprintf(was, sizeof was, "%.4g",
                learning_rate(parse_schedule(schedule), lr, min_lr_ratio, warmup_steps, checkpoint_length, step));
  return cat("train.resume: the lr schedule now ends at step ", length, " (", length_where, "), not at step ",
             checkpoint_length, " as in the run that wrote the checkpoint: the ", schedule, " schedule is ",
             length > checkpoint_length ? "stretched" : "shortened", "; lr at step ", step + 1, " is ", now,
             " on this schedule, ", was, " on the checkpoint's (to keep that one: train.schedule_steps = ",
             checkpoint_length, ")");
}

std::string warmup_warning(const std::string& schedule, float lr, float min_lr_ratio, int warmup_steps,
                           const std::string& warmup_where, int steps, const std::string& steps_where) {
  if (warmup_steps < steps || steps < 1) return "";
  const float last = learning_rate(parse_schedule(schedule), lr, min_lr_ratio, warmup_steps, steps, steps - 1);
  return cat("warning: train.warmup_steps = ", warmup_steps, " (", warmup_where, ") >= train.steps = ", steps,
             " (", steps_where, "): the learning rate rises linearly during all ", steps, " steps and reaches ",
             last, warmup_steps == steps ? " (train.lr)" : cat(" (train.lr = ", lr, " x ", steps, "/", warmup_steps, ")"),
             " only at the last step; the ", schedule, " schedule after the warmup never starts. "
             "Lower train.warmup_steps below train.steps (HF's warmup_ratio 0.1 would be ",
             steps / 10, ")");
}

}  // namespace nlp
