// Token (+ position, + token-type) embeddings, forward and deterministic backward.
//   forward:  out[B,T,C] = wte[ids[b,t]] + wpe[p] (+ wtt[type_ids[b,t]]), p = pos_ids[b,t] (packed
//             rows) or pos_offset + t; wte [V,C], wpe [P,C], wtt [TT,C]; one thread per output element
//   backward: dwpe[pos_offset+t, C] += sum_b dout[b,t]   (one thread per (t,c), b in order), or with
//             pos_ids a scatter of dout rows by pos_ids;
//             dwte[V,C] += scatter of dout rows by ids; dwtt[TT,C] likewise by type_ids.
// The scatter is sort-based and free of float atomics (bitwise reproducible):
//   1. stable radix sort of (id, row) pairs (CUB), so each id's rows are contiguous, in row order;
//   2. the sorted positions are cut into chunks of kSegChunk; a block per chunk sums, per channel,
//      each run of equal ids inside the chunk ("piece") and stores the piece sum at the piece's
//      first position: partial[pos, C];
//   3. a block per id run (segment) adds its pieces in order to the gradient row it alone owns.
// A long run of one id (padding, or the 2 token types) is therefore summed by many blocks in
// step 2 and only len/kSegChunk partials are serial in step 3.
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kSegChunk = 32;    // sorted positions per block in step 2
constexpr int kSegThreads = 128; // channels in parallel (>= kSegChunk)

__global__ void emb_fwd_k(float* __restrict__ out, const int32_t* __restrict__ ids,
                          const int32_t* __restrict__ type_ids, const float* __restrict__ wte,
                          const float* __restrict__ wpe, const float* __restrict__ wtt,
                          const int32_t* __restrict__ pos_ids, int T, int C, int pos_offset, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const int p = pos_ids ? pos_ids[bt] : pos_offset + t;
    float v = wte[(size_t)ids[bt] * C + c] + wpe[(size_t)p * C + c];
    if (type_ids) v = v + wtt[(size_t)type_ids[bt] * C + c];
    out[i] = v;
  }
}

// dwpe[(pos_offset + t), c] += sum_b dout[b, t, c]   (thread per (t, c))
__global__ void emb_bwd_pos_k(float* __restrict__ dwpe, const float* __restrict__ dout, int B,
                              int T, int C, int pos_offset) {
  const size_t n = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t t = i / C, c = i % C;
    float* g = dwpe + (size_t)(pos_offset + t) * C + c;
    float acc = *g;
    for (int b = 0; b < B; ++b) acc += dout[((size_t)b * T + t) * C + c];
    *g = acc;
  }
}

__global__ void iota_k(int32_t* v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

// Step 2: partial[pos, c] = sum of dout[rows[q], c] over the piece starting at sorted position pos.
__global__ void __launch_bounds__(kSegThreads)
    seg_partial_k(float* __restrict__ partial, const uint32_t* __restrict__ keys,
                  const int32_t* __restrict__ rows, const float* __restrict__ dout, int n, int C) {
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
      acc += dout[(size_t)sr[q] * C + c];
    }
    partial[(size_t)(j0 + start) * C + c] = acc;
  }
}

// Step 3: block j handles the segment starting at sorted position j (others exit): its pieces start
// at j and at every chunk boundary inside the segment.
__global__ void __launch_bounds__(kSegThreads)
    seg_finish_k(float* __restrict__ dst, const float* __restrict__ partial,
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

struct SegWs {
  uint32_t* keys_out;
  int32_t* vals_in;
  int32_t* vals_out;
  float* partial;
  void* cub_tmp;
  size_t cub_bytes;
};

SegWs carve(void* ws, int n, int C) {
  char* p = static_cast<char*>(ws);
  SegWs w{};
  w.keys_out = reinterpret_cast<uint32_t*>(p);
  p += align256(sizeof(uint32_t) * n);
  w.vals_in = reinterpret_cast<int32_t*>(p);
  p += align256(sizeof(int32_t) * n);
  w.vals_out = reinterpret_cast<int32_t*>(p);
  p += align256(sizeof(int32_t) * n);
  w.partial = reinterpret_cast<float*>(p);
  p += align256(sizeof(float) * (size_t)n * C);
  w.cub_tmp = p;
  w.cub_bytes = cub_sort_bytes(n);
  return w;
}

// dst[key, C] += sum of dout rows r with keys_in[r] == key
cudaError_t scatter_rows(float* dst, const int32_t* keys_in, const float* dout, int n, int C,
                         void* ws, cudaStream_t s) {
  SegWs w = carve(ws, n, C);
  iota_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(w.vals_in, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  size_t bytes = w.cub_bytes;
  e = cub::DeviceRadixSort::SortPairs(w.cub_tmp, bytes, reinterpret_cast<const uint32_t*>(keys_in),
                                      w.keys_out, w.vals_in, w.vals_out, n, 0,
                                      int(sizeof(uint32_t) * 8), s);
  if (e != cudaSuccess) return e;
  const int nchunks = (n + kSegChunk - 1) / kSegChunk;
  seg_partial_k<<<nchunks, kSegThreads, 0, s>>>(w.partial, w.keys_out, w.vals_out, dout, n, C);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  seg_finish_k<<<n, kSegThreads, 0, s>>>(dst, w.partial, w.keys_out, n, C);
  return cudaGetLastError();
}

}  // namespace

cudaError_t embedding_forward(float* out, const int32_t* ids, const int32_t* type_ids,
                              const float* wte, const float* wpe, const float* wtt, int B, int T,
                              int C, int pos_offset, const int32_t* pos_ids, cudaStream_t s) {
  const size_t n = size_t(B > 0 ? B : 0) * size_t(T > 0 ? T : 0) * size_t(C > 0 ? C : 0);
  if (n)
    emb_fwd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, ids, (type_ids && wtt) ? type_ids : nullptr,
                                                         wte, wpe, wtt, pos_ids, T, C, pos_offset, n);
  return cudaGetLastError();
}

size_t embedding_backward_ws_bytes(int BT, int C) {
  if (BT <= 0 || C <= 0) return 0;
  return 3 * align256(sizeof(int32_t) * BT) + align256(sizeof(float) * (size_t)BT * C) +
         cub_sort_bytes(BT);
}

cudaError_t embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout,
                               const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                               int pos_offset, const int32_t* pos_ids, void* ws, size_t ws_bytes,
                               cudaStream_t s) {
  const int BT = B * T;
  if (BT <= 0 || C <= 0) return cudaGetLastError();
  if (ws_bytes < embedding_backward_ws_bytes(BT, C)) return cudaErrorInvalidValue;
  cudaError_t e;
  if (dwpe && pos_ids) {
    if ((e = scatter_rows(dwpe, pos_ids, dout, BT, C, ws, s)) != cudaSuccess) return e;
  } else if (dwpe) {
    const size_t n = (size_t)T * C;
    emb_bwd_pos_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dwpe, dout, B, T, C, pos_offset);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (dwte && (e = scatter_rows(dwte, ids, dout, BT, C, ws, s)) != cudaSuccess) return e;
  if (dwtt && type_ids && (e = scatter_rows(dwtt, type_ids, dout, BT, C, ws, s)) != cudaSuccess)
    return e;
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
