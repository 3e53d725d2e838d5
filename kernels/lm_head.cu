// The fused LM head's loss (Backend::lm_head_crossentropy): one block per row of a chunk's logits
// [M, ld] (V real columns, ld >= V: the padded vocabulary's row stride). The block reads the row, writes
// its loss, and with `grad` writes the row's (softmax - onehot(target)) * dloss over the same row, so
// no second [M, V] buffer exists; columns V..ld (the padding) are written 0, and rows whose target is
// ignored get zeros. The arithmetic is crossentropy.cu's (max; sum of exp in double; expf), so the
// loss and the gradient are those of crossentropy_forward/backward on the same logits.
// A target outside [0, V) that is not the ignore index lowers *bad_row (atomicMin) to row_base + m;
// such a row gets a NaN loss and zeros. Block reductions are fixed trees: deterministic.
//
// lm_head_crossentropy_bf16 (the bf16-precision head, NLPTRAIN_CUDA_HEAD_DLOGITS=bf16): the same loss
// and gradient arithmetic, read from the logits (left unchanged) and written to a separate bf16
// dlogits[M, ld], each element rounded to nearest even (__float2bfloat16_rn: the rounding the bf16
// GEMM's operand cast, kern::to_bf16, applies to the fp32 dlogits), so the backward GEMMs read the
// same bf16 operand without an fp32 write and a cast.
//
// online = true (NLPTRAIN_CUDA_HEAD_SOFTMAX=online): the same loss and gradient with the row's max and
// sum of exp found in one pass over the row instead of two (lm_head_ce_online_k): each thread keeps a
// running max m and a sum s of exp(x - m) in double, rescaled by exp(m_old - m_new) when its max
// grows; the block then takes the row max M and sums s * exp(m - M). So the row is read twice (the
// statistics, then the gradient) instead of three times. The sum differs from the two-pass sum by
// rounding only (each term's expf is taken against the thread's max, then scaled in double): the
// loss and the gradient agree with the two-pass kernel's to about 1e-7 relative. Same fixed trees:
// deterministic.
#include <cuda_bf16.h>

#include <cmath>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int32_t kIgnore = -100;  // core/backend.h kIgnoreIndex

// One dlogit of the row g, stored in G (float, or bf16 rounded to nearest even).
__device__ __forceinline__ void store_dlogit(float* g, int v, float x) { g[v] = x; }
__device__ __forceinline__ void store_dlogit(__nv_bfloat16* g, int v, float x) {
  g[v] = __float2bfloat16_rn(x);
}

// Row m with target t, when t is the ignore index or outside [0, V): its loss 0 or NaN (the latter
// lowering *bad_row to row_base + m), with `grad` its dlogits g[0, ld) zeros; true then (the block
// has nothing more to do with the row).
template <typename G>
__device__ __forceinline__ bool skipped_row(float* losses, G* g, int ld, int32_t t, int V, int m,
                                            int row_base, int* bad_row, bool grad) {
  const bool bad = t != kIgnore && (t < 0 || t >= V);
  if (t == kIgnore || bad) {
    if (threadIdx.x == 0) {
      losses[m] = bad ? NAN : 0.f;
      if (bad) atomicMin(bad_row, row_base + m);
    }
    if (grad)
      for (int v = threadIdx.x; v < ld; v += blockDim.x) store_dlogit(g, v, 0.f);
    return true;
  }
  return false;
}

// The row's loss from its statistics (max mx, sum of exp se, the target's logit xt) and, with
// `grad`, its dlogits (softmax - onehot(t)) * dloss into g[0, V) and zeros into g[V, ld). g may be
// the row x itself: the statistics' reductions end every read of x before this writes.
template <typename G>
__device__ __forceinline__ void row_loss_and_grad(float* losses, G* g, const float* x, int ld,
                                                  int32_t t, int V, int m, float xt, float mx,
                                                  double se, float dloss, bool grad) {
  if (threadIdx.x == 0) losses[m] = static_cast<float>(log(se) + ((double)mx - (double)xt));
  if (!grad) return;
  const float f = static_cast<float>((double)dloss / se);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float gv = 0.f + expf(x[v] - mx) * f;
    if (v == t) gv -= dloss;
    store_dlogit(g, v, gv);
  }
  for (int v = V + threadIdx.x; v < ld; v += blockDim.x) store_dlogit(g, v, 0.f);
}

