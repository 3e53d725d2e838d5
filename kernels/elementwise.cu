// Elementwise ops: add, accumulate, scale, tanh forward/backward, strided row gather/scatter-add,
// dropout (counter-based mask of core/rng.h: keep(i) = uniform01(seed, i) >= p, the same mask as the
// CPU backend, regenerated in backward), bias broadcast and fill.
// All are grid-stride loops, one thread per element: every output element is written by exactly
// one thread, so results are bitwise equal to the CPU backend's (same float operations).
// Also the float -> bf16 cast of the GEMM operands in the bf16 matmul mode.
#include <cuda_bf16.h>

#include "common.cuh"
#include "core/rng.h"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

// out[n] = a + b   (out may alias a or b)
__global__ void add_k(float* out, const float* a, const float* b, size_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

// dst[n] += src
__global__ void accumulate_k(float* __restrict__ dst, const float* __restrict__ src, size_t n) {
  GRID_STRIDE(i, n) dst[i] += src[i];
}

// x[n] *= f
__global__ void scale_k(float* x, float f, size_t n) { GRID_STRIDE(i, n) x[i] *= f; }

// out[n] = tanh(inp)
__global__ void tanh_fwd_k(float* out, const float* inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = tanhf(inp[i]);
}

// dinp[n] += (1 - out^2) * dout
__global__ void tanh_bwd_k(float* __restrict__ dinp, const float* __restrict__ out,
                           const float* __restrict__ dout, size_t n) {
  GRID_STRIDE(i, n) dinp[i] += (1.f - out[i] * out[i]) * dout[i];
}

// out[i,C] = inp[r(i)*stride + c], r(i) = idx ? idx[i] : i   (i < rows)
__global__ void rows_gather_k(float* __restrict__ out, const float* __restrict__ inp, int C,
                              size_t stride, const int32_t* __restrict__ idx, size_t n) {
  GRID_STRIDE(i, n) {
    const size_t r = i / C, c = i % C;
    out[i] = inp[size_t(idx ? idx[r] : r) * stride + c];
  }
}

// dinp[r(i)*stride + c] += dout[i,C]; the rows are distinct, so no two threads write one element
__global__ void rows_scatter_add_k(float* __restrict__ dinp, const float* __restrict__ dout, int C,
                                   size_t stride, const int32_t* __restrict__ idx, size_t n) {
  GRID_STRIDE(i, n) {
    const size_t r = i / C, c = i % C;
    dinp[size_t(idx ? idx[r] : r) * stride + c] += dout[i];
  }
}

// out[n] = inp * keep(i) / (1-p)   (out may alias inp)
// seed_slot (nullable): the seed is read from it at run time (a replayed CUDA graph's value table)
__global__ void dropout_fwd_k(float* out, const float* inp, size_t n, float p, float sc,
                              uint64_t seed, const uint64_t* seed_slot, size_t row, size_t row_key,
                              const int32_t* token_key, size_t width) {
  const uint64_t sd = seed_slot ? *seed_slot : seed;
  GRID_STRIDE(i, n)
  out[i] = uniform01(sd, drop_key(i, row, row_key, token_key, width)) >= p ? inp[i] * sc : 0.0f;
}

// dinp[n] += dout * keep(i) / (1-p)
__global__ void dropout_bwd_k(float* __restrict__ dinp, const float* __restrict__ dout, size_t n,
                              float p, float sc, uint64_t seed, const uint64_t* seed_slot,
                              size_t row, size_t row_key, const int32_t* __restrict__ token_key,
                              size_t width) {
  const uint64_t sd = seed_slot ? *seed_slot : seed;
  // __fmul_rn: no fused multiply-add, so the rounding is the CPU's (its compiler does not contract)
  GRID_STRIDE(i, n)
  if (uniform01(sd, drop_key(i, row, row_key, token_key, width)) >= p) dinp[i] += __fmul_rn(dout[i], sc);
}

// out[M,N] = bias[N]
__global__ void broadcast_rows_k(float* __restrict__ out, const float* __restrict__ bias, int N,
                                 size_t n) {
  GRID_STRIDE(i, n) out[i] = bias[i % N];
}

__global__ void fill_k(float* x, float v, size_t n) { GRID_STRIDE(i, n) x[i] = v; }

// dst[n] = bf16(src[n]), round to nearest even
__global__ void to_bf16_k(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

// Up to three arrays in one launch, over their concatenated elements: element i of the whole goes
// to the array it falls in (at most two subtractions), converted as to_bf16_k does. (The scalar
// kernel: Bf16Cast::Scalar; it reached about 0.5 TB/s on an H200.)
__global__ void to_bf16_many_k(Bf16Copies c, size_t n) {
  GRID_STRIDE(i, n) {
    size_t j = i;
    int k = 0;
    while (k + 1 < c.count && j >= c.n[k]) j -= c.n[k++];
    static_cast<__nv_bfloat16*>(c.dst[k])[j] = __float2bfloat16_rn(c.src[k][j]);
  }
}

// The same conversion, 8 elements per thread: array k takes the blocks [first[k], first[k+1]), so
// a block's array is one comparison chain (uniform in the block, and constant indices keep the
// parameters out of local memory). Where both of an array's pointers are 16-byte aligned (bit k of
// vec) a thread reads two float4 and writes one 16-byte vector; otherwise, and for the last
// n % 8 elements, one element at a time. Each element is rounded as __float2bfloat16_rn rounds it
// (__floats2bfloat162_rn rounds each half the same way), so the bits equal to_bf16_many_k's.
constexpr int kCastPer = 8;
__global__ void to_bf16_many_vec_k(Bf16Copies c, unsigned first1, unsigned first2, unsigned vec) {
  const unsigned b = blockIdx.x;
  const int k = b >= first2 ? 2 : b >= first1 ? 1 : 0;
  const float* src = k == 2 ? c.src[2] : k == 1 ? c.src[1] : c.src[0];
  __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(k == 2 ? c.dst[2] : k == 1 ? c.dst[1] : c.dst[0]);
  const size_t n = k == 2 ? c.n[2] : k == 1 ? c.n[1] : c.n[0];
  const unsigned kb = b - (k == 2 ? first2 : k == 1 ? first1 : 0u);
  const size_t i0 = (size_t(kb) * blockDim.x + threadIdx.x) * kCastPer;
  if (i0 >= n) return;
  if (((vec >> k) & 1u) && i0 + kCastPer <= n) {
    const float4 a = *reinterpret_cast<const float4*>(src + i0);
    const float4 d = *reinterpret_cast<const float4*>(src + i0 + 4);
    union {
      __nv_bfloat162 h[4];
      uint4 u;
    } out;
    out.h[0] = __floats2bfloat162_rn(a.x, a.y);
    out.h[1] = __floats2bfloat162_rn(a.z, a.w);
    out.h[2] = __floats2bfloat162_rn(d.x, d.y);
    out.h[3] = __floats2bfloat162_rn(d.z, d.w);
    *reinterpret_cast<uint4*>(dst + i0) = out.u;
    return;
  }
  const size_t i1 = i0 + kCastPer < n ? i0 + kCastPer : n;
  for (size_t i = i0; i < i1; ++i) dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace

cudaError_t add(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  if (n) add_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
  return cudaGetLastError();
}

cudaError_t accumulate(float* dst, const float* src, size_t n, cudaStream_t s) {
  if (n) accumulate_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t scale(float* x, float f, size_t n, cudaStream_t s) {
  if (n) scale_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, f, n);
  return cudaGetLastError();
}

cudaError_t tanh_forward(float* out, const float* inp, size_t n, cudaStream_t s) {
  if (n) tanh_fwd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t tanh_backward(float* dinp, const float* out, const float* dout, size_t n,
                          cudaStream_t s) {
  if (n) tanh_bwd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, out, dout, n);
  return cudaGetLastError();
}

cudaError_t rows_gather(float* out, const float* inp, int rows, int C, size_t stride,
                        const int32_t* idx, cudaStream_t s) {
  const size_t n = size_t(rows > 0 ? rows : 0) * size_t(C > 0 ? C : 0);
  if (n) rows_gather_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, C, stride, idx, n);
  return cudaGetLastError();
}

cudaError_t rows_scatter_add(float* dinp, const float* dout, int rows, int C, size_t stride,
                             const int32_t* idx, cudaStream_t s) {
  const size_t n = size_t(rows > 0 ? rows : 0) * size_t(C > 0 ? C : 0);
  if (n)
    rows_scatter_add_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, dout, C, stride, idx, n);
  return cudaGetLastError();
}

namespace {

// dropout_forward and dropout_backward: one launch of `kernel` (dropout_fwd_k or dropout_bwd_k, which
// take the same arguments) over n elements; packed rows (token_key) need their width
using DropoutKernel = void (*)(float*, const float*, size_t, float, float, uint64_t, const uint64_t*,
                               size_t, size_t, const int32_t*, size_t);
cudaError_t launch_dropout(DropoutKernel kernel, float* dst, const float* src, size_t n, float p,
                           uint64_t seed, const uint64_t* seed_slot, size_t row, size_t row_key,
                           const int32_t* token_key, size_t width, cudaStream_t s) {
  if (token_key && width == 0) return cudaErrorInvalidValue;
  if (n)
    kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, src, n, p, dropout_scale(p), seed,
                                                      seed_slot, row, row_key, token_key, width);
  return cudaGetLastError();
}

}  // namespace

