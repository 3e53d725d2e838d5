// Tests of the gradient communication pieces that need no second process (the multi-rank runs are in
// tests/python/test_comm.py): the bucketing of GradReducer, the model's grad-ready hook (every range
// it reports as final must not change afterwards in the same backward, for GPT-2 and every BERT head),
// and the staged communicator's copies on the CPU backend, against a fake inner communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/factory.h"
#include "comm/comm.h"
#include "comm/grad_reducer.h"
#include "core/backend.h"
#include "model/model.h"

using namespace nlp;

namespace {

// Two ranks holding the same data: a sum doubles every element. Started sums are applied only at
// the wait, so a caller that read a range before waiting would see it unreduced.
class FakeComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 2; }
  void allreduce_sum(float* buf, size_t n) override {
    blocking.emplace_back(buf, n);
    for (size_t i = 0; i < n; ++i) buf[i] *= 2;
  }
  void allreduce_sum_host(double* buf, size_t n) override {
    for (size_t i = 0; i < n; ++i) buf[i] *= 2;
  }
  void broadcast_host(void*, size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
  void allreduce_sum_start(float* buf, size_t n) override { started.emplace_back(buf, n); }
  void progress() override { ++progressed; }
  void allreduce_wait() override {
    ++waits;
    for (size_t k = applied; k < started.size(); ++k)
      for (size_t i = 0; i < started[k].second; ++i) started[k].first[i] *= 2;
    applied = started.size();
  }
  // As rank 0 of two ranks holding the same data: its own range doubles.
  void reduce_scatter_sum(float* buf, const ShardLayout& sh) override {
    scattered.push_back(sh.total);
    for (size_t i = sh.lo(0); i < sh.hi(0); ++i) buf[i] *= 2;
  }
  // A bucket: its part in rank 0's range doubles at once, the rest is overwritten with NaN (it is
  // unspecified), so a caller that read outside its range would see it. Started buckets (lo, n).
  void reduce_scatter_sum_start(float* bucket, size_t lo, size_t n, const ShardLayout& sh) override {
    started_rs.emplace_back(lo, n);
    const auto [a, b] = sh.part(0, lo, lo + n);
    for (size_t i = lo; i < lo + n; ++i)
      bucket[i - lo] = i >= a && i < b ? 2 * bucket[i - lo] : std::numeric_limits<float>::quiet_NaN();
  }
  void all_gather(float*, const ShardLayout& sh) override { gathered.push_back(sh.total); }
  void gather_host(const float* mine, float* all, const ShardLayout& sh, int) override {
    std::copy(mine, mine + sh.count[0], all + sh.lo(0));
  }
  std::vector<std::pair<float*, size_t>> blocking, started;
  std::vector<std::pair<size_t, size_t>> started_rs;
  std::vector<size_t> scattered, gathered;
  size_t applied = 0;
  int progressed = 0, waits = 0;
};

}  // namespace

TEST(GradReducer, BucketsAreContiguousDescendingAndCoverTheArena) {
  FakeComm c;
  std::vector<float> g(1000);
  std::iota(g.begin(), g.end(), 1.f);
  GradReducer r(c, g.data(), g.size(), /*bucket_floats=*/100, /*overlap=*/true);
  r.begin();
  for (size_t lo : {900, 850, 700, 400, 390}) r.ready(lo);
  // Started so far: [900,1000), [700,900) (850 alone held only 50 floats), [400,700) (390 adds only
  // 10); not yet reduced (the fake applies them at the wait).
  using R = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(r.buckets(), (R{{900, 1000}, {700, 900}, {400, 700}}));
  EXPECT_EQ(g[999], 1000.f);
  EXPECT_EQ(c.progressed, 5);
  r.ready(0);  // 400 floats left: a bucket of its own
  r.finish();
  EXPECT_EQ(r.buckets(), (R{{900, 1000}, {700, 900}, {400, 700}, {0, 400}}));
  EXPECT_EQ(c.waits, 1);
  EXPECT_TRUE(c.blocking.empty());
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], 2.f * (i + 1)) << i;
}

