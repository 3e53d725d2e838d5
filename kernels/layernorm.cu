// Layer norm over the last dimension, forward and backward.
//   forward:  out[N,C] = (x - mean) * rstd * w[C] + b[C];  mean[N], rstd[N] saved (nullable)
//             rstd = 1/sqrt(var + eps), biased variance, two passes with double accumulation
//             (as the CPU reference does)
//   backward: dinp[N,C] += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w
//             dw[C] += sum_n dout * xhat;  db[C] += sum_n dout   (deterministic: chunked column
//             partials, then each column sums its chunks in order; no atomics)
// One warp per row for the row-wise parts (8 rows per 256-thread block).
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

__global__ void __launch_bounds__(256)
    ln_fwd_k(float* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
             const float* __restrict__ inp, const float* __restrict__ w,
             const float* __restrict__ b, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + (size_t)row * C;
  double s = 0.0;
  for (int c = lane; c < C; c += 32) s += x[c];
  s = warp_sum(s);
  const float mu = static_cast<float>(s / C);
  double ss = 0.0;
  for (int c = lane; c < C; c += 32) {
    const double d = x[c] - mu;
    ss += d * d;
  }
  ss = warp_sum(ss);
  const float rs = static_cast<float>(1.0 / sqrt(ss / C + (double)eps));
  float* y = out + (size_t)row * C;
  for (int c = lane; c < C; c += 32) y[c] = (x[c] - mu) * rs * w[c] + b[c];
  if (lane == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

__global__ void __launch_bounds__(256)
    ln_bwd_dx_k(float* __restrict__ dinp, const float* __restrict__ dout,
                const float* __restrict__ inp, const float* __restrict__ w,
                const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float* x = inp + (size_t)row * C;
  const float* dy = dout + (size_t)row * C;
  float* dx = dinp + (size_t)row * C;
  const float mu = mean[row], rs = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float g = dy[c] * w[c];
    sg += g;
    sgx += g * ((x[c] - mu) * rs);
  }
  sg = warp_sum(sg) / C;
  sgx = warp_sum(sgx) / C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (x[c] - mu) * rs;
    dx[c] += rs * (dy[c] * w[c] - sg - xhat * sgx);
  }
}

constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

// pw[chunk, c] = sum_{n in chunk} dout * xhat;  pb[chunk, c] = sum dout.  block (32,8)
__global__ void ln_bwd_dwdb_partial_k(float* __restrict__ pw, float* __restrict__ pb,
                                      const float* __restrict__ dout,
                                      const float* __restrict__ inp,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ rstd, int N, int C) {
  __shared__ float rw[kRowLanes][kColTile + 1], rb[kRowLanes][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int n0 = blockIdx.y * kColsumChunk;
  const int n1 = min(N, n0 + kColsumChunk);
  float aw = 0.f, ab = 0.f;
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += kRowLanes) {
      const float dy = dout[(size_t)n * C + c];
      aw += dy * ((inp[(size_t)n * C + c] - mean[n]) * rstd[n]);
      ab += dy;
    }
  rw[threadIdx.y][threadIdx.x] = aw;
  rb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = rw[0][threadIdx.x], sb = rb[0][threadIdx.x];
#pragma unroll
    for (int r = 1; r < kRowLanes; ++r) {
      sw += rw[r][threadIdx.x];
      sb += rb[r][threadIdx.x];
    }
    if (pw) pw[(size_t)blockIdx.y * C + c] = sw;
    if (pb) pb[(size_t)blockIdx.y * C + c] = sb;
  }
}

}  // namespace

cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* w, const float* b, int N, int C, float eps,
                              cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  ln_fwd_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, s>>>(
      out, mean, rstd, inp, w, b, N, C, eps);
  return cudaGetLastError();
}

size_t layernorm_backward_ws_bytes(int N, int C) { return 2 * colsum_ws_bytes(N, C); }

cudaError_t layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                               const float* inp, const float* w, const float* mean,
                               const float* rstd, int N, int C, void* ws, cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  if (dinp) {
    ln_bwd_dx_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, s>>>(
        dinp, dout, inp, w, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (dw || db) {
    const int nchunks = (N + kColsumChunk - 1) / kColsumChunk;
    float* pw = static_cast<float*>(ws);
    float* pb = pw + (size_t)nchunks * C;
    dim3 grid((C + kColTile - 1) / kColTile, nchunks), block(kColTile, kRowLanes);
    ln_bwd_dwdb_partial_k<<<grid, block, 0, s>>>(dw ? pw : nullptr, db ? pb : nullptr, dout, inp,
                                                 mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    if (dw && (e = colsum_finish(dw, pw, nchunks, C, s)) != cudaSuccess) return e;
    if (db && (e = colsum_finish(db, pb, nchunks, C, s)) != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
