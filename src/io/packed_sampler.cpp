// Packed steps: the plan of each epoch (see packed_sampler.h).
#include "io/packed_sampler.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

namespace {

// First-fit over R rows in O(log R) per example: a max-tree over each row's room (-1 once the row
// holds max_per_row examples); the leftmost row with room >= len is found by descending it.
class FirstFit {
 public:
  FirstFit(int64_t rows, int T, int max_per_row) : R_(rows), T_(T), M_(max_per_row) {
    while (leaves_ < R_) leaves_ *= 2;
    tree_.assign(2 * static_cast<size_t>(leaves_), -1);
    count_.assign(static_cast<size_t>(R_), 0);
    for (int64_t r = 0; r < R_; ++r) set(r, T_);
  }
  // The row example of length len goes to (and takes it), or -1 when none has room.
  int64_t place(int len) {
    if (tree_[1] < len) return -1;
    size_t i = 1;
    while (i < static_cast<size_t>(leaves_)) i = tree_[2 * i] >= len ? 2 * i : 2 * i + 1;
    const int64_t r = static_cast<int64_t>(i) - leaves_;
    const int room = tree_[i] - len;
    set(r, ++count_[static_cast<size_t>(r)] >= M_ ? -1 : room);
    return r;
  }

 private:
  int64_t R_, leaves_ = 1;
  int T_, M_;
  std::vector<int> tree_, count_;
  void set(int64_t r, int room) {
    size_t i = static_cast<size_t>(leaves_ + r);
    tree_[i] = room;
    for (i /= 2; i >= 1; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
};

}  // namespace

PackedSampler::PackedSampler(const Sampler& order, const std::vector<int32_t>& lengths, int T,
                             int64_t rows_per_step, int max_per_row)
    : order_(order), len_(lengths), T_(T), M_(max_per_row), R_(rows_per_step) {
  if (static_cast<int64_t>(len_.size()) != order.size())
    throw Error(cat("PackedSampler: ", len_.size(), " lengths for ", order.size(), " examples"));
  if (T < 1 || rows_per_step < 1 || max_per_row < 1)
    throw Error(cat("PackedSampler: invalid rows ", rows_per_step, " x ", T, " or examples per row ", max_per_row));
  for (int32_t& L : len_) L = std::clamp<int32_t>(L, 1, T);
}

void PackedSampler::plan(int64_t epoch) const {
  if (plan_epoch_ == epoch) return;
  const std::vector<int64_t>& ord = order_.order(epoch);
  const int64_t n = static_cast<int64_t>(ord.size());
  start_.assign(1, 0);
  row_of_.assign(static_cast<size_t>(n), -1);
  int64_t i = 0;
  while (i < n) {
    FirstFit fit(R_, T_, M_);
    const int64_t s = i;
    int64_t r;
    while (i < n && (r = fit.place(len_[static_cast<size_t>(ord[static_cast<size_t>(i)])])) >= 0)
      row_of_[static_cast<size_t>(i++)] = static_cast<int32_t>(r);
    if (i == n) {  // the order ran out before the rows did: a partial step, dropped
      std::fill(row_of_.begin() + s, row_of_.end(), -1);
      break;
    }
    start_.push_back(i);  // example i fits in none of the rows: it opens the next step
  }
  plan_epoch_ = epoch;
  if (start_.size() < 2)
    throw Error(cat("data.packing: the ", n, " examples do not fill one step of ", R_,
                    " packed rows of ", T_, " tokens (ranks x train.batch_size x train.grad_accum rows "
                    "with data.pack_batch = rows): use fewer rows per step"));
}

void PackedSampler::count_to(int64_t epoch) const {
  while (static_cast<int64_t>(first_step_.size()) <= epoch + 1) {
    const int64_t e = static_cast<int64_t>(first_step_.size()) - 1;
    plan(e);
    first_step_.push_back(first_step_.back() + static_cast<int64_t>(start_.size()) - 1);
  }
}

int64_t PackedSampler::steps_in_epoch(int64_t epoch) const {
  count_to(epoch);
  return first_step_[static_cast<size_t>(epoch + 1)] - first_step_[static_cast<size_t>(epoch)];
}

int64_t PackedSampler::epoch_of(int64_t step) const {
  if (step < 0) throw Error(cat("PackedSampler: negative step ", step));
  int64_t e = 0;
  for (;; ++e) {
    count_to(e);
    if (step < first_step_[static_cast<size_t>(e + 1)]) return e;
  }
}

std::pair<int64_t, int64_t> PackedSampler::position(int64_t step) const {
  const int64_t e = epoch_of(step);
  plan(e);
  return {e, start_[static_cast<size_t>(step - first_step_[static_cast<size_t>(e)])]};
}

int64_t PackedSampler::step_at(int64_t epoch, int64_t offset) const {
  count_to(epoch);
  plan(epoch);
  const auto it = std::lower_bound(start_.begin(), start_.end() - 1, offset);
  return first_step_[static_cast<size_t>(epoch)] + (it - start_.begin());
}

PackedSampler::Micro PackedSampler::micro(int64_t step, int a, int A, int rank, int world, int B) const {
  if (int64_t(world) * B * A != R_ || a < 0 || a >= A || rank < 0 || rank >= world)
    throw Error(cat("PackedSampler: micro-batch ", a, " of ", A, ", rank ", rank, " of ", world, " x ", B,
                    " rows does not match ", R_, " rows per step"));
  const auto [e, s] = position(step);  // plans epoch e
  const int64_t k = step - first_step_[static_cast<size_t>(e)];
  const int64_t end = start_[static_cast<size_t>(k + 1)];
  const int64_t lo = (int64_t(a) * world + rank) * B;
  const std::vector<int64_t>& ord = order_.order(e);
  Micro m;
  m.rows = B;
  for (int64_t i = s; i < end; ++i) {
    const int64_t r = row_of_[static_cast<size_t>(i)] - lo;
    if (r < 0 || r >= B) continue;
    m.idx.push_back(ord[static_cast<size_t>(i)]);
    m.row.push_back(static_cast<int32_t>(r));
  }
  return m;
}

}  // namespace nlp
