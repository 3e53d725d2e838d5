#include "comm/grad_reducer.h"

#include "core/error.h"

namespace nlp {

GradReducer::GradReducer(Comm& comm, float* grad, size_t total, size_t bucket_floats, bool overlap,
                         const ShardLayout* shards)
    : comm_(comm), grad_(grad), total_(total), bucket_(bucket_floats > 0 ? bucket_floats : 1),
      overlap_(overlap), shards_(shards), started_lo_(total) {
  NLP_ASSERT(shards == nullptr || shards->total == total);
}

void GradReducer::begin() {
  started_lo_ = total_;
  buckets_.clear();
}

void GradReducer::start(size_t lo, size_t hi) {
  buckets_.emplace_back(lo, hi);
  if (shards_)
    comm_.reduce_scatter_sum_start(grad_ + lo, lo, hi - lo, *shards_);
  else
    comm_.allreduce_sum_start(grad_ + lo, hi - lo);
}

void GradReducer::ready(size_t lo) {
  if (!overlap_) return;
  NLP_ASSERT(lo <= total_);
  if (lo < started_lo_ && started_lo_ - lo >= bucket_) {
    start(lo, started_lo_);
    started_lo_ = lo;
  }
  comm_.progress();
}

void GradReducer::finish() {
  if (!overlap_) {
    begin();
    buckets_.emplace_back(0, total_);
    if (shards_)
      comm_.reduce_scatter_sum(grad_, *shards_);
    else
      comm_.allreduce_sum(grad_, total_);
    return;
  }
  if (started_lo_ > 0) {
    start(0, started_lo_);
    started_lo_ = 0;
  }
  comm_.allreduce_wait();
}

}  // namespace nlp
