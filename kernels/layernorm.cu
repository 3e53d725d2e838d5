// Layer norm over the last dimension, forward and backward.
//   forward:  out[N,C] = (x - mean) * rstd * w[C] + b[C];  mean[N], rstd[N] saved (nullable)
//             rstd = 1/sqrt(var + eps), biased variance, two passes with double accumulation
//             (as the CPU reference does)
//   backward: dinp[N,C] += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w
//             dw[C] += sum_n dout * xhat;  db[C] += sum_n dout   (deterministic: chunked column
//             partials, then each column sums its chunks in order; no atomics)
// One warp per row for the row-wise parts (8 rows per 256-thread block).
// Fused with the residual add and dropout of a transformer block (core/backend.h):
//   res_ln_fwd:  res[N,C] = x + dropout(delta) (delta may alias res), out = layernorm(res)
//   ln_drop_bwd: g = layernorm's input gradient of dout; dinp += g; ddelta = dropout_backward(g)
// Their row arithmetic is spelled with rounding intrinsics (__fmaf_rn, __fmul_rn, ...), which the
// compiler never contracts or reorders, in the forms the plain layer norm kernels compiled to before
// they shared it (checked on their sm_90 SASS: unchanged). So a fused kernel gives the bits of
// dropout, add and layer norm run in turn, as the CPU backend's fused pass does.
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// One warp normalises one row: y[C] = (x - mu) * rs * w + b, mu and rs from double sums; lane 0
// stores them where mean / rstd are non-null.
__device__ __forceinline__ void ln_row_forward(float* y, float* mean, float* rstd, const float* x,
                                               const float* w, const float* b, int row, int lane,
                                               int C, float eps) {
  double s = 0.0;
  for (int c = lane; c < C; c += 32) s = __dadd_rn(s, double(x[c]));
  s = warp_sum(s);
  const float mu = static_cast<float>(__ddiv_rn(s, double(C)));
  double ss = 0.0;
  for (int c = lane; c < C; c += 32) {
    const double d = __fsub_rn(x[c], mu);
    ss = __fma_rn(d, d, ss);
  }
  ss = warp_sum(ss);
  const float rs =
      static_cast<float>(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(ss, double(C)), double(eps)))));
  for (int c = lane; c < C; c += 32) y[c] = __fmaf_rn(__fmul_rn(__fsub_rn(x[c], mu), rs), w[c], b[c]);
  if (lane == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

__device__ __forceinline__ float ln_xhat(float x, float mu, float rs) {
  return __fmul_rn(__fsub_rn(x, mu), rs);
}

// The row means of the input gradient, over one warp: sg = mean(g), sgx = mean(g * xhat), g = dy * w.
__device__ __forceinline__ void ln_row_dx_means(float& sg, float& sgx, const float* dy,
                                                const float* x, const float* w, float mu, float rs,
                                                int lane, int C) {
  float a = 0.f, ax = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float g = __fmul_rn(dy[c], w[c]);
    a = __fadd_rn(a, g);
    ax = __fmaf_rn(g, ln_xhat(x[c], mu, rs), ax);
  }
  sg = __fdiv_rn(warp_sum(a), float(C));
  sgx = __fdiv_rn(warp_sum(ax), float(C));
}

// acc + rs * (dy * w - sg - xhat * sgx): one element of the input gradient added to acc.
__device__ __forceinline__ float ln_dx_add(float acc, float dy, float w, float x, float mu, float rs,
                                           float sg, float sgx) {
  const float t = __fmaf_rn(-ln_xhat(x, mu, rs), sgx, __fmaf_rn(dy, w, -sg));
  return __fmaf_rn(rs, t, acc);
}

__global__ void __launch_bounds__(256)
    ln_fwd_k(float* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
             const float* __restrict__ inp, const float* __restrict__ w,
             const float* __restrict__ b, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  ln_row_forward(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, w, b, row, lane, C, eps);
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
  float sg, sgx;
  ln_row_dx_means(sg, sgx, dy, x, w, mu, rs, lane, C);
  for (int c = lane; c < C; c += 32) dx[c] = ln_dx_add(dx[c], dy[c], w[c], x[c], mu, rs, sg, sgx);
}

// The dropout mask of core/backend.h's DropRows (p > 0: element i kept iff uniform01(seed, key) >= p,
// scaled by sc = 1/(1-p)); p <= 0 keeps every element unscaled. seed_slot (nullable): the seed is
// read from device memory at run time instead (a replayed CUDA graph's value table): resolved().
struct Drop {
  float p, sc;
  uint64_t seed;
  size_t row, row_key;
  const int32_t* token_key;
  size_t width;
  const uint64_t* seed_slot;
  __device__ __forceinline__ bool keep(size_t i) const {
    return uniform01(seed, drop_key(i, row, row_key, token_key, width)) >= p;
  }
  // this with the seed read from seed_slot, once per thread (p <= 0 draws nothing: not read)
  __device__ __forceinline__ Drop resolved() const {
    Drop d = *this;
    if (seed_slot && p > 0.f) d.seed = *seed_slot;
    return d;
  }
};