TEST(GradReducer, FinishStartsWhatIsLeftAndANewStepStartsOver) {
  FakeComm c;
  std::vector<float> g(300, 1.f);
  GradReducer r(c, g.data(), g.size(), 1000, true);
  r.begin();
  r.ready(200);  // below the bucket size: nothing started
  EXPECT_TRUE(c.started.empty());
  r.finish();
  using R = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(r.buckets(), (R{{0, 300}}));
  for (float v : g) ASSERT_EQ(v, 2.f);
  r.begin();
  r.finish();
  EXPECT_EQ(r.buckets(), (R{{0, 300}}));
  for (float v : g) ASSERT_EQ(v, 4.f);
}

TEST(GradReducer, WithoutOverlapOneBlockingSum) {
  FakeComm c;
  std::vector<float> g(300, 1.f);
  GradReducer r(c, g.data(), g.size(), 10, false);
  r.begin();
  r.ready(100);
  EXPECT_TRUE(c.started.empty());
  r.finish();
  ASSERT_EQ(c.blocking.size(), 1u);
  EXPECT_EQ(c.blocking[0].second, 300u);
  for (float v : g) ASSERT_EQ(v, 2.f);
}

TEST(StagedComm, SumsThroughHostBuffersInChunksAndInBuckets) {
  auto be = make_backend("cpu", 1, 0);
  FakeComm inner;
  auto staged = make_staged_comm(inner, *be, /*chunk_floats=*/7);  // 7 does not divide 50
  float* d = static_cast<float*>(be->alloc(50 * sizeof(float)));
  for (int i = 0; i < 50; ++i) d[i] = float(i);
  staged->allreduce_sum(d, 50);
  ASSERT_EQ(inner.blocking.size(), 8u);  // ceil(50 / 7) chunks
  for (auto& [p, n] : inner.blocking) EXPECT_TRUE(p < d || p >= d + 50) << "not staged";
  for (int i = 0; i < 50; ++i) ASSERT_EQ(d[i], 2.f * i);
  // Buckets: copied out at the start, back at the wait.
  staged->allreduce_sum_start(d + 30, 20);
  staged->allreduce_sum_start(d, 30);
  EXPECT_EQ(d[49], 98.f);  // untouched until the wait
  staged->allreduce_wait();
  for (int i = 0; i < 50; ++i) ASSERT_EQ(d[i], 4.f * i);
  // The next step reuses the buffers.
  staged->allreduce_sum_start(d, 50);
  staged->allreduce_wait();
  for (int i = 0; i < 50; ++i) ASSERT_EQ(d[i], 8.f * i);
  be->release(d);
}

// ---- the grad-ready hook ---------------------------------------------------------------------------

struct HookCase {
  std::string type, task;
};

class GradHookTest : public ::testing::TestWithParam<HookCase> {};

