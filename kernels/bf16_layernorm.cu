// Layer norm with its input, output and their gradients stored in bf16 (kernels.cuh, "bf16 storage");
// the weight, bias, their gradients and the row statistics mean/rstd stay fp32, and so does all
// arithmetic:
//   forward:  out[N,C] = bf16((x - mean) * rstd * w + b),  x = float(inp); mean, rstd as layernorm.cu
//             computes them (two passes, double sums)
//   backward: dinp (+)= bf16(rstd * (g - mean(g) - xhat * mean(g * xhat))),  g = dout * w;
//             dw[C] += sum_n dout * xhat, db[C] += sum_n dout (fp32; chunked column partials in the
//             workspace, then colsum_finish sums each column's chunks in order: no atomics)
//   residual: res = bf16(x + dropout(delta)), then out = layernorm(res) from the stored (rounded) res,
//             so that the backward, which reads res, sees the values the statistics came from.
// One warp per row, 8 rows per 256-thread block. With C a multiple of 8 and the arrays 16-byte
// aligned, each lane moves 8 elements at a time (W = 8, bf16_io.cuh); otherwise one (W = 1).
// The kernel bodies are templated on the storage type T and instantiated for __nv_bfloat16 only
// (layernorm.cu keeps the fp32 kernels).
#include "bf16_io.cuh"
#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// One warp normalises one row of C: y = (x - mu) * rs * w + b; lane 0 stores mu and rs where
// mean / rstd are non-null.
template <typename T, int W>
__device__ __forceinline__ void ln_row_fwd(T* y, float* mean, float* rstd, const T* x,
                                           const float* w, const float* b, int row, int lane,
                                           int C, float eps) {
  double s = 0.0;
  for (int c = lane * W; c < C; c += 32 * W) {
    float v[W];
    load_n<W>(v, x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) s = __dadd_rn(s, double(v[k]));
  }
  s = warp_sum(s);
  const float mu = static_cast<float>(__ddiv_rn(s, double(C)));
  double ss = 0.0;
  for (int c = lane * W; c < C; c += 32 * W) {
    float v[W];
    load_n<W>(v, x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double d = __fsub_rn(v[k], mu);
      ss = __fma_rn(d, d, ss);
    }
  }
  ss = warp_sum(ss);
  const float rs = static_cast<float>(
      __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(ss, double(C)), double(eps)))));
  for (int c = lane * W; c < C; c += 32 * W) {
    float v[W], wv[W], bv[W];
    load_n<W>(v, x + c);
    load_n<W>(wv, w + c);
    load_n<W>(bv, b + c);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = __fmaf_rn(__fmul_rn(__fsub_rn(v[k], mu), rs), wv[k], bv[k]);
    store_n<W>(y + c, v);
  }
  if (lane == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

template <typename T, int W>
__global__ void __launch_bounds__(256)
    ln_fwd_t(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
             const T* __restrict__ inp, const float* __restrict__ w, const float* __restrict__ b,
             int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  ln_row_fwd<T, W>(out + (size_t)row * C, mean, rstd, inp + (size_t)row * C, w, b, row, lane, C, eps);
}

// dinp row (+)= rs * (g - sg - xhat * sgx), g = dy * w, sg = mean(g), sgx = mean(g * xhat)
template <typename T, int W>
__global__ void __launch_bounds__(256)
    ln_bwd_dx_t(T* __restrict__ dinp, bool accumulate, const T* __restrict__ dout,
                const T* __restrict__ inp, const float* __restrict__ w,
                const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const size_t base = (size_t)row * C;
  const float mu = mean[row], rs = rstd[row];
  float a = 0.f, ax = 0.f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float dy[W], x[W], wv[W];
    load_n<W>(dy, dout + base + c);
    load_n<W>(x, inp + base + c);
    load_n<W>(wv, w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float g = __fmul_rn(dy[k], wv[k]);
      a = __fadd_rn(a, g);
      ax = __fmaf_rn(g, __fmul_rn(__fsub_rn(x[k], mu), rs), ax);
    }
  }
  const float sg = __fdiv_rn(warp_sum(a), float(C));
  const float sgx = __fdiv_rn(warp_sum(ax), float(C));
  for (int c = lane * W; c < C; c += 32 * W) {
    float dy[W], x[W], wv[W];
    load_n<W>(dy, dout + base + c);
    load_n<W>(x, inp + base + c);
    load_n<W>(wv, w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float xhat = __fmul_rn(__fsub_rn(x[k], mu), rs);
      x[k] = __fmul_rn(rs, __fmaf_rn(-xhat, sgx, __fmaf_rn(dy[k], wv[k], -sg)));
    }
    store_grad_n<W>(dinp + base + c, x, accumulate);
  }
}

constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

