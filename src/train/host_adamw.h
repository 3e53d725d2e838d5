// The host AdamW of train.offload = optimizer: the update of optimizer.h's AdamW on a shard whose fp32
// master weights, gradient copy and moments live in host memory. The per-element arithmetic is the
// CPU backend's (backend/cpu/optimizer.cpp: bias corrections in double, the update in float, no
// contraction into FMAs since the build is ISO C++), so the result is bitwise the CPU backend's
// adamw_update_spans; the work is split over OpenMP threads in fixed chunks that cut across the
// spans (a model's many small bias and LayerNorm spans do not each run on one thread), and each chunk's
// loop is over restrict pointers so it vectorises.
#pragma once
#include <cstddef>
#include <vector>

#include "core/backend.h"

namespace nlp {

// param, grad, m, v: host arrays laid out alike (a shard's elements); span i covers
// [offset, offset + numel) with its own weight decay. grad is read only (multiplied by grad_scale).
// t: the 1-based step count for bias correction.
void host_adamw_update(float* param, const float* grad, float* m, float* v,
                       const std::vector<Backend::AdamWSpan>& spans, float lr, float beta1, float beta2,
                       float eps, float grad_scale, int t);

}  // namespace nlp