// Two passes over x[0, V): the row's max (*mx), then the sum of exp(x - max) in double (*se), to
// every thread of the block; the sum's reduction ends after every thread's reads of the row.
// redf/redd: __shared__ scratch of 32 each.
__device__ __forceinline__ void two_pass_row_stats(const float* x, int V, float* mx, double* se,
                                                   float* redf, double* redd) {
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
  m = block_max(m, redf);
  double sum = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += (double)expf(x[v] - m);
  *se = block_sum(sum, redd);
  *mx = m;
}

__global__ void lm_head_ce_k(float* __restrict__ losses, float* __restrict__ logits, int ld,
                             const int32_t* __restrict__ targets, float dloss,
                             const float* __restrict__ dloss_slot, int V, int row_base, int* bad_row,
                             bool grad) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int m = blockIdx.x;
  if (dloss_slot) dloss = *dloss_slot;  // a replayed CUDA graph's value, read at run time
  float* x = logits + (size_t)m * ld;
  const int32_t t = targets[m];
  if (skipped_row(losses, x, ld, t, V, m, row_base, bad_row, grad)) return;
  const float xt = x[t];  // read by every thread before any thread writes the row
  float mx;
  double se;
  two_pass_row_stats(x, V, &mx, &se, redf, redd);  // ends after every thread's reads of the row
  row_loss_and_grad(losses, x, x, ld, t, V, m, xt, mx, se, dloss, grad);
}

// lm_head_ce_k with grad, the dlogits stored as bf16 in dl[M, ld] (the logits are only read). The
// arithmetic is lm_head_ce_k's, expression for expression, so each bf16 element is the rounding of
// the fp32 value that kernel writes.
__global__ void lm_head_ce_bf16_k(float* __restrict__ losses, const float* __restrict__ logits,
                                  __nv_bfloat16* __restrict__ dl, int ld,
                                  const int32_t* __restrict__ targets, float dloss,
                                  const float* __restrict__ dloss_slot, int V, int row_base,
                                  int* bad_row) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int m = blockIdx.x;
  if (dloss_slot) dloss = *dloss_slot;
  const float* x = logits + (size_t)m * ld;
  __nv_bfloat16* g = dl + (size_t)m * ld;
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
  const int32_t t = targets[m];
  const bool bad = t != kIgnore && (t < 0 || t >= V);
  if (t == kIgnore || bad) {  // skipped_row with the zero of the stores below
    if (threadIdx.x == 0) {
      losses[m] = bad ? NAN : 0.f;
      if (bad) atomicMin(bad_row, row_base + m);
    }
    for (int v = threadIdx.x; v < ld; v += blockDim.x) g[v] = zero;
    return;
  }
  const float xt = x[t];
  float mx;
  double se;
  two_pass_row_stats(x, V, &mx, &se, redf, redd);
  if (threadIdx.x == 0) losses[m] = static_cast<float>(log(se) + ((double)mx - (double)xt));
  const float f = static_cast<float>((double)dloss / se);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float gv = 0.f + expf(x[v] - mx) * f;
    if (v == t) gv -= dloss;
    g[v] = __float2bfloat16_rn(gv);
  }
  for (int v = V + threadIdx.x; v < ld; v += blockDim.x) g[v] = zero;
}