// res = x + dropout(delta), then out = layernorm(res), mean/rstd saved: dropout_fwd_k's product,
// add_k's sum, then ln_fwd_k's row. Each lane re-reads the res elements it wrote (plain loads: res
// is written here, so it is not read through the read-only path). delta may alias res.
__global__ void __launch_bounds__(256)
    res_ln_fwd_k(float* res, float* __restrict__ out, float* __restrict__ mean,
                 float* __restrict__ rstd, const float* x, const float* delta,
                 const float* __restrict__ w, const float* __restrict__ b, int N, int C, float eps,
                 Drop drop_arg) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const Drop drop = drop_arg.resolved();
  const size_t base = (size_t)row * C;
  for (int c = lane; c < C; c += 32) {
    const size_t i = base + c;
    float d = delta[i];
    if (drop.p > 0.f) d = drop.keep(i) ? __fmul_rn(d, drop.sc) : 0.0f;
    res[i] = __fadd_rn(d, x[i]);
  }
  ln_row_forward(out + base, mean, rstd, res + base, w, b, row, lane, C, eps);
}

// g = layernorm's input gradient of dout (as ln_bwd_dx_k writes it into a zeroed buffer);
// dinp += g (accumulate_k); ddelta = 0 + dropout_backward of g (dropout_bwd_k into a zeroed buffer,
// or accumulate_k for p <= 0). dw/db are the plain backward's (layernorm_backward with dinp null).
__global__ void __launch_bounds__(256)
    ln_drop_bwd_k(float* __restrict__ dinp, float* __restrict__ ddelta,
                  const float* __restrict__ dout, const float* __restrict__ inp,
                  const float* __restrict__ w, const float* __restrict__ mean,
                  const float* __restrict__ rstd, int N, int C, Drop drop_arg) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const Drop drop = drop_arg.resolved();
  const size_t base = (size_t)row * C;
  const float* x = inp + base;
  const float* dy = dout + base;
  const float mu = mean[row], rs = rstd[row];
  float sg, sgx;
  ln_row_dx_means(sg, sgx, dy, x, w, mu, rs, lane, C);
  for (int c = lane; c < C; c += 32) {
    const size_t i = base + c;
    const float g = ln_dx_add(0.0f, dy[c], w[c], x[c], mu, rs, sg, sgx);
    dinp[i] = __fadd_rn(dinp[i], g);
    float dd = __fadd_rn(0.0f, g);
    if (drop.p > 0.f) dd = drop.keep(i) ? __fadd_rn(0.0f, __fmul_rn(g, drop.sc)) : 0.0f;
    ddelta[i] = dd;
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
    if ((e = colsum_finish(dw, pw, nchunks, C, s, db, pb)) != cudaSuccess) return e;  // both in one launch
  }
  return cudaGetLastError();
}

namespace {
Drop make_drop(float p, uint64_t seed, const uint64_t* seed_slot, size_t row, size_t row_key,
               const int32_t* token_key, size_t width) {
  return Drop{p, dropout_scale(p), seed, row, row_key, token_key, width, seed_slot};
}
}  // namespace

cudaError_t residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                       const float* x, const float* delta, const float* w,
                                       const float* b, int N, int C, float eps, float p,
                                       uint64_t seed, const uint64_t* seed_slot, size_t row,
                                       size_t row_key, const int32_t* token_key, size_t width,
                                       cudaStream_t s) {
  if (token_key && width == 0) return cudaErrorInvalidValue;
  if (N <= 0 || C <= 0) return cudaGetLastError();
  res_ln_fwd_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, s>>>(
      res, out, mean, rstd, x, delta, w, b, N, C, eps,
      make_drop(p, seed, seed_slot, row, row_key, token_key, width));
  return cudaGetLastError();
}

cudaError_t layernorm_dropout_backward(float* dinp, float* ddelta, float* dw, float* db,
                                       const float* dout, const float* inp, const float* w,
                                       const float* mean, const float* rstd, int N, int C, float p,
                                       uint64_t seed, const uint64_t* seed_slot, size_t row,
                                       size_t row_key, const int32_t* token_key, size_t width,
                                       void* ws, cudaStream_t s) {
  if (token_key && width == 0) return cudaErrorInvalidValue;
  if (N <= 0 || C <= 0) return cudaGetLastError();
  ln_drop_bwd_k<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0, s>>>(
      dinp, ddelta, dout, inp, w, mean, rstd, N, C,
      make_drop(p, seed, seed_slot, row, row_key, token_key, width));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !(dw || db)) return e;
  return layernorm_backward(nullptr, dw, db, dout, inp, w, mean, rstd, N, C, ws, s);
}

}  // namespace kern
}  // namespace nlp
