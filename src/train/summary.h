// The run summary for scaling studies: <output.dir>/summary.json, written by rank 0 at the end of
// training (also after a stop signal). Step time is split into compute, exposed communication (the
// time the training thread is blocked in communication: starting gradient buckets, waiting for them
// before clipping, the small host sums; comm_s is rank 0's, comm_s_max_rank and comm_s_mean_rank
// over all ranks) and data wait (reading and batching). A rank that finishes its backward before
// the others also waits for them (load imbalance, not communication): comm_s_min_step, the mean over
// steps of the smallest exposed time among the ranks in that step (that of the last rank to get
// there), is the communication that was not hidden, without the imbalance.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/session.h"

namespace nlp {

struct StepTimes {
  static constexpr size_t kKeep = 1000;  // per-step comm times kept (the last ones)
  int steps = 0;
  double total = 0, data = 0, comm = 0;
  // Token positions of the timed steps over all ranks: computed (each micro-batch's B x its length,
  // trimmed with data.padding = longest) and real (attention_mask 1).
  double computed_tokens = 0, real_tokens = 0;
  std::vector<double> comm_steps;  // this rank's exposed comm of the last kKeep timed steps
  void add(double step_s, double data_s, double comm_s, double computed, double real) {
    ++steps;
    total += step_s;
    data += data_s;
    comm += comm_s;
    computed_tokens += computed;
    real_tokens += real;
    if (comm_steps.size() == kKeep) comm_steps.erase(comm_steps.begin());
    comm_steps.push_back(comm_s);
  }
};

// Throughput of the timed steps (every step after the first, whose one-time set-up would skew it;
// zero when only one ran), over all ranks, in tokens per second of three kinds:
//   padded:   tokens_per_step / step time: every position of the global batch at the file's length,
//             padding included (what the run would compute without data.padding = longest);
//   computed: the positions computed (each micro-batch at its length after trimming: the log's tok/s);
//   real:     the tokens with attention mask 1 (no padding).
// The log's "done" line and summary.json (padded_tokens_per_s, computed_tokens_per_s,
// real_tokens_per_s) give these same numbers.
struct Throughput {
  double padded = 0, computed = 0, real = 0;
  int steps = 0;  // the steps they are averaged over
};
Throughput throughput(const StepTimes& times, int64_t tokens_per_step);

// What happened to the run besides its timing: resume and non-finite steps (see the README's
// "Reliability" section). Written as summary.json's "resumed_from", "resumed_step",
// "damaged_checkpoints" ([{"file", "reason"}]), "metrics_dropped", "nonfinite_skipped", "warnings".
struct RunNotes {
  std::string resumed_from;  // checkpoint path; "" = not resumed
  int64_t resumed_step = 0;
  // Resume at another world size or batch shape (train/resume.h BatchPlan): the batch shape this run
  // used (0 = train.batch_size / train.grad_accum as configured) and summary.json's "resume_world"
  // object ("" = null: not resumed, or resumed with the checkpoint's shape).
  int batch_size = 0, grad_accum = 0;
  std::string resume_world_json;
  // run.cuda_graph: summary.json's "cuda_graph" object, this rank's micro-batches {"replayed",
  // "recorded", "eager", "failed_recordings", "dropped_recordings", "check_us" (the host time of a
  // micro-batch's check, mean), "eager_reasons": {reason: count}} ("" = null: off).
  std::string cuda_graph_json;
  // run.profile: summary.json's "profile" object, the per-op account (backend/op_account.h); "" = null.
  std::string profile_json;
  // summary.json's "gpu_paths" object (core/path_counts.h path_counts_json) over the timed steps, on
  // a backend that counts what ran (cuda); "" = the key is left out (the cpu backend, or no step
  // timed).
  std::string gpu_paths_json;
  std::vector<std::pair<std::string, std::string>> damaged_checkpoints;  // (file, reason), newest first
  int64_t metrics_dropped = 0;    // metrics.jsonl lines of the interrupted run removed on resume
  int64_t nonfinite_skipped = 0;  // steps whose update was skipped (train.nonfinite = skip)
  std::vector<std::string> warnings;  // every warning line of the log
  // summary.json's "zero" and "optimizer_state_bytes_per_rank": the AdamW m and v this rank holds
  // (1/N of the whole with train.zero = 1 on N ranks), and "optimizer_state_bytes_total" (all ranks).
  int zero = 0;
  int64_t optimizer_bytes = 0, optimizer_bytes_total = 0;
  // "offload" (train.offload) and "optimizer_host_bytes_per_rank": with offload, the host memory of this
  // rank's master weights, m, v and gradient copy (optimizer_state_bytes_per_rank then counts the
  // moments, which are on the host).
  std::string offload = "none";
  int64_t gradient_bytes = 0;  // "gradient_bytes_per_rank": the arena, or train.zero = 2's shard and buffers
  int64_t optimizer_host_bytes = 0;
  // data.padding over every micro-batch of the run, all ranks: micro-batches, the sum of their
  // lengths (after trimming), and token positions at the file's length, computed and real.
  double micro_batches = 0, batch_len_sum = 0;
  double file_tokens = 0, computed_tokens = 0, real_tokens = 0;
  double rows = 0, examples = 0;  // rows computed and examples in them (data.packing: several a row)
  // Padding share of the positions computed, and of the positions at the file's length (0: none).
  double padding_fraction() const { return computed_tokens > 0 ? 1.0 - real_tokens / computed_tokens : 0; }
  double padding_fraction_untrimmed() const { return file_tokens > 0 ? 1.0 - real_tokens / file_tokens : 0; }
};

void write_summary(Session& s, const StepTimes& times, int64_t tokens_per_step, int T,
                   bool completed, const RunNotes& notes = {});

}  // namespace nlp