TEST_P(GradHookTest, RangesReportedFinalDoNotChangeLater) {
  const HookCase hc = GetParam();
  auto be = make_backend("cpu", 1, 0);
  ModelConfig mc;
  mc.type = hc.type;
  const int B = 2, T = 8, V = 40, L = 3;
  mc.vocab_size = V;
  mc.n_layer = L, mc.n_head = 2, mc.n_embd = 16, mc.n_positions = 16;
  mc.num_hidden_layers = L, mc.num_attention_heads = 2, mc.hidden_size = 16;
  mc.intermediate_size = 32, mc.max_position_embeddings = 16;
  mc.num_labels = 3;
  auto m = make_model(mc, *be, hc.task);
  m->init_weights(3);
  ParamStore& ps = m->params();

  std::vector<int32_t> ids(B * T), mask(B * T, 1), types(B * T, 0), targets(B * T), labels(B),
      start(B), end(B), rows, row_targets;
  for (int i = 0; i < B * T; ++i) {
    ids[i] = (i * 7 + 3) % V;
    targets[i] = hc.task == "ner" ? i % 3 : (i * 5 + 1) % V;
    if (hc.task == "mlm" && i % 3 == 0) {
      rows.push_back(i);
      row_targets.push_back(targets[i]);
    }
  }
  for (int b = 0; b < B; ++b) labels[b] = b % 3, start[b] = 1 + b, end[b] = 3 + b;
  DeviceBatch db;
  db.B = B, db.T = T;
  db.ids = ids.data();
  if (hc.type == "bert") db.mask = mask.data(), db.type_ids = types.data();
  db.targets = targets.data();
  db.labels = labels.data();
  db.start = start.data(), db.end = end.data();
  db.rows = rows.data(), db.row_targets = row_targets.data(), db.nrows = int(rows.size());

  be->zero(ps.grad(), ps.total() * sizeof(float));
  m->forward(db, true, 11);
  std::vector<std::pair<size_t, std::vector<float>>> snaps;
  m->set_grad_ready_hook([&](size_t lo) {
    snaps.emplace_back(lo, std::vector<float>(ps.grad() + lo, ps.grad() + ps.total()));
  });
  m->backward(db, 0.05f, true, 11);
  m->set_grad_ready_hook(nullptr);

  ASSERT_EQ(snaps.size(), size_t(L + 2)) << "after the head, after each block, after the embeddings";
  EXPECT_EQ(snaps.back().first, 0u);
  EXPECT_LT(snaps.front().first, ps.total());
  for (size_t k = 1; k < snaps.size(); ++k) EXPECT_LT(snaps[k].first, snaps[k - 1].first) << k;
  double first_abs = 0;
  for (float v : snaps[1].second) first_abs += std::abs(v);
  EXPECT_GT(first_abs, 0) << "the last block's gradients are final after its backward: not all zero";
  for (const auto& [lo, snap] : snaps) {
    ASSERT_EQ(0, std::memcmp(snap.data(), ps.grad() + lo, snap.size() * sizeof(float)))
        << "gradients at offsets >= " << lo << " changed after the hook said they were final";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GradHookTest,
                         ::testing::Values(HookCase{"gpt2", "clm"}, HookCase{"bert", "mlm"},
                                           HookCase{"bert", "doc_cls"}, HookCase{"bert", "ner"},
                                           HookCase{"bert", "qa"}),
                         [](const auto& info) { return info.param.type + "_" + info.param.task; });

// ---- ZeRO-1 shard layout (comm/shard.h) -----------------------------------------------------------

TEST(ShardLayout, RangesTileTheArenaAlignedAndBalanced) {
  for (size_t total : {0, 1, 15, 16, 17, 1000, 124439808 + 7})
    for (int ranks : {1, 2, 3, 4, 7, 8}) {
      const ShardLayout sh = ShardLayout::even(total, ranks, 16);
      ASSERT_EQ(sh.ranks(), ranks);
      size_t next = 0, each = 0;
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(sh.lo(r), next) << total << " " << ranks << " " << r;  // contiguous, in rank order
        if (r == 0) each = sh.count[0];
        if (sh.count[r] > 0) ASSERT_EQ(sh.lo(r) % 16, 0u);  // an empty range sits at the end
        // every range is the first one's size, except a shorter last non-empty one and empty ones
        if (sh.hi(r) < total) ASSERT_EQ(sh.count[r], each) << total << " " << ranks << " " << r;
        next = sh.hi(r);
      }
      ASSERT_EQ(next, total);
      EXPECT_EQ(sh.total, total);
      EXPECT_EQ(sh.largest(), each);
      // no rank holds more than its share rounded up to the alignment
      EXPECT_LE(each, (total + ranks - 1) / ranks + 15);
    }
  const ShardLayout one = ShardLayout::even(1000, 1);
  EXPECT_EQ(one.lo(0), 0u);
  EXPECT_EQ(one.hi(0), 1000u);
  EXPECT_TRUE(ShardLayout::even(64, 4).equal_counts());
  EXPECT_FALSE(ShardLayout::even(65, 4).equal_counts());
}

