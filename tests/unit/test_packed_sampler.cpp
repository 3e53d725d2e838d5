// PackedSampler (data.pack_batch = rows): the plan of packed steps, checked against its definition
// (packed_sampler.h) computed here the plain way, not by the code under test:
//  - a step is a contiguous run of the epoch's order, the steps of an epoch follow each other, and
//    only the epoch's last partial step is left out;
//  - each example sits in the first row (of all the step's rows) with room for it and fewer than
//    max_per_row examples, and the step ends at the first example that fits in none;
//  - the split of a step's rows over ranks and micro-batches does not change which examples make a
//    step or where each goes;
//  - position() and step_at() agree with the steps, across epochs (each epoch's own shuffle);
//  - pack_rows with the planned rows: the examples at the end of their rows in index order, the
//    rows' count fixed, the batch not ragged; with a fixed number of examples, the same rows and
//    ignored fillers after the real examples, at distinct positions where no example starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "io/dataset.h"
#include "io/packed_sampler.h"
#include "train/batches.h"

namespace {

std::vector<int32_t> random_lengths(int64_t n, int lo, int hi, uint64_t seed) {
  nlp::Rng r(seed);
  std::vector<int32_t> len(static_cast<size_t>(n));
  for (auto& L : len) L = lo + static_cast<int32_t>(r.next_u64() % uint64_t(hi - lo + 1));
  return len;
}

// The plan of one epoch by the definition: steps as [first, end) offsets of `order`, and the row of
// each offset (-1: left out).
struct Plain {
  std::vector<std::pair<int64_t, int64_t>> steps;
  std::vector<int> row;
};
Plain plain_plan(const std::vector<int64_t>& order, const std::vector<int32_t>& len, int T, int R, int M) {
  Plain p;
  p.row.assign(order.size(), -1);
  size_t i = 0;
  while (i < order.size()) {
    std::vector<int> fill(R, 0), count(R, 0);
    const size_t first = i;
    bool full = false;
    for (; i < order.size(); ++i) {
      const int L = len[size_t(order[i])];
      int r = 0;
      while (r < R && (fill[r] + L > T || count[r] >= M)) ++r;
      if (r == R) {
        full = true;
        break;
      }
      fill[r] += L;
      ++count[r];
      p.row[i] = r;
    }
    if (!full) {
      for (size_t k = first; k < order.size(); ++k) p.row[k] = -1;
      break;
    }
    p.steps.push_back({int64_t(first), int64_t(i)});
  }
  return p;
}

// Every micro-batch of step `step` gathered into the step's rows: example -> global row.
std::map<int64_t, int> step_rows(const nlp::PackedSampler& ps, int64_t step, int world, int B, int A) {
  std::map<int64_t, int> at;
  for (int a = 0; a < A; ++a)
    for (int r = 0; r < world; ++r) {
      const auto m = ps.micro(step, a, A, r, world, B);
      EXPECT_EQ(m.rows, B);
      EXPECT_EQ(m.idx.size(), m.row.size());
      for (size_t k = 0; k < m.idx.size(); ++k) {
        EXPECT_TRUE(at.emplace(m.idx[k], (a * world + r) * B + m.row[k]).second) << "example twice in a step";
        EXPECT_GE(m.row[k], 0);
        EXPECT_LT(m.row[k], B);
      }
    }
  return at;
}

TEST(PackedSampler, StepsAreFirstFitRunsOfTheOrder) {
  const int T = 32, M = 5;
  const int64_t N = 700;
  const auto len = random_lengths(N, 1, 20, 11);
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "in file order");
    const nlp::Sampler order(N, 8, 0, 1, 42, shuffle);
    const nlp::PackedSampler ps(order, len, T, 8, M);
    for (int64_t epoch : {0, 1}) {
      const std::vector<int64_t> ord = order.order(epoch);  // a copy: later calls may replan
      const Plain want = plain_plan(ord, len, T, 8, M);
      ASSERT_GT(want.steps.size(), 10u);
      ASSERT_EQ(ps.steps_in_epoch(epoch), int64_t(want.steps.size()));
      int64_t first_step = 0;
      for (int64_t e = 0; e < epoch; ++e) first_step += ps.steps_in_epoch(e);
      for (size_t k = 0; k < want.steps.size(); ++k) {
        const int64_t step = first_step + int64_t(k);
        const auto [b, e] = want.steps[k];
        const auto pos = ps.position(step);
        EXPECT_EQ(pos.first, epoch);
        EXPECT_EQ(pos.second, b);
        const auto got = step_rows(ps, step, 1, 8, 1);
        ASSERT_EQ(int64_t(got.size()), e - b) << "step " << step;
        std::vector<int> fill(8, 0);
        for (int64_t i = b; i < e; ++i) {
          const int64_t ex = ord[size_t(i)];
          ASSERT_TRUE(got.count(ex)) << "example " << ex << " of offset " << i << " is not in step " << step;
          EXPECT_EQ(got.at(ex), want.row[size_t(i)]);
          fill[size_t(got.at(ex))] += len[size_t(ex)];
        }
        for (int f : fill) {
          EXPECT_LE(f, T);
          EXPECT_GT(f, 0);  // no empty row: an empty row has room for any example
        }
      }
      // the left-out tail is shorter than what would fill a step
      EXPECT_LT(want.steps.back().second, N);
    }
  }
}

