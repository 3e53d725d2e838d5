// The activation arena of a model (bert.cpp, gpt2.cpp): one backend allocation that the model lays
// out (Carver) for batches of up to cap_B x cap_T, and the shape of the batch in use. A batch larger
// in either dimension carves the whole arena anew at the larger of the two shapes, so the arena only
// grows and each tensor is used as the prefix of its slot; Model::reserve carves it once, at the
// largest batch, before the first step.
//   ActivationArena arena_{be_, [this](int B, int T) { return acts_numel(B, T); },
//                          [this](Carver& take, int B, int T) { x_ = take(B * T * C_); ... }};
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <utility>

#include "core/backend.h"
#include "model/carver.h"

namespace nlp {

class ActivationArena {
 public:
  // numel(B, T): the arena's floats for B x T; layout(take, B, T): takes every one of them
  using Numel = std::function<size_t(int B, int T)>;
  using Layout = std::function<void(Carver& take, int B, int T)>;
  ActivationArena(Backend& be, Numel numel, Layout layout)
      : be_(be), numel_(std::move(numel)), layout_(std::move(layout)) {}
  ~ActivationArena() { be_.release(base_); }
  ActivationArena(const ActivationArena&) = delete;
  ActivationArena& operator=(const ActivationArena&) = delete;

  // Carved for at least B x T.
  void reserve(int B, int T) {
    if (B <= cap_B_ && T <= cap_T_) return;
    carve(std::max(B, cap_B_), std::max(T, cap_T_));
  }
  // The batch of the next forward is B x T: carved for at least that, and its shape kept (B(), T()).
  void use(int B, int T) {
    reserve(B, T);
    B_ = B;
    T_ = T;
  }
  // The layout changed (train.recompute): carved anew at the next reserve or use.
  void invalidate() { B_ = T_ = cap_B_ = cap_T_ = 0; }
  int B() const { return B_; }  // the batch in use (the last use)
  int T() const { return T_; }

 private:
  void carve(int B, int T) {
    be_.release(base_);
    const size_t n = numel_(B, T);
    base_ = static_cast<float*>(be_.alloc(n * sizeof(float)));
    cap_B_ = B;
    cap_T_ = T;
    Carver take(base_, n);
    layout_(take, B, T);
    take.done();
  }

  Backend& be_;
  Numel numel_;
  Layout layout_;
  float* base_ = nullptr;
  int B_ = 0, T_ = 0;          // the batch in use
  int cap_B_ = 0, cap_T_ = 0;  // the shape the arena is carved for (>= the batch's)
};

}  // namespace nlp
