// Learning-rate schedules: linear warmup over warmup_steps, then linear or cosine decay to
// lr * min_lr_ratio at `steps`, or constant. step is 0-based (the step about to be taken). The notes
// below take the schedule's name (train.schedule's text), which they print.
#pragma once
#include <string>

#include "config/config.h"  // enum Schedule (train.schedule), parse_schedule

namespace nlp {

float learning_rate(Schedule schedule, float lr, float min_lr_ratio, int warmup_steps,
                    int total_steps, int step);

// The warning for train.warmup_steps >= train.steps (the schedule never leaves its warmup), saying
// what the schedule will do; "" when warmup_steps < steps. `*_where` name where each value came from
// (Config::where, or "from train.epochs").
// The schedule's length: train.schedule_steps, or train.steps when it is 0.
inline int schedule_length(int schedule_steps, int steps) { return schedule_steps > 0 ? schedule_steps : steps; }

// On resume: a line saying that the schedule's length differs from the checkpoint's (`checkpoint_length`,
// 0 = not recorded: ""), with both schedules' lr at `step` (the step about to be taken) and the key that
// keeps the checkpoint's schedule; "" when the lengths agree.
std::string resume_schedule_note(const std::string& schedule, float lr, float min_lr_ratio, int warmup_steps,
                                 int checkpoint_length, int length, const std::string& length_where, int step);

std::string warmup_warning(const std::string& schedule, float lr, float min_lr_ratio, int warmup_steps,
                           const std::string& warmup_where, int steps, const std::string& steps_where);

}  // namespace nlp