TEST(PackedSampler, SplitOverRanksAndMicroBatchesKeepsEverySteps) {
  const int T = 24;
  const int64_t N = 500;
  const auto len = random_lengths(N, 2, 18, 12);
  const nlp::Sampler order(N, 8, 0, 1, 7, true);
  const nlp::PackedSampler one(order, len, T, 8, 16);
  struct Split { int world, B, A; };
  for (const Split sp : {Split{2, 4, 1}, Split{4, 2, 1}, Split{2, 2, 2}, Split{1, 4, 2}, Split{8, 1, 1}}) {
    SCOPED_TRACE(testing::Message() << sp.world << " ranks x " << sp.B << " rows x accum " << sp.A);
    const nlp::PackedSampler split(order, len, T, int64_t(sp.world) * sp.B * sp.A, 16);
    for (int64_t step : {0, 1, 5, 17, 40}) {
      EXPECT_EQ(step_rows(split, step, sp.world, sp.B, sp.A), step_rows(one, step, 1, 8, 1)) << "step " << step;
    }
  }
  EXPECT_THROW(one.micro(0, 0, 1, 2, 2, 4), nlp::Error);  // rank 2 of 2
  EXPECT_THROW(one.micro(0, 0, 1, 0, 1, 4), nlp::Error);  // 4 rows of the plan's 8
}

TEST(PackedSampler, StepAtFindsTheFirstStepFromAnOffset) {
  const int T = 16;
  const int64_t N = 300;
  const auto len = random_lengths(N, 1, 16, 13);
  const nlp::Sampler order(N, 4, 0, 1, 3, true);
  const nlp::PackedSampler ps(order, len, T, 4, 4);
  const int64_t k0 = ps.steps_in_epoch(0), k1 = ps.steps_in_epoch(1);
  for (int64_t step = 0; step < k0 + k1; ++step) {
    const auto [e, off] = ps.position(step);
    EXPECT_EQ(e, step < k0 ? 0 : 1);
    EXPECT_EQ(ps.step_at(e, off), step);  // a step's own start
    if (step + 1 < k0 + k1 && ps.position(step + 1).first == e) {
      EXPECT_EQ(ps.step_at(e, off + 1), step + 1);  // inside a step: the next one
    }
  }
  // past the epoch's last step: the first step of the next epoch
  EXPECT_EQ(ps.step_at(0, N), k0);
}

TEST(PackedSampler, RefusesFewerExamplesThanOneStep) {
  const std::vector<int32_t> len(10, 8);
  const nlp::Sampler order(10, 2, 0, 1, 1, false);
  const nlp::PackedSampler ps(order, len, 16, 8, 16);  // 8 rows of 16 hold 16 examples of 8
  EXPECT_THROW(ps.steps_in_epoch(0), nlp::Error);
}

// Five doc_cls examples of lengths {5, 3, 6, 2, 4} in rows of 16, token t of example b = 100 (b+1) + t.
const std::vector<int> kFiveLengths = {5, 3, 6, 2, 4};
nlp::HostBatch five_examples(int T) {
  nlp::HostBatch hb;
  hb.B = 5;
  hb.T = T;
  hb.ids.assign(5 * T, 0);
  hb.mask.assign(5 * T, 0);
  hb.targets.assign(5 * T, -100);
  hb.type_ids.assign(5 * T, 0);
  hb.labels = {0, 1, 0, 1, 1};
  for (int b = 0; b < 5; ++b)
    for (int t = 0; t < kFiveLengths[b]; ++t) {
      hb.ids[b * T + t] = 100 * (b + 1) + t;
      hb.mask[b * T + t] = 1;
    }
  return hb;
}

