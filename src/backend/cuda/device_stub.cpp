// CUDA device discovery for builds without CUDA (-DNLPTRAIN_CUDA=OFF or no nvcc).
#include "backend/cuda/device.h"

namespace nlp {

bool cuda_compiled() { return false; }

int cuda_device_count(std::string* why_none) {
  if (why_none) *why_none = "nlptrain was built without CUDA (no nvcc, or -DNLPTRAIN_CUDA=OFF)";
  return 0;
}

std::string cuda_device_description(int) { return "none"; }

bool cuda_mem_info(int, size_t*, size_t*) { return false; }

}  // namespace nlp
