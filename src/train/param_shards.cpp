#include "train/param_shards.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

size_t zero3_buffer_floats(const ParamStore& ps) {
  size_t resident = 0, block = 0;
  for (const GradRegion& r : zero2_regions(ps)) {
    if (r.layer < 0)
      resident += r.hi - r.lo;
    else
      block = std::max(block, r.hi - r.lo);
  }
  return resident + block;
}

ParamShards::ParamShards(Comm& comm, Backend& be, ParamStore& ps, const ShardLayout& sh, int rank)
    : comm_(comm), be_(be), ps_(ps), sh_(sh), rank_(rank), lo_(sh.lo(rank)), n_(sh.count[rank]) {
  NLP_ASSERT(sh.total == ps.total() && ps.data() != nullptr);
  auto alloc = [&](size_t n) {
    auto* p = static_cast<float*>(be.alloc(std::max<size_t>(n, 1) * sizeof(float)));
    owned_.push_back(p);
    buffer_floats_ += n;
    return p;
  };
  size_t block = 0;
  const std::vector<GradRegion> regions = zero2_regions(ps);
  for (const GradRegion& r : regions)
    if (r.layer >= 0) block = std::max(block, r.hi - r.lo);
  if (block > 0) block_ = alloc(block);
  for (const GradRegion& r : regions) {
    float* buf = block_;
    if (r.layer < 0) {
      buf = alloc(r.hi - r.lo);
      be.copy(buf, ps.data() + r.lo, (r.hi - r.lo) * sizeof(float));  // the whole tensors, as loaded
    } else {
      if (layer_region_.size() <= size_t(r.layer)) layer_region_.resize(size_t(r.layer) + 1, -1);
      layer_region_[size_t(r.layer)] = static_cast<int>(regions_.size());
    }
    regions_.push_back({r.lo, r.hi, r.layer, buf});
  }
  shard_ = static_cast<float*>(be.alloc(std::max<size_t>(n_, 1) * sizeof(float)));
  if (n_ > 0) be.copy(shard_, ps.data() + lo_, n_ * sizeof(float));
  ps.release_params();
  map_buffers();
}

ParamShards::~ParamShards() {
  if (full_) be_.release(full_);
  for (float* p : owned_) be_.release(p);
  be_.release(shard_);
}

void ParamShards::map_buffers() {
  const auto& specs = ps_.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t off = specs[i].offset;
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [off](const Region& r) { return off >= r.lo && off < r.hi; });
    NLP_ASSERT(it != regions_.end() && off + specs[i].numel <= it->hi);
    ps_.map_param(static_cast<int>(i), it->buf + (off - it->lo));
  }
}

void ParamShards::gather(float* buf, size_t lo, size_t hi) {
  // The region's split over the ranks, relative to lo: each rank's part of [lo, hi) of the arena.
  ShardLayout t;
  t.total = hi - lo;
  for (int r = 0; r < sh_.ranks(); ++r) {
    const auto [a, b] = sh_.part(r, lo, hi);
    t.offset.push_back(std::min(a, hi) - lo);
    t.count.push_back(b - a);
  }
  if (t.count[rank_] > 0)
    be_.copy(buf + t.offset[rank_], shard_ + (lo + t.offset[rank_] - lo_), t.count[rank_] * sizeof(float));
  comm_.all_gather(buf, t);
}

void ParamShards::refresh() {
  NLP_ASSERT(!full_);
  for (const Region& r : regions_)
    if (r.layer < 0) gather(r.buf, r.lo, r.hi);
  held_ = -1;
}

void ParamShards::use_block(int l) {
  if (full_ || l == held_) return;
  NLP_ASSERT(l >= 0 && size_t(l) < layer_region_.size() && layer_region_[size_t(l)] >= 0);
  const Region& r = regions_[size_t(layer_region_[size_t(l)])];
  gather(block_, r.lo, r.hi);
  held_ = l;
  ++gathers_;
}

void ParamShards::gather_all() {
  if (full_) return;
  full_ = static_cast<float*>(be_.alloc(std::max<size_t>(ps_.total(), 1) * sizeof(float)));
  gather(full_, 0, ps_.total());
  const auto& specs = ps_.specs();
  for (size_t i = 0; i < specs.size(); ++i) ps_.map_param(static_cast<int>(i), full_ + specs[i].offset);
}

void ParamShards::release_all() {
  if (!full_) return;
  be_.release(full_);
  full_ = nullptr;
  map_buffers();
}

}  // namespace nlp
