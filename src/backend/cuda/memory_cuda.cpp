// CudaBackend (cuda_backend_impl.h): device memory and copies. Memory comes from cudaMallocAsync on
// the backend's stream (the device's default pool, its release threshold raised at construction, so
// freed memory stays cached) and is zeroed; host staging buffers are pinned. to_device and to_host
// synchronise the stream, so a host buffer may be reused as soon as to_device returns and is valid as
// soon as to_host returns. The workspace is the backend's grow-only scratch (device_workspace.h).
#include "backend/cuda/cuda_backend_impl.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nlp::cuda {

void* CudaBackend::alloc(size_t bytes) {
  no_capture("alloc");
  const size_t n = bytes ? bytes : 256;
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, n, stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Error(cat("cuda backend: out of device memory allocating ", bytes, " bytes on GPU ",
                    device_, " (", free_b >> 20, " MiB free of ", total_b >> 20,
                    " MiB): lower train.batch_size or data.seq_len (", cudaGetErrorString(e), ")"));
  }
  ck(cudaMemsetAsync(p, 0, n, stream_), "cudaMemsetAsync(alloc)");
  return p;
}

void CudaBackend::release(void* p) {
  no_capture("release");
  if (p) ck(cudaFreeAsync(p, stream_), "cudaFreeAsync");
}

void CudaBackend::zero(void* p, size_t bytes) {
  forget_ce_stats(p);
  if (bytes) op(cudaMemsetAsync(p, 0, bytes, stream_), "zero");
  weights_written(static_cast<const float*>(p), bytes / sizeof(float));
}

void CudaBackend::to_device(void* dst, const void* host_src, size_t bytes) {
  no_capture("to_device");
  forget_ce_stats(dst);
  if (!bytes) return;
  op(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "to_device");
  weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
  ck(cudaStreamSynchronize(stream_), "to_device (synchronize)");
  after_sync();
}

void* CudaBackend::host_alloc(size_t bytes) {
  no_capture("host_alloc");
  void* p = nullptr;
  ck(cudaMallocHost(&p, bytes), "cudaMallocHost (staging buffer)");
  return p;
}

void CudaBackend::host_release(void* p) {
  no_capture("host_release");
  if (p) cudaFreeHost(p);
}

void CudaBackend::to_host(void* host_dst, const void* src, size_t bytes) {
  no_capture("to_host");
  if (!bytes) return;
  op(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "to_host");
  ck(cudaStreamSynchronize(stream_), "to_host (synchronize)");
  after_sync();
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  forget_ce_stats(dst);
  if (bytes && dst != src)
    op(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  if (dst != src) weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
}

// Scratch that lives until the next call needing more (stream order makes reuse safe).
void* CudaBackend::workspace(size_t bytes) {
  return ws_.get(
      bytes, stream_, [this](size_t, size_t) { no_capture("the workspace would grow"); }, ck);
}

void CudaBackend::after_sync() {
  if (prof_) prof_->collect();
  check_targets();
}

}  // namespace nlp::cuda
