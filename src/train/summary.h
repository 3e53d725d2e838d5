// The run summary for scaling studies: <output.dir>/summary.json, written by rank 0 at the end of
// training (also after a stop signal). Step time is split into compute, exposed communication
// (allreduce time that is not overlapped with compute) and data wait (reading and batching).
#pragma once
#include <cstdint>

#include "train/session.h"

namespace nlp {

struct StepTimes {
  int steps = 0;
  double total = 0, data = 0, comm = 0;
  void add(double step_s, double data_s, double comm_s) {
    ++steps;
    total += step_s;
    data += data_s;
    comm += comm_s;
  }
};

void write_summary(Session& s, const StepTimes& times, int64_t tokens_per_step, int T,
                   bool completed);

}  // namespace nlp
