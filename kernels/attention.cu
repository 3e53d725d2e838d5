// Multi-head scaled dot-product attention over a packed qkv[B,T,3C] (q | k | v; head h uses
// columns h*HS..h*HS+HS of each part), causal and key-padding masks, dropout on the probabilities
// with the documented mask index ((b*NH + h)*T + i)*T + j, and single-position KV-cache decoding.
//
// The interface saves the full probabilities att[B,NH,T,T] for backward, so the forward is three
// launches (scores -> masked softmax in place -> dropout(att) @ v) and the backward five
// (dA' = dout v^T -> softmax backward in place -> dq, dk, dv). The products are one templated
// shared-memory tiled kernel (64x64 output tile per block, 16-deep k slices, 4x4 outputs per
// thread, fp32 FMA accumulation) over (b, h) in blockIdx.z, reading each operand through
// (batch, head, row, column) strides, so no head is ever copied out of qkv:
//   scores  S[T,T]   = (q * 1/sqrt(HS)) @ k^T     stored into att    (causal: tiles above the diagonal skipped)
//   forward O[T,HS]  = dropout(att) @ v           stored into out    (causal: k range up to the row tile)
//   dA'[T,T]         = dout @ v^T                 stored into scratch
//   dq[T,HS]        += dS @ k                     into dqkv q part   (causal: k range up to the row tile)
//   dk[T,HS]        += dS^T @ q                   into dqkv k part   (causal: k range from the row tile)
//   dv[T,HS]        += dropout(att)^T @ dout      into dqkv v part   (causal: k range from the row tile)
// The row-wise softmax kernels use one warp per row. The dropout mask is regenerated from
// core/rng.h wherever the dropped probabilities are read, so nothing is stored.
// Every output element is produced by one thread: results are deterministic.
#include <cmath>

#include "common.cuh"
#include "core/rng.h"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int BM = 64, BN = 64, BK = 16;
constexpr int kGemmThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kMaxGridZ = 65535;

// Element (r, c) of head (b, h) of an operand: p[b*sb + h*sh + r*sr + c*sc].
struct HMat {
  const float* p;
  long long sb, sh, sr, sc;
};
struct HOut {
  float* p;
  long long sb, sh, sr, sc;
};

enum ALoad { kPlain = 0, kDropAtt = 1, kDropAttT = 2 };
enum KRange { kAll = 0, kSkipUpper = 1, kUpToRow = 2, kFromRow = 3 };

struct DropInfo {
  float p, scale;  // dropout probability and 1/(1-p)
  uint64_t seed;
  int T;           // the mask's key length T_key (core/backend.h): element (bh, i, j) draws at ((bh*T + i)*T + j)
  // Packed rows (core/backend.h): token_key[b*Tr + t] = example * T + position; (b, i, j) are then
  // the example and the positions it gives. nullptr: unpacked.
  const int32_t* token_key = nullptr;
  int Tr = 0;  // the rows' length (token_key's row stride)
  // nullable: the seed is read from it at run time instead (a replayed CUDA graph's value table)
  const uint64_t* seed_slot = nullptr;
  __device__ __forceinline__ uint64_t seed_now() const { return seed_slot ? *seed_slot : seed; }
};

// The dropout mask index of probability (i, j) of head h in row b (core/backend.h).
__device__ __forceinline__ uint64_t att_drop_index(const DropInfo& d, int b, int h, int NH, int i, int j) {
  if (!d.token_key) return (((uint64_t)b * NH + h) * d.T + i) * d.T + j;
  const int32_t* tk = d.token_key + (size_t)b * d.Tr;
  const uint64_t ki = (uint64_t)tk[i], kj = (uint64_t)tk[j], Tk = (uint64_t)d.T;
  return ((ki / Tk * NH + h) * Tk + ki % Tk) * Tk + kj % Tk;
}