cudaError_t dropout_forward(float* out, const float* inp, size_t n, float p, uint64_t seed,
                            const uint64_t* seed_slot, size_t row, size_t row_key,
                            const int32_t* token_key, size_t width, cudaStream_t s) {
  return launch_dropout(dropout_fwd_k, out, inp, n, p, seed, seed_slot, row, row_key, token_key,
                        width, s);
}

cudaError_t dropout_backward(float* dinp, const float* dout, size_t n, float p, uint64_t seed,
                             const uint64_t* seed_slot, size_t row, size_t row_key,
                             const int32_t* token_key, size_t width, cudaStream_t s) {
  return launch_dropout(dropout_bwd_k, dinp, dout, n, p, seed, seed_slot, row, row_key, token_key,
                        width, s);
}

cudaError_t broadcast_rows(float* out, const float* bias, int M, int N, cudaStream_t s) {
  const size_t n = size_t(M > 0 ? M : 0) * size_t(N > 0 ? N : 0);
  if (n) broadcast_rows_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, bias, N, n);
  return cudaGetLastError();
}

cudaError_t fill(float* x, float v, size_t n, cudaStream_t s) {
  if (n) fill_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, v, n);
  return cudaGetLastError();
}

cudaError_t to_bf16(void* dst, const float* src, size_t n, cudaStream_t s) {
  if (n)
    to_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), src, n);
  return cudaGetLastError();
}

