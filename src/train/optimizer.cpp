#include "train/optimizer.h"

namespace nlp {

AdamW::AdamW(ParamStore& ps, Backend& be, const TrainConfig& tc) : ps_(ps), be_(be), tc_(tc) {
  m_ = static_cast<float*>(be.alloc(ps.total() * sizeof(float)));
  v_ = static_cast<float*>(be.alloc(ps.total() * sizeof(float)));
}

AdamW::~AdamW() {
  be_.release(m_);
  be_.release(v_);
}

void AdamW::step(float lr, float grad_scale, int t) {
  if (spans_.empty())
    for (const auto& s : ps_.specs())
      spans_.push_back({s.offset, s.numel, s.decay ? tc_.weight_decay : 0.f});
  be_.adamw_update_spans(ps_.data(), ps_.grad(), m_, v_, spans_, lr, tc_.beta1, tc_.beta2,
                         tc_.adam_eps, grad_scale, t);
}

std::vector<NamedTensor> AdamW::host_views(float* dev, std::vector<float>& host) const {
  download(dev, host);
  std::vector<NamedTensor> v;
  for (const auto& s : ps_.specs()) v.push_back(NamedTensor{s.name, s.shape, host.data() + s.offset});
  return v;
}

void AdamW::download(const float* dev, std::vector<float>& host) const {
  host.resize(ps_.total());
  be_.to_host(host.data(), dev, ps_.total() * sizeof(float));
}

void AdamW::upload(float* dev, const std::vector<float>& host) {
  be_.to_device(dev, host.data(), ps_.total() * sizeof(float));
}

}  // namespace nlp