// C[M,N] (=|+=) opA(A)[M,K] @ B[K,N] per head bh = blockIdx.z (+ k*gridDim.z).
// A element (m, k) is scaled by a_scale (kPlain) or, for the probabilities, multiplied by the
// dropout keep factor of (i, j) = (m, k) (kDropAtt) or (k, m) (kDropAttT).
template <int AMODE>
__global__ void __launch_bounds__(kGemmThreads)
    head_gemm_k(HOut Cm, HMat A, HMat Bm, int M, int N, int K, int NH, int BH, int krange,
                bool accumulate, float a_scale, DropInfo drop) {
  __shared__ __align__(16) float As[BK][BM + 4];  // A tile, transposed: As[k][m]
  __shared__ __align__(16) float Bs[BK][BN + 4];
  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;

  int kbeg = 0, kend = K;
  if (krange == kUpToRow) kend = min(K, row0 + BM);
  if (krange == kFromRow) kbeg = min(K, row0);
  const bool skip = krange == kSkipUpper && col0 > row0 + BM - 1;
  if (skip) return;  // uniform over the block

  const bool a_kfast = A.sc == 1;   // consecutive threads along k
  const bool b_nfast = Bm.sc == 1;  // consecutive threads along n
  const uint64_t seed = AMODE == kPlain ? 0 : drop.seed_now();

  for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
    const int b = bh / NH, h = bh % NH;
    const float* Ap = A.p + b * A.sb + h * A.sh;
    const float* Bp = Bm.p + b * Bm.sb + h * Bm.sh;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

    for (int k0 = kbeg; k0 < kend; k0 += BK) {
      // load A tile [BM x BK] -> As[k][m]
#pragma unroll
      for (int l = 0; l < (BM * BK) / kGemmThreads; ++l) {
        const int e = tid + l * kGemmThreads;
        int m, k;
        if (a_kfast) {
          m = e / BK;
          k = e % BK;
        } else {
          m = e % BM;
          k = e / BM;
        }
        const int gm = row0 + m, gk = k0 + k;
        float v = 0.f;
        if (gm < M && gk < kend) {
          v = Ap[gm * A.sr + gk * A.sc];
          if (AMODE == kPlain) {
            v *= a_scale;
          } else {
            const int i = AMODE == kDropAtt ? gm : gk;
            const int j = AMODE == kDropAtt ? gk : gm;
            const uint64_t idx = att_drop_index(drop, b, h, NH, i, j);
            v = (v != 0.f && uniform01(seed, idx) >= drop.p) ? v * drop.scale : 0.f;
          }
        }
        As[k][m] = v;
      }
      // load B tile [BK x BN] -> Bs[k][n]
#pragma unroll
      for (int l = 0; l < (BK * BN) / kGemmThreads; ++l) {
        const int e = tid + l * kGemmThreads;
        int k, n;
        if (b_nfast) {
          k = e / BN;
          n = e % BN;
        } else {
          k = e % BK;
          n = e / BK;
        }
        const int gk = k0 + k, gn = col0 + n;
        Bs[k][n] = (gk < kend && gn < N) ? Bp[gk * Bm.sr + gn * Bm.sc] : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < BK; ++k) {
        const float4 a4 = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
        const float4 b4 = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w};
        const float bb[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], bb[j], acc[i][j]);
      }
      __syncthreads();
    }

    float* Cp = Cm.p + b * Cm.sb + h * Cm.sh;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int gm = row0 + ty * 4 + i;
      if (gm >= M) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int gn = col0 + tx * 4 + j;
        if (gn >= N) continue;
        float* c = Cp + gm * Cm.sr + gn * Cm.sc;
        *c = accumulate ? *c + acc[i][j] : acc[i][j];
      }
    }
  }
}

template <int AMODE>
cudaError_t head_gemm(HOut C, HMat A, HMat B, int M, int N, int K, int NH, int BH, KRange kr,
                      bool accumulate, float a_scale, DropInfo drop, cudaStream_t s) {
  if (M <= 0 || N <= 0 || BH <= 0) return cudaGetLastError();
  dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM, BH < kMaxGridZ ? BH : kMaxGridZ);
  head_gemm_k<AMODE><<<grid, kGemmThreads, 0, s>>>(C, A, B, M, N, K, NH, BH, int(kr), accumulate,
                                                   a_scale, drop);
  return cudaGetLastError();
}

