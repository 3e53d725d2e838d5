// A Backend that sits in front of another and passes every op on (core/backend_ops.def), with the
// profiling calls and the bf16 weight copy's; a wrapper derives from it and overrides only what it
// intercepts (step_graph.h: the recording of a micro-batch; op_account_backend.h: run.profile's
// account). A wrapper records no graphs of its own: the capture calls keep Backend's defaults.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"

namespace nlp {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}
  Backend& inner() { return in_; }

  std::string name() const override { return in_.name(); }
  std::string details() const override { return in_.details(); }
  void set_profiling(bool on) override { in_.set_profiling(on); }
  std::string profile_report() override { return in_.profile_report(); }
  void profile_label(const char* label) override { in_.profile_label(label); }
  std::vector<ProfileTime> profile_times() override { return in_.profile_times(); }
  void register_weights(const float* arena, size_t n) override { in_.register_weights(arena, n); }
  void weights_written(const float* p, size_t n) override { in_.weights_written(p, n); }
  const uint16_t* bf16_weights() const override { return in_.bf16_weights(); }
  bool path_counts(PathCounts* out) const override { return in_.path_counts(out); }

#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  ret name params override { return in_.name args; }
#include "core/backend_ops.def"

 protected:
  Backend& in_;
};

}  // namespace nlp
