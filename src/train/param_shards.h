// ZeRO-3's parameters (train.zero = 3): no parameter arena. Each rank keeps persistently only its fp32
// shard of the parameters (its range [sh.lo(rank), sh.hi(rank)) of the arena, comm/shard.h; the
// optimizer updates it in place) and, for the forward and backward to read,
//  - the "resident" tensors outside the transformer blocks (embeddings, final LayerNorm, heads), whole
//    (grad_shards.h's regions): GPT-2's tied word embedding is one tensor, gathered once per update,
//    that serves the input embedding and the LM head alike (and gets one gradient, grad_shards.h);
//  - one block-sized buffer: before block l's parameters are read (Model::set_block_hook: its
//    forward, its recomputed forward with train.recompute = block, its backward) they are all-gathered
//    into it from the ranks' shards, unless it already holds block l.
// After every update (and a resume) refresh() gathers the resident tensors again and forgets the held
// block. The gathers are blocking (Comm::all_gather): the next block's gather does not overlap this
// block's compute, so there is no prefetch depth to set.
//
// Every rank calls every gather in the same order: the training forward and backward visit the same
// blocks in the same order on every rank (the same micro-batch count per step). Evaluation, the
// training samples and best.h5 instead gather the whole arena once (gather_all, every rank at the
// same point of the step), run on it, and release it (release_all), so no data-dependent path (an
// evaluation batch count, a sample's length) issues a collective.
#pragma once
#include <cstddef>
#include <vector>

#include "comm/comm.h"
#include "core/backend.h"
#include "model/params.h"
#include "train/grad_shards.h"

namespace nlp {

// The parameter floats one rank holds with train.zero = 3 besides its shard: the resident tensors' and
// one block buffer (the largest block).
size_t zero3_buffer_floats(const ParamStore& ps);

class ParamShards {
 public:
  // Takes this rank's shard and the resident tensors from the parameter store's arena (which must
  // hold the whole parameters, as loaded), then frees the arena (ps.release_params) and maps the
  // tensors into this object's buffers.
  ParamShards(Comm& comm, Backend& be, ParamStore& ps, const ShardLayout& sh, int rank);
  ~ParamShards();
  ParamShards(const ParamShards&) = delete;
  ParamShards& operator=(const ParamShards&) = delete;

  float* shard() { return shard_; }  // arena [sh.lo(rank), sh.hi(rank)) of the parameters
  size_t shard_size() const { return n_; }
  // The shard changed (an update, a resume): gather the resident tensors again, drop the held block.
  void refresh();
  // Block l's parameters into the block buffer (a collective: every rank calls it for the same l).
  void use_block(int l);
  // The whole arena gathered on every rank and every tensor mapped into it (a collective), and back.
  void gather_all();
  void release_all();
  bool whole() const { return full_ != nullptr; }
  size_t buffer_bytes() const { return buffer_floats_ * sizeof(float); }  // resident + block buffer
  int gathers() const { return gathers_; }  // block gathers so far (for tests and logs)

 private:
  // Arena [lo, hi) into buf (hi - lo floats): this rank's part from the shard, the rest all-gathered.
  void gather(float* buf, size_t lo, size_t hi);
  void map_buffers();  // every tensor to its resident buffer or the block buffer
  Comm& comm_;
  Backend& be_;
  ParamStore& ps_;
  ShardLayout sh_;
  int rank_;
  size_t lo_, n_;
  float* shard_ = nullptr;
  float* block_ = nullptr;  // one block's parameters (the largest block's size)
  float* full_ = nullptr;   // gather_all's arena
  struct Region {
    size_t lo, hi;
    int layer;
    float* buf;  // resident: its own buffer; a block: block_
  };
  std::vector<Region> regions_;
  std::vector<int> layer_region_;  // layer -> index into regions_
  std::vector<float*> owned_;
  size_t buffer_floats_ = 0;
  int held_ = -1;  // the block in block_ (-1: none)
  int gathers_ = 0;
};

}  // namespace nlp
