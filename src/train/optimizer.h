// AdamW with decoupled weight decay (torch.optim.AdamW), parameter groups by the HF Trainer rule:
// no decay on biases and LayerNorm weights (ParamSpec::decay). Moments live in backend memory,
// laid out like the parameter arena.
#pragma once
#include <vector>

#include "config/config.h"
#include "core/backend.h"
#include "io/weights.h"
#include "model/params.h"

namespace nlp {

class AdamW {
 public:
  AdamW(ParamStore& ps, Backend& be, const TrainConfig& tc);
  ~AdamW();
  // One update with learning rate lr; gradients are multiplied by grad_scale (clipping) first.
  // t is the 1-based step count used for bias correction.
  void step(float lr, float grad_scale, int t);

  float* exp_avg() { return m_; }
  float* exp_avg_sq() { return v_; }
  // Host copies of the moments as named tensors (for checkpoints), and back.
  std::vector<NamedTensor> host_views(float* dev, std::vector<float>& host) const;
  void download(const float* dev, std::vector<float>& host) const;
  void upload(float* dev, const std::vector<float>& host);

 private:
  ParamStore& ps_;
  Backend& be_;
  TrainConfig tc_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  std::vector<Backend::AdamWSpan> spans_;  // one per parameter tensor, with its weight decay
};

}  // namespace nlp