// pack_rows with planned rows: examples 0..4 of lengths {5, 3, 6, 2, 4} to rows {1, 0, 1, 0, 0} of 3:
// row 0 holds example 1 at 0, 3 at 3, 4 at 5 (9 tokens); row 1 example 0 at 0, 2 at 5 (11); row 2 none.
TEST(PackedSampler, PackRowsPutsExamplesInTheirPlannedRows) {
  const int T = 16;
  const std::vector<int>& len = kFiveLengths;
  const nlp::HostBatch hb = five_examples(T);
  const std::vector<int32_t> rows = {1, 0, 1, 0, 0};
  nlp::HostBatch cut = hb, full = hb;
  nlp::pack_rows(full, 0, &rows, 3);
  nlp::pack_rows(cut, 4, &rows, 3);
  EXPECT_EQ(full.B, 3);
  EXPECT_EQ(full.T, T);
  EXPECT_EQ(cut.T, 12);  // the longest row, 11, rounded up to 4
  EXPECT_EQ(full.E, 5);
  EXPECT_FALSE(full.ragged);
  const std::vector<int32_t> first_full = {T + 0, 0, T + 5, 3, 5};
  const std::vector<int32_t> first_cut = {12 + 0, 0, 12 + 5, 3, 5};
  EXPECT_EQ(full.first, first_full);
  EXPECT_EQ(cut.first, first_cut);
  for (const auto* b : {&full, &cut})
    for (int e = 0; e < 5; ++e)
      for (int t = 0; t < len[e]; ++t) {
        EXPECT_EQ(b->ids[size_t(b->first[e] + t)], 100 * (e + 1) + t);
        EXPECT_EQ(b->pos[size_t(b->first[e] + t)], t);
      }
  // segment ids number the examples of a row in index order; row 2 is all padding
  EXPECT_EQ(full.mask[0], 1);
  EXPECT_EQ(full.mask[3], 2);
  EXPECT_EQ(full.mask[5], 3);
  EXPECT_EQ(full.mask[T + 5], 2);
  EXPECT_EQ(std::count(full.mask.begin() + 2 * T, full.mask.end(), 0), T);
  // a plan that overfills a row is refused
  nlp::HostBatch over = hb;
  const std::vector<int32_t> one_row = {0, 0, 0, 0, 0};  // 20 tokens in a row of 16
  EXPECT_THROW(nlp::pack_rows(over, 0, &one_row, 1), nlp::Error);
}

// data.pack_fixed_examples: the same rows, with the examples padded to rows x min(per_row, row
// length) by ignored fillers at distinct positions where no example starts (the heads scatter-add
// their rows there): up to every position of the batch (per_row 20 > rows of 12).
TEST(PackedSampler, PackRowsWithFixedExamplesAddsIgnoredFillers) {
  const std::vector<int>& len = kFiveLengths;
  const nlp::HostBatch hb = five_examples(16);
  const std::vector<int32_t> rows = {1, 0, 1, 0, 0};
  struct Case {
    int multiple, per_row, E;
  };
  for (const Case c : {Case{0, 4, 3 * 4}, Case{4, 4, 3 * 4}, Case{4, 20, 3 * 12}, Case{0, 1, 5 - 2}}) {
    SCOPED_TRACE(testing::Message() << "multiple " << c.multiple << ", per_row " << c.per_row);
    nlp::HostBatch plain = hb, fixed = hb;
    nlp::pack_rows(plain, c.multiple, &rows, 3);
    if (c.E < 5) {  // fewer fixed examples than the plan holds: a plan of another per-row bound
      EXPECT_THROW(nlp::pack_rows(fixed, c.multiple, &rows, 3, c.per_row), nlp::Error);
      continue;
    }
    nlp::pack_rows(fixed, c.multiple, &rows, 3, c.per_row);
    const size_t n = size_t(fixed.B) * fixed.T;
    EXPECT_EQ(fixed.E, c.E);
    // the rows are those of the plain packing
    EXPECT_EQ(fixed.B, plain.B);
    EXPECT_EQ(fixed.T, plain.T);
    EXPECT_EQ(fixed.ids, plain.ids);
    EXPECT_EQ(fixed.mask, plain.mask);
    EXPECT_EQ(fixed.pos, plain.pos);
    EXPECT_EQ(fixed.token_key, plain.token_key);
    ASSERT_EQ(fixed.first.size(), size_t(c.E));
    ASSERT_EQ(fixed.length.size(), size_t(c.E));
    ASSERT_EQ(fixed.labels.size(), size_t(c.E));
    // the real examples first and unchanged, then the fillers: ignored, one position each, at
    // distinct positions of the batch, none of them where an example starts
    std::set<int32_t> at;
    for (int e = 0; e < c.E; ++e) {
      EXPECT_GE(fixed.first[e], 0);
      EXPECT_LT(size_t(fixed.first[e]), n);
      EXPECT_TRUE(at.insert(fixed.first[e]).second) << "example " << e << " at " << fixed.first[e];
      if (e < 5) {
        EXPECT_EQ(fixed.first[e], plain.first[e]);
        EXPECT_EQ(fixed.length[e], len[e]);
        EXPECT_EQ(fixed.labels[e], hb.labels[e]);
      } else {
        EXPECT_EQ(fixed.length[e], 1);
        EXPECT_EQ(fixed.labels[e], -100);
      }
    }
    EXPECT_EQ(fixed.loss_units(nlp::Task::DocCls), 5);
    EXPECT_FALSE(fixed.ragged);
  }
}

}  // namespace
