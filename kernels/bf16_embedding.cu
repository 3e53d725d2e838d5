// Token (+ position, + token-type) embeddings with the output and its gradient stored in bf16
// (kernels.cuh, "bf16 storage"); the tables and their gradients stay fp32.
//   forward:  out[B,T,C] = bf16(wte[ids] + wpe[p] (+ wtt[type_ids])), summed in fp32 in that order
//             (embedding.cu's sum, rounded once)
//   backward: the table gradients as embedding.cu accumulates them, from float(dout): dwpe by one
//             thread per (t, c) over b in order (or, with pos_ids, by the scatter), dwte / dwtt by
//             the sort-based scatter (stable radix sort of (id, row), per-chunk piece sums, then each
//             id's pieces in order by the one block that owns its gradient row): no float atomics,
//             bitwise reproducible. The workspace has embedding.cu's layout.
// The kernel bodies are templated on the storage type T of out / dout and instantiated for
// __nv_bfloat16 only (embedding.cu keeps the fp32 kernels).
#include <cub/device/device_radix_sort.cuh>

#include "bf16_io.cuh"
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kSegChunk = 32;     // sorted positions per block in the piece sums
constexpr int kSegThreads = 128;  // channels in parallel (>= kSegChunk)

// kRowVec: C a multiple of 8 and every array 16-byte aligned: one chunk of 8 channels a thread
// (within one row); otherwise one element a thread.
template <typename T, bool kRowVec>
__global__ void emb_fwd_t(T* __restrict__ out, const int32_t* __restrict__ ids,
                          const int32_t* __restrict__ type_ids, const float* __restrict__ wte,
                          const float* __restrict__ wpe, const float* __restrict__ wtt,
                          const int32_t* __restrict__ pos_ids, int T_, int C, int pos_offset,
                          size_t n) {
  constexpr int W = kRowVec ? kVec : 1;
  const size_t units = n / W;
  for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
       u += (size_t)gridDim.x * blockDim.x) {
    const size_t i = u * W;
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T_);
    const int p = pos_ids ? pos_ids[bt] : pos_offset + t;
    float v[W], e[W];
    load_n<W>(v, wte + (size_t)ids[bt] * C + c);
    load_n<W>(e, wpe + (size_t)p * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = __fadd_rn(v[k], e[k]);
    if (type_ids) {
      load_n<W>(e, wtt + (size_t)type_ids[bt] * C + c);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = __fadd_rn(v[k], e[k]);
    }
    store_n<W>(out + i, v);
  }
}

// dwpe[(pos_offset + t), c] += sum_b dout[b, t, c]   (thread per (t, c), b in order)
template <typename T>
__global__ void emb_bwd_pos_t(float* __restrict__ dwpe, const T* __restrict__ dout, int B, int T_,
                              int C, int pos_offset) {
  const size_t n = (size_t)T_ * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t t = i / C, c = i % C;
    float* g = dwpe + (size_t)(pos_offset + t) * C + c;
    float acc = *g;
    for (int b = 0; b < B; ++b) acc += to_f(dout[((size_t)b * T_ + t) * C + c]);
    *g = acc;
  }
}

__global__ void iota_t(int32_t* v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

// partial[pos, c] = sum of dout[rows[q], c] over the piece (run of equal keys within a chunk of
// kSegChunk sorted positions) starting at sorted position pos
template <typename T>
__global__ void __launch_bounds__(kSegThreads)
    seg_partial_t(float* __restrict__ partial, const uint32_t* __restrict__ keys,
                  const int32_t* __restrict__ rows, const T* __restrict__ dout, int n, int C) {
  __shared__ uint32_t sk[kSegChunk];
  __shared__ int32_t sr[kSegChunk];
  const int j0 = blockIdx.x * kSegChunk;
  const int cnt = min(kSegChunk, n - j0);
  if (threadIdx.x < cnt) {
    sk[threadIdx.x] = keys[j0 + threadIdx.x];
    sr[threadIdx.x] = rows[j0 + threadIdx.x];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    int start = 0;
    for (int q = 0; q < cnt; ++q) {
      if (q > 0 && sk[q] != sk[q - 1]) {
        partial[(size_t)(j0 + start) * C + c] = acc;
        acc = 0.f;
        start = q;
      }
      acc += to_f(dout[(size_t)sr[q] * C + c]);
    }
    partial[(size_t)(j0 + start) * C + c] = acc;
  }
}

// Block j handles the id run starting at sorted position j (the others exit): its pieces start at j
// and at every chunk boundary inside the run; they are added in order to the row it alone owns.
__global__ void __launch_bounds__(kSegThreads)
    seg_finish_t(float* __restrict__ dst, const float* __restrict__ partial,
                 const uint32_t* __restrict__ keys, int n, int C) {
  const int j = blockIdx.x;
  const uint32_t key = keys[j];
  if (j > 0 && keys[j - 1] == key) return;
  float* d = dst + (size_t)key * C;
  const int first_boundary = (j / kSegChunk + 1) * kSegChunk;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = d[c];
    acc += partial[(size_t)j * C + c];
    for (int p = first_boundary; p < n && keys[p] == key; p += kSegChunk)
      acc += partial[(size_t)p * C + c];
    d[c] = acc;
  }
}

