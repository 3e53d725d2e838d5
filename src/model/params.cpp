#include "model/params.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

int ParamStore::add(const std::string& name, std::vector<int64_t> shape, bool decay, bool packed) {
  NLP_ASSERT(params_ == nullptr);
  ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.decay = decay;
  s.numel = 1;
  for (auto d : s.shape) s.numel *= static_cast<size_t>(d);
  // Keep every tensor 16-float aligned (64 bytes) for vector loads.
  s.offset = packed ? total_ : (total_ + 15) / 16 * 16;
  total_ = s.offset + s.numel;
  specs_.push_back(std::move(s));
  return static_cast<int>(specs_.size()) - 1;
}

void ParamStore::allocate(Backend& be, bool grads, bool params) {
  be_ = &be;
  if (params) params_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  if (grads) grads_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  if (params) be.register_weights(params_, total_);  // the persistent bf16 copy, where the backend keeps one
}

void ParamStore::set_upload_window(float* dst, size_t lo, size_t hi) {
  window_ = dst;
  window_lo_ = lo;
  window_hi_ = hi;
}

ParamStore::~ParamStore() {
  if (be_) {
    if (params_) {
      be_->register_weights(params_, 0);  // no bf16 copy outlives its weights
      be_->release(params_);
    }
    if (grads_) be_->release(grads_);
  }
}

namespace {

// Tensor i at p in `map`, the per-tensor pointers that replace the arena's: filled from the arena
// (each tensor at its offset, or null without an arena) at the first mapping.
void map_tensor(std::vector<float*>& map, float* arena, const std::vector<ParamSpec>& specs, int i, float* p) {
  if (map.empty()) {
    map.resize(specs.size());
    for (size_t k = 0; k < specs.size(); ++k) map[k] = arena ? arena + specs[k].offset : nullptr;
  }
  map[static_cast<size_t>(i)] = p;
}

// Before the arena [arena, arena + total) is freed: what still points into it points nowhere.
void unmap_arena(std::vector<float*>& map, const float* arena, size_t total) {
  for (float*& p : map)
    if (p >= arena && p < arena + total) p = nullptr;
}

}  // namespace

void ParamStore::map_grad(int i, float* p) { map_tensor(gmap_, grads_, specs_, i, p); }

void ParamStore::release_grads() {
  if (!grads_) return;
  unmap_arena(gmap_, grads_, total_);
  be_->release(grads_);
  grads_ = nullptr;
}

void ParamStore::map_param(int i, float* p) { map_tensor(pmap_, params_, specs_, i, p); }

void ParamStore::release_params() {
  if (!params_) return;
  unmap_arena(pmap_, params_, total_);
  be_->register_weights(params_, 0);
  be_->release(params_);
  params_ = nullptr;
}

int ParamStore::index(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  throw Error(cat("internal error: no parameter named '", name, "'"));
}

std::vector<NamedTensor> ParamStore::host_views(std::vector<float>& host) const {
  host.resize(total_);
  std::vector<NamedTensor> v;
  v.reserve(specs_.size());
  for (const auto& s : specs_) v.push_back(NamedTensor{s.name, s.shape, host.data() + s.offset});
  return v;
}

void ParamStore::download(std::vector<float>& host) const {
  if (!params_)
    throw Error("internal error: the parameter arena was released (train.zero = 3 keeps only shards); "
                "the whole parameters are not on this rank");
  host.resize(total_);
  be_->to_host(host.data(), params_, total_ * sizeof(float));
}

void ParamStore::upload(const std::vector<float>& host) {
  NLP_ASSERT(host.size() == total_);
  if (!params_)
    throw Error("internal error: the parameter arena was released (train.zero = 3 keeps only shards)");
  be_->to_device(params_, host.data(), total_ * sizeof(float));
}

void ParamStore::upload_tensor(int i, const float* host) {
  if (!params_ && window_) {  // train.zero = 3's initialisation: this rank's part only
    const ParamSpec& s = specs_[static_cast<size_t>(i)];
    const size_t a = std::max(s.offset, window_lo_), b = std::min(s.offset + s.numel, window_hi_);
    if (a < b) be_->to_device(window_ + (a - window_lo_), host + (a - s.offset), (b - a) * sizeof(float));
    return;
  }
  if (!params_)
    throw Error("internal error: the parameter arena was released (train.zero = 3 keeps only shards)");
  be_->to_device(p(i), host, specs_[static_cast<size_t>(i)].numel * sizeof(float));
}

}  // namespace nlp
