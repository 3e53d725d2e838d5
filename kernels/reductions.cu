// Deterministic reductions:
//  - column sums (bias gradients): dst[N] += sum_m x[M,N], two stages: chunks of kColsumChunk rows
//    give partial[nchunks,N] (each column summed by one thread over its rows, then the 8 row lanes of
//    a block combined in a fixed order), then each column adds its chunk partials in order;
//  - sum / sum of squares of a float vector in double: per-block double partials over a grid that
//    depends only on n, then one block sums the partials with a fixed tree.
// No float atomics anywhere: the same input gives the same bits on every run.
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kColTile = 32;  // columns per block (one warp wide)
constexpr int kRowLanes = 8;  // rows processed in parallel per block

// partial[chunk, c] = sum_{m in chunk} x[m, c];  block (32, 8), grid (ceil(N/32), nchunks)
__global__ void colsum_partial_k(float* __restrict__ partial, const float* __restrict__ x, int M,
                                 int N) {
  __shared__ float red[kRowLanes][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int m0 = blockIdx.y * kColsumChunk;
  const int m1 = min(M, m0 + kColsumChunk);
  float acc = 0.f;
  if (c < N)
    for (int m = m0 + threadIdx.y; m < m1; m += kRowLanes) acc += x[(size_t)m * N + c];
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
    float s = red[0][threadIdx.x];
#pragma unroll
    for (int r = 1; r < kRowLanes; ++r) s += red[r][threadIdx.x];
    partial[(size_t)blockIdx.y * N + c] = s;
  }
}

// dst[c] += sum_k partial[k, c], k in order; blockIdx.y = 1 does the same for dst1/partial1 (two
// column sums of one shape in one launch)
__global__ void colsum_finish_k(float* __restrict__ dst, const float* __restrict__ partial,
                                float* __restrict__ dst1, const float* __restrict__ partial1,
                                int nchunks, int N) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= N) return;
  if (blockIdx.y == 1) {
    dst = dst1;
    partial = partial1;
  }
  float acc = 0.f;
  for (int k = 0; k < nchunks; ++k) acc += partial[(size_t)k * N + c];
  dst[c] += acc;
}

constexpr int kSumThreads = 256;
constexpr int kSumMaxBlocks = 1024;

inline int sum_blocks(size_t n) {
  size_t g = (n + kSumThreads * 4 - 1) / (kSumThreads * 4);
  if (g < 1) g = 1;
  return static_cast<int>(g < kSumMaxBlocks ? g : kSumMaxBlocks);
}

// partial[block] = sum over the block's grid-stride elements of x (or x^2), in double
template <bool kSquare>
__global__ void sum_partial_k(double* __restrict__ partial, const float* __restrict__ x, size_t n) {
  __shared__ double red[32];
  double acc = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const double v = x[i];
    acc += kSquare ? v * v : v;
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *result = sum of partial[0..nb)
__global__ void sum_finish_k(double* __restrict__ result, const double* __restrict__ partial,
                             int nb) {
  __shared__ double red[32];
  double acc = 0.0;
  for (int k = threadIdx.x; k < nb; k += blockDim.x) acc += partial[k];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) *result = acc;
}

}  // namespace

size_t colsum_ws_bytes(int M, int N) {
  if (M <= 0 || N <= 0) return 0;
  const size_t nchunks = (size_t(M) + kColsumChunk - 1) / kColsumChunk;
  return nchunks * size_t(N) * sizeof(float);
}

cudaError_t colsum_finish(float* dst, const float* partial, int nchunks, int N, cudaStream_t s,
                          float* dst1, const float* partial1) {
  if (!dst) {  // only the second pair (or none)
    dst = dst1;
    partial = partial1;
    dst1 = nullptr;
  }
  if (dst && nchunks > 0 && N > 0)
    colsum_finish_k<<<dim3((N + 255) / 256, dst1 ? 2 : 1), 256, 0, s>>>(dst, partial, dst1, partial1,
                                                                      nchunks, N);
  return cudaGetLastError();
}

cudaError_t colsum_accumulate(float* dst, const float* x, int M, int N, void* ws, cudaStream_t s) {
  if (M <= 0 || N <= 0) return cudaGetLastError();
  const int nchunks = (M + kColsumChunk - 1) / kColsumChunk;
  float* partial = static_cast<float*>(ws);
  dim3 grid((N + kColTile - 1) / kColTile, nchunks), block(kColTile, kRowLanes);
  colsum_partial_k<<<grid, block, 0, s>>>(partial, x, M, N);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return colsum_finish(dst, partial, nchunks, N, s);
}

size_t sum_ws_bytes(size_t n) { return size_t(sum_blocks(n)) * sizeof(double); }

cudaError_t sum_double(double* result, const float* x, size_t n, bool square, void* ws,
                       cudaStream_t s) {
  const int nb = sum_blocks(n);
  double* partial = static_cast<double*>(ws);
  if (square)
    sum_partial_k<true><<<nb, kSumThreads, 0, s>>>(partial, x, n);
  else
    sum_partial_k<false><<<nb, kSumThreads, 0, s>>>(partial, x, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  sum_finish_k<<<1, kSumThreads, 0, s>>>(result, partial, nb);
  return cudaGetLastError();
}

namespace {
__global__ void add_scaled_k(double* acc, const double* x, double scale) {
  *acc = __dadd_rn(*acc, __dmul_rn(scale, *x));
}
}  // namespace

cudaError_t add_scaled_double(double* acc, const double* x, double scale, cudaStream_t s) {
  add_scaled_k<<<1, 1, 0, s>>>(acc, x, scale);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
