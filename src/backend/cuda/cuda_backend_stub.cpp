// The CUDA backend factory in builds without CUDA (-DNLPTRAIN_CUDA=OFF or no nvcc).
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace nlp {

std::unique_ptr<Backend> make_cuda_backend(int local_rank, const BackendOptions&) {
  throw Error(cat("run.backend=cuda (local rank ", local_rank,
                  "): nlptrain was built without CUDA (no nvcc, or -DNLPTRAIN_CUDA=OFF); "
                  "use run.backend=cpu or rebuild with the CUDA toolkit"));
}

bool cuda_fused_attention_available(std::string* why) {
  if (why) *why = "nlptrain was built without CUDA";
  return false;
}

CudnnPackedCalls cuda_cudnn_packed_calls() { return {}; }

void* cuda_backend_stream(Backend&) { return nullptr; }

}  // namespace nlp
