// data.padding = longest and data.group_by_length, below the model:
//  - trim_to_longest: the kept length (longest row, answer positions, rounding), the columns cut
//    row by row, MLM rows renumbered, nothing cut when the batch is full;
//  - dropout and attention keyed by T_key: a batch trimmed to T' positions draws exactly the masks of
//    the batch padded to T_key (outputs at the kept positions equal the padded op's, bitwise for
//    dropout, and attention forward and backward to fp32 summation order);
//  - the length-grouped Sampler: a permutation of the epoch per global batch, the same global batch
//    (as a set) at any world size, ranks interleaved, lengths grouped, deterministic;
//  - data.packing: pack_rows' placement and columns; attention over a packed row (segment ids)
//    equals each example's own attention, forward and backward, causal or not; position ids restart.
// Every expected value comes from the padded computation or from the definitions, never from the
// code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <iterator>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/dataset.h"
#include "model/carver.h"
#include "train/batches.h"

namespace {

using nlp::Backend;
using VF = std::vector<float>;

Backend& be() {
  static std::unique_ptr<Backend> b = nlp::make_cpu_backend(2);
  return *b;
}

VF randn(size_t n, uint64_t seed) {
  nlp::Rng r(seed);
  VF v(n);
  for (auto& x : v) x = r.normal();
  return v;
}

// A batch of B rows of T positions whose row b is real for its first len[b] positions.
nlp::HostBatch padded_batch(const std::vector<int>& len, int T) {
  nlp::HostBatch hb;
  hb.B = static_cast<int>(len.size());
  hb.T = hb.T_key = T;
  const size_t n = size_t(hb.B) * T;
  hb.ids.assign(n, 0);
  hb.mask.assign(n, 0);
  hb.targets.assign(n, nlp::kIgnoreIndex);
  hb.type_ids.assign(n, 0);
  for (int b = 0; b < hb.B; ++b)
    for (int t = 0; t < len[b]; ++t) {
      const size_t i = size_t(b) * T + t;
      hb.ids[i] = 100 + b * 1000 + t;  // (row, position) readable from the id
      hb.mask[i] = 1;
      hb.type_ids[i] = t >= len[b] / 2;
      if (t % 3 == 1) hb.targets[i] = 7 * b + t;
    }
  hb.labels.assign(hb.B, 1);
  hb.start.assign(hb.B, nlp::kIgnoreIndex);
  hb.end.assign(hb.B, nlp::kIgnoreIndex);
  for (size_t i = 0; i < n; ++i)
    if (hb.targets[i] != nlp::kIgnoreIndex) {
      hb.rows.push_back(static_cast<int32_t>(i));
      hb.row_targets.push_back(hb.targets[i]);
    }
  hb.has_padding = true;
  return hb;
}

TEST(TrimToLongest, CutsEveryColumnToTheLongestRowRoundedUp) {
  const int T = 32;
  const std::vector<int> len = {5, 11, 3};
  const nlp::HostBatch full = padded_batch(len, T);
  nlp::HostBatch hb = full;
  nlp::trim_to_longest(hb, 8);
  ASSERT_EQ(hb.T, 16);  // longest 11, rounded up to 16
  EXPECT_EQ(hb.T_key, T);
  EXPECT_TRUE(hb.has_padding);
  ASSERT_EQ(hb.ids.size(), size_t(3 * 16));
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 16; ++t) {
      const size_t i = size_t(b) * 16 + t, j = size_t(b) * T + t;
      EXPECT_EQ(hb.ids[i], full.ids[j]);
      EXPECT_EQ(hb.mask[i], full.mask[j]);
      EXPECT_EQ(hb.targets[i], full.targets[j]);
      EXPECT_EQ(hb.type_ids[i], full.type_ids[j]);
    }
  // MLM rows: the same (row, position) renumbered b*T'+t, in the same order, with the same targets
  ASSERT_EQ(hb.rows.size(), full.rows.size());
  for (size_t k = 0; k < hb.rows.size(); ++k) {
    EXPECT_EQ(hb.rows[k] / 16, full.rows[k] / T);
    EXPECT_EQ(hb.rows[k] % 16, full.rows[k] % T);
    EXPECT_EQ(hb.ids[size_t(hb.rows[k])], full.ids[size_t(full.rows[k])]);
  }
  EXPECT_EQ(hb.row_targets, full.row_targets);
}

TEST(TrimToLongest, KeepsAnswerPositionsAndTargetsPastTheMask) {
  const int T = 64;
  nlp::HostBatch hb = padded_batch({4, 6}, T);
  hb.start[1] = 20;  // an answer in the padding (a malformed file): never cut
  hb.end[1] = 30;
  nlp::trim_to_longest(hb, 8);
  EXPECT_EQ(hb.T, 32);
  nlp::HostBatch tg = padded_batch({4, 6}, T);
  tg.targets[size_t(1) * T + 40] = 3;  // a target on a padding position: never cut
  nlp::trim_to_longest(tg, 1);
  EXPECT_EQ(tg.T, 41);
}

