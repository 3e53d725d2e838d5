// The host copier of the CUDA backend (host_copy.h): one non-blocking copy stream and one event per
// started copy (kept and reused step after step). A copy to the host waits on an event recorded on the
// backend's stream when it is started, so it reads what the kernels queued before it wrote; the copy
// stream runs its copies in the order they were started; order_backend makes the backend's stream wait
// on the copy stream's last event.
#include <cuda_runtime_api.h>

#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host_copy.h"
#include "core/error.h"

namespace nlp {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(cat("CUDA host copy: ", what, ": ", cudaGetErrorString(e)));
}

class CudaHostCopier final : public HostCopier {
 public:
  explicit CudaHostCopier(cudaStream_t backend) : be_stream_(backend) {
    ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ck(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming), "cudaEventCreate");
    ck(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaHostCopier() override {
    cudaStreamSynchronize(stream_);  // no copy may still read or write memory freed after this
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaEventDestroy(produced_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int to_host_start(void* host, const void* dev, size_t bytes) override {
    ck(cudaEventRecord(produced_, be_stream_), "cudaEventRecord");
    ck(cudaStreamWaitEvent(stream_, produced_, 0), "cudaStreamWaitEvent");
    if (bytes) ck(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (to host)");
    if (next_ == events_.size()) {
      cudaEvent_t e = nullptr;
      ck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      events_.push_back(e);
    }
    ck(cudaEventRecord(events_[next_], stream_), "cudaEventRecord");
    return static_cast<int>(next_++);
  }
  void to_device_start(void* dev, const void* host, size_t bytes) override {
    if (bytes) ck(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to device)");
  }
  void wait_host(int ticket) override {
    NLP_ASSERT(ticket >= 0 && size_t(ticket) < next_);
    ck(cudaEventSynchronize(events_[size_t(ticket)]), "cudaEventSynchronize");
  }
  void order_backend() override {
    ck(cudaEventRecord(done_, stream_), "cudaEventRecord");
    ck(cudaStreamWaitEvent(be_stream_, done_, 0), "cudaStreamWaitEvent");
    next_ = 0;
  }

 private:
  cudaStream_t be_stream_ = nullptr, stream_ = nullptr;
  cudaEvent_t produced_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> events_;
  size_t next_ = 0;  // the next ticket
};

}  // namespace

std::unique_ptr<HostCopier> make_host_copier(Backend& be) {
  void* s = cuda_backend_stream(be);
  if (!s) return nullptr;
  return std::make_unique<CudaHostCopier>(static_cast<cudaStream_t>(s));
}

}  // namespace nlp
