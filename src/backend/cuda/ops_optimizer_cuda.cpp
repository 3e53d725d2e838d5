// CudaBackend (cuda_backend_impl.h): the reductions in double (kernels/reductions.cu) and AdamW
// (kernels/adamw.cu), per tensor or every span of the arena in one launch.
#include "backend/cuda/cuda_backend_impl.h"

#include <cmath>
#include <vector>

namespace nlp::cuda {

double CudaBackend::sum(const float* x, size_t N) {
  return reduce(x, N, false);
}

double CudaBackend::sumsq(const float* x, size_t N) {
  return reduce(x, N, true);
}

void CudaBackend::sum_into(double* acc, const float* x, size_t N, double scale) {
  if (N == 0) return;  // the sum is 0: acc + scale * 0 is acc (never -0 here: a sum of losses)
  void* ws = workspace(kern::sum_ws_bytes(N));
  double* d = static_cast<double*>(small_);
  op(kern::sum_double(d, x, N, false, ws, stream_), "sum");
  op(kern::add_scaled_double(acc, d, scale, stream_), "sum_into");
}

double CudaBackend::reduce(const float* x, size_t N, bool square) {
  no_capture(square ? "sumsq (a read-back)" : "sum (a read-back)");
  if (N == 0) return 0.0;
  void* ws = workspace(kern::sum_ws_bytes(N));
  double* d = static_cast<double*>(small_);
  op(kern::sum_double(d, x, N, square, ws, stream_), square ? "sumsq" : "sum");
  ck(cudaMemcpyAsync(host_small_, d, sizeof(double), cudaMemcpyDeviceToHost, stream_),
     "sum (copy)");
  ck(cudaStreamSynchronize(stream_), "sum (synchronize)");
  after_sync();
  return *static_cast<double*>(host_small_);
}

void CudaBackend::adamw_update(float* param, const float* grad, float* m, float* v, size_t N,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               float grad_scale, int t) {
  // bias corrections in double as torch (and the CPU backend) do
  const double bc1 = 1.0 - std::pow((double)beta1, t);
  const double bc2 = 1.0 - std::pow((double)beta2, t);
  const float step_size = static_cast<float>((double)lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - lr * weight_decay;
  forget_head_wte(param, N);
  op(kern::adamw_update(param, grad, m, v, N, step_size, bc2_sqrt, decay, beta1, beta2, eps,
                        grad_scale, stream_, copy_of(param, N)),
     "adamw_update");
}

// Every tensor in one launch (a step of BERT-base has ~200 tensors: ~200 launches and their gaps
// otherwise). The span table lives on the device, uploaded when the spans change.
// zero_grad: one memset over the spans' whole range after the launch (the gaps between spans are
// alignment padding that no kernel writes).
void CudaBackend::adamw_update_spans(float* param, float* grad, float* m, float* v,
                                     const std::vector<AdamWSpan>& spans, float lr, float beta1,
                                     float beta2, float eps, float grad_scale, int t,
                                     bool zero_grad) {
  float wd = 0.f;  // the one non-zero weight decay (one launch handles two decay factors)
  bool one_wd = true;
  for (const AdamWSpan& sp : spans) {
    if (sp.weight_decay != 0.f && wd != 0.f && sp.weight_decay != wd) one_wd = false;
    if (sp.weight_decay != 0.f) wd = sp.weight_decay;
  }
  bool ascending = true;
  for (size_t k = 1; k < spans.size(); ++k)
    ascending = ascending && spans[k].offset >= spans[k - 1].offset + spans[k - 1].numel;
  if (spans.empty() || !one_wd || !ascending) {
    Backend::adamw_update_spans(param, grad, m, v, spans, lr, beta1, beta2, eps, grad_scale, t, zero_grad);
    return;
  }
  if (!same_spans(spans)) upload_spans(spans);
  const double bc1 = 1.0 - std::pow((double)beta1, t);
  const double bc2 = 1.0 - std::pow((double)beta2, t);
  const float step_size = static_cast<float>((double)lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay_on = 1.0f - lr * wd;
  const float decay_off = 1.0f - lr * 0.0f;
  const size_t n_total = spans.back().offset + spans.back().numel;
  forget_head_wte(param, n_total);
  op(kern::adamw_update_spans(param, grad, m, v, span_start_, span_end_, span_decay_,
                              int(spans.size()), n_total, step_size, bc2_sqrt, decay_on,
                              decay_off, beta1, beta2, eps, grad_scale, stream_,
                              copy_of(param, n_total)),
     "adamw_update");
  if (zero_grad)
    zero(grad + spans.front().offset, (n_total - spans.front().offset) * sizeof(float));
}

bool CudaBackend::same_spans(const std::vector<AdamWSpan>& spans) const {
  if (spans.size() != spans_.size()) return false;
  for (size_t k = 0; k < spans.size(); ++k)
    if (spans[k].offset != spans_[k].offset || spans[k].numel != spans_[k].numel ||
        (spans[k].weight_decay != 0.f) != (spans_[k].weight_decay != 0.f))
      return false;
  return true;
}

void CudaBackend::upload_spans(const std::vector<AdamWSpan>& spans) {
  const size_t n = spans.size();
  std::vector<uint64_t> st(n), en(n);
  std::vector<uint8_t> dec(n);
  for (size_t k = 0; k < n; ++k) {
    st[k] = spans[k].offset;
    en[k] = spans[k].offset + spans[k].numel;
    dec[k] = spans[k].weight_decay != 0.f;
  }
  release(span_start_);
  span_start_ = static_cast<uint64_t*>(alloc(n * 17 + 16));  // start | end | decay
  span_end_ = span_start_ + n;
  span_decay_ = reinterpret_cast<uint8_t*>(span_end_ + n);
  to_device(span_start_, st.data(), n * 8);
  to_device(span_end_, en.data(), n * 8);
  to_device(span_decay_, dec.data(), n);
  spans_ = spans;
}

}  // namespace nlp::cuda