TEST(TrimToLongest, MultipleOneAndFullBatches) {
  nlp::HostBatch a = padded_batch({5, 9}, 32);
  nlp::trim_to_longest(a, 1);
  EXPECT_EQ(a.T, 9);
  nlp::HostBatch b = padded_batch({30, 9}, 32);  // rounds to 32: nothing to cut
  const nlp::HostBatch b0 = b;
  nlp::trim_to_longest(b, 8);
  EXPECT_EQ(b.T, 32);
  EXPECT_EQ(b.ids, b0.ids);
  nlp::HostBatch c = padded_batch({8, 8}, 32);  // every row full at 8: no padding left
  nlp::trim_to_longest(c, 8);
  EXPECT_EQ(c.T, 8);
  EXPECT_FALSE(c.has_padding);
  nlp::HostBatch d = padded_batch({0, 0}, 32);  // nothing real at all: one multiple kept
  nlp::trim_to_longest(d, 8);
  EXPECT_EQ(d.T, 8);
}

TEST(KeyedDropout, TrimmedRowsDrawThePaddedMask) {
  const int B = 3, T = 24, Tn = 10, C = 7;
  const float p = 0.3f;
  const uint64_t seed = 0xABCD;
  const VF x = randn(size_t(B) * T * C, 1);
  VF full(x.size());
  be().dropout_forward(full.data(), x.data(), x.size(), p, seed);
  VF xt(size_t(B) * Tn * C);
  for (int b = 0; b < B; ++b)
    std::copy_n(x.begin() + size_t(b) * T * C, size_t(Tn) * C, xt.begin() + size_t(b) * Tn * C);
  VF trimmed(xt.size()), plain(xt.size());
  be().dropout_forward(trimmed.data(), xt.data(), xt.size(), p, seed, nlp::drop_rows(Tn, T, C));
  be().dropout_forward(plain.data(), xt.data(), xt.size(), p, seed);  // flat index: another mask
  size_t differ = 0;
  for (int b = 0; b < B; ++b)
    for (size_t k = 0; k < size_t(Tn) * C; ++k) {
      ASSERT_EQ(trimmed[size_t(b) * Tn * C + k], full[size_t(b) * T * C + k]) << b << " " << k;
      differ += plain[size_t(b) * Tn * C + k] != full[size_t(b) * T * C + k];
    }
  EXPECT_GT(differ, 10u);  // the keying matters: without it rows after the first draw other masks
  // backward: the same keep factors
  const VF d = randn(xt.size(), 2);
  VF gt(xt.size(), 0.f), gf(x.size(), 0.f), df(x.size(), 0.f);
  for (int b = 0; b < B; ++b)
    std::copy_n(d.begin() + size_t(b) * Tn * C, size_t(Tn) * C, df.begin() + size_t(b) * T * C);
  be().dropout_backward(gt.data(), d.data(), d.size(), p, seed, nlp::drop_rows(Tn, T, C));
  be().dropout_backward(gf.data(), df.data(), df.size(), p, seed);
  for (int b = 0; b < B; ++b)
    for (size_t k = 0; k < size_t(Tn) * C; ++k)
      ASSERT_EQ(gt[size_t(b) * Tn * C + k], gf[size_t(b) * T * C + k]);
}