// core/backend.h's rule: the mask holds a segment id per token (0 = padding); query i sees key j when
// mask[j] != 0 and (mask[i] == mask[j] or mask[i] == 0). A 0/1 mask is the key-padding mask; packed
// rows (ids 1, 2, ... per example) are block-diagonal.
__device__ __forceinline__ bool key_ok(const int32_t* mask, bool causal, int i, int j) {
  return (!causal || j <= i) && (!mask || (mask[j] != 0 && (mask[i] == 0 || mask[i] == mask[j])));
}

constexpr int kRowWarps = 4;  // rows per 128-thread block in the softmax kernels

// In place over att rows (bh, i): raw scores -> masked softmax probabilities; a fully masked row and
// every j beyond the causal limit become 0.
__global__ void __launch_bounds__(32 * kRowWarps)
    softmax_fwd_k(float* __restrict__ att, const int32_t* __restrict__ attn_mask, bool causal,
                  int NH, int T, long long rows) {
  const long long r = (long long)blockIdx.x * kRowWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int i = static_cast<int>(r % T);
  const long long bh = r / T;
  const int b = static_cast<int>(bh / NH);
  const int32_t* mask = attn_mask ? attn_mask + (size_t)b * T : nullptr;
  float* a = att + (size_t)r * T;
  const int jend = causal ? i + 1 : T;
  float mx = -INFINITY;
  for (int j = lane; j < jend; j += 32)
    if (key_ok(mask, causal, i, j)) mx = fmaxf(mx, a[j]);
  mx = warp_max(mx);
  float den = 0.f;
  for (int j = lane; j < jend; j += 32) {
    const float e = key_ok(mask, causal, i, j) ? expf(a[j] - mx) : 0.f;
    a[j] = e;
    den += e;
  }
  den = warp_sum(den);
  const float inv = den > 0.f ? 1.f / den : 0.f;
  for (int j = lane; j < jend; j += 32) a[j] *= inv;
  for (int j = jend + lane; j < T; j += 32) a[j] = 0.f;
}

// In place over scratch rows: dA' -> dS.  With kf the keep factor (0 where masked or a == 0):
//   dA = dA' kf;  dS_j = a_j (dA_j - sum_k a_k dA_k) / sqrt(HS)  (0 where a_j == 0 or j beyond causal)
__global__ void __launch_bounds__(32 * kRowWarps)
    softmax_bwd_k(float* __restrict__ ds, const float* __restrict__ att,
                  const int32_t* __restrict__ attn_mask, bool causal, float p, float dscale,
                  uint64_t seed, float sc, int NH, int T, DropInfo dk, long long rows) {
  const long long r = (long long)blockIdx.x * kRowWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int i = static_cast<int>(r % T);
  const long long bh = r / T;
  const int b = static_cast<int>(bh / NH);
  const int32_t* mask = attn_mask ? attn_mask + (size_t)b * T : nullptr;
  const float* a = att + (size_t)r * T;
  float* d = ds + (size_t)r * T;
  const int jend = causal ? i + 1 : T;
  const int h = static_cast<int>(bh % NH);
  const bool drop = p > 0.f;
  if (drop && dk.seed_slot) seed = *dk.seed_slot;
  float dot = 0.f;
  for (int j = lane; j < jend; j += 32) {
    const float aj = a[j];
    float kf = 1.f;
    if (aj == 0.f || !key_ok(mask, causal, i, j))
      kf = 0.f;
    else if (drop)
      kf = uniform01(seed, att_drop_index(dk, b, h, NH, i, j)) >= p ? dscale : 0.f;
    const float da = d[j] * kf;
    d[j] = da;
    dot += aj * da;
  }
  dot = warp_sum(dot);
  for (int j = lane; j < jend; j += 32) {
    const float aj = a[j];
    d[j] = aj == 0.f ? 0.f : aj * (d[j] - dot) * sc;
  }
  for (int j = jend + lane; j < T; j += 32) d[j] = 0.f;
}

