// Elementwise ops on activations stored in bf16 (kernels.cuh, "bf16 storage"): GELU forward and
// backward, add, accumulate, scale, dropout forward and backward, strided row gather and
// scatter-add, and the fp32 -> bf16 store of a gradient with and without accumulation.
// Each element is loaded to fp32, computed in fp32 as the fp32 kernel of the same op computes it
// (gelu.cu, elementwise.cu: the same formulas, the same dropout keys of core/rng.h) and rounded to
// nearest even once, on store. A gradient output with accumulate = false is written without being
// read. Every kernel is a grid-stride loop over chunks of 8 elements (bf16_io.cuh): one thread
// writes a chunk, so results depend on nothing but the inputs (no atomics).
// The kernel bodies are templated on the storage type T and instantiated for __nv_bfloat16 only:
// the fp32 launchers keep their own kernels (elementwise.cu, gelu.cu).
#include "bf16_io.cuh"
#include "common.cuh"
#include "core/rng.h"
#include "gelu_math.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

#define CHUNK_STRIDE(j, chunks) \
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < (chunks); j += (size_t)gridDim.x * blockDim.x)

// out[n] = gelu(inp)
template <typename T, bool kTanh>
__global__ void gelu_fwd_t(T* __restrict__ out, const T* __restrict__ inp, size_t n, bool vec) {
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float v[kVec];
    load_chunk(v, inp + j * kVec, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = gelu_f<kTanh>(v[k]);
    store_chunk(out + j * kVec, v, cnt, vec);
  }
}

// dinp[n] (+)= gelu'(inp) * dout
template <typename T, bool kTanh>
__global__ void gelu_bwd_t(T* __restrict__ dinp, bool accumulate, const T* __restrict__ inp,
                           const T* __restrict__ dout, size_t n, bool vec) {
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float x[kVec], d[kVec];
    load_chunk(x, inp + j * kVec, cnt, vec);
    load_chunk(d, dout + j * kVec, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = gelu_grad_f<kTanh>(x[k]) * d[k];
    store_grad_chunk(dinp + j * kVec, x, cnt, vec, accumulate);
  }
}

// out[n] = a + b   (out may alias a or b: each thread reads its chunk before writing it)
template <typename T>
__global__ void add_t(T* out, const T* a, const T* b, size_t n, bool vec) {
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float va[kVec], vb[kVec];
    load_chunk(va, a + j * kVec, cnt, vec);
    load_chunk(vb, b + j * kVec, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) va[k] = __fadd_rn(va[k], vb[k]);
    store_chunk(out + j * kVec, va, cnt, vec);
  }
}

// dst[n] = float(dst) + float(src)   (TD, TS: the storage of dst and src)
template <typename TD, typename TS>
__global__ void accumulate_t(TD* __restrict__ dst, const TS* __restrict__ src, size_t n, bool vec) {
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float v[kVec];
    load_chunk(v, src + j * kVec, cnt, vec);
    store_grad_chunk(dst + j * kVec, v, cnt, vec, true);
  }
}

// dst[n] = float(src) (TS fp32: the gradient store without accumulation)
template <typename TD, typename TS>
__global__ void copy_t(TD* __restrict__ dst, const TS* __restrict__ src, size_t n, bool vec) {
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float v[kVec];
    load_chunk(v, src + j * kVec, cnt, vec);
    store_chunk(dst + j * kVec, v, cnt, vec);
  }
}

// x[n] *= f
template <typename T>
__global__ void scale_t(T* x, float f, size_t n, bool vec) {
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float v[kVec];
    load_chunk(v, x + j * kVec, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = __fmul_rn(v[k], f);
    store_chunk(x + j * kVec, v, cnt, vec);
  }
}

// out[n] = inp * keep(i) / (1-p)   (out may alias inp)
template <typename T>
__global__ void dropout_fwd_t(T* out, const T* inp, size_t n, DropMask m, bool vec) {
  const uint64_t sd = m.resolved_seed();
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float v[kVec];
    load_chunk(v, inp + j * kVec, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      v[k] = (k < cnt && m.keep(sd, j * kVec + k)) ? __fmul_rn(v[k], m.sc) : 0.0f;
    store_chunk(out + j * kVec, v, cnt, vec);
  }
}