// Attention with key padding and dropout: the batch padded to T with rows real up to len[b] <= Tn,
// against the same batch cut to Tn positions with T_key = T. Outputs and the q/k/v gradients at the
// kept positions agree to fp32 summation order (the masked keys add exact zeros).
TEST(KeyedAttention, TrimmedBatchEqualsPaddedBatchWithDropout) {
  const int B = 2, T = 40, Tn = 17, NH = 2, HS = 8, C = NH * HS;
  const std::vector<int> len = {17, 9};
  const float p = 0.2f;
  const uint64_t seed = 4242;
  const VF qkv = randn(size_t(B) * T * 3 * C, 3);
  const VF dout = randn(size_t(B) * T * C, 4);
  std::vector<int32_t> mask(size_t(B) * T, 0), maskn(size_t(B) * Tn, 0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < len[b]; ++t) mask[size_t(b) * T + t] = maskn[size_t(b) * Tn + t] = 1;
  auto cut = [&](const VF& v, int width) {
    VF o(size_t(B) * Tn * width);
    for (int b = 0; b < B; ++b)
      std::copy_n(v.begin() + size_t(b) * T * width, size_t(Tn) * width, o.begin() + size_t(b) * Tn * width);
    return o;
  };
  auto run = [&](const VF& q, const VF& dO, const std::vector<int32_t>& m, int Tr, int Tk, VF& out, VF& dq) {
    VF att(be().attention_saved_floats(B, Tr, NH, HS)), scr(be().attention_scratch_floats(B, Tr, NH, HS));
    out.assign(size_t(B) * Tr * C, 0.f);
    dq.assign(size_t(B) * Tr * 3 * C, 0.f);
    be().attention_forward(out.data(), att.data(), q.data(), m.data(), false, p, seed, B, Tr, NH, HS, Tk);
    be().attention_backward(dq.data(), scr.data(), dO.data(), out.data(), q.data(), att.data(), m.data(),
                            false, p, seed, B, Tr, NH, HS, Tk);
  };
  VF out_f, dq_f, out_t, dq_t, out_u, dq_u;
  // the padded run's dout is zero at padding positions (no loss there), as in a model
  VF dpad = dout;
  for (int b = 0; b < B; ++b)
    for (int t = len[b]; t < T; ++t) std::fill_n(dpad.begin() + (size_t(b) * T + t) * C, C, 0.f);
  run(qkv, dpad, mask, T, 0, out_f, dq_f);
  run(cut(qkv, 3 * C), cut(dpad, C), maskn, Tn, T, out_t, dq_t);
  run(cut(qkv, 3 * C), cut(dpad, C), maskn, Tn, 0, out_u, dq_u);  // unkeyed: another mask
  auto max_rel = [&](const VF& a, const VF& full, int width, bool real_only) {
    double num = 0, den = 0;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < (real_only ? len[b] : Tn); ++t)
        for (int c = 0; c < width; ++c) {
          const double u = a[(size_t(b) * Tn + t) * width + c], v = full[(size_t(b) * T + t) * width + c];
          num = std::max(num, std::abs(u - v));
          den = std::max(den, std::abs(v));
        }
    return num / den;
  };
  EXPECT_LE(max_rel(out_t, out_f, C, true), 1e-6);
  EXPECT_LE(max_rel(dq_t, dq_f, 3 * C, false), 1e-6);
  EXPECT_GT(max_rel(out_u, out_f, C, true), 1e-2);  // the keying is what makes them equal
}

std::vector<int32_t> spread_lengths(int64_t n, uint64_t seed) {
  nlp::Rng r(seed);
  std::vector<int32_t> len(static_cast<size_t>(n));
  for (auto& l : len) l = 2 + static_cast<int32_t>(r.uniform() * 120);
  return len;
}

const nlp::GroupOrder kOrders[] = {nlp::GroupOrder::LongestFirst, nlp::GroupOrder::Shuffled};

TEST(LengthGroupedSampler, GlobalBatchesPartitionTheEpochAtAnyWorldSize) {
  for (const nlp::GroupOrder order : kOrders) {
  SCOPED_TRACE(order == nlp::GroupOrder::Shuffled ? "shuffled" : "longest_first");
  const int64_t n = 1000;
  const std::vector<int32_t> len = spread_lengths(n, 5);
  const nlp::Sampler one(n, 8, 0, 1, 77, true, &len, 0, order);
  const nlp::Sampler r0(n, 4, 0, 2, 77, true, &len, 0, order), r1(n, 4, 1, 2, 77, true, &len, 0, order);
  const int64_t bpe = one.batches_per_epoch();
  ASSERT_EQ(bpe, n / 8);
  ASSERT_EQ(r0.batches_per_epoch(), bpe);
  std::set<int64_t> seen;
  for (int64_t g = 0; g < bpe; ++g) {
    auto a = one.indices(g), b = r0.indices(g), c = r1.indices(g);
    std::multiset<int64_t> whole(a.begin(), a.end()), parts(b.begin(), b.end());
    parts.insert(c.begin(), c.end());
    EXPECT_EQ(whole, parts) << "global batch " << g;
    // interleaved: rank 0 holds positions 0, 2, 4, ... of the single rank's batch
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(b[size_t(i)], a[size_t(2 * i)]);
      EXPECT_EQ(c[size_t(i)], a[size_t(2 * i + 1)]);
    }
    for (int64_t i : a) EXPECT_TRUE(seen.insert(i).second) << "example " << i << " twice in an epoch";
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), bpe * 8);
  }
}