// One block per (b, h): write k, v of qkv_new into the caches at pos, then
// out[b, h*HS..] = softmax(q k[0..pos]^T / sqrt(HS)) v[0..pos].  s: [BH, pos+1] scores scratch.
__global__ void __launch_bounds__(128)
    decode_k(float* __restrict__ out, const float* __restrict__ qkv_new, float* __restrict__ kcache,
             float* __restrict__ vcache, float* __restrict__ sbuf, int pos, int Tmax, int NH,
             int HS, float sc) {
  __shared__ float red[32];
  extern __shared__ float qs[];  // [HS] q * sc
  const int bh = blockIdx.x;
  const int b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const float* q = qkv_new + (size_t)b * 3 * C + (size_t)h * HS;
  float* kc = kcache + (size_t)bh * Tmax * HS;
  float* vc = vcache + (size_t)bh * Tmax * HS;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    kc[(size_t)pos * HS + d] = q[C + d];
    vc[(size_t)pos * HS + d] = q[2 * C + d];
    qs[d] = q[d] * sc;
  }
  __syncthreads();
  const int L = pos + 1;
  float* s = sbuf + (size_t)bh * L;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int j = w; j < L; j += nw) {
    const float* kj = kc + (size_t)j * HS;
    float acc = 0.f;
    for (int d = lane; d < HS; d += 32) acc += qs[d] * kj[d];
    acc = warp_sum(acc);
    if (lane == 0) s[j] = acc;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < L; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = block_max(mx, red);
  float den = 0.f;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    const float e = expf(s[j] - mx);
    s[j] = e;
    den += e;
  }
  den = block_sum(den, red);  // synchronises: s is complete
  const float inv = 1.f / den;
  float* o = out + (size_t)b * C + (size_t)h * HS;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < L; ++j) acc += (s[j] * inv) * vc[(size_t)j * HS + d];
    o[d] = acc;
  }
}

}  // namespace

cudaError_t attention_forward(float* out, float* att, const float* qkv, const int32_t* attn_mask,
                              bool causal, float dropout_p, uint64_t seed,
                              const uint64_t* seed_slot, int B, int T, int NH, int HS, int T_key,
                              const int32_t* token_key, cudaStream_t s) {
  const int Tk = key_length(T, T_key);
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return cudaGetLastError();
  const long long C = (long long)NH * HS, C3 = 3 * C, TT = (long long)T * T;
  const int BH = B * NH;
  const float sc = 1.0f / sqrtf(static_cast<float>(HS));
  const DropInfo nodrop{0.f, 1.f, 0, T};
  cudaError_t e;
  // scores[T,T] = (q sc) @ k^T  -> att
  HOut S{att, NH * TT, TT, T, 1};
  HMat Q{qkv, T * C3, HS, C3, 1};
  HMat Kt{qkv + C, T * C3, HS, 1, C3};  // (d, j) -> k[j, d]
  e = head_gemm<kPlain>(S, Q, Kt, T, T, HS, NH, BH, causal ? kSkipUpper : kAll, false, sc, nodrop, s);
  if (e != cudaSuccess) return e;
  const long long rows = (long long)BH * T;
  softmax_fwd_k<<<static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps), 32 * kRowWarps, 0, s>>>(
      att, attn_mask, causal, NH, T, rows);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  // out[T,HS] = dropout(att) @ v
  HMat P{att, NH * TT, TT, T, 1};
  HMat Vm{qkv + 2 * C, T * C3, HS, C3, 1};
  HOut O{out, T * C, HS, C, 1};
  const KRange kr = causal ? kUpToRow : kAll;
  if (dropout_p > 0.f)
    return head_gemm<kDropAtt>(O, P, Vm, T, HS, T, NH, BH, kr, false, 1.f,
                               DropInfo{dropout_p, dropout_scale(dropout_p), seed, Tk, token_key,
                                        T, seed_slot},
                               s);
  return head_gemm<kPlain>(O, P, Vm, T, HS, T, NH, BH, kr, false, 1.f, nodrop, s);
}

