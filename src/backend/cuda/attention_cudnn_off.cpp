// attention_cudnn.h in CUDA builds without the cuDNN frontend (CMake did not find cudnn_frontend.h,
// cudnn.h or libcudnn, or -DNLPTRAIN_CUDNN=OFF): nothing runs; the factory reports why
// (make_cuda_backend with fused_attention on throws before constructing a CudnnAttention).
#include "backend/cuda/attention_cudnn.h"

#include "core/error.h"

#ifndef NLPTRAIN_CUDNN_MISSING
#define NLPTRAIN_CUDNN_MISSING "cuDNN support was not configured"
#endif

namespace nlp::cuda {

bool cudnn_attention_compiled(std::string* why) {
  if (why) *why = NLPTRAIN_CUDNN_MISSING;
  return false;
}

void cudnn_packed_calls(long* ragged, long* bias) { *ragged = *bias = 0; }

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(cudaStream_t) {
  throw Error(cat("cuDNN attention: not compiled in (", NLPTRAIN_CUDNN_MISSING, ")"));
}

CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::supports(int, int, int, int) { return false; }

void CudnnAttention::forward(float*, float*, const float*, const int32_t*, bool, int, bool, float,
                             uint64_t, const uint64_t*, int, int, int, int) {
  throw Error("cuDNN attention: not compiled in");
}

void CudnnAttention::backward(float*, float*, const float*, const float*, const int32_t*, bool, int,
                              bool, float, uint64_t, const uint64_t*, int, int, int, int) {
  throw Error("cuDNN attention: not compiled in");
}

void CudnnAttention::forward_bf16(void*, float*, const void*, const int32_t*, bool, int, bool, float,
                                  uint64_t, const uint64_t*, int, int, int, int) {
  throw Error("cuDNN attention: not compiled in");
}

void CudnnAttention::backward_bf16(void*, bool, float*, const void*, const void*, const void*,
                                   const float*, const int32_t*, bool, int, bool, float, uint64_t,
                                   const uint64_t*, int, int, int, int) {
  throw Error("cuDNN attention: not compiled in");
}

long CudnnAttention::grows() const { return 0; }
long CudnnAttention::builds() const { return 0; }

}  // namespace nlp::cuda