// Groups are optimizer steps (world x B x grad_accum examples): at any world size and accumulation
// that keep the global batch (what a resume at another world size does), an optimizer step trains
// on the same set of examples.
TEST(LengthGroupedSampler, OptimizerStepsAreTheSameSetsAtAnyWorldAndAccumulation) {
  const int64_t n = 1000;
  const std::vector<int32_t> len = spread_lengths(n, 9);
  struct Shape { int world, B, A; };
  const Shape shapes[] = {{1, 8, 2}, {2, 4, 2}, {2, 8, 1}, {4, 2, 2}, {1, 16, 1}};
  std::vector<std::vector<std::multiset<int64_t>>> steps;  // [shape][step] -> examples
  for (const nlp::GroupOrder order : kOrders)
  for (const Shape& sh : shapes) {
    std::vector<std::multiset<int64_t>> per_step(40);
    for (int r = 0; r < sh.world; ++r) {
      const nlp::Sampler s(n, sh.B, r, sh.world, 3, true, &len, int64_t(sh.world) * sh.B * sh.A, order);
      for (int step = 0; step < 40; ++step)
        for (int a = 0; a < sh.A; ++a)
          for (int64_t i : s.indices(int64_t(step) * sh.A + a)) per_step[size_t(step)].insert(i);
    }
    steps.push_back(per_step);
  }
  const size_t per_order = std::size(shapes);
  for (size_t o = 0; o < std::size(kOrders); ++o)
    for (size_t k = 1; k < per_order; ++k)
      for (size_t st = 0; st < steps[0].size(); ++st)
        EXPECT_EQ(steps[o * per_order + k][st], steps[o * per_order][st]) << "order " << o << " shape " << k << " step " << st;
  EXPECT_THROW(nlp::Sampler(n, 4, 0, 2, 3, true, &len, 12), nlp::Error);  // not whole micro-batches
  EXPECT_THROW(nlp::Sampler(n, 4, 0, 0, 3, true, &len, 16), nlp::Error);  // no ranks: an error, not a
  EXPECT_THROW(nlp::Sampler(n, 0, 0, 1, 3, true, &len, 16), nlp::Error);  // division by zero
}

TEST(LengthGroupedSampler, GroupsLengthsAndShufflesBatchesDeterministically) {
  const int64_t n = 4000;
  const std::vector<int32_t> len = spread_lengths(n, 6);
  const auto shuffled = nlp::GroupOrder::Shuffled;
  const nlp::Sampler grouped(n, 16, 0, 1, 11, true, &len, 0, shuffled), again(n, 16, 0, 1, 11, true, &len, 0, shuffled);
  const nlp::Sampler plain(n, 16, 0, 1, 11, true), other_seed(n, 16, 0, 1, 12, true, &len, 0, shuffled);
  const int64_t bpe = grouped.batches_per_epoch();
  // padded positions if each batch runs at its longest row
  auto padded = [&](const nlp::Sampler& s, int64_t g0) {
    double pos = 0;
    for (int64_t g = g0; g < g0 + bpe; ++g) {
      int32_t mx = 0;
      for (int64_t i : s.indices(g)) mx = std::max(mx, len[size_t(i)]);
      pos += 16.0 * mx;
    }
    return pos;
  };
  double real = 0;
  for (int64_t g = 0; g < bpe; ++g)
    for (int64_t i : grouped.indices(g)) real += len[size_t(i)];
  // lengths 2..121, uniform: random batches of 16 run near the maximum (~114), so about half of the
  // positions are padding; grouped batches run near the length of their own examples.
  const double pad_grouped = 1.0 - real / padded(grouped, 0), pad_plain = 1.0 - real / padded(plain, 0);
  std::printf("padding fraction: grouped %.3f, random order %.3f\n", pad_grouped, pad_plain);
  EXPECT_LT(pad_grouped, 0.1);
  EXPECT_GT(pad_plain, 0.3);
  bool same_order = true, batch_lengths_descend = true;
  int32_t prev = INT32_MAX;
  for (int64_t g = 0; g < bpe; ++g) {
    same_order &= grouped.indices(g) == again.indices(g);
    const int32_t first = len[size_t(grouped.indices(g)[0])];
    batch_lengths_descend &= first <= prev;
    prev = first;
  }
  EXPECT_TRUE(same_order);                 // deterministic
  EXPECT_FALSE(batch_lengths_descend);     // the batches' order is shuffled, not longest first
  EXPECT_NE(grouped.indices(0), other_seed.indices(0));
  EXPECT_NE(grouped.indices(0), grouped.indices(bpe));  // the next epoch is another order
}

// data.group_order = longest_first (the default), HF's LengthGroupedSampler order: mega-batches of
// min(50, N / (4 x group)) steps, each running from its longest examples to its shortest, in turn.
// The steps are the same sets of examples as the shuffled order's (only their order differs).
TEST(LengthGroupedSampler, LongestFirstRunsEachMegaBatchFromLongestToShortest) {
  struct Case { int64_t n; int B; int64_t mega; };
  // 4000 / (4 x 16) = 62 -> at most 50; 400 / (4 x 8) = 12; 40 / (4 x 8) = 1 (at least one step)
  for (const Case c : {Case{4000, 16, 50}, Case{400, 8, 12}, Case{40, 8, 1}}) {
    SCOPED_TRACE(c.n);
    const std::vector<int32_t> len = spread_lengths(c.n, 21);
    const nlp::Sampler hf(c.n, c.B, 0, 1, 5, true, &len);  // the default order
    const nlp::Sampler sh(c.n, c.B, 0, 1, 5, true, &len, 0, nlp::GroupOrder::Shuffled);
    ASSERT_EQ(hf.mega_batch_steps(), c.mega);
    const int64_t bpe = hf.batches_per_epoch();
    auto lo = [&](const std::vector<int64_t>& ix) {
      int32_t m = INT32_MAX;
      for (int64_t i : ix) m = std::min(m, len[size_t(i)]);
      return m;
    };
    auto hi = [&](const std::vector<int64_t>& ix) {
      int32_t m = 0;
      for (int64_t i : ix) m = std::max(m, len[size_t(i)]);
      return m;
    };
    int restarts = 0;
    std::multiset<std::multiset<int64_t>> steps_hf, steps_sh;
    for (int64_t g = 0; g < bpe; ++g) {
      const auto a = hf.indices(g), b = sh.indices(g);
      steps_hf.insert(std::multiset<int64_t>(a.begin(), a.end()));
      steps_sh.insert(std::multiset<int64_t>(b.begin(), b.end()));
      if (g == 0) continue;
      const auto prev = hf.indices(g - 1);
      if (g % c.mega != 0) {
        EXPECT_GE(lo(prev), hi(a)) << "step " << g << " holds a longer example than step " << g - 1;
      } else if (hi(a) > lo(prev)) {
        ++restarts;  // a new mega-batch starts again from its longest examples
      }
    }
    EXPECT_EQ(steps_hf, steps_sh);
    // every mega-batch boundary restarts from long examples (lengths 2..121 at random: certain here)
    if (c.mega > 1) EXPECT_EQ(restarts, (bpe - 1) / c.mega);
  }
}

