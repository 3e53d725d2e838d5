// ZeRO-3's parameters (train.zero = 3): no parameter arena. Each rank keeps persistently only its fp32
// shard of the parameters (its range [sh.lo(rank), sh.hi(rank)) of the arena, comm/shard.h; the
// optimizer updates it in place) and, for the forward and backward to read,
//  - the "resident" tensors outside the transformer blocks (embeddings, final LayerNorm, heads), each
//    region in a buffer of its own (grad_shards.h's regions), of two kinds:
//    * the model's weights-then-gradients tensors (Model::weights_then_grads: GPT-2's tied wte and its
//      wpe): one buffer serves as the weights in the forward and as the gradient in the backward. The
//      model calls need(i) before its forward first reads tensor i (the buffer is all-gathered from
//      the shards there unless it holds the current weights: once per micro-batch) and done(i) at the
//      point of the backward after which it reads the weights no more and before it first writes the
//      gradient (GPT-2: wte between the LM head's input gradient and its weight gradient, so the tied
//      wte serves the input lookup and the output layer from one gather and gets one gradient from
//      both uses; wpe before the embedding backward): the buffer is zeroed and GradShards sums it as
//      that tensor's gradient region (grad_buffers()). So no rank holds a whole copy of these weights
//      beside a whole copy of their gradient.
//    * the others (final LayerNorm, BERT's embedding LayerNorm, pooler and heads, whose backward reads
//      the weights it writes the gradient of): whole weights, gathered once after every update;
//  - 1 + prefetch block buffers: before block l's parameters are read (Model::set_block_hook: its
//    forward, its recomputed forward with train.recompute = block, its backward) they are all-gathered
//    into a buffer from the ranks' shards unless a buffer holds block l already, and the gathers of the
//    next `prefetch` blocks in the current direction (up in the forward, down in the backward; at block
//    0 up, at the last block down) are started (Comm::all_gather_start) into the other buffers, so that
//    they run while block l computes (where the communicator runs them in the background: MPI's
//    communication thread, NCCL's communication stream; the staged communicator gathers at once).
// After every update (and a resume) refresh() waits for started gathers, gathers the whole resident
// tensors again, marks the weights-then-gradients buffers stale and empties the block buffers.
//
// Every rank issues every gather in the same order: which blocks are gathered and prefetched depends
// only on the sequence of blocks used, and the training forward and backward visit the same blocks in
// the same order on every rank (the same micro-batch count per step), and each micro-batch's forward
// needs the same weights-then-gradients tensors. Evaluation, the training samples and best.h5 instead
// gather the whole arena once (gather_all, every rank at the same point of the step), run on it, and
// release it (release_all), so no data-dependent path (an evaluation batch count, a sample's length)
// issues a collective (need() and done() do nothing while it is held).
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "comm/comm.h"
#include "core/backend.h"
#include "model/params.h"
#include "train/grad_shards.h"

namespace nlp {

// The parameter floats one rank holds with train.zero = 3 besides its shard: the resident tensors' and
// 1 + prefetch block buffers (the largest block's size).
size_t zero3_buffer_floats(const ParamStore& ps, int prefetch);

class ParamShards {
 public:
  // Takes this rank's shard and the resident tensors from the parameter store's arena (which must
  // hold the whole parameters, as loaded), then frees the arena (ps.release_params) and maps the
  // tensors into this object's buffers.
  // weights_then_grads: the tensors (indices into ps.specs(), each outside the blocks) whose buffer
  // turns into their gradient's in the backward (Model::weights_then_grads).
  // Without a parameter arena (ps.data() null: a run initialised from scratch, app/main.cpp), `init`
  // fills the parameters instead: it runs with the store's upload window on this rank's shard
  // (ParamStore::set_upload_window: the model's init_weights draws every tensor as always and keeps
  // this rank's part), then the resident tensors are gathered from the shards (a collective).
  ParamShards(Comm& comm, Backend& be, ParamStore& ps, const ShardLayout& sh, int rank, int prefetch = 0,
              const std::vector<int>& weights_then_grads = {}, const std::function<void()>& init = {});
  ~ParamShards();
  ParamShards(const ParamShards&) = delete;
  ParamShards& operator=(const ParamShards&) = delete;

  float* shard() { return shard_; }  // arena [sh.lo(rank), sh.hi(rank)) of the parameters
  size_t shard_size() const { return n_; }
  // The shard changed (an update, a resume): gather the resident tensors again, empty the block buffers.
  void refresh();
  // Block l's parameters into a block buffer and the next blocks' gathers started (a collective: every
  // rank calls it for the same l).
  void use_block(int l);
  // A weights-then-gradients tensor's weights, gathered unless its buffer holds them (a collective:
  // every rank calls it in the same forwards), and its buffer turned into its (zero) gradient
  // (once per backward: a second call in the same backward does nothing).
  void need(int tensor);
  void done(int tensor);
  // Those buffers, for GradShards to sum as the tensors' gradient regions.
  std::vector<GradBuffer> grad_buffers() const;
  size_t block_floats() const { return block_; }  // the largest block's floats (0: no blocks)
  // The whole arena gathered on every rank and every tensor mapped into it (a collective), and back.
  void gather_all();
  void release_all();
  bool whole() const { return full_ != nullptr; }
  size_t buffer_bytes() const { return buffer_floats_ * sizeof(float); }  // resident + block buffers
  int gathers() const { return gathers_; }        // block gathers so far, prefetched or not
  int prefetched() const { return prefetched_; }  // of which started ahead of their use

 private:
  // Arena [lo, hi) into buf (hi - lo floats): this rank's part from the shard, the rest all-gathered
  // (started only, with start = true: complete after wait_all()).
  void gather(float* buf, size_t lo, size_t hi, bool start);
  void wait_all();     // every started gather complete
  int slot_of(int l) const;
  int victim(int keep) const;  // a buffer to gather into: empty first; not `keep` nor an upcoming block
  void start_block(int l, int slot, bool ahead);
  void map_buffers();  // every tensor to its resident buffer, or a block's to the buffer holding it
  Comm& comm_;
  Backend& be_;
  ParamStore& ps_;
  ShardLayout sh_;
  int rank_;
  int prefetch_;
  size_t lo_, n_;
  float* shard_ = nullptr;
  float* full_ = nullptr;  // gather_all's arena
  struct Region {
    size_t lo, hi;
    int layer;
    float* buf;  // resident: its own buffer; a block: null (it lives in a slot)
    bool then_grads = false;  // a weights-then-gradients tensor's buffer
    bool valid = true;        // it holds the current weights (not a gradient, not stale)
  };
  Region& region_of_tensor(int tensor);
  struct Slot {
    float* buf;
    int layer = -1;  // the block it holds (-1: none)
    bool pending = false;  // its gather started, not yet waited for
  };
  std::vector<Region> regions_;
  std::vector<int> layer_region_;                // layer -> index into regions_
  std::vector<std::vector<int>> layer_tensors_;  // layer -> its tensors' indices
  std::vector<Slot> slots_;
  std::vector<float*> owned_;
  size_t buffer_floats_ = 0;
  size_t block_ = 0;
  int current_ = -1;  // the slot of the block in use
  int prev_ = -1;     // the block used last
  bool up_ = true;    // the direction of the prefetch
  std::vector<int> upcoming_;  // the blocks to prefetch after the last use
  int gathers_ = 0, prefetched_ = 0;
};

}  // namespace nlp
