#include "model/params.h"

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

void ParamStore::allocate(Backend& be) {
  be_ = &be;
  params_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  grads_ = static_cast<float*>(be.alloc(total_ * sizeof(float)));
  be.register_weights(params_, total_);  // the persistent bf16 copy, where the backend keeps one
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

void ParamStore::map_grad(int i, float* p) {
  if (gmap_.empty()) {
    gmap_.resize(specs_.size());
    for (size_t k = 0; k < specs_.size(); ++k) gmap_[k] = grads_ ? grads_ + specs_[k].offset : nullptr;
  }
  gmap_[static_cast<size_t>(i)] = p;
}

void ParamStore::release_grads() {
  if (!grads_) return;
  for (float*& p : gmap_)  // what still points into the arena points nowhere
    if (p >= grads_ && p < grads_ + total_) p = nullptr;
  be_->release(grads_);
  grads_ = nullptr;
}

void ParamStore::map_param(int i, float* p) {
  if (pmap_.empty()) {
    pmap_.resize(specs_.size());
    for (size_t k = 0; k < specs_.size(); ++k) pmap_[k] = params_ ? params_ + specs_[k].offset : nullptr;
  }
  pmap_[static_cast<size_t>(i)] = p;
}

void ParamStore::release_params() {
  if (!params_) return;
  for (float*& p : pmap_)
    if (p >= params_ && p < params_ + total_) p = nullptr;
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
  if (!params_)
    throw Error("internal error: the parameter arena was released (train.zero = 3 keeps only shards)");
  be_->to_device(p(i), host, specs_[static_cast<size_t>(i)].numel * sizeof(float));
}

}  // namespace nlp
