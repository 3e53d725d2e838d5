#include "train/optimizer.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

AdamW::AdamW(ParamStore& ps, Backend& be, const TrainConfig& tc, size_t lo, size_t hi)
    : ps_(ps), be_(be), tc_(tc), lo_(lo), hi_(hi) {
  NLP_ASSERT(lo <= hi && hi <= ps.total());
  const size_t n = std::max<size_t>(hi - lo, 1);  // an empty shard (more ranks than floats) still allocates
  m_ = static_cast<float*>(be.alloc(n * sizeof(float)));
  v_ = static_cast<float*>(be.alloc(n * sizeof(float)));
  for (const auto& s : ps.specs()) {
    const size_t a = std::max(s.offset, lo), b = std::min(s.offset + s.numel, hi);
    if (a < b) spans_.push_back({a - lo, b - a, s.decay ? tc.weight_decay : 0.f});
  }
}

AdamW::~AdamW() {
  be_.release(m_);
  be_.release(v_);
}

void AdamW::step(float lr, float grad_scale, int t, bool zero_grad) {
  if (spans_.empty()) return;
  be_.adamw_update_spans(ps_.data() + lo_, ps_.grad() + lo_, m_, v_, spans_, lr, tc_.beta1, tc_.beta2,
                         tc_.adam_eps, grad_scale, t, zero_grad);
}

void AdamW::download(const float* dev, std::vector<float>& host) const {
  host.resize(hi_ - lo_);
  be_.to_host(host.data(), dev, host.size() * sizeof(float));
}

void AdamW::upload(float* dev, const std::vector<float>& whole) {
  NLP_ASSERT(whole.size() == ps_.total());
  be_.to_device(dev, whole.data() + lo_, (hi_ - lo_) * sizeof(float));
}

}  // namespace nlp