inline size_t align256(size_t b) { return (b + 255) / 256 * 256; }

size_t cub_sort_bytes(int n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), n);
  return bytes;
}

// dst[key, C] += sum of dout rows r with keys_in[r] == key; ws as embedding_backward_bf16_ws_bytes:
// sorted keys, row numbers in and out (int32 [n] each), partial (fp32 [n, C]), CUB's scratch.
template <typename T>
cudaError_t scatter_rows(float* dst, const int32_t* keys_in, const T* dout, int n, int C, void* ws,
                         cudaStream_t s) {
  char* p = static_cast<char*>(ws);
  auto* keys_out = reinterpret_cast<uint32_t*>(p);
  p += align256(sizeof(uint32_t) * n);
  auto* vals_in = reinterpret_cast<int32_t*>(p);
  p += align256(sizeof(int32_t) * n);
  auto* vals_out = reinterpret_cast<int32_t*>(p);
  p += align256(sizeof(int32_t) * n);
  auto* partial = reinterpret_cast<float*>(p);
  p += align256(sizeof(float) * (size_t)n * C);
  size_t bytes = cub_sort_bytes(n);
  iota_t<<<grid_for(n, kThreads), kThreads, 0, s>>>(vals_in, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = cub::DeviceRadixSort::SortPairs(p, bytes, reinterpret_cast<const uint32_t*>(keys_in), keys_out,
                                      vals_in, vals_out, n, 0, int(sizeof(uint32_t) * 8), s);
  if (e != cudaSuccess) return e;
  const int nchunks = (n + kSegChunk - 1) / kSegChunk;
  seg_partial_t<T><<<nchunks, kSegThreads, 0, s>>>(partial, keys_out, vals_out, dout, n, C);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  seg_finish_t<<<n, kSegThreads, 0, s>>>(dst, partial, keys_out, n, C);
  return cudaGetLastError();
}

}  // namespace

cudaError_t embedding_forward_bf16(void* out, const int32_t* ids, const int32_t* type_ids,
                                   const float* wte, const float* wpe, const float* wtt, int B,
                                   int T, int C, int pos_offset, const int32_t* pos_ids,
                                   cudaStream_t s) {
  const size_t n = size_t(B > 0 ? B : 0) * size_t(T > 0 ? T : 0) * size_t(C > 0 ? C : 0);
  if (!n) return cudaGetLastError();
  if (!(type_ids && wtt)) type_ids = nullptr, wtt = nullptr;
  auto* o = static_cast<bf16*>(out);
  const bool vec = C % kVec == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe) &&
                   (!wtt || aligned16(wtt));
  if (vec)
    emb_fwd_t<bf16, true><<<grid_for(n / kVec, kThreads), kThreads, 0, s>>>(
        o, ids, type_ids, wte, wpe, wtt, pos_ids, T, C, pos_offset, n);
  else
    emb_fwd_t<bf16, false><<<grid_for(n, kThreads), kThreads, 0, s>>>(
        o, ids, type_ids, wte, wpe, wtt, pos_ids, T, C, pos_offset, n);
  return cudaGetLastError();
}

size_t embedding_backward_bf16_ws_bytes(int BT, int C) {
  if (BT <= 0 || C <= 0) return 0;
  return 3 * align256(sizeof(int32_t) * BT) + align256(sizeof(float) * (size_t)BT * C) +
         cub_sort_bytes(BT);
}

cudaError_t embedding_backward_bf16(float* dwte, float* dwpe, float* dwtt, const void* dout,
                                    const int32_t* ids, const int32_t* type_ids, int B, int T,
                                    int C, int pos_offset, const int32_t* pos_ids, void* ws,
                                    size_t ws_bytes, cudaStream_t s) {
  const int BT = B * T;
  if (BT <= 0 || C <= 0) return cudaGetLastError();
  if (ws_bytes < embedding_backward_bf16_ws_bytes(BT, C)) return cudaErrorInvalidValue;
  auto* dy = static_cast<const bf16*>(dout);
  cudaError_t e;
  if (dwpe && pos_ids) {
    if ((e = scatter_rows(dwpe, pos_ids, dy, BT, C, ws, s)) != cudaSuccess) return e;
  } else if (dwpe) {
    const size_t n = (size_t)T * C;
    emb_bwd_pos_t<bf16><<<grid_for(n, kThreads), kThreads, 0, s>>>(dwpe, dy, B, T, C, pos_offset);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (dwte && (e = scatter_rows(dwte, ids, dy, BT, C, ws, s)) != cudaSuccess) return e;
  if (dwtt && type_ids && (e = scatter_rows(dwtt, type_ids, dy, BT, C, ws, s)) != cudaSuccess)
    return e;
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
