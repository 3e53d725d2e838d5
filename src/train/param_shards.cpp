#include "train/param_shards.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

size_t zero3_buffer_floats(const ParamStore& ps, int prefetch) {
  const std::vector<GradRegion> regions = zero2_regions(ps);
  size_t resident = 0;
  for (const GradRegion& r : regions)
    if (r.layer < 0) resident += r.hi - r.lo;
  return resident + size_t(1 + std::max(prefetch, 0)) * largest_block_floats(regions);
}

ParamShards::ParamShards(Comm& comm, Backend& be, ParamStore& ps, const ShardLayout& sh, int rank, int prefetch,
                         const std::vector<int>& weights_then_grads, const std::function<void()>& init)
    : comm_(comm), be_(be), ps_(ps), sh_(sh), rank_(rank), prefetch_(std::max(prefetch, 0)), lo_(sh.lo(rank)),
      n_(sh.count[rank]) {
  const bool from_init = ps.data() == nullptr;  // no arena: the shard initialised here
  NLP_ASSERT(sh.total == ps.total() && (!from_init || init));
  auto alloc = [&](size_t n) {
    auto* p = static_cast<float*>(be.alloc(std::max<size_t>(n, 1) * sizeof(float)));
    owned_.push_back(p);
    buffer_floats_ += n;
    return p;
  };
  int layers = 0;
  std::vector<std::pair<size_t, size_t>> own;
  for (int i : weights_then_grads) {
    const auto& sp = ps.specs().at(size_t(i));
    own.emplace_back(sp.offset, sp.offset + sp.numel);
  }
  const std::vector<GradRegion> regions = split_regions(zero2_regions(ps), own);
  for (const GradRegion& r : regions)
    if (r.layer >= 0) layers = std::max(layers, r.layer + 1);
  const size_t block = largest_block_floats(regions);
  block_ = block;
  layer_region_.assign(size_t(layers), -1);
  layer_tensors_.resize(size_t(layers));
  for (const GradRegion& r : regions) {
    float* buf = nullptr;
    if (r.layer < 0) {
      buf = alloc(r.hi - r.lo);
      if (!from_init) be.copy(buf, ps.data() + r.lo, (r.hi - r.lo) * sizeof(float));  // as loaded
    } else {
      layer_region_[size_t(r.layer)] = static_cast<int>(regions_.size());
    }
    const bool then_grads =
        std::find(own.begin(), own.end(), std::make_pair(r.lo, r.hi)) != own.end();
    regions_.push_back({r.lo, r.hi, r.layer, buf, then_grads, /*valid=*/!from_init});
  }
  const auto& specs = ps.specs();
  for (size_t i = 0; i < specs.size(); ++i)
    for (const Region& r : regions_)
      if (r.layer >= 0 && specs[i].offset >= r.lo && specs[i].offset < r.hi)
        layer_tensors_[size_t(r.layer)].push_back(static_cast<int>(i));
  shard_ = static_cast<float*>(be.alloc(std::max<size_t>(n_, 1) * sizeof(float)));
  if (from_init) {
    ps.set_upload_window(shard_, lo_, lo_ + n_);  // every tensor drawn, this rank's part kept
    try {
      init();
    } catch (...) {
      ps.set_upload_window(nullptr, 0, 0);
      throw;
    }
    ps.set_upload_window(nullptr, 0, 0);
  } else if (n_ > 0) {
    be.copy(shard_, ps.data() + lo_, n_ * sizeof(float));
  }
  ps.release_params();
  // the block buffers after the arena is gone (the backend zeroes them: they are resident at once);
  // more buffers than blocks would never be used
  if (block > 0)
    for (int k = 0; k < std::min(1 + prefetch_, layers); ++k) slots_.push_back({alloc(block)});
  map_buffers();
  if (from_init) refresh();  // the whole resident tensors from the shards
}

ParamShards::~ParamShards() {
  try {
    wait_all();  // no collective may still write into a buffer freed here
  } catch (...) {
  }
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
    float* base = it->buf;
    if (it->layer >= 0) {  // the buffer holding the block, else the first one (read only after a gather)
      const int s = slot_of(it->layer);
      base = slots_[size_t(s >= 0 ? s : 0)].buf;
    }
    ps_.map_param(static_cast<int>(i), base + (off - it->lo));
  }
}

void ParamShards::gather(float* buf, size_t lo, size_t hi, bool start) {
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
  if (start)
    comm_.all_gather_start(buf, t);
  else
    comm_.all_gather(buf, t);
}

void ParamShards::wait_all() {
  bool any = false;
  for (const Slot& s : slots_) any = any || s.pending;
  if (!any) return;
  comm_.allreduce_wait();
  for (Slot& s : slots_) s.pending = false;
}