// One pass over x[0, V): the row's max (returned in *mx) and sum of exp(x - max) in double (*se), to
// every thread of the block. redf/redd: __shared__ scratch of 32 each.
__device__ __forceinline__ void online_row_stats(const float* __restrict__ x, int V, float* mx,
                                                 double* se, float* redf, double* redd) {
  // Non-finite logits end as the two-pass kernel's do: a NaN anywhere makes the sum NaN (NaN is
  // never "greater", and a NaN sum survives every rescaling), -inf adds nothing (skipped, so that
  // -inf - -inf makes no NaN), +inf makes inf - inf = NaN. A sum of 0 is never rescaled (0 * exp(inf)).
  float m = -INFINITY;
  double sum = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = x[v];
    if (xv > m) {  // the running max grows: rescale the sum so far
      sum = (sum == 0.0 ? 0.0 : sum * exp((double)m - (double)xv)) + 1.0;
      m = xv;
    } else if (xv != -INFINITY) {
      sum += (double)expf(xv - m);
    }
  }
  const float M = block_max(m, redf);
  const double part = sum == 0.0 ? 0.0 : sum * exp((double)m - (double)M);
  *se = block_sum(part, redd);
  *mx = M;
}

// lm_head_ce_k (G = float: the dlogits over the logits, `grad` optional) and lm_head_ce_bf16_k
// (G = __nv_bfloat16: the dlogits into dl, grad always) with the one-pass statistics. In the fp32
// form dl is the logits row itself; every read of the row ends at the block reductions, before any
// thread writes it.
template <typename G>
__global__ void lm_head_ce_online_k(float* __restrict__ losses, const float* logits, G* dl, int ld,
                                    const int32_t* __restrict__ targets, float dloss,
                                    const float* __restrict__ dloss_slot, int V, int row_base,
                                    int* bad_row, bool grad) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int m = blockIdx.x;
  if (dloss_slot) dloss = *dloss_slot;
  const float* x = logits + (size_t)m * ld;
  G* g = dl + (size_t)m * ld;
  const int32_t t = targets[m];
  if (skipped_row(losses, g, ld, t, V, m, row_base, bad_row, grad)) return;
  const float xt = x[t];
  float mx;
  double se;
  online_row_stats(x, V, &mx, &se, redf, redd);
  row_loss_and_grad(losses, g, x, ld, t, V, m, xt, mx, se, dloss, grad);
}

inline int threads_for(int V) { return V >= 4096 ? 512 : (V >= 512 ? 256 : (V >= 64 ? 64 : 32)); }

}  // namespace

cudaError_t lm_head_crossentropy(float* losses, float* logits, int ld, const int32_t* targets,
                                 float dloss, const float* dloss_slot, int M, int V, int row_base,
                                 int* bad_row, bool grad, cudaStream_t s, bool online) {
  if (M <= 0) return cudaGetLastError();
  if (online)
    lm_head_ce_online_k<float><<<M, threads_for(V), 0, s>>>(losses, logits, logits, ld, targets, dloss,
                                                            dloss_slot, V, row_base, bad_row, grad);
  else
    lm_head_ce_k<<<M, threads_for(V), 0, s>>>(losses, logits, ld, targets, dloss, dloss_slot, V,
                                              row_base, bad_row, grad);
  return cudaGetLastError();
}

cudaError_t lm_head_crossentropy_bf16(float* losses, const float* logits, void* dlogits, int ld,
                                      const int32_t* targets, float dloss, const float* dloss_slot,
                                      int M, int V, int row_base, int* bad_row, cudaStream_t s,
                                      bool online) {
  if (M <= 0) return cudaGetLastError();
  if (online)
    lm_head_ce_online_k<__nv_bfloat16><<<M, threads_for(V), 0, s>>>(
        losses, logits, static_cast<__nv_bfloat16*>(dlogits), ld, targets, dloss, dloss_slot, V,
        row_base, bad_row, true);
  else
    lm_head_ce_bf16_k<<<M, threads_for(V), 0, s>>>(losses, logits,
                                                   static_cast<__nv_bfloat16*>(dlogits), ld, targets,
                                                   dloss, dloss_slot, V, row_base, bad_row);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