// pack_rows: lengths {5, 11, 3, 9, 4} in rows of 16, first-fit longest first: 11 -> row 0 at 0, 9 ->
// row 1 at 0, 5 -> row 0 at 11, 4 -> row 1 at 9, 3 -> row 1 at 13 (0 has 0 left). Worked out by hand
// from the rule, not read from the code.
TEST(PackRows, FirstFitLongestFirstKeepsEveryColumnOfEachExample) {
  const int T = 16;
  const std::vector<int> len = {5, 11, 3, 9, 4};
  const nlp::HostBatch full = padded_batch(len, T);
  nlp::HostBatch hb = full;
  nlp::pack_rows(hb, 0);  // rows of the file's length
  ASSERT_EQ(hb.B, 2);
  ASSERT_EQ(hb.E, 5);
  EXPECT_EQ(hb.T, T);
  EXPECT_TRUE(hb.has_padding);
  const std::vector<int32_t> first = {0 * T + 11, 0 * T + 0, 1 * T + 13, 1 * T + 0, 1 * T + 9};
  const std::vector<int32_t> seg = {2, 1, 3, 1, 2};  // order of placement within the row
  EXPECT_EQ(hb.first, first);
  EXPECT_EQ(hb.length, std::vector<int32_t>(len.begin(), len.end()));
  int64_t real = 0;
  for (int e = 0; e < 5; ++e)
    for (int t = 0; t < len[e]; ++t) {
      const size_t i = size_t(first[e]) + t, j = size_t(e) * T + t;
      EXPECT_EQ(hb.ids[i], full.ids[j]);
      EXPECT_EQ(hb.targets[i], full.targets[j]);
      EXPECT_EQ(hb.type_ids[i], full.type_ids[j]);
      EXPECT_EQ(hb.mask[i], seg[e]);
      EXPECT_EQ(hb.pos[i], t);
      EXPECT_EQ(hb.token_key[i], e * T + t);  // the padded batch's (example, position)
      ++real;
    }
  int64_t zeros = 0;  // everything else is padding: segment 0, no target
  for (size_t i = 0; i < hb.mask.size(); ++i)
    if (hb.mask[i] == 0) {
      ++zeros;
      EXPECT_EQ(hb.targets[i], nlp::kIgnoreIndex);
    }
  EXPECT_EQ(real + zeros, int64_t(2) * T);
  EXPECT_EQ(hb.labels, full.labels);  // per example, unchanged
  // MLM rows: the same tokens and targets, at their packed positions
  ASSERT_EQ(hb.rows.size(), full.rows.size());
  std::multiset<std::pair<int32_t, int32_t>> want, got;
  for (size_t k = 0; k < full.rows.size(); ++k) want.insert({full.ids[size_t(full.rows[k])], full.row_targets[k]});
  for (size_t k = 0; k < hb.rows.size(); ++k) {
    got.insert({hb.ids[size_t(hb.rows[k])], hb.row_targets[k]});
    EXPECT_EQ(hb.targets[size_t(hb.rows[k])], hb.row_targets[k]);
  }
  EXPECT_EQ(got, want);
}

