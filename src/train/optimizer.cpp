#include "train/optimizer.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/host_copy.h"
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
    copier_ = make_host_copier(be);  // cuda: the pipelined step below; null elsewhere
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
  copier_.reset();  // its copies complete before the host buffers go
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
  if (offload_ && copier_) {
    step_pipelined(lr, grad_scale, t, zero_grad);
    return;
  }
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

void AdamW::grads_final(size_t a, size_t b) {
  if (!copier_ || a >= b) return;
  NLP_ASSERT(lo_ <= a && b <= hi_);
  const size_t x = a - lo_, y = b - lo_;
  for (const Early& e : early_)
    if (x < e.b && e.a < y) {
      early_.clear();
      break;
    }
  early_.push_back({x, y, copier_->to_host_start(host_grad_ + x, grads() + x, (y - x) * sizeof(float))});
}

// The offloaded step on cuda: with ZeRO-2 and 3 the gradients went to the host region by region as the
// last micro-batch's backward completed them (grads_final); otherwise every chunk's gradients start
// to the host now (the copy stream runs them in order, after the kernels queued so far). The host
// updates each piece as it arrives (the later ones still copying) and starts its weights back, so
// the copies both ways overlap the host AdamW. The backend's stream then waits for the copies on the
// GPU, not the host: the next kernels, the bf16 copy's rounding (weights_written) and the zeroing of
// the gradients queue behind them. The
// elements and their arithmetic are those of one host_adamw_update over the shard, so the result is
// bitwise the synchronous path's. master_ is written again only after a later ticket's wait (the
// next step's first chunk to the host, queued behind this step's copies back).
void AdamW::step_pipelined(float lr, float grad_scale, int t, bool zero_grad) {
  const size_t n = hi_ - lo_;
  // the pieces in the order their copies were started: grads_final's when they tile [0, n), else chunks
  std::vector<Early> pieces = early_;
  early_.clear();
  {
    std::vector<Early> sorted = pieces;
    std::sort(sorted.begin(), sorted.end(), [](const Early& p, const Early& q) { return p.a < q.a; });
    size_t at = 0;
    for (const Early& e : sorted) at = e.a == at ? e.b : n + 1;
    if (at != n) pieces.clear();
  }
  if (pieces.empty())
    for (size_t a = 0; a < n; a += kOffloadChunk) {
      const size_t b = std::min(n, a + kOffloadChunk);
      pieces.push_back({a, b, copier_->to_host_start(host_grad_ + a, grads() + a, (b - a) * sizeof(float))});
    }
  std::vector<Backend::AdamWSpan> part;
  for (const Early& pc : pieces) {
    const size_t a = pc.a, b = pc.b;
    part.clear();  // the spans clipped to [a, b), relative to a
    for (const auto& sp : spans_) {
      const size_t x = std::max(sp.offset, a), y = std::min(sp.offset + sp.numel, b);
      if (x < y) part.push_back({x - a, y - x, sp.weight_decay});
    }
    copier_->wait_host(pc.ticket);
    if (!part.empty())
      host_adamw_update(master_ + a, host_grad_ + a, m_ + a, v_ + a, part, lr, tc_.beta1, tc_.beta2, tc_.adam_eps,
                        grad_scale, t);
    copier_->to_device_start(params() + a, master_ + a, (b - a) * sizeof(float));
  }
  copier_->order_backend();
  be_.weights_written(params(), n);  // the copies wrote past the backend: its bf16 copy (core/backend.h)
  if (zero_grad) be_.zero(grads(), n * sizeof(float));
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
