// Per-op GPU time for the CUDA backend (run.profile): an event is recorded on the backend's stream
// after every op; the time between two consecutive events is charged to the op that ended second.
// Ops run in stream order, so the charges add up to the stream's busy time plus the gaps in which the
// GPU waited for the host (launch overhead, host synchronisation): those gaps land on the op launched
// after them, which is where a host-bound step shows up. No synchronisation is added: events are read
// when the stream is synchronised anyway (collect(), called from the backend's synchronize()).
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

namespace nlp::cuda {

class OpProfile {
 public:
  explicit OpProfile(cudaStream_t s) : stream_(s) {}
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // After an op's launch: charge it the time since the previous mark.
  void mark(const char* op);
  // The stream is synchronised: turn the pending events into charges (events are reused).
  void collect();
  // Table of ops by total time: total ms, share, calls, mean us per call; empty when nothing ran.
  std::string report();
  // Total ms and calls per op name so far (synchronises the stream first): run.profile's account.
  std::vector<std::pair<std::string, std::pair<double, long>>> times();

 private:
  struct Stat {
    double ms = 0;
    long calls = 0;
  };
  cudaEvent_t event();

  cudaStream_t stream_;
  std::vector<cudaEvent_t> free_;
  std::vector<std::pair<const char*, cudaEvent_t>> pending_;
  cudaEvent_t last_ = nullptr;  // the newest collected event (the start of the next charge)
  std::map<std::string, Stat> stats_;
};

}  // namespace nlp::cuda
