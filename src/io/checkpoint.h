// Checkpoints: the weights in the HF layout (so a checkpoint is a valid model.weights file), the AdamW
// moments under optimizer/exp_avg/<name> and optimizer/exp_avg_sq/<name>, and the training state as root
// attributes. Written atomically (temporary file, fsync, rename); only the newest `keep` are kept.
// Files: <output.dir>/checkpoints/step_<8-digit step>.h5
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
};

// Returns the path written.
std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            const std::vector<NamedTensor>& params,
                            const std::vector<NamedTensor>& exp_avg,
                            const std::vector<NamedTensor>& exp_avg_sq,
                            const std::function<void(h5::File&)>& write_model_attrs, int keep);

// Newest checkpoint in <output_dir>/checkpoints, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);

// Loads weights, moments and state (shapes validated as in load_tensors).
TrainState load_checkpoint(const std::string& path, const std::vector<NamedTensor>& params,
                           const std::vector<NamedTensor>& exp_avg,
                           const std::vector<NamedTensor>& exp_avg_sq);

}  // namespace nlp
