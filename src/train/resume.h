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
#include "train/optimizer.h"
#include "train/session.h"

namespace nlp {

struct ResumeOutcome {
  std::string path;  // the checkpoint resumed from; "" = there was none (start from step 0)
  std::vector<std::pair<std::string, std::string>> damaged;  // (file, reason), newest first
  std::vector<std::string> moved_to;  // per damaged file: where it was moved ("" = not moved)
};

// Loads parameters and AdamW moments into the model and `opt`, and the state into `st`, on every
// rank. Collective: every rank must call it.
ResumeOutcome resume_from_checkpoint(Session& s, AdamW& opt, TrainState& st);

}  // namespace nlp
