// Device helpers shared by the kernels in kernels/*.cu (device code: include from .cu files only).
// Every reduction here is a fixed tree (xor shuffles, then one warp over the warp partials), so a
// result depends only on the data and the launch shape, never on timing: the CUDA backend is
// deterministic run to run on the same GPU model.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/rng.h"

namespace nlp {
namespace kern {

constexpr unsigned kFull = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `red` is __shared__ scratch of 32 elements; the call synchronises the block.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[w] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : T(0);
  return warp_sum(v);
}

// Max over the block, as block_sum.
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : -__int_as_float(0x7f800000);
  return warp_max(v);
}

// The dropout mask key of element i of a tensor (core/backend.h DropRows): keyed_index (core/rng.h) of
// a trimmed layout, or with token_key (packed rows) token_key[i / width] * width + i % width.
__device__ __forceinline__ uint64_t drop_key(size_t i, size_t row, size_t row_key,
                                             const int32_t* token_key, size_t width) {
  return token_key ? uint64_t(token_key[i / width]) * width + i % width : keyed_index(i, row, row_key);
}

// The scale 1/(1-p) of the elements dropout keeps (0 for p >= 1, where none is kept).
inline float dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

// Blocks for a grid-stride loop over n elements (a function of n only).
inline unsigned grid_for(size_t n, int threads, size_t cap = 8192) {
  size_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g < cap ? g : cap);
}

// Threads per block of the one-thread-per-element kernels, and their grid-stride loop over
// i in [0, n) (launched with grid_for(n, kThreads) blocks).
constexpr int kThreads = 256;
#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

}  // namespace kern
}  // namespace nlp
