// Learning-rate schedules: linear warmup over warmup_steps, then linear or cosine decay to
// lr * min_lr_ratio at `steps`, or constant. step is 0-based (the step about to be taken).
#pragma once
#include <string>

namespace nlp {

float learning_rate(const std::string& schedule, float lr, float min_lr_ratio, int warmup_steps,
                    int total_steps, int step);

}  // namespace nlp
