// One allocation laid out as a run of tensors: a model's activations, a block's saved state and
// scratch, the decoder's KV cache. Each owner computes its arena's size with one function and lays
// it out with another; Carver checks that the two agree, so an edit to one without the other fails
// at the first carve instead of overrunning the arena or leaving a tensor short.
//   Carver take(base, numel);  x = take(B * T * C);  ...  take.done();
#pragma once
#include <cstddef>

#include "core/error.h"

namespace nlp {

class Carver {
 public:
  Carver(float* base, size_t numel) : p_(base), end_(base + numel) {}
  // the next k floats
  float* operator()(size_t k) {
    NLP_ASSERT(k <= size_t(end_ - p_));  // more than the size function counted
    float* r = p_;
    p_ += k;
    return r;
  }
  // every float counted has been taken
  void done() const { NLP_ASSERT(p_ == end_); }

 private:
  float* p_;
  float* const end_;
};

}  // namespace nlp
