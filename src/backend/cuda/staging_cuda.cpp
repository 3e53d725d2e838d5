// CudaBackend (cuda_backend_impl.h): the dispatch of the ops on typed views (core/tensor.h) that every
// ops_<family>_cuda.cpp follows, and the staged bf16 path (Stage).
// fp32 views run the fp32 ops of their family (the GPU-verified path) on their own memory; an fp32
// gradient marked overwrite is zeroed first and then accumulated into. Any bf16 view: the native
// bf16 kernels where an op has them and NLPTRAIN_CUDA_BF16_ACTS is native (the default), else
// staged: each bf16 input widened into an fp32 staging buffer, the fp32 op run, and each bf16
// output rounded back (kern::to_bf16, round to nearest even), so the tensor is stored in bf16 at
// the points the CPU backend rounds (cpu/staged.h). Neither bf16 way has run on a GPU yet.
// Native: kernels/bf16_*.cu (kernels.cuh, "bf16 storage"), used when every non-null view of the op
// is bf16 (native_bf16_views); a gradient's overwrite flag becomes the launcher's accumulate = false.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <vector>

namespace nlp::cuda {

// ---- Stage: fp32 stand-ins for one op's views ----
const float* CudaBackend::Stage::in(CAct v, size_t n) {
  check_fits(v, n, what_);
  if (!v.p || v.f32()) return static_cast<const float*>(v.p);
  float* s = b_.stage_buf(k_++, n);
  b_.op(kern::from_bf16(s, v.p, n, b_.stream_), what_);
  ++b_.to32_;
  return s;
}

void CudaBackend::Stage::finish() {
  for (const Back& o : back_) b_.op(kern::to_bf16(o.dst, o.src, o.n, b_.stream_), what_);
  b_.to16_ += int64_t(back_.size());
  back_.clear();
}

float* CudaBackend::Stage::stand_in(Act v, size_t n, bool accumulate) {
  check_fits(v, n, what_);
  if (!v.p) return nullptr;
  if (v.f32()) return accumulate ? b_.acc_f32(v, n) : v.fp();
  float* s = b_.stage_buf(k_++, n);
  if (accumulate && !v.write) {
    b_.op(kern::from_bf16(s, v.p, n, b_.stream_), what_);
    ++b_.to32_;
  } else if (accumulate)
    b_.zero(s, n * sizeof(float));
  back_.push_back(Back{v.p, s, n});
  return s;
}

// An fp32 gradient view as the fp32 ops take it (they accumulate): zeroed first when the view
// says overwrite.
float* CudaBackend::acc_f32(Act v, size_t n) {
  if (v.write && v.p) zero(v.p, n * sizeof(float));
  return v.fp();
}

bool CudaBackend::native_bf16_views(std::initializer_list<CAct> views) const {
  if (!native_bf16()) return false;
  for (const CAct& v : views)
    if (v.p && v.dt != DType::BF16) return false;
  return true;
}

// Staging buffer k, grown to n floats (never while recording).
float* CudaBackend::stage_buf(size_t k, size_t n) {
  if (stage_.size() <= k) stage_.resize(k + 1, {nullptr, 0});
  auto& [p, cap] = stage_[k];
  if (n > cap) {
    no_capture("a bf16 staging buffer would grow");
    ++grows_;
    release(p);
    p = nullptr;
    cap = 0;
    p = static_cast<float*>(alloc(n * sizeof(float)));
    cap = n;
  }
  return p;
}

// Elements of a [rows, stride] tensor that row ops over n rows of width C read (see rows_gather).
size_t CudaBackend::strided_extent(int n, int C, size_t stride, const int32_t* idx) {
  if (n <= 0) return 0;
  size_t rows = size_t(n);
  if (idx) {
    std::vector<int32_t> h(static_cast<size_t>(n));
    to_host(h.data(), idx, h.size() * sizeof(int32_t));
    for (int32_t r : h) rows = std::max(rows, size_t(r) + 1);
  }
  return (rows - 1) * stride + size_t(C);
}

}  // namespace nlp::cuda
