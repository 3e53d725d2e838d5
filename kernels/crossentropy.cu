// Fused softmax + cross-entropy over logits[M,V], one block per row; the probabilities are never
// stored: each pass re-reads the row (max; sum of exp in double; then the loss or the gradient).
//   forward:  losses[M] = log(sum_v exp(x_v - max)) + max - x[target]   (0 where target == -100)
//   backward: dlogits[M,V] += (softmax(x) - onehot(target)) * dloss       (ignored rows untouched)
// Targets outside [0, V) that are not the ignore index are reported through *bad_row (atomicMin of
// the row index, an integer: the reported row does not depend on timing); such rows are skipped.
// Block reductions are fixed trees: deterministic.
// Segments (packed qa): row m is segment m of one vector, at first[m], len[m] wide (a target outside
// [0, len[m]) is reported like one outside [0, V)).
// Row statistics: the forward can save each row's max and sum of exp (row_max, row_sumexp), and the
// backward can take them instead of re-reading the row twice (one read of the logits instead of three):
// the same numbers, so the same bits as recomputing them.
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"

namespace nlp {
namespace kern {
namespace {

constexpr int32_t kIgnore = -100;  // core/backend.h kIgnoreIndex

// max over the row and sum of exp(x - max) in double, returned to every thread
__device__ __forceinline__ void row_stats(const float* x, int V, float* mx_out, double* se_out) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
  mx = block_max(mx, redf);
  double se = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) se += (double)expf(x[v] - mx);
  se = block_sum(se, redd);
  *mx_out = mx;
  *se_out = se;
}

// Row m of the logits: at m * V, V wide; or (seg_first non-null) segment m, at seg_first[m],
// seg_len[m] wide.
__device__ __forceinline__ size_t row_at(int m, int V, const int32_t* seg_first) {
  return seg_first ? (size_t)seg_first[m] : (size_t)m * V;
}

__global__ void ce_fwd_k(float* __restrict__ losses, const float* __restrict__ logits,
                         const int32_t* __restrict__ targets, int V, int* bad_row,
                         float* __restrict__ row_max, double* __restrict__ row_sumexp,
                         const int32_t* __restrict__ seg_first, const int32_t* __restrict__ seg_len) {
  const int m = blockIdx.x;
  const int32_t t = targets[m];
  if (seg_len) V = seg_len[m];
  if (t == kIgnore) {
    if (threadIdx.x == 0) losses[m] = 0.f;
    return;
  }
  if (t < 0 || t >= V) {
    if (threadIdx.x == 0) {
      atomicMin(bad_row, m);
      losses[m] = NAN;
    }
    return;
  }
  const float* x = logits + row_at(m, V, seg_first);
  float mx;
  double se;
  row_stats(x, V, &mx, &se);
  if (threadIdx.x == 0) {
    losses[m] = static_cast<float>(log(se) + ((double)mx - (double)x[t]));
    if (row_max) {
      row_max[m] = mx;
      row_sumexp[m] = se;
    }
  }
}

__global__ void ce_bwd_k(float* __restrict__ dlogits, const float* __restrict__ logits,
                         const int32_t* __restrict__ targets, float dloss,
                         const float* __restrict__ dloss_slot, int V, int* bad_row,
                         const float* __restrict__ row_max, const double* __restrict__ row_sumexp,
                         const int32_t* __restrict__ seg_first, const int32_t* __restrict__ seg_len) {
  const int m = blockIdx.x;
  if (dloss_slot) dloss = *dloss_slot;  // a replayed CUDA graph's value, read at run time
  const int32_t t = targets[m];
  if (seg_len) V = seg_len[m];
  if (t == kIgnore) return;
  if (t < 0 || t >= V) {
    if (threadIdx.x == 0) atomicMin(bad_row, m);
    return;
  }
  const size_t at = row_at(m, V, seg_first);
  const float* x = logits + at;
  float* g = dlogits + at;
  float mx;
  double se;
  if (row_max) {
    mx = row_max[m];
    se = row_sumexp[m];
  } else {
    row_stats(x, V, &mx, &se);
  }
  const float f = static_cast<float>((double)dloss / se);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float gv = g[v] + expf(x[v] - mx) * f;
    if (v == t) gv -= dloss;
    g[v] = gv;
  }
}

inline int threads_for(int V) { return V >= 4096 ? 512 : (V >= 512 ? 256 : (V >= 64 ? 64 : 32)); }
// segments are examples' positions in a packed row: up to the row length, a few hundred
constexpr int kSegmentThreads = 64;

}  // namespace

cudaError_t crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                 int M, int V, int* bad_row, float* row_max, double* row_sumexp,
                                 cudaStream_t s) {
  if (M <= 0) return cudaGetLastError();
  ce_fwd_k<<<M, threads_for(V), 0, s>>>(losses, logits, targets, V, bad_row, row_max, row_sumexp,
                                        nullptr, nullptr);
  return cudaGetLastError();
}

cudaError_t crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                  float dloss, const float* dloss_slot, int M, int V, int* bad_row,
                                  const float* row_max, const double* row_sumexp, cudaStream_t s) {
  if (M <= 0) return cudaGetLastError();
  ce_bwd_k<<<M, threads_for(V), 0, s>>>(dlogits, logits, targets, dloss, dloss_slot, V, bad_row,
                                        row_max, row_sumexp, nullptr, nullptr);
  return cudaGetLastError();
}

cudaError_t segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                         const int32_t* len, const int32_t* targets, int E, int* bad_row,
                                         cudaStream_t s) {
  if (E <= 0) return cudaGetLastError();
  ce_fwd_k<<<E, kSegmentThreads, 0, s>>>(losses, x, targets, 0, bad_row, nullptr, nullptr, first, len);
  return cudaGetLastError();
}

cudaError_t segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                          const int32_t* len, const int32_t* targets, float dloss,
                                          const float* dloss_slot, int E, int* bad_row,
                                          cudaStream_t s) {
  if (E <= 0) return cudaGetLastError();
  ce_bwd_k<<<E, kSegmentThreads, 0, s>>>(dx, x, targets, dloss, dloss_slot, 0, bad_row, nullptr,
                                         nullptr, first, len);
  return cudaGetLastError();
}

}  // namespace kern
}  // namespace nlp
