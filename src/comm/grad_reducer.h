// Bucketed, overlapped gradient reduction over one contiguous gradient arena (as PyTorch DDP does
// with its buckets). The model's backward reports, after each block and after the embeddings, that
// the gradients at offsets [lo, total) are final (Model::set_grad_ready_hook); the reducer starts a
// non-blocking sum (Comm::allreduce_sum_start) of the not yet started range [lo, started_lo) once it
// holds at least bucket_floats, so buckets go out in reverse layer order while the backward of the
// earlier blocks runs. finish() starts the rest and waits: call it before reading the gradients.
// overlap = false: finish() sums the whole arena with one blocking call (the reference behaviour).
// shards (train.zero = 1): each rank needs the sum of its own range only, so buckets are
// reduce-scattered instead (Comm::reduce_scatter_sum_start: each bucket's part in a rank's range is
// reduced to that rank), and without overlap finish() reduce-scatters the whole arena at once.
#pragma once
#include <cstddef>
#include <vector>

#include "comm/comm.h"

namespace nlp {

class GradReducer {
 public:
  GradReducer(Comm& comm, float* grad, size_t total, size_t bucket_floats, bool overlap,
              const ShardLayout* shards = nullptr);
  // Start of a step's last micro-batch backward: nothing started yet.
  void begin();
  // grad[lo, total) is final on this rank (lo only decreases within a step).
  void ready(size_t lo);
  // Start what is left and wait for every sum: grad holds the sum over ranks on return (with shards:
  // in this rank's range only).
  void finish();
  // The ranges [lo, hi) started in the last step, in order (for tests and logs).
  const std::vector<std::pair<size_t, size_t>>& buckets() const { return buckets_; }

 private:
  void start(size_t lo, size_t hi);
  Comm& comm_;
  float* grad_;
  size_t total_, bucket_;
  bool overlap_;
  const ShardLayout* shards_;
  size_t started_lo_;  // [started_lo_, total_) has been started
  std::vector<std::pair<size_t, size_t>> buckets_;
};

}  // namespace nlp
