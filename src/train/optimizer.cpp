#include "train/optimizer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "train/host_adamw.h"

namespace nlp {

namespace {
float* host_zeros(Backend& be, size_t n) {
  auto* p = static_cast<float*>(be.host_alloc(n * sizeof(float)));
  std::memset(p, 0, n * sizeof(float));
  return p;
}
}  // namespace

AdamW::AdamW(ParamStore& ps, Backend& be, const TrainConfig& tc, size_t lo, size_t hi, bool offload)
    : ps_(ps), be_(be), tc_(tc), lo_(lo), hi_(hi), offload_(offload) {
  NLP_ASSERT(lo <= hi && hi <= ps.total());
  const size_t n = std::max<size_t>(hi - lo, 1);  // an empty shard (more ranks than floats) still allocates
  if (offload) {
    m_ = host_zeros(be, n);
    v_ = host_zeros(be, n);
    master_ = host_zeros(be, n);
    host_grad_ = host_zeros(be, n);
    if (ps.data()) load_master();  // train.zero = 3 frees the arena first: loaded once set_params gave the shard
  } else {
    m_ = static_cast<float*>(be.alloc(n * sizeof(float)));
    v_ = static_cast<float*>(be.alloc(n * sizeof(float)));
  }
  for (const auto& s : ps.specs()) {
    const size_t a = std::max(s.offset, lo), b = std::min(s.offset + s.numel, hi);
    if (a < b) spans_.push_back({a - lo, b - a, s.decay ? tc.weight_decay : 0.f});
  }
}

AdamW::~AdamW() {
  if (offload_) {
    for (float* p : {m_, v_, master_, host_grad_}) be_.host_release(p);
    return;
  }
  be_.release(m_);
  be_.release(v_);
}

void AdamW::load_master() {
  if (offload_ && hi_ > lo_) be_.to_host(master_, params(), (hi_ - lo_) * sizeof(float));
}

void AdamW::step(float lr, float grad_scale, int t, bool zero_grad) {
  if (spans_.empty()) return;
  if (offload_) {
    const size_t bytes = (hi_ - lo_) * sizeof(float);
    be_.to_host(host_grad_, grads(), bytes);
    if (zero_grad) be_.zero(grads(), bytes);
    host_adamw_update(master_, host_grad_, m_, v_, spans_, lr, tc_.beta1, tc_.beta2, tc_.adam_eps, grad_scale, t);
    be_.to_device(params(), master_, bytes);
    return;
  }
  be_.adamw_update_spans(params(), grads(), m_, v_, spans_, lr, tc_.beta1, tc_.beta2,
                         tc_.adam_eps, grad_scale, t, zero_grad);
}

void AdamW::download(const float* dev, std::vector<float>& host) const {
  host.resize(hi_ - lo_);
  if (offload_)
    std::memcpy(host.data(), dev, host.size() * sizeof(float));
  else
    be_.to_host(host.data(), dev, host.size() * sizeof(float));
}

void AdamW::read_moment(int which, size_t a, size_t b, float* host) const {
  NLP_ASSERT(lo_ <= a && a <= b && b <= hi_);
  const float* src = (which == 0 ? m_ : v_) + (a - lo_);
  if (offload_)
    std::memcpy(host, src, (b - a) * sizeof(float));
  else if (b > a)
    be_.to_host(host, src, (b - a) * sizeof(float));
}

void AdamW::write_moment(int which, size_t a, size_t b, const float* host) {
  NLP_ASSERT(lo_ <= a && a <= b && b <= hi_);
  float* dst = (which == 0 ? m_ : v_) + (a - lo_);
  if (offload_)
    std::memcpy(dst, host, (b - a) * sizeof(float));
  else if (b > a)
    be_.to_device(dst, host, (b - a) * sizeof(float));
}

void AdamW::upload(float* dev, const std::vector<float>& whole) {
  NLP_ASSERT(whole.size() == ps_.total());
  if (offload_)
    std::memcpy(dev, whole.data() + lo_, (hi_ - lo_) * sizeof(float));
  else
    be_.to_device(dev, whole.data() + lo_, (hi_ - lo_) * sizeof(float));
}

}  // namespace nlp
