// AdamW with decoupled weight decay (torch.optim.AdamW), parameter groups by the HF Trainer rule:
// no decay on biases and LayerNorm weights (ParamSpec::decay). Moments live in backend memory.
//
// An AdamW owns the range [lo, hi) of the parameter arena: the whole arena without ZeRO, this rank's
// shard with train.zero = 1 (comm/shard.h). Its moments hold hi - lo floats, laid out like that range
// of the arena, and step() updates only that range of the parameters (from the same range of the
// gradients); the caller all-gathers the parameters afterwards.
//
// offload (train.offload = optimizer): the range's fp32 master weights, m and v live in host memory
// (Backend::host_alloc: page-locked on a GPU); step() copies the range's gradients to the host, runs
// the host AdamW there (train/host_adamw.h: bitwise the CPU backend's update) and copies the updated
// weights back into the parameter arena (which rounds its bf16 copy, core/backend.h). The backend then
// holds no optimizer state. The master copy is the arena's range as of the last load_master(): call it
// whenever the arena's parameters were written from outside the optimizer (initialisation, resume).
// On cuda the step is pipelined over chunks of the shard (backend/cuda/host_copy.h: copies on their
// own stream, ordered by events): the gradients go to the host chunk by chunk, the host AdamW updates
// each chunk as it arrives while the next ones copy, and the weights go back without blocking the
// backend's stream (bitwise the synchronous path, which the CPU backend keeps).
#pragma once
#include <memory>
#include <vector>

#include "config/config.h"
#include "core/backend.h"
#include "model/params.h"

namespace nlp {

class HostCopier;

class AdamW {
 public:
  AdamW(ParamStore& ps, Backend& be, const TrainConfig& tc, size_t lo, size_t hi, bool offload = false);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update with learning rate lr; gradients are multiplied by grad_scale (clipping) first.
  // t is the 1-based step count used for bias correction. zero_grad: the range's gradients are zero
  // afterwards (zeroed in the update's pass on the CPU).
  void step(float lr, float grad_scale, int t, bool zero_grad);

  size_t lo() const { return lo_; }
  size_t hi() const { return hi_; }
  size_t state_bytes() const { return 2 * (hi_ - lo_) * sizeof(float); }  // m and v, this rank
  bool offloaded() const { return offload_; }
  // Host bytes of the offloaded state: master weights, m, v and the gradient copy (0 without offload).
  size_t host_bytes() const { return offload_ ? 4 * (hi_ - lo_) * sizeof(float) : 0; }
  // The moments: backend memory, or host memory when offloaded.
  float* exp_avg() { return m_; }
  float* exp_avg_sq() { return v_; }
  // A moment's range to the host (hi - lo floats), and back from a whole-arena host copy (a
  // checkpoint's: ps.total() floats, of which [lo, hi) is taken).
  void download(const float* dev, std::vector<float>& host) const;
  void upload(float* dev, const std::vector<float>& whole);
  // Arena elements [a, b) (within [lo, hi)) of moment `which` (0 = m, 1 = v) to and from host memory
  // (checkpoints, a tensor at a time).
  void read_moment(int which, size_t a, size_t b, float* host) const;
  void write_moment(int which, size_t a, size_t b, const float* host);
  // offload: the master weights from the arena's range (no-op without offload).
  void load_master();
  // The range's gradients (hi - lo floats in backend memory): the arena's range by default, the
  // gradient shard with train.zero = 2 (train/grad_shards.h).
  void set_grads(float* g) { grad_src_ = g; }
  // offload on cuda: the gradients of arena [a, b) (within [lo, hi)) hold this step's sum (queued on
  // the backend's stream; train/grad_shards.h's final hook): their copy to the host starts now, and
  // step() uses it when such ranges tile the whole range (else it copies all again). A range that
  // meets one already started begins a new list (the last step was skipped: no step() came). No-op
  // elsewhere.
  void grads_final(size_t a, size_t b);
  float* grads() { return grad_src_ ? grad_src_ : ps_.grad() + lo_; }
  // The range's parameters (hi - lo floats in backend memory) that step() updates: the arena's range
  // by default, the parameter shard with train.zero = 3 (train/param_shards.h).
  void set_params(float* p) { param_src_ = p; }
  bool sharded_params() const { return param_src_ != nullptr; }
  float* params() { return param_src_ ? param_src_ : ps_.data() + lo_; }
  const float* params() const { return param_src_ ? param_src_ : ps_.data() + lo_; }

 private:
  ParamStore& ps_;
  Backend& be_;
  TrainConfig tc_;
  size_t lo_, hi_;
  bool offload_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  float* master_ = nullptr;  // offload: the range's fp32 weights on the host
  float* host_grad_ = nullptr;  // offload: the range's gradients copied to the host
  float* grad_src_ = nullptr;   // set_grads
  float* param_src_ = nullptr;  // set_params
  // One per parameter tensor that overlaps [lo, hi), clipped to it and with offsets relative to lo.
  std::vector<Backend::AdamWSpan> spans_;
  // offload on cuda: the copies of the pipelined step (null elsewhere: the synchronous step)
  std::unique_ptr<HostCopier> copier_;
  static constexpr size_t kOffloadChunk = size_t(1) << 20;  // floats per chunk of the pipelined step
  struct Early {
    size_t a, b;  // range-relative [a, b)
    int ticket;
  };
  std::vector<Early> early_;  // grads_final's copies started this step, in order
  void step_pipelined(float lr, float grad_scale, int t, bool zero_grad);
};

}  // namespace nlp
