// One allocation laid out as a run of tensors: a model's activations, a block's saved state and
// scratch, the decoder's KV cache. Each owner computes its arena's size with one function and lays
// it out with another; Carver checks that the two agree, so an edit to one without the other fails
// at the first carve instead of overrunning the arena or leaving a tensor short.
//   Carver take(base, numel);  x = take(B * T * C);  a = take.act(B * T * C, dt);  ...  take.done();
// Arenas are counted in floats. An activation stored as bf16 (core/tensor.h) takes half as many,
// rounded up to whole 32-byte pieces so that the tensor after it stays aligned for vector accesses;
// an fp32 activation takes exactly its elements (the layout of an all-fp32 arena is unchanged).
#pragma once
#include <cstddef>

#include "core/error.h"
#include "core/tensor.h"

namespace nlp {

// Floats of an arena that n elements stored as dt take.
constexpr size_t act_floats(size_t n, DType dt) {
  return dt == DType::F32 ? n : (n * dtype_bytes(dt) + 31) / 32 * 8;
}

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
  // the next activation of n elements stored as dt (act_floats(n, dt) floats; its extent n)
  Act act(size_t n, DType dt) { return Act((*this)(act_floats(n, dt)), dt, n); }
  // every float counted has been taken
  void done() const { NLP_ASSERT(p_ == end_); }

 private:
  float* p_;
  float* const end_;
};

}  // namespace nlp
