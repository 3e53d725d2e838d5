// How ZeRO-1 (train.zero = 1) splits a flat arena of floats (the parameters, their gradients and the
// AdamW moments, laid out alike) over the ranks: one contiguous range per rank, in rank order, each a
// multiple of `align` floats except the last one that is not empty (ranges are cache-line aligned, and
// on the GPU vector-aligned). Rank r owns [offset[r], offset[r] + count[r]); the ranges tile [0, total).
// With one rank (or train.zero = 0) the one range is the whole arena.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace nlp {

struct ShardLayout {
  std::vector<size_t> offset, count;  // one per rank
  size_t total = 0;

  int ranks() const { return static_cast<int>(count.size()); }
  size_t lo(int r) const { return offset[r]; }
  size_t hi(int r) const { return offset[r] + count[r]; }
  size_t largest() const;  // the largest count (what one rank allocates at most)
  bool equal_counts() const;  // every count the same (NCCL's native reduce-scatter/all-gather)
  // The part of [a, b) that rank r owns, as [first, second) (empty: first == second). A bucket
  // [a, b) is the concatenation, in rank order, of its parts.
  std::pair<size_t, size_t> part(int r, size_t a, size_t b) const;

  // `total` floats over `ranks` ranks: ceil(total / ranks) rounded up to `align` each, the last
  // non-empty range shorter, ranges past the end empty.
  static ShardLayout even(size_t total, int ranks, size_t align = 16);
};

}  // namespace nlp