// With a multiple, the row length is the one with the fewest positions (rows x length), the shorter on
// a tie. Lengths {5, 11, 3, 9, 4} (32 tokens), rows of up to 16, first-fit longest first: 11 -> 11 | 9 |
// 5 4 | 3 = 44 positions; 12 -> 11 | 9 3 | 5 4 = 36; 13 -> 11 | 9 4 | 5 3 = 39; 14 -> 11 3 | 9 5 | 4 =
// 42; 15 -> 11 4 | 9 5 | 3 = 45; 16 -> 11 5 | 9 4 3 = 32: 16 wins. Lengths {6, 6, 5, 4}: 6 -> 4 rows,
// 24; 9 -> 6 | 6 | 5 4 = 27; 10 -> 6 4 | 6 | 5 = 30; 11 -> 6 5 | 6 4 = 22; 12 -> 6 6 | 5 4 = 24: 11
// wins. With multiple 8 the candidates are 8 (4 rows, 32) and 16 (6 6 4 | 5, 32): the tie goes to 8.
TEST(PackRows, ChoosesTheRowLengthWithTheFewestPositions) {
  nlp::HostBatch a = padded_batch({5, 11, 3, 9, 4}, 16);
  nlp::pack_rows(a, 1);
  EXPECT_EQ(a.T, 16);
  EXPECT_EQ(a.B, 2);
  nlp::HostBatch b = padded_batch({6, 6, 5, 4}, 16);
  nlp::pack_rows(b, 1);
  EXPECT_EQ(b.T, 11);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.T_key, 16);  // dropout keys stay those of the file's rows
  EXPECT_EQ(b.ids.size(), size_t(22));
  EXPECT_EQ(b.first, (std::vector<int32_t>{0, 11, 6, 17}));
  nlp::HostBatch c = padded_batch({6, 6, 5, 4}, 16);
  nlp::pack_rows(c, 8);
  EXPECT_EQ(c.T, 8);
  EXPECT_EQ(c.B, 4);
}

// The row length rule of data.packing: multiples of max(pad_multiple, 16), except rows of the file's
// length with data.padding = max_length, and on cuda with model.attention = cudnn unless
// data.pad_multiple was given (one row length, one cuDNN graph).
TEST(PackRows, FullRowsOnCudaWithCudnnUnlessThePadMultipleIsSet) {
  nlp::Config c;
  c.data.padding = "longest";
  c.model.attention = "cudnn";
  c.data.pad_multiple = nlp::auto_pad_multiple(true, true);  // as main.cpp resolves auto
  EXPECT_EQ(c.data.pad_multiple, 64);
  EXPECT_TRUE(nlp::packs_full_rows(c, true));
  EXPECT_FALSE(nlp::packs_full_rows(c, false));  // cpu
  EXPECT_EQ(nlp::packing_multiple(c, true), 0);
  c.data.pad_multiple = nlp::auto_pad_multiple(false, true);  // the cpu's auto
  EXPECT_EQ(nlp::packing_multiple(c, false), 16);
  for (const char* a : {"auto", "native"}) {  // packed rows on the native kernels: no graphs
    c.model.attention = a;
    EXPECT_FALSE(nlp::packs_full_rows(c, true)) << a;
  }
  c.model.attention = "cudnn";
  c.explicitly_set.insert("data.pad_multiple");
  c.data.pad_multiple = 32;
  EXPECT_FALSE(nlp::packs_full_rows(c, true));
  EXPECT_EQ(nlp::packing_multiple(c, true), 32);
  c.data.padding = "max_length";
  EXPECT_EQ(nlp::packing_multiple(c, true), 0);
  // what 0 means to pack_rows: rows of the file's length
  nlp::HostBatch b = padded_batch({6, 6, 5, 4}, 16);
  nlp::pack_rows(b, 0);
  EXPECT_EQ(b.T, 16);
  EXPECT_EQ(b.B, 2);
}

// data.pad_multiple = 0: 1 on the cpu, 64 on cuda with cuDNN's attention (graphs per length), 8 with
// the native kernels.
TEST(TrimToLongest, AutoMultiplePerBackendAndAttention) {
  EXPECT_EQ(nlp::auto_pad_multiple(false, false), 1);
  EXPECT_EQ(nlp::auto_pad_multiple(false, true), 1);
  EXPECT_EQ(nlp::auto_pad_multiple(true, false), 8);
  EXPECT_EQ(nlp::auto_pad_multiple(true, true), 64);
}

TEST(PackRows, RejectsAMaskThatIsNotOnesThenZeros) {
  nlp::HostBatch hole = padded_batch({5, 6}, 16);
  hole.mask[size_t(1) * 16 + 2] = 0;
  EXPECT_THROW(nlp::pack_rows(hole, 1), nlp::Error);
  nlp::HostBatch empty = padded_batch({5, 0}, 16);
  EXPECT_THROW(nlp::pack_rows(empty, 1), nlp::Error);
  nlp::HostBatch answer = padded_batch({5, 6}, 16);
  answer.start[0] = 7;  // past its 5 tokens
  EXPECT_THROW(nlp::pack_rows(answer, 1), nlp::Error);
}

