// CudaBackend (cuda_backend_impl.h): the persistent bf16 copy of the weights (core/backend.h,
// run.bf16_weights with train.precision = bf16): one bf16 rounding of the registered parameter arena,
// rounded again wherever the arena is written, which the GEMMs read as their weight operand instead
// of casting the fp32 weights at every call.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <cstdint>

namespace nlp::cuda {

void CudaBackend::register_weights(const float* arena, size_t n) {
  if (!wcopy_on_ || (n == 0 && arena != warena_)) return;
  no_capture("register_weights");
  if (wcopy_) release(wcopy_);
  wcopy_ = nullptr;
  warena_ = nullptr;
  wn_ = 0;
  hw_.w = nullptr;  // the head's padded copy was made from the old copy
  if (n == 0) return;
  wcopy_ = static_cast<uint16_t*>(alloc(std::max<size_t>(n, 1) * sizeof(uint16_t)));
  warena_ = arena;
  wn_ = n;
  weights_written(arena, n);
}

// Rounds the part of [p, p + n) inside the arena again (kern::to_bf16: round to nearest even, the
// rounding of the GEMM's operand casts and of the AdamW kernel).
void CudaBackend::weights_written(const float* p, size_t n) {
  if (!warena_ || !n || p + n <= warena_ || p >= warena_ + wn_) return;
  forget_head_wte(p, n);
  const size_t lo = p > warena_ ? size_t(p - warena_) : 0;
  const size_t hi = std::min(wn_, size_t(p + n - warena_));
  op(kern::to_bf16(wcopy_ + lo, warena_ + lo, hi - lo, stream_), "cast: weights (bf16 copy)");
  ++to16_;
}

// The persistent copy of w[n] (register_weights) when w lies inside the arena, else null.
const uint16_t* CudaBackend::persistent(const float* w, size_t n) const {
  if (!warena_ || w < warena_ || w + n > warena_ + wn_) return nullptr;
  return wcopy_ + (w - warena_);
}

}  // namespace nlp::cuda
