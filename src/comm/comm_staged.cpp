// The staged communicator (comm.gpu = staged): gradient sums copy backend memory to a host buffer
// (page-locked on the CUDA backend), sum it with the inner (MPI) communicator and copy it back, in
// chunks. It needs nothing but MPI, so it serves builds without NCCL and several ranks sharing one
// GPU (which NCCL refuses). Overlapped buckets: allreduce_sum_start copies the bucket to its own host
// buffer (on the CUDA backend to_host waits for the kernels queued so far, which is what orders the
// copy after the kernels that produced the gradients) and starts the inner non-blocking sum;
// allreduce_wait waits for them and copies every bucket back (with ZeRO-1, this rank's part of it).
#include "comm/comm.h"
#include "comm/host_forwarding_comm.h"
#include "core/backend.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace nlp {
namespace {

class StagedComm final : public HostForwardingComm {
 public:
  StagedComm(Comm& inner, Backend& be, size_t chunk) : HostForwardingComm(inner), be_(be), chunk_(std::max<size_t>(chunk, 1)) {}
  ~StagedComm() override {
    for (auto& b : bufs_) be_.host_release(b.host);
  }

  [[noreturn]] void abort(int code) override {
    host_.abort(code);
    std::_Exit(code);  // not reached
  }

  void allreduce_sum(float* buf, size_t n) override {
    if (size() == 1) return;
    float* host = buffer(0, std::min(n, chunk_));
    for (size_t off = 0; off < n; off += chunk_) {
      const size_t cnt = std::min(chunk_, n - off);
      be_.to_host(host, buf + off, cnt * sizeof(float));
      host_.allreduce_sum(host, cnt);
      be_.to_device(buf + off, host, cnt * sizeof(float));
    }
  }

  void allreduce_sum_start(float* buf, size_t n) override {
    if (size() == 1 || n == 0) return;
    float* host = buffer(started_.size() + 1, n);  // buffer 0 is the blocking path's
    be_.to_host(host, buf, n * sizeof(float));
    host_.allreduce_sum_start(host, n);
    started_.push_back({buf, host, n});
  }
  // A ZeRO-1 bucket: all of it to its own host buffer (every rank contributes to every part), only
  // this rank's part back at the wait.
  void reduce_scatter_sum_start(float* bucket, size_t lo, size_t n, const ShardLayout& sh) override {
    if (size() == 1 || n == 0) return;
    float* host = buffer(started_.size() + 1, n);
    be_.to_host(host, bucket, n * sizeof(float));
    host_.reduce_scatter_sum_start(host, lo, n, sh);
    const auto [a, b] = sh.part(rank(), lo, lo + n);
    started_.push_back({bucket + (a - lo), host + (a - lo), b - a});
  }
  void progress() override { host_.progress(); }

  // ZeRO-1 through host memory: the whole arena goes to the host for the reduce-scatter (MPI needs
  // every rank's full contribution) and only this rank's range comes back; for the all-gather only
  // this rank's range goes to the host and the whole arena comes back. Buffer 0 (the blocking path's).
  void reduce_scatter_sum(float* buf, const ShardLayout& sh) override {
    if (size() == 1) return;
    float* host = buffer(0, sh.total);
    be_.to_host(host, buf, sh.total * sizeof(float));
    host_.reduce_scatter_sum(host, sh);
    const size_t lo = sh.lo(rank());
    be_.to_device(buf + lo, host + lo, sh.count[rank()] * sizeof(float));
  }
  void all_gather(float* buf, const ShardLayout& sh) override {
    if (size() == 1) return;
    float* host = buffer(0, sh.total);
    const size_t lo = sh.lo(rank());
    be_.to_host(host + lo, buf + lo, sh.count[rank()] * sizeof(float));
    host_.all_gather(host, sh);
    be_.to_device(buf, host, sh.total * sizeof(float));
  }
  void allreduce_wait() override {
    host_.allreduce_wait();
    for (const auto& s : started_) be_.to_device(s.dev, s.host, s.n * sizeof(float));
    started_.clear();
  }

 private:
  struct HostBuf {
    float* host = nullptr;
    size_t cap = 0;
  };
  struct Started {
    float* dev;
    float* host;
    size_t n;
  };
  // Host buffer i with room for n floats (buffers are reused step after step, grown when needed;
  // buffer i is never in use when it is asked for: the previous step's wait released it).
  float* buffer(size_t i, size_t n) {
    if (bufs_.size() <= i) bufs_.resize(i + 1);
    HostBuf& b = bufs_[i];
    if (b.cap < n) {
      be_.host_release(b.host);
      b.host = nullptr;
      b.host = static_cast<float*>(be_.host_alloc(n * sizeof(float)));
      b.cap = n;
    }
    return b.host;
  }

  Backend& be_;
  size_t chunk_;
  std::vector<HostBuf> bufs_;
  std::vector<Started> started_;
};

}  // namespace

std::unique_ptr<Comm> make_staged_comm(Comm& inner, Backend& be, size_t chunk_floats) {
  return std::make_unique<StagedComm>(inner, be, chunk_floats);
}

}  // namespace nlp