TEST(GradReducer, ZeroWithOverlapReduceScattersEachBucket) {
  FakeComm c;
  std::vector<float> g(1000);
  std::iota(g.begin(), g.end(), 1.f);
  const ShardLayout sh = ShardLayout::even(g.size(), 2);  // rank 0 owns [0, 512)
  GradReducer r(c, g.data(), g.size(), 300, /*overlap=*/true, &sh);
  r.begin();
  for (size_t lo : {700, 400, 0}) r.ready(lo);
  r.finish();
  using R = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(r.buckets(), (R{{700, 1000}, {400, 700}, {0, 400}}));
  EXPECT_EQ(c.started_rs, (R{{700, 300}, {400, 300}, {0, 400}}));  // [400, 700) straddles 512
  EXPECT_TRUE(c.started.empty() && c.blocking.empty() && c.scattered.empty());
  EXPECT_EQ(c.waits, 1);
  for (size_t i = 0; i < 512; ++i) ASSERT_EQ(g[i], 2.f * (i + 1)) << i;
}

TEST(GradReducer, ZeroWithoutOverlapReduceScattersOnceAfterTheBackward) {
  FakeComm c;
  std::vector<float> g(1000, 1.f);
  const ShardLayout sh = ShardLayout::even(g.size(), 2);
  GradReducer r(c, g.data(), g.size(), 300, /*overlap=*/false, &sh);
  r.begin();
  for (size_t lo : {700, 400, 0}) r.ready(lo);
  EXPECT_TRUE(c.started_rs.empty() && c.started.empty());
  r.finish();
  EXPECT_EQ(c.scattered, std::vector<size_t>{1000});
  EXPECT_TRUE(c.blocking.empty());
  EXPECT_EQ(c.waits, 0);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], i < sh.hi(0) ? 2.f : 1.f) << i;
}

TEST(ShardLayout, PartsOfABucketTileIt) {
  const ShardLayout sh = ShardLayout::even(70, 4, 16);  // [0,32) [32,64) [64,70) [70,70)
  using P = std::pair<size_t, size_t>;
  EXPECT_EQ(sh.part(0, 10, 50), (P{10, 32}));
  EXPECT_EQ(sh.part(1, 10, 50), (P{32, 50}));
  EXPECT_EQ(sh.part(2, 10, 50).second - sh.part(2, 10, 50).first, 0u);
  EXPECT_EQ(sh.part(3, 0, 70).second - sh.part(3, 0, 70).first, 0u);
  EXPECT_EQ(sh.part(2, 60, 70), (P{64, 70}));
}

// A ZeRO bucket through the staged communicator: all of it goes to the host, only this rank's part
// comes back (the fake writes NaN over the rest of the host copy).
TEST(StagedComm, ZeroBucketsBringBackOnlyThisRanksPart) {
  auto be = make_backend("cpu", 1, 0);
  FakeComm inner;
  auto staged = make_staged_comm(inner, *be, 7);
  const ShardLayout sh = ShardLayout::even(100, 2);  // rank 0 owns [0, 64)
  float* d = static_cast<float*>(be->alloc(100 * sizeof(float)));
  for (int i = 0; i < 100; ++i) d[i] = float(i);
  staged->reduce_scatter_sum_start(d + 50, 50, 50, sh);  // straddles 64
  staged->reduce_scatter_sum_start(d, 0, 50, sh);
  EXPECT_EQ(d[10], 10.f);  // untouched until the wait
  staged->allreduce_wait();
  using R = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(inner.started_rs, (R{{50, 50}, {0, 50}}));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(d[i], i < 64 ? 2.f * i : float(i)) << i;
  be->release(d);
}
