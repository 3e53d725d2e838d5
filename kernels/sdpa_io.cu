// Glue kernels of the cuDNN fused-attention path (src/backend/cuda/attention_cudnn.cpp): the key
// padding mask as an additive bias plus each sequence's first unmasked key, the output and incoming
// gradient conversions that zero the query rows whose keys are all masked, and the Philox seed/offset
// pair cuDNN's dropout reads from device memory.
//
// A query row (b, i) is dead when no key is visible to it: first[b] > i under the causal mask, or
// first[b] == T (every key of sequence b masked) without it. cuDNN would give such a row the uniform
// average of the (all masked) keys; the native path gives zeros, and so do these conversions
// (out = 0; dO = 0, which makes every gradient contribution of the row zero).
//
// Packed rows through cuDNN's ragged (THD) layout: every example is one cuDNN sequence, found from
// the segment ids (a run of equal non-zero ids within a row), with its ragged offsets into the
// token-major q|k|v and o buffers and its length. Padding tokens (id 0) belong to no sequence: cuDNN
// neither reads nor writes them, so their output is set to 0 here and their gradient left out.
//
// bf16 I/O (activations stored in bf16): the same rules applied to bf16 buffers, in place or into a
// copy, and the add of a bf16 gradient into a bf16 gradient (sdpa_rows_bf16, sdpa_tokens_bf16).
#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr float kMaskedBias = -1e9f;  // finite: exp underflows to 0, no inf - inf = NaN in the softmax

// bias[B, rows, ld] (bf16) for j < T: 0 where query r sees key j, kMaskedBias where not, by backend.h's
// segment rule (key j real, and query r padding or of j's segment); rows == 1 (one row broadcast over
// the queries): the key padding rule, as for a padding query. For a 0/1 mask the two agree, so a
// materialised bias (rows == T) serves key padding and packed rows alike. 0 in the padding columns
// j >= T (never read: the tensor's logical width is T).
__global__ void mask_bias_k(__nv_bfloat16* __restrict__ bias, const int32_t* __restrict__ mask,
                            int T, int rows, int ld, size_t n) {
  GRID_STRIDE(i, n) {
    const int j = int(i % ld);
    const size_t b = i / (size_t(ld) * rows);
    const int r = int((i / ld) % rows);
    float v = 0.0f;
    if (j < T) {
      const int32_t sj = mask[b * T + j], si = rows == T ? mask[b * T + r] : 0;
      v = (sj != 0 && (si == 0 || si == sj)) ? 0.0f : kMaskedBias;
    }
    bias[i] = __float2bfloat16_rn(v);
  }
}

// first[b] = min { j : mask[b, j] != 0 }, T when none; one block per sequence b
__global__ void first_key_k(int32_t* __restrict__ first, const int32_t* __restrict__ mask, int T) {
  __shared__ int m;
  if (threadIdx.x == 0) m = T;
  __syncthreads();
  const int32_t* row = mask + size_t(blockIdx.x) * T;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    if (row[j] != 0) atomicMin(&m, j);  // integer min: the same result in any order
  __syncthreads();
  if (threadIdx.x == 0) first[blockIdx.x] = m;
}

// Which query rows the conversions below keep (true) or zero (false); rows are flat b*T+i.
struct LiveByFirstKey {  // padded rows: a row with at least one visible key
  const int32_t* first;
  bool causal;
  int T;
  __device__ bool operator()(size_t row) const {
    const int b = int(row / T), i = int(row % T);
    return first[b] <= (causal ? i : T - 1);
  }
};
struct LiveBySegment {  // packed rows (ragged): a token of some example (segment id != 0)
  const int32_t* mask;
  __device__ bool operator()(size_t row) const { return mask[row] != 0; }
};

// out[rows, C] = live(row) ? float(o[row, c]) : 0
template <class Live>
__global__ void out_from_bf16_k(float* __restrict__ out, const __nv_bfloat16* __restrict__ o,
                                Live live, int C, size_t n) {
  GRID_STRIDE(i, n) out[i] = live(i / C) ? __bfloat162float(o[i]) : 0.0f;
}

// dst[B,T,C] = live(b,t) ? bf16(dout[b,t,c]) : 0
__global__ void dout_to_bf16_k(__nv_bfloat16* __restrict__ dst, const float* __restrict__ dout,
                               LiveByFirstKey live, int C, size_t n) {
  GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(live(i / C) ? dout[i] : 0.0f);
}