// dinp[n] (+)= dout * keep(i) / (1-p)   (dropped elements: unchanged when accumulating, else 0)
template <typename T>
__global__ void dropout_bwd_t(T* __restrict__ dinp, bool accumulate, const T* __restrict__ dout,
                              size_t n, DropMask m, bool vec) {
  const uint64_t sd = m.resolved_seed();
  CHUNK_STRIDE(j, chunks_of(n)) {
    const int cnt = chunk_count(j, n);
    float v[kVec];
    load_chunk(v, dout + j * kVec, cnt, vec);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      v[k] = (k < cnt && m.keep(sd, j * kVec + k)) ? __fmul_rn(v[k], m.sc) : 0.0f;
    store_grad_chunk(dinp + j * kVec, v, cnt, vec, accumulate);
  }
}

// Rows: element (i, c) of the [rows, C] operand is element (r(i), c) of the strided one,
// r(i) = idx ? idx[i] : i. kRowVec: C and stride are multiples of 8 and both arrays 16-byte aligned,
// so a chunk lies in one row and moves as one vector; otherwise one element a thread.
__device__ __forceinline__ size_t strided_at(size_t i, int C, size_t stride, const int32_t* idx) {
  const size_t r = i / C, c = i % C;
  return size_t(idx ? idx[r] : r) * stride + c;
}

// out[rows, C] = inp rows
template <typename T, bool kRowVec>
__global__ void rows_gather_t(T* __restrict__ out, const T* __restrict__ inp, int C, size_t stride,
                              const int32_t* __restrict__ idx, size_t n) {
  if (kRowVec) {
    CHUNK_STRIDE(j, n / kVec) {
      float v[kVec];
      load8(v, inp + strided_at(j * kVec, C, stride, idx));
      store8(out + j * kVec, v);
    }
  } else {
    CHUNK_STRIDE(i, n) out[i] = inp[strided_at(i, C, stride, idx)];  // a copy: no rounding
  }
}

// dinp rows (+)= dout[rows, C]; the rows are distinct, so no two threads write one element
template <typename T, bool kRowVec>
__global__ void rows_scatter_t(T* __restrict__ dinp, bool accumulate, const T* __restrict__ dout,
                               int C, size_t stride, const int32_t* __restrict__ idx, size_t n) {
  if (kRowVec) {
    CHUNK_STRIDE(j, n / kVec) {
      float v[kVec];
      load8(v, dout + j * kVec);
      store_grad_chunk(dinp + strided_at(j * kVec, C, stride, idx), v, kVec, true, accumulate);
    }
  } else {
    CHUNK_STRIDE(i, n) {
      T* d = dinp + strided_at(i, C, stride, idx);
      const float v = to_f(dout[i]);
      put_f(*d, accumulate ? __fadd_rn(to_f(*d), v) : v);
    }
  }
}

inline unsigned grid_chunks(size_t n) { return grid_for(chunks_of(n), kThreads); }

}  // namespace

cudaError_t gelu_forward_bf16(void* out, const void* inp, size_t n, bool tanh_form,
                              cudaStream_t s) {
  if (!n) return cudaGetLastError();
  auto* o = static_cast<bf16*>(out);
  auto* x = static_cast<const bf16*>(inp);
  const bool vec = aligned16(out) && aligned16(inp);
  if (tanh_form)
    gelu_fwd_t<bf16, true><<<grid_chunks(n), kThreads, 0, s>>>(o, x, n, vec);
  else
    gelu_fwd_t<bf16, false><<<grid_chunks(n), kThreads, 0, s>>>(o, x, n, vec);
  return cudaGetLastError();
}

cudaError_t gelu_backward_bf16(void* dinp, bool accumulate, const void* inp, const void* dout,
                               size_t n, bool tanh_form, cudaStream_t s) {
  if (!n) return cudaGetLastError();
  auto* dx = static_cast<bf16*>(dinp);
  auto* x = static_cast<const bf16*>(inp);
  auto* dy = static_cast<const bf16*>(dout);
  const bool vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
  if (tanh_form)
    gelu_bwd_t<bf16, true><<<grid_chunks(n), kThreads, 0, s>>>(dx, accumulate, x, dy, n, vec);
  else
    gelu_bwd_t<bf16, false><<<grid_chunks(n), kThreads, 0, s>>>(dx, accumulate, x, dy, n, vec);
  return cudaGetLastError();
}

cudaError_t add_bf16(void* out, const void* a, const void* b, size_t n, cudaStream_t s) {
  if (n)
    add_t<bf16><<<grid_chunks(n), kThreads, 0, s>>>(
        static_cast<bf16*>(out), static_cast<const bf16*>(a), static_cast<const bf16*>(b), n,
        aligned16(out) && aligned16(a) && aligned16(b));
  return cudaGetLastError();
}

