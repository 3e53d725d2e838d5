#include "train/schedule.h"

#include <cmath>

#include "core/error.h"

namespace nlp {

float learning_rate(const std::string& schedule, float lr, float min_lr_ratio, int warmup_steps,
                    int total_steps, int step) {
  // Warmup multiplier (step+1)/warmup: unlike HF's step/warmup, the first update is not taken at lr 0.
  if (warmup_steps > 0 && step < warmup_steps)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (schedule == "constant") return lr;
  const float min_lr = lr * min_lr_ratio;
  const int decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return lr;
  float progress = static_cast<float>(step - warmup_steps) / static_cast<float>(decay_steps);
  progress = std::min(std::max(progress, 0.f), 1.f);
  if (schedule == "linear") return min_lr + (lr - min_lr) * (1.f - progress);
  if (schedule == "cosine")
    return min_lr + (lr - min_lr) * 0.5f * (1.f + std::cos(3.14159265358979f * progress));
  throw Error(cat("train.schedule: unknown schedule '", schedule, "'"));
}

}  // namespace nlp