// One block. Sequence starts: token i (of n = B*T) with mask[i] != 0 and i the first of its row or
// mask[i-1] != mask[i]. Each thread counts the starts in its contiguous chunk of tokens, an exclusive
// scan numbers them in token order, then each thread writes its sequences: off_qkv[e] = first * 3C,
// off_o[e] = first * C, seqlen[e] = the run's length. Entries from the number found up to E get
// length 0 at the buffers' end; off_*[E] = the buffers' end.
constexpr int kRaggedThreads = 1024;
__global__ void ragged_offsets_k(int64_t* __restrict__ off_qkv, int64_t* __restrict__ off_o,
                                 int32_t* __restrict__ seqlen, const int32_t* __restrict__ mask,
                                 int T, size_t n, int E, int C) {
  __shared__ int base[kRaggedThreads + 1];
  const size_t chunk = (n + blockDim.x - 1) / blockDim.x;
  const size_t lo = min(n, size_t(threadIdx.x) * chunk), hi = min(n, lo + chunk);
  auto starts = [&](size_t i) { return mask[i] != 0 && (i % T == 0 || mask[i - 1] != mask[i]); };
  int mine = 0;
  for (size_t i = lo; i < hi; ++i) mine += starts(i);
  base[threadIdx.x + 1] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive scan of at most 1024 counts: short, and in a fixed order
    base[0] = 0;
    for (unsigned t = 1; t <= blockDim.x; ++t) base[t] += base[t - 1];
  }
  __syncthreads();
  int e = base[threadIdx.x];
  for (size_t i = lo; i < hi; ++i) {
    if (!starts(i)) continue;
    size_t j = i + 1;
    while (j < n && j % T != 0 && mask[j] == mask[i]) ++j;
    if (e < E) {
      off_qkv[e] = int64_t(i) * 3 * C;
      off_o[e] = int64_t(i) * C;
      seqlen[e] = int32_t(j - i);
    }
    ++e;
  }
  const int found = min(base[blockDim.x], E);  // more runs than E: the extra ones are dropped
  for (int k = found + int(threadIdx.x); k <= E; k += blockDim.x) {
    off_qkv[k] = int64_t(n) * 3 * C;
    off_o[k] = int64_t(n) * C;
    if (k < E) seqlen[k] = 0;
  }
}

// dst[rows, W] += live(row) ? float(src[row, w]) : 0
__global__ void accumulate_bf16_k(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src,
                                  LiveBySegment live, int W, size_t n) {
  GRID_STRIDE(i, n) if (live(i / W)) dst[i] += __bfloat162float(src[i]);
}

// bf16 I/O (attention_cudnn.h forward_bf16/backward_bf16): dst[rows, W] = live(row) ? src : 0, in
// place when dst == src (then only the dead rows are written)
template <class Live>
__global__ void rows_bf16_k(__nv_bfloat16* dst, const __nv_bfloat16* src, Live live, int W,
                            size_t n) {
  GRID_STRIDE(i, n) {
    const bool keep = live(i / W);
    if (dst != src)
      dst[i] = keep ? src[i] : __float2bfloat16_rn(0.0f);
    else if (!keep)
      dst[i] = __float2bfloat16_rn(0.0f);
  }
}

struct AllLive {
  __device__ bool operator()(size_t) const { return true; }
};

// dst[rows, W] = bf16(float(dst) + float(src)) on live rows (other rows untouched); fp32 sum, one
// rounding on store
template <class Live>
__global__ void accumulate_rows_bf16_k(__nv_bfloat16* __restrict__ dst,
                                       const __nv_bfloat16* __restrict__ src, Live live, int W,
                                       size_t n) {
  GRID_STRIDE(i, n) if (live(i / W)) dst[i] =
      __float2bfloat16_rn(__bfloat162float(dst[i]) + __bfloat162float(src[i]));
}

__global__ void philox_args_k(int64_t* dst, int64_t seed, const uint64_t* seed_slot, int64_t offset) {
  dst[0] = seed_slot ? static_cast<int64_t>(*seed_slot) : seed;
  dst[1] = offset;
}

}  // namespace

