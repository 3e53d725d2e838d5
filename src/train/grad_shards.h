// ZeRO-2's gradients (train.zero = 2): no gradient arena. Each rank keeps its fp32 gradient shard (its
// range of the arena, comm/shard.h) and, for the backward to write into, only
//  - the "resident" tensors outside the transformer blocks (embeddings, final LayerNorm, heads: the
//    tied word embedding gets gradients at both ends of the backward), and
//  - `slots` block-sized buffers that the blocks take in turn (block l writes into slot l % slots).
// ParamStore::map_grads points every tensor's gradient there (params.h). As the backward reports a
// block final (Model::set_grad_ready_hook), its buffer is reduce-scattered (Comm::reduce_scatter_sum_start:
// only this rank's part of it is summed here); at the next report, before the following block writes
// into a buffer still in flight, the started sums are waited for, each buffer's part in this rank's
// range is added to the shard, and the buffer is zeroed for reuse. So one block's reduce-scatter runs
// while the next block computes (two slots), every micro-batch of train.grad_accum is reduced and
// accumulated into the shard, and the gradient memory per rank is the resident tensors + the slots +
// 1/N of the arena instead of the whole arena.
//
// The blocks are found by name (HF state_dict keys "<prefix>.h.<l>." or "<prefix>.layer.<l>."); their
// ranges must tile a contiguous part of the arena in layer order, with the other tensors before or
// after it. A report that falls inside a region (a model reporting at another granularity) is an
// internal error, raised before any buffer is overwritten out of turn.
#pragma once
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/backend.h"
#include "model/params.h"

namespace nlp {

// The arena's regions for ZeRO-2, in arena order: [lo, hi) and the layer (-1 = resident).
struct GradRegion {
  size_t lo = 0, hi = 0;
  int layer = -1;
};
// Throws nlp::Error naming the tensor when the layout does not fit the scheme above.
std::vector<GradRegion> zero2_regions(const ParamStore& ps);
// The largest block region's floats (0 when there are none): a block buffer's size, and the piece
// train.zero = 3 sums the resident regions in (GradShards, the memory plan).
size_t largest_block_floats(const std::vector<GradRegion>& regions);
// The gradient floats one rank holds with train.zero = 2 and `slots` block buffers, besides its shard:
// the resident tensors' and the slots'.
size_t zero2_buffer_floats(const ParamStore& ps, int slots);
// The regions with each range of `own` (arena [lo, hi), inside a resident region) a resident region
// of its own: the resident region around it split before and after it (train.zero = 3's tensors whose
// weights' buffer turns into their gradient's, param_shards.h). Throws nlp::Error when a range is not
// inside one resident region.
std::vector<GradRegion> split_regions(std::vector<GradRegion> regions,
                                      const std::vector<std::pair<size_t, size_t>>& own);

// A range [lo, hi) of the arena whose gradient the backward writes into a buffer its caller owns
// (train.zero = 3: the weights' buffer of a tensor that the backward no longer reads by then,
// param_shards.h, which zeroes it at that point and gathers the weights into it again before the next
// forward); GradShards sums it as a region of its own and leaves it as it is after.
struct GradBuffer {
  size_t lo = 0, hi = 0;
  float* buf = nullptr;
};

class GradShards {
 public:
  // Frees the parameter store's gradient arena (ps.release_grads) and maps its tensors' gradients
  // into this object's buffers (and the `external` ranges' into theirs). overlap = false: each
  // block's sum is waited for at once. piece > 0: the resident regions are summed in pieces of at
  // most `piece` floats, one reduce-scatter each, one after the other, so that MPI's temporaries
  // (a whole sum's size, twice on rank 0: memory_plan.cpp) stay at a piece's size (train.zero = 3
  // passes the largest block's size; the sums are elementwise, so the pieces give the same bits).
  GradShards(Comm& comm, Backend& be, ParamStore& ps, const ShardLayout& sh, int rank, bool overlap,
             int slots = 2, std::vector<GradBuffer> external = {}, size_t piece = 0);
  ~GradShards();
  GradShards(const GradShards&) = delete;
  GradShards& operator=(const GradShards&) = delete;

  float* shard() { return shard_; }  // this rank's summed gradients, arena [sh.lo(rank), sh.hi(rank))
  size_t shard_size() const { return n_; }
  void zero_shard();
  // One micro-batch's backward: begin() before it, ready() as its hook, end() after it (starts what is
  // left, waits, accumulates into the shard; every buffer it owns is zero again on return). last: the step's
  // last micro-batch (its accumulations complete the shard: the final hook below is called).
  void begin(bool last = true);
  // Called in the last micro-batch as each region's part of this rank's range, arena [a, b), holds
  // the step's sum (queued on the backend's stream): train.offload = optimizer starts its copy to the
  // host there (AdamW::grads_final), while the backward of the earlier blocks goes on.
  void set_final_hook(std::function<void(size_t a, size_t b)> hook) { final_ = std::move(hook); }
  void ready(size_t lo);
  void end();
  size_t buffer_bytes() const { return buffer_floats_ * sizeof(float); }  // resident + slots
  // The ranges [lo, hi) started in the last micro-batch, in order (for tests and logs).
  const std::vector<std::pair<size_t, size_t>>& buckets() const { return buckets_; }

 private:
  struct Region {
    size_t lo, hi;
    int layer;   // -1: resident
    float* buf;  // the region's gradients: buf[i - lo] for arena offset i
    bool started = false, pending = false;
    bool external = false;  // a GradBuffer: its owner zeroes it before the backward writes it
  };
  void start(Region& r);
  void drain();  // wait for every started sum, add the parts into the shard, zero the buffers
  Comm& comm_;
  Backend& be_;
  ParamStore& ps_;
  ShardLayout sh_;
  int rank_;
  bool overlap_;
  size_t piece_;   // the resident regions' sums in pieces of at most this many floats (0: whole)
  size_t lo_, n_;  // this rank's range
  float* shard_ = nullptr;
  std::vector<float*> owned_;  // buffers allocated here
  std::vector<Region> regions_;  // in arena order
  size_t buffer_floats_ = 0;
  size_t next_;  // regions_[next_, size) are started in this micro-batch (next_ decreases)
  bool last_ = true;
  std::function<void(size_t, size_t)> final_;
  std::vector<std::pair<size_t, size_t>> buckets_;
};

}  // namespace nlp