int ParamShards::slot_of(int l) const {
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].layer == l) return static_cast<int>(k);
  return -1;
}

int ParamShards::victim(int keep) const {
  int pick = -1;
  for (size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[k];
    if (int(k) == keep) continue;
    if (s.layer < 0) return static_cast<int>(k);
    if (std::find(upcoming_.begin(), upcoming_.end(), s.layer) != upcoming_.end()) continue;
    if (pick < 0) pick = static_cast<int>(k);
  }
  return pick;
}

void ParamShards::start_block(int l, int slot, bool ahead) {
  Slot& s = slots_[size_t(slot)];
  if (s.pending) wait_all();  // never gather into a buffer a started gather still writes
  const Region& r = regions_[size_t(layer_region_[size_t(l)])];
  s.layer = l;
  gather(s.buf, r.lo, r.hi, ahead);
  s.pending = ahead;
  ++gathers_;
  if (ahead) ++prefetched_;
}

void ParamShards::use_block(int l) {
  if (full_) return;
  NLP_ASSERT(l >= 0 && size_t(l) < layer_region_.size() && layer_region_[size_t(l)] >= 0);
  const int L = static_cast<int>(layer_region_.size());
  // the direction: up from block 0, down from the last block, else as the blocks go
  if (l == 0)
    up_ = true;
  else if (l == L - 1)
    up_ = false;
  else if (prev_ >= 0 && l != prev_)
    up_ = l > prev_;
  prev_ = l;
  upcoming_.clear();
  for (int k = 1; k <= prefetch_; ++k) {
    const int c = up_ ? l + k : l - k;
    if (c < 0 || c >= L) break;
    upcoming_.push_back(c);
  }
  int s = slot_of(l);
  if (s < 0) {
    s = victim(-1);
    NLP_ASSERT(s >= 0);
    start_block(l, s, /*ahead=*/false);
  }
  if (slots_[size_t(s)].pending) wait_all();
  current_ = s;
  float* buf = slots_[size_t(s)].buf;
  const Region& r = regions_[size_t(layer_region_[size_t(l)])];
  for (int i : layer_tensors_[size_t(l)])
    ps_.map_param(i, buf + (ps_.specs()[size_t(i)].offset - r.lo));
  // the next blocks' gathers, started now to run while block l computes
  for (int c : upcoming_) {
    if (slot_of(c) >= 0) continue;
    const int v = victim(current_);
    if (v < 0) break;
    start_block(c, v, /*ahead=*/true);
  }
}

void ParamShards::refresh() {
  NLP_ASSERT(!full_);
  wait_all();
  for (Region& r : regions_) {
    if (r.then_grads)
      r.valid = false;  // gathered at the next forward's need() (it holds the last gradient now)
    else if (r.layer < 0)
      gather(r.buf, r.lo, r.hi, false);
  }
  for (Slot& s : slots_) s.layer = -1;
  current_ = prev_ = -1;
  up_ = true;
}

ParamShards::Region& ParamShards::region_of_tensor(int tensor) {
  const size_t off = ps_.specs().at(size_t(tensor)).offset;
  for (Region& r : regions_)
    if (r.then_grads && r.lo == off) return r;
  throw Error(cat("internal error: train.zero = 3: tensor '", ps_.specs()[size_t(tensor)].name,
                  "' is not one whose weights' buffer turns into its gradient's"));
}

void ParamShards::need(int tensor) {
  if (full_) return;  // gather_all's arena holds every tensor
  Region& r = region_of_tensor(tensor);
  if (r.valid) return;
  gather(r.buf, r.lo, r.hi, false);
  r.valid = true;
}

void ParamShards::done(int tensor) {
  NLP_ASSERT(!full_);  // no backward runs on gather_all's arena
  Region& r = region_of_tensor(tensor);
  if (!r.valid) return;  // its gradient already (a model may say so twice in one backward)
  // the backward adds into it from here (the next forward gathers the weights over it)
  be_.zero(r.buf, (r.hi - r.lo) * sizeof(float));
  r.valid = false;
}

std::vector<GradBuffer> ParamShards::grad_buffers() const {
  std::vector<GradBuffer> out;
  for (const Region& r : regions_)
    if (r.then_grads) out.push_back({r.lo, r.hi, r.buf});
  return out;
}

void ParamShards::gather_all() {
  if (full_) return;
  wait_all();
  full_ = static_cast<float*>(be_.alloc(std::max<size_t>(ps_.total(), 1) * sizeof(float)));
  gather(full_, 0, ps_.total(), false);
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
