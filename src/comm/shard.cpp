#include "comm/shard.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

ShardLayout ShardLayout::even(size_t total, int ranks, size_t align) {
  NLP_ASSERT(ranks >= 1 && align >= 1);
  ShardLayout s;
  s.total = total;
  const size_t n = static_cast<size_t>(ranks);
  size_t each = (total + n - 1) / n;
  each = (each + align - 1) / align * align;
  for (size_t r = 0; r < n; ++r) {
    const size_t lo = std::min(total, r * each);
    const size_t hi = std::min(total, lo + each);
    s.offset.push_back(lo);
    s.count.push_back(hi - lo);
  }
  return s;
}

size_t ShardLayout::largest() const {
  size_t m = 0;
  for (size_t c : count) m = std::max(m, c);
  return m;
}

bool ShardLayout::equal_counts() const {
  for (size_t c : count)
    if (c != count.front()) return false;
  return true;
}

std::pair<size_t, size_t> ShardLayout::part(int r, size_t a, size_t b) const {
  const size_t first = std::max(a, lo(r)), last = std::min(b, hi(r));
  return first < last ? std::pair{first, last} : std::pair{first, first};
}

}  // namespace nlp
