#include "train/grad_shards.h"

#include <algorithm>
#include <map>
#include <cctype>
#include <string>

#include "core/error.h"

namespace nlp {
namespace {

// The layer index of a block tensor ("transformer.h.3.attn.c_attn.weight" -> 3), else -1: the first
// "h.<digits>." or "layer.<digits>." at the start of the name or after a dot.
int layer_of(const std::string& name) {
  for (const char* key : {"h.", "layer."}) {
    const size_t k = std::string(key).size();
    for (size_t at = name.find(key); at != std::string::npos; at = name.find(key, at + 1)) {
      if (at > 0 && name[at - 1] != '.') continue;
      size_t i = at + k, j = i;
      while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
      if (j > i && j < name.size() && name[j] == '.') return std::stoi(name.substr(i, j - i));
    }
  }
  return -1;
}

}  // namespace

std::vector<GradRegion> zero2_regions(const ParamStore& ps) {
  std::map<int, std::pair<size_t, size_t>> layers;  // layer -> [lowest offset, highest end)
  for (const auto& s : ps.specs()) {
    const int l = layer_of(s.name);
    if (l < 0) continue;
    auto [it, fresh] = layers.try_emplace(l, s.offset, s.offset + s.numel);
    if (!fresh) {
      it->second.first = std::min(it->second.first, s.offset);
      it->second.second = std::max(it->second.second, s.offset + s.numel);
    }
  }
  std::vector<GradRegion> out;
  if (layers.empty()) {  // no blocks: everything resident
    out.push_back({0, ps.total(), -1});
    return out;
  }
  const size_t blocks_lo = layers.begin()->second.first;
  size_t blocks_hi = layers.rbegin()->second.second;
  int expect = 0;
  for (const auto& [l, r] : layers) {
    if (l != expect++)
      throw Error(cat("train.zero = 2: the model's blocks are not numbered 0, 1, ... (no layer ", expect - 1, ")"));
    (void)r;
  }
  // the resident tensors: wholly before or after the blocks; the first one after them starts the suffix
  size_t suffix_lo = ps.total();
  for (const auto& s : ps.specs()) {
    if (layer_of(s.name) >= 0) continue;
    if (s.offset + s.numel <= blocks_lo) continue;
    if (s.offset < blocks_hi)
      throw Error(cat("train.zero = 2: tensor '", s.name, "' lies between the transformer blocks in the "
                      "parameter arena; ZeRO-2 needs the blocks contiguous"));
    suffix_lo = std::min(suffix_lo, s.offset);
  }
  blocks_hi = std::max(blocks_hi, std::min(suffix_lo, ps.total()));
  if (blocks_lo > 0) out.push_back({0, blocks_lo, -1});
  for (auto it = layers.begin(); it != layers.end(); ++it) {
    auto next = std::next(it);
    const size_t lo = it->second.first, hi = next == layers.end() ? blocks_hi : next->second.first;
    if (hi < it->second.second)
      throw Error(cat("train.zero = 2: the tensors of block ", it->first, " and block ", it->first + 1,
                      " interleave in the parameter arena"));
    out.push_back({lo, hi, it->first});
  }
  if (blocks_hi < ps.total()) out.push_back({blocks_hi, ps.total(), -1});
  return out;
}

size_t largest_block_floats(const std::vector<GradRegion>& regions) {
  size_t block = 0;
  for (const GradRegion& r : regions)
    if (r.layer >= 0) block = std::max(block, r.hi - r.lo);
  return block;
}

size_t zero2_buffer_floats(const ParamStore& ps, int slots) {
  const std::vector<GradRegion> regions = zero2_regions(ps);
  size_t resident = 0;
  int blocks = 0;
  for (const GradRegion& r : regions) {
    if (r.layer < 0)
      resident += r.hi - r.lo;
    else
      ++blocks;
  }
  return resident + size_t(std::min(slots, blocks)) * largest_block_floats(regions);
}

std::vector<GradRegion> split_regions(std::vector<GradRegion> regions,
                                      const std::vector<std::pair<size_t, size_t>>& own) {
  for (const auto& [lo, hi] : own) {
    auto it = std::find_if(regions.begin(), regions.end(),
                           [lo = lo, hi = hi](const GradRegion& r) { return r.layer < 0 && lo >= r.lo && hi <= r.hi; });
    if (it == regions.end() || hi <= lo)
      throw Error(cat("internal error: train.zero = 3: the arena range [", lo, ", ", hi,
                      ") is not inside one of the regions outside the transformer blocks"));
    const GradRegion r = *it;
    it = regions.erase(it);
    std::vector<GradRegion> parts;
    if (r.lo < lo) parts.push_back({r.lo, lo, -1});
    parts.push_back({lo, hi, -1});
    if (hi < r.hi) parts.push_back({hi, r.hi, -1});
    regions.insert(it, parts.begin(), parts.end());
  }
  return regions;
}

GradShards::GradShards(Comm& comm, Backend& be, ParamStore& ps, const ShardLayout& sh, int rank, bool overlap,
                       int slots, std::vector<GradBuffer> external, size_t piece)
    : comm_(comm), be_(be), ps_(ps), sh_(sh), rank_(rank), overlap_(overlap), piece_(piece), lo_(sh.lo(rank)),
      n_(sh.count[rank]) {
  NLP_ASSERT(sh.total == ps.total() && slots >= 2);
  std::vector<std::pair<size_t, size_t>> own;
  for (const GradBuffer& e : external) own.emplace_back(e.lo, e.hi);
  // throws before anything is freed
  const std::vector<GradRegion> regions = split_regions(zero2_regions(ps), own);
  // The arena (zero: nothing in it is needed) goes before the shard and the buffers are allocated, so
  // they never coexist: allocated first, the rank's peak resident memory was the arena + the shard +
  // the buffers at this point (GPT-2 124M on 2 ranks: 142 MiB above ZeRO-1's peak, all of it here).
  ps.release_grads();
  size_t block = 0;
  for (const GradRegion& r : regions)
    if (r.layer >= 0) block = std::max(block, r.hi - r.lo);
  auto alloc = [&](size_t n) {
    auto* p = static_cast<float*>(be.alloc(std::max<size_t>(n, 1) * sizeof(float)));  // zeroed
    owned_.push_back(p);
    buffer_floats_ += n;
    return p;
  };
  std::vector<float*> slot;
  for (const GradRegion& r : regions) {
    float* buf = nullptr;
    auto ext = std::find_if(external.begin(), external.end(),
                            [&r](const GradBuffer& e) { return e.lo == r.lo && e.hi == r.hi; });
    if (ext != external.end()) {
      buf = ext->buf;  // the caller's (zero when the backward first writes it)
    } else if (r.layer < 0) {
      buf = alloc(r.hi - r.lo);
    } else {
      const size_t k = size_t(r.layer) % size_t(slots);
      while (slot.size() <= k) slot.push_back(alloc(block));
      buf = slot[k];
    }
    regions_.push_back({r.lo, r.hi, r.layer, buf});
    regions_.back().external = ext != external.end();
  }
  shard_ = static_cast<float*>(be.alloc(std::max<size_t>(n_, 1) * sizeof(float)));
  // every tensor's gradient into its region's buffer
  const auto& specs = ps.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t off = specs[i].offset;
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [off](const Region& r) { return off >= r.lo && off < r.hi; });
    NLP_ASSERT(it != regions_.end() && off + specs[i].numel <= it->hi);
    ps.map_grad(static_cast<int>(i), it->buf + (off - it->lo));
  }
  next_ = regions_.size();
}

