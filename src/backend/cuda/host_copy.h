// Copies between backend memory and page-locked host memory on their own CUDA stream, ordered against
// the CUDA backend's stream by events (as the NCCL communicator orders its collectives), so that they
// run while the backend's stream computes and while the host computes. train.offload = optimizer uses
// it to pipeline its step on cuda (train/optimizer.h): the gradient shard to the host in chunks, the
// host AdamW on each chunk as it arrives, the updated weights back, none of it blocking the backend's
// stream. Implemented in host_copy_cuda.cpp; make_host_copier gives null for any other backend (and in
// builds without CUDA, host_copy_stub.cpp), whose callers keep their synchronous to_host / to_device.
#pragma once
#include <cstddef>
#include <memory>

#include "core/backend.h"

namespace nlp {

class HostCopier {
 public:
  virtual ~HostCopier() = default;
  // Starts copying `bytes` from backend memory to host memory (page-locked: Backend::host_alloc) after
  // the work queued so far on the backend's stream; returns a ticket for wait_host. `host` is valid
  // once wait_host(ticket) returns.
  virtual int to_host_start(void* host, const void* dev, size_t bytes) = 0;
  // Starts copying host memory to backend memory after the copies started before it; `host` must not
  // change until a later ticket's wait_host or the backend's stream is ordered after it and has run.
  virtual void to_device_start(void* dev, const void* host, size_t bytes) = 0;
  // Blocks the host until the copy with this ticket (and every copy started before it) is complete.
  virtual void wait_host(int ticket) = 0;
  // The backend's stream waits (on the GPU, the host goes on) for every copy started so far; the
  // tickets start again from 0.
  virtual void order_backend() = 0;
};

// The copier of a CUDA backend; null for any other backend.
std::unique_ptr<HostCopier> make_host_copier(Backend& be);

}  // namespace nlp
