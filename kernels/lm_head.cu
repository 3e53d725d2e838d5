// The fused LM head's loss (Backend::lm_head_crossentropy): one block per row of a chunk's logits
// [M, ld] (V real columns, ld >= V: the padded vocabulary's row stride). The block reads the row, writes
// its loss, and with `grad` writes the row's (softmax - onehot(target)) * dloss over the same row, so
// no second [M, V] buffer exists; columns V..ld (the padding) are written 0, and rows whose target is
// ignored get zeros. The arithmetic is crossentropy.cu's (max; sum of exp in double; expf), so the
// loss and the gradient are those of crossentropy_forward/backward on the same logits.
// A target outside [0, V) that is not the ignore index lowers *bad_row (atomicMin) to row_base + m;
// such a row gets a NaN loss and zeros. Block reductions are fixed trees: deterministic.
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int32_t kIgnore = -100;  // core/backend.h kIgnoreIndex

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
  const bool bad = t != kIgnore && (t < 0 || t >= V);
  if (t == kIgnore || bad) {
    if (threadIdx.x == 0) {
      losses[m] = bad ? NAN : 0.f;
      if (bad) atomicMin(bad_row, row_base + m);
    }
    if (grad)
      for (int v = threadIdx.x; v < ld; v += blockDim.x) x[v] = 0.f;
    return;
  }
  const float xt = x[t];  // read by every thread before any thread writes the row
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
  mx = block_max(mx, redf);
  double se = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) se += (double)expf(x[v] - mx);
  se = block_sum(se, redd);  // ends after every thread's reads above
  if (threadIdx.x == 0) losses[m] = static_cast<float>(log(se) + ((double)mx - (double)xt));
  if (!grad) return;
  const float f = static_cast<float>((double)dloss / se);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float gv = 0.f + expf(x[v] - mx) * f;
    if (v == t) gv -= dloss;
    x[v] = gv;
  }
  for (int v = V + threadIdx.x; v < ld; v += blockDim.x) x[v] = 0.f;
}

inline int threads_for(int V) { return V >= 4096 ? 512 : (V >= 512 ? 256 : (V >= 64 ? 64 : 32)); }

}  // namespace

cudaError_t lm_head_crossentropy(float* losses, float* logits, int ld, const int32_t* targets,
                                 float dloss, const float* dloss_slot, int M, int V, int row_base,
                                 int* bad_row, bool grad, cudaStream_t s) {
  if (M <= 0) return cudaGetLastError();
  lm_head_ce_k<<<M, threads_for(V), 0, s>>>(losses, logits, ld, targets, dloss, dloss_slot, V,
                                            row_base, bad_row, grad);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