// One packed row of three examples (lengths 5, 9, 6) and a padding tail, against each example alone
// (a batch of one, no mask): outputs and q/k/v gradients at the examples' positions agree to fp32
// summation order, and the gradient reaching the padding tail's q/k/v is exactly zero when its dout
// is zero. Causal too (the rule is the same with j <= i).
TEST(PackedAttention, EachSegmentEqualsItsExampleAlone) {
  const int T = 24, NH = 2, HS = 8, C = NH * HS;
  const std::vector<int> len = {5, 9, 6}, off = {0, 5, 14};
  for (bool causal : {false, true}) {
    const VF qkv = randn(size_t(T) * 3 * C, 11);
    VF dout = randn(size_t(T) * C, 12);
    std::fill(dout.begin() + size_t(20) * C, dout.end(), 0.f);  // no loss on the padding tail
    std::vector<int32_t> seg(T, 0);
    for (int e = 0; e < 3; ++e)
      for (int t = 0; t < len[e]; ++t) seg[size_t(off[e] + t)] = e + 1;
    VF att(be().attention_saved_floats(1, T, NH, HS)), scr(be().attention_scratch_floats(1, T, NH, HS));
    VF out(size_t(T) * C), dq(size_t(T) * 3 * C, 0.f);
    be().attention_forward(out.data(), att.data(), qkv.data(), seg.data(), causal, 0.f, 1, 1, T, NH, HS);
    be().attention_backward(dq.data(), scr.data(), dout.data(), out.data(), qkv.data(), att.data(), seg.data(),
                            causal, 0.f, 1, 1, T, NH, HS);
    double worst = 0;
    for (int e = 0; e < 3; ++e) {
      const int L = len[e];
      VF q1(qkv.begin() + size_t(off[e]) * 3 * C, qkv.begin() + size_t(off[e] + L) * 3 * C);
      VF d1(dout.begin() + size_t(off[e]) * C, dout.begin() + size_t(off[e] + L) * C);
      VF a1(be().attention_saved_floats(1, L, NH, HS)), s1(be().attention_scratch_floats(1, L, NH, HS));
      VF o1(size_t(L) * C), g1(size_t(L) * 3 * C, 0.f);
      be().attention_forward(o1.data(), a1.data(), q1.data(), nullptr, causal, 0.f, 1, 1, L, NH, HS);
      be().attention_backward(g1.data(), s1.data(), d1.data(), o1.data(), q1.data(), a1.data(), nullptr, causal,
                              0.f, 1, 1, L, NH, HS);
      for (size_t k = 0; k < o1.size(); ++k)
        worst = std::max(worst, std::abs(double(out[size_t(off[e]) * C + k]) - o1[k]) / (1 + std::abs(o1[k])));
      for (size_t k = 0; k < g1.size(); ++k)
        worst = std::max(worst, std::abs(double(dq[size_t(off[e]) * 3 * C + k]) - g1[k]) / (1 + std::abs(g1[k])));
    }
    EXPECT_LE(worst, 1e-6) << "causal " << causal;
    // the tail's k and v are attended by nobody but the tail, whose dout is zero
    for (size_t k = size_t(20) * 3 * C; k < dq.size(); ++k) ASSERT_EQ(dq[k], 0.f) << k;
  }
}