cudaError_t accumulate_bf16_bf16(void* dst, const void* src, size_t n, cudaStream_t s) {
  if (n)
    accumulate_t<bf16, bf16><<<grid_chunks(n), kThreads, 0, s>>>(
        static_cast<bf16*>(dst), static_cast<const bf16*>(src), n, aligned16(dst) && aligned16(src));
  return cudaGetLastError();
}

cudaError_t scale_bf16(void* x, float f, size_t n, cudaStream_t s) {
  if (n) scale_t<bf16><<<grid_chunks(n), kThreads, 0, s>>>(static_cast<bf16*>(x), f, n, aligned16(x));
  return cudaGetLastError();
}

cudaError_t dropout_forward_bf16(void* out, const void* inp, size_t n, float p, uint64_t seed,
                                 const uint64_t* seed_slot, size_t row, size_t row_key,
                                 const int32_t* token_key, size_t width, cudaStream_t s) {
  if (token_key && width == 0) return cudaErrorInvalidValue;
  if (n)
    dropout_fwd_t<bf16><<<grid_chunks(n), kThreads, 0, s>>>(
        static_cast<bf16*>(out), static_cast<const bf16*>(inp), n,
        make_drop_mask(p, seed, seed_slot, row, row_key, token_key, width),
        aligned16(out) && aligned16(inp));
  return cudaGetLastError();
}

cudaError_t dropout_backward_bf16(void* dinp, bool accumulate, const void* dout, size_t n, float p,
                                  uint64_t seed, const uint64_t* seed_slot, size_t row,
                                  size_t row_key, const int32_t* token_key, size_t width,
                                  cudaStream_t s) {
  if (token_key && width == 0) return cudaErrorInvalidValue;
  if (n)
    dropout_bwd_t<bf16><<<grid_chunks(n), kThreads, 0, s>>>(
        static_cast<bf16*>(dinp), accumulate, static_cast<const bf16*>(dout), n,
        make_drop_mask(p, seed, seed_slot, row, row_key, token_key, width),
        aligned16(dinp) && aligned16(dout));
  return cudaGetLastError();
}

cudaError_t rows_gather_bf16(void* out, const void* inp, int rows, int C, size_t stride,
                             const int32_t* idx, cudaStream_t s) {
  const size_t n = size_t(rows > 0 ? rows : 0) * size_t(C > 0 ? C : 0);
  if (!n) return cudaGetLastError();
  auto* o = static_cast<bf16*>(out);
  auto* x = static_cast<const bf16*>(inp);
  if (C % kVec == 0 && stride % kVec == 0 && aligned16(out) && aligned16(inp))
    rows_gather_t<bf16, true><<<grid_for(n / kVec, kThreads), kThreads, 0, s>>>(o, x, C, stride, idx, n);
  else
    rows_gather_t<bf16, false><<<grid_for(n, kThreads), kThreads, 0, s>>>(o, x, C, stride, idx, n);
  return cudaGetLastError();
}

cudaError_t rows_scatter_add_bf16(void* dinp, bool accumulate, const void* dout, int rows, int C,
                                  size_t stride, const int32_t* idx, cudaStream_t s) {
  const size_t n = size_t(rows > 0 ? rows : 0) * size_t(C > 0 ? C : 0);
  if (!n) return cudaGetLastError();
  auto* d = static_cast<bf16*>(dinp);
  auto* g = static_cast<const bf16*>(dout);
  if (C % kVec == 0 && stride % kVec == 0 && aligned16(dinp) && aligned16(dout))
    rows_scatter_t<bf16, true><<<grid_for(n / kVec, kThreads), kThreads, 0, s>>>(
        d, accumulate, g, C, stride, idx, n);
  else
    rows_scatter_t<bf16, false><<<grid_for(n, kThreads), kThreads, 0, s>>>(d, accumulate, g, C,
                                                                           stride, idx, n);
  return cudaGetLastError();
}

cudaError_t store_f32_bf16(void* dst, bool accumulate, const float* src, size_t n,
                           cudaStream_t s) {
  if (!n) return cudaGetLastError();
  auto* d = static_cast<bf16*>(dst);
  const bool vec = aligned16(dst) && aligned16(src);
  if (accumulate)
    accumulate_t<bf16, float><<<grid_chunks(n), kThreads, 0, s>>>(d, src, n, vec);
  else
    copy_t<bf16, float><<<grid_chunks(n), kThreads, 0, s>>>(d, src, n, vec);
  return cudaGetLastError();
}

cudaError_t accumulate_f32_into_bf16(void* dst, const float* src, size_t n, cudaStream_t s) {
  return store_f32_bf16(dst, true, src, n, s);
}

}  // namespace kern
}  // namespace nlp
