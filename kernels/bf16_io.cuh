// Loads and stores of activations by storage type, for the kernels whose activations may be stored
// in bf16 (kernels/bf16_*.cu; device code: include from .cu files only). Arithmetic is always fp32:
// a load widens to float (exact), a store of a bf16 rounds to nearest even (__float2bfloat16_rn).
//
// Vector access: a "chunk" is kVec = 8 consecutive elements, 16 bytes of bf16 (one uint4) or 32
// bytes of fp32 (two float4). A chunk is moved with vector instructions when the caller says its
// array is 16-byte aligned (aligned16, checked on the host) and the chunk is whole; otherwise, and
// for the tail of an array, element by element. Either way each element gets the same value, so the
// choice never changes a result.
// Also DropMask: the dropout mask of elementwise.cu's dropout kernels, shared by the bf16 kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "core/rng.h"

namespace nlp {
namespace kern {

constexpr int kVec = 8;

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void put_f(float& d, float v) { d = v; }
__device__ __forceinline__ void put_f(bf16& d, float v) { d = __float2bfloat16_rn(v); }

// v[8] = the whole chunk at p (16-byte aligned)
__device__ __forceinline__ void load8(float (&v)[kVec], const bf16* p) {
  union {
    uint4 u;
    __nv_bfloat162 h[4];
  } in;
  in.u = *reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(in.h[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(float (&v)[kVec], const float* p) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// the whole chunk at p (16-byte aligned) = v[8], each element rounded as put_f rounds it
// (__floats2bfloat162_rn rounds each half as __float2bfloat16_rn does)
__device__ __forceinline__ void store8(bf16* p, const float (&v)[kVec]) {
  union {
    uint4 u;
    __nv_bfloat162 h[4];
  } out;
#pragma unroll
  for (int k = 0; k < 4; ++k) out.h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = out.u;
}
__device__ __forceinline__ void store8(float* p, const float (&v)[kVec]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// v[k] = p[k] for k < cnt (the rest 0): vector when vec and the chunk is whole
template <typename T>
__device__ __forceinline__ void load_chunk(float (&v)[kVec], const T* p, int cnt, bool vec) {
  if (vec && cnt == kVec) {
    load8(v, p);
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = k < cnt ? to_f(p[k]) : 0.0f;
}

// p[k] = v[k] for k < cnt
template <typename T>
__device__ __forceinline__ void store_chunk(T* p, const float (&v)[kVec], int cnt, bool vec) {
  if (vec && cnt == kVec) {
    store8(p, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    if (k < cnt) put_f(p[k], v[k]);
}

// A gradient output: p[k] = v[k] (accumulate false: the prior contents are not read) or
// p[k] = float(p[k]) + v[k], rounded once on store.
template <typename T>
__device__ __forceinline__ void store_grad_chunk(T* p, float (&v)[kVec], int cnt, bool vec,
                                                 bool accumulate) {
  if (accumulate) {
    float old[kVec];
    load_chunk(old, p, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = __fadd_rn(old[k], v[k]);
  }
  store_chunk(p, v, cnt, vec);
}

// Elements in chunk j of an array of n: 8, or fewer for the last.
__device__ __forceinline__ int chunk_count(size_t j, size_t n) {
  const size_t i0 = j * kVec;
  return n - i0 < size_t(kVec) ? int(n - i0) : kVec;
}

// W consecutive elements of a row as floats: W = kVec, one chunk by vector (p 16-byte aligned), or
// W = 1, one element (the kernels that walk rows by lanes take W as a template argument).
template <int W, typename T>
__device__ __forceinline__ void load_n(float (&v)[W], const T* p) {
  if constexpr (W == kVec)
    load8(v, p);
  else
    v[0] = to_f(*p);
}
template <int W, typename T>
__device__ __forceinline__ void store_n(T* p, const float (&v)[W]) {
  if constexpr (W == kVec)
    store8(p, v);
  else
    put_f(*p, v[0]);
}
// A gradient output of W elements: p = v, or p = float(p) + v (accumulate), rounded once on store.
template <int W, typename T>
__device__ __forceinline__ void store_grad_n(T* p, float (&v)[W], bool accumulate) {
  if (accumulate) {
    float old[W];
    load_n<W>(old, p);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = __fadd_rn(old[k], v[k]);
  }
  store_n<W>(p, v);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__host__ __device__ __forceinline__ size_t chunks_of(size_t n) { return (n + kVec - 1) / kVec; }

// The dropout mask of elementwise.cu's dropout kernels (core/backend.h DropRows): element i kept iff
// uniform01(seed, drop_key(i, ...)) >= p, scaled by sc = 1/(1-p). seed_slot (nullable): the seed is
// read from device memory when the kernel runs (a replayed CUDA graph's value table).
struct DropMask {
  float p, sc;
  uint64_t seed;
  const uint64_t* seed_slot;
  size_t row, row_key;
  const int32_t* token_key;
  size_t width;
  __device__ __forceinline__ bool keep(uint64_t sd, size_t i) const {
    return uniform01(sd, drop_key(i, row, row_key, token_key, width)) >= p;
  }
  // once per thread, and only when a mask is drawn (p > 0)
  __device__ __forceinline__ uint64_t resolved_seed() const {
    return (seed_slot && p > 0.f) ? *seed_slot : seed;
  }
};

inline DropMask make_drop_mask(float p, uint64_t seed, const uint64_t* seed_slot, size_t row,
                               size_t row_key, const int32_t* token_key, size_t width) {
  return DropMask{p, dropout_scale(p), seed, seed_slot, row, row_key, token_key, width};
}

}  // namespace kern
}  // namespace nlp
