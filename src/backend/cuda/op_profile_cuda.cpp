#include "backend/cuda/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace nlp::cuda {

OpProfile::~OpProfile() {
  for (auto& [op, e] : pending_) cudaEventDestroy(e);
  for (auto e : free_) cudaEventDestroy(e);
  if (last_) cudaEventDestroy(last_);
}

cudaEvent_t OpProfile::event() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) throw Error("run.profile: cudaEventCreate failed");
  return e;
}

void OpProfile::mark(const char* op) {
  cudaEvent_t e = event();
  cudaEventRecord(e, stream_);
  pending_.emplace_back(op, e);
}

void OpProfile::collect() {
  for (auto& [op, e] : pending_) {
    if (last_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, last_, e) == cudaSuccess) {
        Stat& s = stats_[op];
        s.ms += ms;
        s.calls += 1;
      }
      free_.push_back(last_);
    }
    last_ = e;
  }
  pending_.clear();
}

std::vector<std::pair<std::string, std::pair<double, long>>> OpProfile::times() {
  cudaStreamSynchronize(stream_);
  collect();
  std::vector<std::pair<std::string, std::pair<double, long>>> v;
  for (const auto& [k, s] : stats_) v.push_back({k, {s.ms, s.calls}});
  return v;
}

std::string OpProfile::report() {
  cudaStreamSynchronize(stream_);
  collect();
  if (stats_.empty()) return {};
  std::vector<std::pair<std::string, Stat>> v(stats_.begin(), stats_.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (auto& [k, s] : v) total += s.ms;
  std::string out = "profile (run.profile): GPU time per op, stream order, host gaps charged to the next op\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-34s %10s %6s %8s %10s\n", "op", "total ms", "share", "calls", "us/call");
  out += line;
  for (auto& [k, s] : v) {
    std::snprintf(line, sizeof line, "  %-34s %10.2f %5.1f%% %8ld %10.1f\n", k.c_str(), s.ms,
                  100.0 * s.ms / total, s.calls, 1000.0 * s.ms / double(s.calls));
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-34s %10.2f", "total", total);
  out += line;
  return out;
}

}  // namespace nlp::cuda