// pw[chunk, c] = sum_{n in chunk} dout * xhat;  pb[chunk, c] = sum dout   (block (32, 8), as
// layernorm.cu's partial kernel, reading T)
template <typename T>
__global__ void ln_bwd_dwdb_partial_t(float* __restrict__ pw, float* __restrict__ pb,
                                      const T* __restrict__ dout, const T* __restrict__ inp,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ rstd, int N, int C) {
  __shared__ float rw[kRowLanes][kColTile + 1], rb[kRowLanes][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int n0 = blockIdx.y * kColsumChunk;
  const int n1 = min(N, n0 + kColsumChunk);
  float aw = 0.f, ab = 0.f;
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += kRowLanes) {
      const float dy = to_f(dout[(size_t)n * C + c]);
      aw += dy * ((to_f(inp[(size_t)n * C + c]) - mean[n]) * rstd[n]);
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

// res = x + dropout(delta) (rounded to T), then out = layernorm(res) from the stored res. Each lane
// re-reads the res elements it wrote; __syncwarp orders the writes before the row's reads all the
// same. delta (and x) may alias res: an element is read before the same lane writes it.
template <typename T, int W>
__global__ void __launch_bounds__(256)
    res_ln_fwd_t(T* res, T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                 const T* x, const T* delta, const float* __restrict__ w,
                 const float* __restrict__ b, int N, int C, float eps, DropMask m) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const uint64_t sd = m.resolved_seed();
  const size_t base = (size_t)row * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    float d[W], xv[W];
    load_n<W>(d, delta + base + c);
    load_n<W>(xv, x + base + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (m.p > 0.f) d[k] = m.keep(sd, base + c + k) ? __fmul_rn(d[k], m.sc) : 0.0f;
      d[k] = __fadd_rn(d[k], xv[k]);
    }
    store_n<W>(res + base + c, d);
  }
  __syncwarp();
  ln_row_fwd<T, W>(out + base, mean, rstd, res + base, w, b, row, lane, C, eps);
}

inline unsigned row_blocks(int N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

cudaError_t layernorm_forward_bf16(void* out, float* mean, float* rstd, const void* inp,
                                   const float* w, const float* b, int N, int C, float eps,
                                   cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  auto* o = static_cast<bf16*>(out);
  auto* x = static_cast<const bf16*>(inp);
  if (C % kVec == 0 && aligned16(out) && aligned16(inp) && aligned16(w) && aligned16(b))
    ln_fwd_t<bf16, kVec><<<row_blocks(N), 32 * kRowsPerBlock, 0, s>>>(o, mean, rstd, x, w, b, N, C, eps);
  else
    ln_fwd_t<bf16, 1><<<row_blocks(N), 32 * kRowsPerBlock, 0, s>>>(o, mean, rstd, x, w, b, N, C, eps);
  return cudaGetLastError();
}

size_t layernorm_backward_bf16_ws_bytes(int N, int C) { return 2 * colsum_ws_bytes(N, C); }

cudaError_t layernorm_backward_bf16(void* dinp, bool accumulate, float* dw, float* db,
                                    const void* dout, const void* inp, const float* w,
                                    const float* mean, const float* rstd, int N, int C, void* ws,
                                    cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  auto* dy = static_cast<const bf16*>(dout);
  auto* x = static_cast<const bf16*>(inp);
  if (dinp) {
    auto* dx = static_cast<bf16*>(dinp);
    if (C % kVec == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w))
      ln_bwd_dx_t<bf16, kVec><<<row_blocks(N), 32 * kRowsPerBlock, 0, s>>>(dx, accumulate, dy, x, w,
                                                                           mean, rstd, N, C);
    else
      ln_bwd_dx_t<bf16, 1><<<row_blocks(N), 32 * kRowsPerBlock, 0, s>>>(dx, accumulate, dy, x, w,
                                                                        mean, rstd, N, C);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (dw || db) {
    const int nchunks = (N + kColsumChunk - 1) / kColsumChunk;
    float* pw = static_cast<float*>(ws);
    float* pb = pw + (size_t)nchunks * C;
    dim3 grid((C + kColTile - 1) / kColTile, nchunks), block(kColTile, kRowLanes);
    ln_bwd_dwdb_partial_t<bf16><<<grid, block, 0, s>>>(dw ? pw : nullptr, db ? pb : nullptr, dy, x,
                                                       mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    if ((e = colsum_finish(dw, pw, nchunks, C, s, db, pb)) != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

cudaError_t residual_layernorm_forward_bf16(void* res, void* out, float* mean, float* rstd,
                                            const void* x, const void* delta, const float* w,
                                            const float* b, int N, int C, float eps, float p,
                                            uint64_t seed, const uint64_t* seed_slot, size_t row,
                                            size_t row_key, const int32_t* token_key, size_t width,
                                            cudaStream_t s) {
  if (token_key && width == 0) return cudaErrorInvalidValue;
  if (N <= 0 || C <= 0) return cudaGetLastError();
  auto* r = static_cast<bf16*>(res);
  auto* o = static_cast<bf16*>(out);
  auto* xv = static_cast<const bf16*>(x);
  auto* d = static_cast<const bf16*>(delta);
  const DropMask m = make_drop_mask(p, seed, seed_slot, row, row_key, token_key, width);
  if (C % kVec == 0 && aligned16(res) && aligned16(out) && aligned16(x) && aligned16(delta) &&
      aligned16(w) && aligned16(b))
    res_ln_fwd_t<bf16, kVec><<<row_blocks(N), 32 * kRowsPerBlock, 0, s>>>(r, o, mean, rstd, xv, d, w,
                                                                          b, N, C, eps, m);
  else
    res_ln_fwd_t<bf16, 1><<<row_blocks(N), 32 * kRowsPerBlock, 0, s>>>(r, o, mean, rstd, xv, d, w, b,
                                                                       N, C, eps, m);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
