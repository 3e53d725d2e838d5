// CUDA device discovery (built when nvcc is found).
#include <cuda_runtime.h>

#include <cstdio>

#include "backend/cuda/device.h"

namespace nlp {

bool cuda_compiled() { return true; }

int cuda_device_count(std::string* why_none) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // cudaErrorNoDevice / cudaErrorInsufficientDriver (no driver on this machine): no device.
    if (why_none) *why_none = cudaGetErrorString(err);
    cudaGetLastError();
    return 0;
  }
  if (n == 0 && why_none) *why_none = "no CUDA device found";
  return n;
}

std::string cuda_device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "unknown CUDA device";
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %.1f GiB, sm_%d%d", p.name,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
  return buf;
}

bool cuda_mem_info(int index, size_t* free_bytes, size_t* total_bytes) {
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return false;
  if (cudaSetDevice(index) != cudaSuccess) return false;
  const bool ok = cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
  cudaSetDevice(prev);
  if (!ok) cudaGetLastError();
  return ok;
}

}  // namespace nlp