cudaError_t sdpa_mask_bias(void* bias, int32_t* first, const int32_t* mask, int B, int T, int rows,
                           int ld, cudaStream_t s) {
  if (B <= 0 || T <= 0) return cudaSuccess;
  const size_t n = size_t(B) * rows * ld;
  mask_bias_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(bias), mask, T,
                                                         rows, ld, n);
  first_key_k<<<B, kThreads, 0, s>>>(first, mask, T);
  return cudaGetLastError();
}

cudaError_t sdpa_out_from_bf16(float* out, const void* o, const int32_t* first, bool causal, int B,
                               int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (!first) return from_bf16(out, o, n, s);
  if (n)
    out_from_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        out, static_cast<const __nv_bfloat16*>(o), LiveByFirstKey{first, causal, T}, C, n);
  return cudaGetLastError();
}

cudaError_t sdpa_dout_to_bf16(void* dst, const float* dout, const int32_t* first, bool causal,
                              int B, int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (!first) return to_bf16(dst, dout, n, s);
  if (n)
    dout_to_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<__nv_bfloat16*>(dst), dout, LiveByFirstKey{first, causal, T}, C, n);
  return cudaGetLastError();
}

cudaError_t sdpa_ragged_offsets(int64_t* off_qkv, int64_t* off_o, int32_t* seqlen,
                                const int32_t* mask, int B, int T, int E, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T;
  if (E <= 0) return cudaSuccess;
  ragged_offsets_k<<<1, kRaggedThreads, 0, s>>>(off_qkv, off_o, seqlen, mask, T, n, E, C);
  return cudaGetLastError();
}

cudaError_t sdpa_out_from_bf16_tokens(float* out, const void* o, const int32_t* mask, size_t tokens,
                                      int C, cudaStream_t s) {
  const size_t n = tokens * C;
  if (n)
    out_from_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        out, static_cast<const __nv_bfloat16*>(o), LiveBySegment{mask}, C, n);
  return cudaGetLastError();
}

cudaError_t sdpa_accumulate_bf16_tokens(float* dst, const void* src, const int32_t* mask,
                                        size_t tokens, int W, cudaStream_t s) {
  const size_t n = tokens * W;
  if (n)
    accumulate_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        dst, static_cast<const __nv_bfloat16*>(src), LiveBySegment{mask}, W, n);
  return cudaGetLastError();
}

cudaError_t sdpa_philox_args(int64_t* dst, uint64_t seed, const uint64_t* seed_slot, uint64_t offset,
                             cudaStream_t s) {
  philox_args_k<<<1, 1, 0, s>>>(dst, static_cast<int64_t>(seed), seed_slot,
                                static_cast<int64_t>(offset));
  return cudaGetLastError();
}

cudaError_t sdpa_rows_bf16(void* dst, const void* src, const int32_t* first, bool causal, int B,
                           int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  auto* d = static_cast<__nv_bfloat16*>(dst);
  const auto* x = static_cast<const __nv_bfloat16*>(src);
  if (n == 0) return cudaSuccess;
  if (first)
    rows_bf16_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(d, x, LiveByFirstKey{first, causal, T}, C,
                                                           n);
  else if (dst != src)
    return cudaMemcpyAsync(dst, src, n * 2, cudaMemcpyDeviceToDevice, s);
  return cudaGetLastError();
}

cudaError_t sdpa_tokens_bf16(void* dst, const void* src, const int32_t* mask, size_t tokens, int W,
                             bool accumulate, cudaStream_t s) {
  const size_t n = tokens * W;
  auto* d = static_cast<__nv_bfloat16*>(dst);
  const auto* x = static_cast<const __nv_bfloat16*>(src);
  if (n == 0) return cudaSuccess;
  const unsigned g = grid_for(n, kThreads);
  if (accumulate && mask)
    accumulate_rows_bf16_k<<<g, kThreads, 0, s>>>(d, x, LiveBySegment{mask}, W, n);
  else if (accumulate)
    accumulate_rows_bf16_k<<<g, kThreads, 0, s>>>(d, x, AllLive{}, W, n);
  else if (mask)
    rows_bf16_k<<<g, kThreads, 0, s>>>(d, x, LiveBySegment{mask}, W, n);
  else if (dst != src)
    return cudaMemcpyAsync(dst, src, n * 2, cudaMemcpyDeviceToDevice, s);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