// With dropout: a packed row (token_key = example * Tk + position) draws the masks of the padded
// batch [3, Tk] with a 0/1 mask, so outputs and q/k/v gradients at the examples' positions agree to
// fp32 summation order; the hidden-state dropout (DropRows with token_key) agrees bitwise. Without
// the keys (T_key alone) the packed row draws other masks and differs.
TEST(PackedAttention, TokenKeysDrawThePaddedBatchsDropoutMasks) {
  const int T = 24, Tk = 10, NH = 2, HS = 8, C = NH * HS, E = 3;
  const std::vector<int> len = {5, 9, 6}, off = {0, 5, 14};
  const float p = 0.25f;
  const uint64_t seed = 777;
  const VF qkv = randn(size_t(T) * 3 * C, 31);
  VF dout = randn(size_t(T) * C, 32);
  std::fill(dout.begin() + size_t(20) * C, dout.end(), 0.f);
  std::vector<int32_t> seg(T, 0), key(T, 0), mask(size_t(E) * Tk, 0);
  VF qkv_pad(size_t(E) * Tk * 3 * C, 0.f), dout_pad(size_t(E) * Tk * C, 0.f);
  for (int e = 0; e < E; ++e)
    for (int t = 0; t < len[e]; ++t) {
      const int i = off[e] + t;
      seg[size_t(i)] = e + 1;
      key[size_t(i)] = e * Tk + t;
      mask[size_t(e) * Tk + t] = 1;
      std::copy_n(qkv.begin() + size_t(i) * 3 * C, 3 * C, qkv_pad.begin() + (size_t(e) * Tk + t) * 3 * C);
      std::copy_n(dout.begin() + size_t(i) * C, C, dout_pad.begin() + (size_t(e) * Tk + t) * C);
    }
  auto run = [&](int B, int Tr, const VF& q, const VF& d, const std::vector<int32_t>& m, int T_key,
                 const int32_t* tk, VF& out, VF& dq) {
    VF att(be().attention_saved_floats(B, Tr, NH, HS)), scr(be().attention_scratch_floats(B, Tr, NH, HS));
    out.assign(size_t(B) * Tr * C, 0.f);
    dq.assign(size_t(B) * Tr * 3 * C, 0.f);
    be().attention_forward(out.data(), att.data(), q.data(), m.data(), false, p, seed, B, Tr, NH, HS, T_key, tk);
    be().attention_backward(dq.data(), scr.data(), d.data(), out.data(), q.data(), att.data(), m.data(), false, p,
                            seed, B, Tr, NH, HS, T_key, tk);
  };
  VF out_p, dq_p, out_r, dq_r, out_u, dq_u;
  run(1, T, qkv, dout, seg, Tk, key.data(), out_p, dq_p);
  run(E, Tk, qkv_pad, dout_pad, mask, 0, nullptr, out_r, dq_r);
  run(1, T, qkv, dout, seg, Tk, nullptr, out_u, dq_u);  // keyed by row position: other masks
  double worst = 0, unkeyed = 0;
  for (int e = 0; e < E; ++e)
    for (int t = 0; t < len[e]; ++t) {
      const size_t i = size_t(off[e] + t), r = size_t(e) * Tk + t;
      for (int c = 0; c < C; ++c) {
        worst = std::max(worst, std::abs(double(out_p[i * C + c]) - out_r[r * C + c]));
        unkeyed = std::max(unkeyed, std::abs(double(out_u[i * C + c]) - out_r[r * C + c]));
      }
      for (int c = 0; c < 3 * C; ++c)
        worst = std::max(worst, std::abs(double(dq_p[i * 3 * C + c]) - dq_r[r * 3 * C + c]));
    }
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(unkeyed, 1e-2);
  // hidden-state dropout on [T, C] keyed per token equals the padded [E, Tk, C] dropout, bitwise
  const VF x = randn(size_t(T) * C, 33);
  VF x_pad(size_t(E) * Tk * C, 0.f), y(x.size()), y_pad(x_pad.size());
  for (int e = 0; e < E; ++e)
    std::copy_n(x.begin() + size_t(off[e]) * C, size_t(len[e]) * C, x_pad.begin() + size_t(e) * Tk * C);
  be().dropout_forward(y.data(), x.data(), x.size(), p, seed, nlp::drop_rows(T, Tk, C, key.data()));
  be().dropout_forward(y_pad.data(), x_pad.data(), x_pad.size(), p, seed);
  for (int e = 0; e < E; ++e)
    for (int k = 0; k < len[e] * C; ++k)
      ASSERT_EQ(y[size_t(off[e]) * C + k], y_pad[size_t(e) * Tk * C + k]) << e << " " << k;
}

// Position ids: packed rows look up (and scatter into) the position each token has in its example.
TEST(PackedEmbedding, PositionIdsRestartInEachExample) {
  const int B = 1, T = 8, C = 5, V = 20, P = 10;
  const VF wte = randn(size_t(V) * C, 21), wpe = randn(size_t(P) * C, 22);
  const std::vector<int32_t> ids = {3, 4, 5, 6, 7, 8, 9, 10}, pos = {0, 1, 2, 0, 1, 0, 1, 2};
  VF out(size_t(T) * C);
  be().embedding_forward(out.data(), ids.data(), nullptr, wte.data(), wpe.data(), nullptr, B, T, C, 0,
                         pos.data());
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c)
      ASSERT_EQ(out[size_t(t) * C + c], wte[size_t(ids[t]) * C + c] + wpe[size_t(pos[t]) * C + c]);
  const VF dout = randn(size_t(T) * C, 23);
  VF dwpe(size_t(P) * C, 0.f);
  be().embedding_backward(nullptr, dwpe.data(), nullptr, dout.data(), ids.data(), nullptr, B, T, C, 0,
                          pos.data());
  for (int p = 0; p < P; ++p)
    for (int c = 0; c < C; ++c) {
      double want = 0;
      for (int t = 0; t < T; ++t)
        if (pos[t] == p) want += dout[size_t(t) * C + c];
      ASSERT_NEAR(dwpe[size_t(p) * C + c], want, 1e-6) << p << " " << c;
    }
}

// The activation arenas are laid out by a Carver (model/carver.h), which holds the layout to the size
// its owner counted: tensors one after another, and an error for a layout that takes more or less.
TEST(Carver, LaysTensorsOutInOrderAndHoldsTheLayoutToTheCount) {
  std::vector<float> arena(10);
  nlp::Carver take(arena.data(), arena.size());
  float* a = take(4);
  float* b = take(0);
  float* c = take(6);
  EXPECT_EQ(a, arena.data());
  EXPECT_EQ(b, arena.data() + 4);
  EXPECT_EQ(c, arena.data() + 4);
  EXPECT_NO_THROW(take.done());
  EXPECT_THROW(take(1), nlp::Error);  // past the count
  nlp::Carver short_layout(arena.data(), arena.size());
  short_layout(9);
  EXPECT_THROW(short_layout.done(), nlp::Error);  // one float counted and never taken
}

}  // namespace
