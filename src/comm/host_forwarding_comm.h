// A communicator whose host-side calls are another's: the ranks, the sums and broadcast of host
// memory, the gather to one rank and the barrier go to `host` (MPI). The staged
// (comm_staged.cpp) and NCCL (nccl/comm_nccl.cpp) communicators derive from it and implement only
// the sums of backend memory and the abort.
#pragma once
#include <cstddef>

#include "comm/comm.h"

namespace nlp {

class HostForwardingComm : public Comm {
 public:
  explicit HostForwardingComm(Comm& host) : host_(host) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  int local_rank() const override { return host_.local_rank(); }
  int local_size() const override { return host_.local_size(); }
  void allreduce_sum_host(double* buf, size_t n) override { host_.allreduce_sum_host(buf, n); }
  void broadcast_host(void* buf, size_t bytes, int root) override { host_.broadcast_host(buf, bytes, root); }
  void gather_host(const float* mine, float* all, const ShardLayout& sh, int root) override {
    host_.gather_host(mine, all, sh, root);
  }
  void barrier() override { host_.barrier(); }

 protected:
  Comm& host_;  // not owned
};

}  // namespace nlp
