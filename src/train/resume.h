// Resume (train.resume = true): choose the newest intact checkpoint, the same on every rank.
//
// Rank 0 tries the checkpoints in <output.dir>/checkpoints newest first; load_checkpoint verifies
// each (opens, every tensor present with its shape, checksums, the state attributes, the step in the
// name). A checkpoint that fails is reported with its reason and, once an older intact one is found,
// renamed to <file>.damaged so that it is neither chosen again nor counted by checkpoint.keep. Rank 0
// then broadcasts its choice, the training state and the tensors, so every rank continues from
// exactly the state rank 0 verified (no rank reads a file on its own, so node-local copies that
// differ cannot split the job). When checkpoints exist but none is intact, every rank throws the same
// Error listing each file tried and why it failed.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/packed_sampler.h"
#include "train/optimizer.h"
#include "train/session.h"

namespace nlp {

struct ResumeOutcome {
  std::string path;  // the checkpoint resumed from; "" = there was none (start from step 0)
  std::vector<std::pair<std::string, std::string>> damaged;  // (file, reason), newest first
  std::vector<std::string> moved_to;  // per damaged file: where it was moved ("" = not moved)
  // Checkpoints not used because they record another run id than the run resumed (Log::run_id(),
  // from <output.dir>/run_id): (file, its run id), newest first. A file that records none is tried.
  std::vector<std::pair<std::string, std::string>> other_runs;
  std::string run_id;  // the run id the chosen checkpoint records ("" = none, or no checkpoint)
};

// Resume at another world size (or batch shape): how training continues from a checkpoint written
// by `st.world_size` ranks with `st.batch_size` x `st.grad_accum` on `world` ranks now.
//
// The global batch G = ranks x train.batch_size x train.grad_accum is kept when it can be: the keys
// the user gave for this run (on the command line, or in the INI with a value other than the
// checkpoint's) are used as given; the others are adjusted, train.grad_accum first (per-rank batch
// and memory unchanged), then train.batch_size. When no adjustment keeps G and neither key was given,
// the run stops naming the keys to set; when a key was given, the run continues with the values as
// given (another G) and a warning.
// The data position is carried over in examples: the same epoch (same order, from train.seed), and
// the examples of it already seen are not seen again; the rest of the epoch follows in its order.
struct BatchPlan {
  int batch_size = 0, grad_accum = 0;   // what this run uses
  int64_t next_batch = 0;               // data position in units of world x batch_size examples
  bool changed = false;                 // world size or batch shape differ from the checkpoint's
  std::vector<std::string> info;        // log lines
  std::vector<std::string> warnings;    // warning lines (also in summary.json)
  std::string json;                     // summary.json "resume_world" object, "" when !changed
};
// Throws an Error (same on every rank) when the global batch cannot be kept and is not given.
BatchPlan plan_resume_batches(const TrainState& st, int world, int64_t num_examples, const Config& cfg);

// data.pack_batch = rows, resumed with another batch shape: the data position (st.next_batch, in
// micro-batches of A) of this run. The same rows per step (ranks x batch_size x grad_accum) make the
// same packed steps, so the step count carries over; other rows per step make other steps, and the
// run continues at the first step of the new plan that starts at or after the checkpoint's place in
// its epoch (the examples in between are skipped, none is seen twice). `from`: the checkpoint's
// state (world size, batch shape, next_batch); `now`: this run's packed steps. Appends log lines to
// `info`.
int64_t packed_resume_position(const TrainState& from, int world, int B, int A, const Config& cfg,
                               const PackedSampler& now, const std::vector<int32_t>& lengths,
                               std::vector<std::string>* info);

// Loads parameters and AdamW moments into the model and `opt`, and the state into `st`, on every
// rank. Collective: every rank must call it.
ResumeOutcome resume_from_checkpoint(Session& s, AdamW& opt, TrainState& st);

}  // namespace nlp
