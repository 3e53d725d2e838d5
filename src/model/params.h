// Parameters and their gradients: one contiguous arena each in backend memory (as in llm.c), so that
// gradients are allreduced in one call and the optimizer walks one buffer. Each tensor keeps its
// Hugging Face state_dict name and shape, which is what the HDF5 weights and checkpoints use.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "io/weights.h"

namespace nlp {

struct ParamSpec {
  std::string name;            // HF state_dict key, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // HF shape
  bool decay = true;           // AdamW weight decay applies (false for biases and LayerNorm)
  size_t offset = 0;           // element offset into the arenas
  size_t numel = 0;
};

class ParamStore {
 public:
  // Register a tensor before allocate(); returns its index. packed = placed immediately after the
  // previous tensor (no alignment gap), so that e.g. BERT's query/key/value form one [3C, C] matrix.
  int add(const std::string& name, std::vector<int64_t> shape, bool decay, bool packed = false);
  // params and grads arenas, zeroed; grads = false: no gradient arena (as after release_grads);
  // params = false: no parameter arena either (train.zero = 3 initialising into its shards)
  void allocate(Backend& be, bool grads = true, bool params = true);
  // train.zero = 3's initialisation into this rank's shard (train/param_shards.h): while set, and
  // without a parameter arena, upload_tensor keeps only the tensor's part in arena [lo, hi), written
  // to dst + (offset - lo). dst = nullptr unsets it.
  void set_upload_window(float* dst, size_t lo, size_t hi);
  ~ParamStore();

  const std::vector<ParamSpec>& specs() const { return specs_; }
  size_t total() const { return total_; }
  float* data() { return params_; }
  float* grad() { return grads_; }
  float* p(int i) { return pmap_.empty() ? params_ + specs_[i].offset : pmap_[i]; }
  float* g(int i) { return gmap_.empty() ? grads_ + specs_[i].offset : gmap_[i]; }
  // train.zero = 2 (train/grad_shards.h): tensor i's gradient lives at p instead of in the arena.
  void map_grad(int i, float* p);
  // Frees the gradient arena: grad() is null afterwards and every tensor's gradient must be mapped.
  void release_grads();
  // train.zero = 3 (train/param_shards.h): tensor i's parameters live at p instead of in the arena.
  void map_param(int i, float* p);
  // Frees the parameter arena (and its bf16 copy): data() is null afterwards, every tensor's
  // parameters must be mapped, and download/upload throw.
  void release_params();
  bool params_released() const { return params_ == nullptr && be_ != nullptr; }
  int index(const std::string& name) const;  // throws when unknown

  // Host copies in HF layout for I/O: fills `host` (resized to total()) and returns views into it.
  std::vector<NamedTensor> host_views(std::vector<float>& host) const;
  void download(std::vector<float>& host) const;           // backend -> host, all params
  void upload(const std::vector<float>& host);             // host -> backend, all params
  void upload_tensor(int i, const float* host);            // host -> backend, tensor i (numel floats)

 private:
  Backend* be_ = nullptr;
  std::vector<ParamSpec> specs_;
  size_t total_ = 0;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::vector<float*> gmap_;  // map_grad's pointers (empty: the arena's)
  std::vector<float*> pmap_;  // map_param's pointers (empty: the arena's)
  float* window_ = nullptr;   // set_upload_window's
  size_t window_lo_ = 0, window_hi_ = 0;
};

}  // namespace nlp
