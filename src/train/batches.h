// Batches for causal LM: reads this rank's examples through the Sampler, builds shifted targets
// (target[t] = label[t+1], the last position takes the label after the window, -100 for 2-D rows;
// as HF's shift inside the loss) and uploads them to backend memory.
#pragma once
#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "io/dataset.h"
#include "model/model.h"

namespace nlp {

// Host-side CLM batch: ids, mask and shifted targets, [B,T] each.
struct HostBatch {
  int B = 0, T = 0;
  std::vector<int32_t> ids, mask, targets;
  bool has_padding = false;  // any mask value 0 (else the mask is not passed to attention)
  int64_t valid_targets() const;
};

HostBatch make_clm_batch(const TokenBatch& tb);

// Backend copies of one batch.
class DeviceBatchBuffer {
 public:
  explicit DeviceBatchBuffer(Backend& be) : be_(be) {}
  ~DeviceBatchBuffer();
  DeviceBatch upload(const HostBatch& hb);

 private:
  Backend& be_;
  int32_t* buf_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace nlp