cudaError_t attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* att, const int32_t* attn_mask, bool causal,
                               float dropout_p, uint64_t seed, const uint64_t* seed_slot, int B,
                               int T, int NH, int HS, int T_key, const int32_t* token_key,
                               cudaStream_t s) {
  const int Tk = key_length(T, T_key);
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return cudaGetLastError();
  const long long C = (long long)NH * HS, C3 = 3 * C, TT = (long long)T * T;
  const int BH = B * NH;
  const float sc = 1.0f / sqrtf(static_cast<float>(HS));
  const DropInfo nodrop{0.f, 1.f, 0, T};
  const DropInfo drop{dropout_p, dropout_scale(dropout_p), seed, Tk, token_key, T, seed_slot};
  cudaError_t e;
  HMat dO{dout, T * C, HS, C, 1};
  HMat Vt{qkv + 2 * C, T * C3, HS, 1, C3};  // (d, j) -> v[j, d]
  HOut dA{scratch, NH * TT, TT, T, 1};
  // dA'[T,T] = dout @ v^T
  e = head_gemm<kPlain>(dA, dO, Vt, T, T, HS, NH, BH, causal ? kSkipUpper : kAll, false, 1.f,
                        nodrop, s);
  if (e != cudaSuccess) return e;
  const long long rows = (long long)BH * T;
  softmax_bwd_k<<<static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps), 32 * kRowWarps, 0, s>>>(
      scratch, att, attn_mask, causal, dropout_p, drop.scale, seed, sc, NH, T, drop, rows);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  // dq[T,HS] += dS @ k
  HMat dS{scratch, NH * TT, TT, T, 1};
  HMat Km{qkv + C, T * C3, HS, C3, 1};
  HOut dQ{dqkv, T * C3, HS, C3, 1};
  e = head_gemm<kPlain>(dQ, dS, Km, T, HS, T, NH, BH, causal ? kUpToRow : kAll, true, 1.f, nodrop, s);
  if (e != cudaSuccess) return e;
  // dk[T,HS] += dS^T @ q
  HMat dSt{scratch, NH * TT, TT, 1, T};
  HMat Qm{qkv, T * C3, HS, C3, 1};
  HOut dK{dqkv + C, T * C3, HS, C3, 1};
  const KRange from = causal ? kFromRow : kAll;
  e = head_gemm<kPlain>(dK, dSt, Qm, T, HS, T, NH, BH, from, true, 1.f, nodrop, s);
  if (e != cudaSuccess) return e;
  // dv[T,HS] += dropout(att)^T @ dout
  HMat Pt{att, NH * TT, TT, 1, T};
  HOut dV{dqkv + 2 * C, T * C3, HS, C3, 1};
  if (dropout_p > 0.f)
    return head_gemm<kDropAttT>(dV, Pt, dO, T, HS, T, NH, BH, from, true, 1.f, drop, s);
  return head_gemm<kPlain>(dV, Pt, dO, T, HS, T, NH, BH, from, true, 1.f, nodrop, s);
}

size_t attention_decode_ws_bytes(int B, int pos, int NH) {
  return sizeof(float) * size_t(B > 0 ? B : 0) * size_t(NH > 0 ? NH : 0) * size_t(pos + 1);
}

cudaError_t attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache,
                             int B, int pos, int Tmax, int NH, int HS, void* ws, cudaStream_t s) {
  if (B <= 0 || NH <= 0 || HS <= 0) return cudaGetLastError();
  if (pos < 0 || pos >= Tmax) return cudaErrorInvalidValue;
  const float sc = 1.0f / sqrtf(static_cast<float>(HS));
  decode_k<<<B * NH, 128, sizeof(float) * HS, s>>>(out, qkv_new, kcache, vcache,
                                                  static_cast<float*>(ws), pos, Tmax, NH, HS, sc);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
