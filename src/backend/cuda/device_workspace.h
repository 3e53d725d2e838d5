// A grow-only device buffer on one stream: scratch that a call reuses as long as it fits and that is
// reallocated (stream-ordered free, then a stream-ordered allocation rounded up to a whole MiB) when
// a call needs more. Stream order makes reuse by the next call safe. Its pointer changes only when it
// grows, so a CUDA graph recorded before a growth points into freed memory: each owner refuses to grow
// while its stream is captured (the `refuse` callback) and counts the growths (grows()) so that a
// replay after one can be refused. Used by the CUDA backend's workspace, the GEMM's bf16 operand
// scratch and cuDNN attention's workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace nlp::cuda {

class DeviceWorkspace {
 public:
  // `name` for the error messages of the two calls ("cudaFreeAsync(<name>)", "cudaMallocAsync(<name>)")
  explicit DeviceWorkspace(const char* name)
      : free_what_(std::string("cudaFreeAsync(") + name + ")"),
        malloc_what_(std::string("cudaMallocAsync(") + name + ")") {}
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;

  // At least `bytes` on `stream`. When the buffer must grow: refuse(held, bytes) first (it throws
  // when growing is not allowed now), then the growth is counted, the old buffer freed and the new
  // one allocated, each call's error passed to check(error, what) (which throws on failure).
  template <typename Refuse, typename Check>
  void* get(size_t bytes, cudaStream_t stream, Refuse&& refuse, Check&& check) {
    if (bytes <= bytes_) return p_;
    refuse(bytes_, bytes);
    ++grows_;
    if (p_) check(cudaFreeAsync(p_, stream), free_what_.c_str());
    p_ = nullptr;
    bytes_ = 0;
    const size_t mib = size_t(1) << 20;
    const size_t n = (bytes + mib - 1) / mib * mib;
    check(cudaMallocAsync(&p_, n, stream), malloc_what_.c_str());
    bytes_ = n;
    return p_;
  }
  // Frees the buffer (stream-ordered, errors ignored: for destructors).
  void free_async(cudaStream_t stream) {
    if (p_) cudaFreeAsync(p_, stream);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }
  size_t grows() const { return grows_; }  // reallocations so far

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  size_t grows_ = 0;
  std::string free_what_, malloc_what_;
};

}  // namespace nlp::cuda
