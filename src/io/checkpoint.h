// Checkpoints: the weights in the HF layout (so a checkpoint is a valid model.weights file), the AdamW
// moments under optimizer/exp_avg/<name> and optimizer/exp_avg_sq/<name>, and the training state as root
// attributes. Written atomically (temporary file, fsync, rename); only the newest `keep` are kept.
// Files: <output.dir>/checkpoints/step_<8-digit step>.h5
//
// Integrity: every dataset carries its CRC-32 and the root the number of checksummed datasets
// (io/tensor_checksum.h); the training state attributes are covered by "nlptrain_state_crc32".
// load_checkpoint verifies all of them, and that the step in the file name is the step the file
// holds, so a truncated, bit-flipped or edited checkpoint is an Error naming the file and the reason.
// Checkpoints written before checksums existed load unverified.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/weights.h"

namespace nlp {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  int64_t next_batch = 0;    // data position: global batch counter for the Sampler
  uint64_t seed = 0;         // run seed (dropout and shuffling streams are derived from seed and step)
  int64_t world_size = 1;    // world size that wrote it (informational)
  double best_metric = 0.0;  // best eval metric so far (loss for clm)
  // AdamW updates applied (its bias-correction step count); smaller than `step` when steps were
  // skipped for a non-finite gradient (train.nonfinite = skip). Older checkpoints: = step.
  int64_t optimizer_steps = 0;
  int64_t nonfinite_skipped = 0;  // steps skipped so far
  int64_t nonfinite_streak = 0;   // consecutive skipped steps ending at `step`
  // train.batch_size and train.grad_accum of the run that wrote it (with world_size: its global
  // batch, and the unit of next_batch, world_size x batch_size examples). 0 = not recorded (older
  // checkpoints).
  int64_t batch_size = 0;
  int64_t grad_accum = 0;
  // 1: next_batch counts micro-batches of packed steps (data.pack_batch = rows, train.batch_size in
  // rows); 0: of train.batch_size examples (and every checkpoint written before packed steps existed).
  int64_t packed_rows = 0;
  // The length of the lr schedule of the run that wrote it (train.schedule_steps, else train.steps);
  // 0 = not recorded (older checkpoints).
  int64_t schedule_steps = 0;
};

// Returns the path written.
std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            const std::vector<NamedTensor>& params,
                            const std::vector<NamedTensor>& exp_avg,
                            const std::vector<NamedTensor>& exp_avg_sq,
                            const std::function<void(h5::File&)>& write_model_attrs, int keep);

// The same file written tensor by tensor, so that no caller holds the whole model state: `specs`
// names and shapes the tensors (data unused), and fetch(group, i, out) fills `out` (specs[i].numel()
// floats) with tensor i of the group: 0 = the weights, 1 = exp_avg, 2 = exp_avg_sq, called in that
// order, each group in the order of `specs`. The writer holds one buffer of the largest tensor.
using TensorFetch = std::function<void(int group, size_t i, float* out)>;
std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            const std::vector<NamedTensor>& specs, const TensorFetch& fetch,
                            const std::function<void(h5::File&)>& write_model_attrs, int keep);

// Retention (checkpoint.keep = keep > 0): of the checkpoint files in a folder, given as paths newest
// (highest step) first, the ones to remove so that `keep` remain, counting every file in the folder:
// the one just written (`written`) and the newest keep - 1 others stay, even when `written` is not
// among the newest steps (a file of a higher step left by something else). keep <= 0: none.
std::vector<std::string> checkpoints_to_remove(const std::vector<std::string>& newest_first,
                                               const std::string& written, int keep);

// Newest checkpoint in <output_dir>/checkpoints, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);

// Every checkpoint file (step_<digits>.h5) in <output_dir>/checkpoints, newest first.
std::vector<std::string> checkpoint_files(const std::string& output_dir);

// Loads weights, moments and state (shapes validated as in load_tensors, checksums verified).
// Throws an Error naming the file and the reason when the file cannot be opened, lacks a tensor or
// an attribute, fails a checksum, or holds another step than its name says.
TrainState load_checkpoint(const std::string& path, const std::vector<NamedTensor>& params,
                           const std::vector<NamedTensor>& exp_avg,
                           const std::vector<NamedTensor>& exp_avg_sq);
// The same checks, tensor by tensor through one buffer of the largest tensor: sink(group, i, data) gets
// each verified tensor (groups as TensorFetch's). A null sink only verifies the file.
using TensorSink = std::function<void(int group, size_t i, const float* data)>;
TrainState load_checkpoint(const std::string& path, const std::vector<NamedTensor>& specs, const TensorSink& sink);

}  // namespace nlp