GradShards::~GradShards() {
  for (float* p : owned_) be_.release(p);
  be_.release(shard_);
}

void GradShards::zero_shard() { be_.zero(shard_, std::max<size_t>(n_, 1) * sizeof(float)); }

void GradShards::begin(bool last) {
  last_ = last;
  for (Region& r : regions_) r.started = r.pending = false;
  next_ = regions_.size();
  buckets_.clear();
}

void GradShards::start(Region& r) {
  r.started = r.pending = true;
  buckets_.emplace_back(r.lo, r.hi);
  const size_t n = r.hi - r.lo, piece = r.layer < 0 && piece_ > 0 ? piece_ : n;
  // in pieces: each a collective of its own, run in the order started (comm.h)
  for (size_t off = 0; off < n; off += piece)
    comm_.reduce_scatter_sum_start(r.buf + off, r.lo + off, std::min(piece, n - off), sh_);
  if (!overlap_) drain();
}

void GradShards::drain() {
  comm_.allreduce_wait();
  for (Region& r : regions_) {
    if (!r.pending) continue;
    const auto [a, b] = sh_.part(rank_, r.lo, r.hi);
    if (b > a) be_.accumulate(shard_ + (a - lo_), r.buf + (a - r.lo), b - a);
    if (b > a && last_ && final_) final_(a, b);
    if (!r.external) be_.zero(r.buf, (r.hi - r.lo) * sizeof(float));  // an external one: its owner's
    r.pending = false;
  }
}

void GradShards::ready(size_t lo) {
  // The regions final now; the next block writes into a slot whose last user must be drained first.
  size_t k = next_;
  while (k > 0 && regions_[k - 1].lo >= lo) --k;
  if (k == next_) return;
  int blocks = 0;
  for (size_t i = k; i < next_; ++i)
    if (regions_[i].layer >= 0) ++blocks;
  if (blocks > 1)
    throw Error(cat("internal error: train.zero = 2: ", blocks, " blocks' gradients became final at once (the "
                    "model must report each block, Model::set_grad_ready_hook)"));
  drain();
  for (size_t i = next_; i-- > k;) start(regions_[i]);
  next_ = k;
  comm_.progress();
}

void GradShards::end() {
  drain();
  for (size_t i = next_; i-- > 0;) start(regions_[i]);
  next_ = 0;
  drain();
}

}  // namespace nlp
