// Packed steps (data.packing with data.pack_batch = rows): train.batch_size counts rows of the file's
// length T, and each optimizer step takes as many examples as fill its rows.
//
// The plan of an epoch walks that epoch's example order (Sampler::order: shuffled, length-grouped
// when asked) and cuts it into steps. A step has R = ranks x train.batch_size x train.grad_accum rows;
// each example in turn goes to the first of them with room for its length and fewer than
// max_per_row examples (first-fit, in the order), and the step ends at the first example that fits
// in none (that one opens the next step). A step is therefore a contiguous run of the order: the
// examples are seen in the same order as an unpacked run's, none twice, and the examples of step k
// do not depend on how the R rows are split between ranks and micro-batches. On NSMC (T = 128, mean
// 19 tokens) 32 rows fill to 98% with about 208 examples a step. The epoch's last examples, which do
// not fill a whole step, are dropped (as an unpacked run drops its last partial batch).
//
// Micro-batch a of rank r gets rows [(a x ranks + r) x B, ... + B) of the step: the examples placed
// there, in the order, and the row of each within its B. Every step has the same rows, so a GPU run
// sees one shape; the number of examples varies from step to step (the log reports its mean).
//
// Positions: steps are counted from the start of training across epochs (`step` below); the plan of
// an epoch is computed when first needed (every earlier epoch's step count too), from the lengths
// alone, the same on every rank.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "io/dataset.h"

namespace nlp {

class PackedSampler {
 public:
  // lengths[i]: example i's real tokens (attention_mask ones; 0 counts as 1), at most T.
  // rows_per_step = ranks x batch_size x grad_accum; max_per_row >= 1.
  PackedSampler(const Sampler& order, const std::vector<int32_t>& lengths, int T, int64_t rows_per_step,
                int max_per_row);

  struct Micro {
    std::vector<int64_t> idx;  // example indices, in the order
    std::vector<int32_t> row;  // row of each within the micro-batch's rows, in [0, rows)
    int rows = 0;
  };
  // Micro-batch `a` of `A` of rank `rank` of `world`, with `B` rows each (world x B x A must be the
  // rows per step), of step `step`.
  Micro micro(int64_t step, int a, int A, int rank, int world, int B) const;

  int64_t steps_in_epoch(int64_t epoch) const;
  // Where step `step` starts: its epoch and the offset of its first example in that epoch's order.
  std::pair<int64_t, int64_t> position(int64_t step) const;
  // The first step of `epoch` whose first example is at or after `offset` of its order (the first
  // step of the next epoch when there is none).
  int64_t step_at(int64_t epoch, int64_t offset) const;
  int64_t rows_per_step() const { return R_; }
  int row_length() const { return T_; }

 private:
  const Sampler& order_;
  std::vector<int32_t> len_;
  int T_, M_;
  int64_t R_;
  // first_step_[e] = the global step number of epoch e's first step (computed up to the epochs seen)
  mutable std::vector<int64_t> first_step_{0};
  mutable int64_t plan_epoch_ = -1;
  mutable std::vector<int64_t> start_;   // the plan's steps: start_[k] = offset of step k's first example
  mutable std::vector<int32_t> row_of_;  // per offset of the order: the row (of R) its example went to
  void plan(int64_t epoch) const;        // start_, row_of_ of `epoch`
  void count_to(int64_t epoch) const;    // first_step_ up to epoch + 1
  int64_t epoch_of(int64_t step) const;
};

}  // namespace nlp