cudaError_t to_bf16_many(const Bf16Copies& c, cudaStream_t s, Bf16Cast cast) {
  if (c.count < 1 || c.count > Bf16Copies::kMax) return cudaErrorInvalidValue;
  if (cast == Bf16Cast::Scalar) {
    size_t n = 0;
    for (int k = 0; k < c.count; ++k) n += c.n[k];
    if (n) to_bf16_many_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(c, n);
    return cudaGetLastError();
  }
  constexpr size_t kPerBlock = size_t(kThreads) * kCastPer;
  size_t first[Bf16Copies::kMax + 1] = {};  // array k's first block; first[count..] = the total
  unsigned vec = 0;
  for (int k = 0; k < Bf16Copies::kMax; ++k) {
    const size_t n = k < c.count ? c.n[k] : 0;
    first[k + 1] = first[k] + (n + kPerBlock - 1) / kPerBlock;
    const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    if (k < c.count && addr(c.src[k]) % 16 == 0 && addr(c.dst[k]) % 16 == 0) vec |= 1u << k;
  }
  const size_t blocks = first[Bf16Copies::kMax];
  if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;  // over 2^31 blocks (2^43 elements)
  if (blocks)
    to_bf16_many_vec_k<<<unsigned(blocks), kThreads, 0, s>>>(c, unsigned(first[1]), unsigned(first[2]), vec);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
