// Multi-rank unit tests of the communicators (run by ctest under mpirun with 2 and 4 ranks,
// tests/CMakeLists.txt): MpiComm's blocking and bucketed sums, and the staged communicator (backend
// memory -> host buffer -> MPI -> back, in chunks) on the CPU backend, where to_host/to_device are
// plain copies. Every rank runs every test; a failure on any rank fails the mpirun.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "comm/grad_reducer.h"
#include "core/backend.h"

using namespace nlp;

namespace {

Comm* g_mpi = nullptr;

// Ranks other than 0 print only their failures, naming the rank.
class RankFailurePrinter final : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// Rank r holds (r + 1) * (i % 97 + 1) at index i: the sum over ranks is S * (i % 97 + 1) with
// S = size (size + 1) / 2, exact in fp32 for these small integers whatever the summation order.
void fill(float* p, size_t n, size_t first, int rank) {
  for (size_t i = 0; i < n; ++i) p[i] = float(rank + 1) * float((first + i) % 97 + 1);
}
void expect_summed(const float* p, size_t n, int size, const char* what) {
  const float s = float(size) * float(size + 1) / 2;
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(p[i], s * float(i % 97 + 1)) << what << ": index " << i << " of " << n;
}

TEST(MpiComm, BlockingAndBucketedSums) {
  Comm& c = *g_mpi;
  ASSERT_GE(c.size(), 2) << "run under mpirun with 2 or more ranks";
  std::vector<float> a(10007);
  fill(a.data(), a.size(), 0, c.rank());
  c.allreduce_sum(a.data(), a.size());
  expect_summed(a.data(), a.size(), c.size(), "allreduce_sum");

  // Buckets of uneven sizes started back to front, as GradReducer does; summed only at the wait.
  fill(a.data(), a.size(), 0, c.rank());
  c.allreduce_sum_start(a.data() + 6000, 4007);
  c.allreduce_sum_start(a.data() + 5999, 1);
  c.allreduce_sum_start(a.data(), 5999);
  c.progress();
  c.allreduce_wait();
  expect_summed(a.data(), a.size(), c.size(), "buckets");
  c.allreduce_wait();  // nothing started: returns at once
}

TEST(MpiComm, HostSumsAndBroadcast) {
  Comm& c = *g_mpi;
  double v[2] = {1.0, double(c.rank())};
  c.allreduce_sum_host(v, 2);
  EXPECT_EQ(v[0], c.size());
  EXPECT_EQ(v[1], c.size() * (c.size() - 1) / 2.0);
  int x = c.rank() == 0 ? 42 : -1;
  c.broadcast_host(&x, sizeof x, 0);
  EXPECT_EQ(x, 42);
}

TEST(StagedComm, CpuBackendChunksAndBucketsEqualTheSum) {
  Comm& c = *g_mpi;
  auto be = make_backend("cpu", 1, 0);
  // 1000 floats per chunk: 10007 is 11 chunks, the last one partial.
  auto staged = make_staged_comm(c, *be, 1000);
  EXPECT_EQ(staged->rank(), c.rank());
  EXPECT_EQ(staged->size(), c.size());
  const size_t n = 10007;
  float* d = static_cast<float*>(be->alloc(n * sizeof(float)));
  fill(d, n, 0, c.rank());
  staged->allreduce_sum(d, n);
  expect_summed(d, n, c.size(), "staged allreduce_sum");

  // Three steps of buckets through the GradReducer (the trainer's path), reusing the host buffers.
  for (int step = 0; step < 3; ++step) {
    fill(d, n, 0, c.rank());
    GradReducer r(*staged, d, n, /*bucket_floats=*/3000, /*overlap=*/true);
    r.begin();
    for (size_t lo : {8000, 6500, 2000, 1500}) r.ready(lo);
    r.ready(0);
    r.finish();
    ASSERT_EQ(r.buckets().size(), 3u);  // [6500,n) [2000,6500) [0,2000)
    expect_summed(d, n, c.size(), "staged buckets");
  }
  be->release(d);
}

// Rank-dependent "gradients": `a` summed by the reference path (one blocking allreduce), `b` the same
// values not yet summed, for the path under test.
void reference_and_copy(Comm& c, size_t n, std::vector<float>& a, std::vector<float>& b) {
  a.resize(n);
  for (size_t i = 0; i < n; ++i) a[i] = 0.001f * float(c.rank() + 1) * float(i % 1013) - 0.3f;
  b = a;
  GradReducer one(c, a.data(), n, 1000, /*overlap=*/false);
  one.begin();
  one.finish();
}

TEST(GradReducer, OverlapEqualsOneAllreduceOverMpi) {
  Comm& c = *g_mpi;
  const size_t n = 50000;
  std::vector<float> a, b;
  reference_and_copy(c, n, a, b);
  GradReducer ovl(c, b.data(), n, 1000, /*overlap=*/true);
  ovl.begin();
  for (size_t lo = n; lo >= 5000; lo -= 5000) ovl.ready(lo - 5000);
  ovl.finish();
  EXPECT_EQ(ovl.buckets().size(), 10u);
  // With 2 ranks a + b is the same whatever the algorithm; with more, only the order may differ.
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::abs(a[i]))) << i;
}

// ZeRO-1's collectives: reduce-scatter leaves each rank's range summed, all-gather spreads every
// rank's range, gather_host brings the ranges to one rank; on an arena whose size does not divide
// evenly (the last range is shorter; with 4 ranks on 70 floats the last one is empty), through MPI
// and through the staged communicator.
void check_zero_collectives(Comm& c, Backend* be, const char* what) {
  for (size_t n : {size_t(10007), size_t(70), size_t(64)}) {
    const ShardLayout sh = ShardLayout::even(n, c.size(), 16);
    float* d = be ? static_cast<float*>(be->alloc(n * sizeof(float))) : new float[n];
    fill(d, n, 0, c.rank());
    c.reduce_scatter_sum(d, sh);
    const size_t lo = sh.lo(c.rank()), cnt = sh.count[c.rank()];
    const float S = float(c.size()) * float(c.size() + 1) / 2;
    for (size_t i = lo; i < lo + cnt; ++i)
      ASSERT_EQ(d[i], S * float(i % 97 + 1)) << what << " reduce-scatter, n " << n << ", index " << i;

    // all-gather: rank r's range holds -(r + 1) * i; afterwards every rank sees every range.
    for (size_t i = 0; i < n; ++i) d[i] = 0.f;
    for (size_t i = lo; i < lo + cnt; ++i) d[i] = -float(c.rank() + 1) * float(i);
    c.all_gather(d, sh);
    for (int r = 0; r < c.size(); ++r)
      for (size_t i = sh.lo(r); i < sh.hi(r); ++i)
        ASSERT_EQ(d[i], -float(r + 1) * float(i)) << what << " all-gather, n " << n << ", index " << i;

    std::vector<float> mine(d + lo, d + lo + cnt), all(c.rank() == 0 ? n : 0, 0.f);
    c.gather_host(mine.data(), c.rank() == 0 ? all.data() : nullptr, sh, 0);
    if (c.rank() == 0)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(all[i], d[i]) << what << " gather_host, n " << n << ", index " << i;
    if (be) be->release(d);
    else delete[] d;
  }
}

TEST(MpiComm, ZeroReduceScatterAllGatherGather) { check_zero_collectives(*g_mpi, nullptr, "mpi"); }

TEST(StagedComm, ZeroReduceScatterAllGatherGather) {
  auto be = make_backend("cpu", 1, 0);
  auto staged = make_staged_comm(*g_mpi, *be, 1000);
  check_zero_collectives(*staged, be.get(), "staged");
}

// The trainer's ZeRO path: reduce-scatter, then each rank's range equals that range of the allreduce.
TEST(GradReducer, ZeroShardsEqualTheAllreduce) {
  Comm& c = *g_mpi;
  const size_t n = 50000;
  std::vector<float> a, b;
  reference_and_copy(c, n, a, b);
  const ShardLayout sh = ShardLayout::even(n, c.size());
  GradReducer zero(c, b.data(), n, 1000, /*overlap=*/true, &sh);
  zero.begin();
  zero.finish();
  for (size_t i = sh.lo(c.rank()); i < sh.hi(c.rank()); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::abs(a[i]))) << i;
}

// ZeRO-1 with comm.overlap: buckets reduce-scattered during the backward (each part to its owner),
// some straddling two ranks' ranges, the arena not a multiple of the ranks; through MPI and staged,
// three steps (the staged host buffers are reused). Each rank's range equals that range of the allreduce.
void check_zero_buckets(Comm& c, Backend* be, const char* what) {
  const size_t n = 50003;
  std::vector<float> a, b;
  reference_and_copy(c, n, a, b);
  const ShardLayout sh = ShardLayout::even(n, c.size());
  std::vector<float> host(be ? 0 : n);
  float* d = be ? static_cast<float*>(be->alloc(n * sizeof(float))) : host.data();
  for (int step = 0; step < 3; ++step) {
    std::copy(b.begin(), b.end(), d);
    GradReducer zero(c, d, n, 7000, /*overlap=*/true, &sh);
    zero.begin();
    for (size_t lo = n - 3000; lo > 3000; lo -= 3000) zero.ready(lo);
    zero.ready(0);
    zero.finish();
    int straddling = 0;
    for (const auto& [lo, hi] : zero.buckets()) {
      int owners = 0;
      for (int r = 0; r < c.size(); ++r) owners += sh.part(r, lo, hi).second > sh.part(r, lo, hi).first;
      straddling += owners > 1;
    }
    EXPECT_GE(zero.buckets().size(), 5u) << what;
    EXPECT_GE(straddling, 1) << what << ": no bucket straddles two ranks' ranges";
    for (size_t i = sh.lo(c.rank()); i < sh.hi(c.rank()); ++i)
      ASSERT_NEAR(a[i], d[i], 1e-6f * (1 + std::abs(a[i]))) << what << " step " << step << " index " << i;
  }
  if (be) be->release(d);
}

TEST(GradReducer, ZeroBucketsEqualTheAllreduceOverMpi) { check_zero_buckets(*g_mpi, nullptr, "mpi"); }

// Without the background thread (MPI without MPI_THREAD_SERIALIZED): the non-blocking collectives are
// started on the caller's thread and completed, with their moves, at the wait.
TEST(MpiComm, WithoutTheThreadBucketsAndZeroBucketsEqualTheAllreduce) {
  auto inline_comm = make_mpi_comm(/*timeout_s=*/60, /*thread=*/false);
  Comm& c = *inline_comm;
  std::vector<float> a(10007);
  fill(a.data(), a.size(), 0, c.rank());
  c.allreduce_sum_start(a.data() + 6000, 4007);
  c.allreduce_sum_start(a.data(), 6000);
  c.progress();
  c.allreduce_wait();
  expect_summed(a.data(), a.size(), c.size(), "buckets without the thread");
  check_zero_buckets(c, nullptr, "mpi without the thread");
}

// ZeRO-3's prefetch (Comm::all_gather_start): several uneven all-gathers started back to back, with a
// reduce-scatter bucket between them, are complete with every rank's part after one wait; with and
// without the background thread, and through the staged communicator (where they run at once).
void check_started_all_gathers(Comm& c, Backend* be, const char* what) {
  const size_t n = 10007;
  const ShardLayout whole = ShardLayout::even(3 * n, c.size(), 16);
  std::vector<float*> bufs;
  std::vector<ShardLayout> parts;
  for (int k = 0; k < 3; ++k) {  // the k-th third of an arena split over the ranks, relative to its start
    ShardLayout t;
    t.total = n;
    for (int r = 0; r < c.size(); ++r) {
      const auto [a, b] = whole.part(r, k * n, (k + 1) * n);
      t.offset.push_back(std::min(a, (k + 1) * n) - k * n);
      t.count.push_back(b - a);
    }
    float* d = be ? static_cast<float*>(be->alloc(n * sizeof(float))) : new float[n]();
    for (size_t i = t.lo(c.rank()); i < t.hi(c.rank()); ++i) d[i] = float(k + 1) * float(i) + float(c.rank());
    bufs.push_back(d);
    parts.push_back(t);
  }
  std::vector<float> g(64);
  fill(g.data(), g.size(), 0, c.rank());
  c.all_gather_start(bufs[0], parts[0]);
  c.allreduce_sum_start(g.data(), g.size());
  c.all_gather_start(bufs[1], parts[1]);
  c.all_gather_start(bufs[2], parts[2]);
  c.allreduce_wait();
  expect_summed(g.data(), g.size(), c.size(), what);
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < c.size(); ++r)
      for (size_t i = parts[k].lo(r); i < parts[k].hi(r); ++i)
        ASSERT_EQ(bufs[k][i], float(k + 1) * float(i) + float(r)) << what << " gather " << k << ", index " << i;
    if (be) be->release(bufs[k]);
    else delete[] bufs[k];
  }
}

TEST(MpiComm, StartedAllGathersCompleteAtTheWait) {
  check_started_all_gathers(*g_mpi, nullptr, "mpi");
  auto inline_comm = make_mpi_comm(/*timeout_s=*/60, /*thread=*/false);
  check_started_all_gathers(*inline_comm, nullptr, "mpi without the thread");
  auto be = make_backend("cpu", 1, 0);
  auto staged = make_staged_comm(*g_mpi, *be, 1000);
  check_started_all_gathers(*staged, be.get(), "staged");
}

TEST(StagedComm, ZeroBucketsEqualTheAllreduce) {
  auto be = make_backend("cpu", 1, 0);
  auto staged = make_staged_comm(*g_mpi, *be, 1000);
  check_zero_buckets(*staged, be.get(), "staged");
}

}  // namespace

// comm/agree.h: no error anywhere returns on every rank; an error on the last rank only (or on every
// rank) makes every rank throw ReportedError, carrying its own message where it has one.
TEST(AgreeOnError, EveryRankThrowsWhenAnyRankFails) {
  Comm& c = *g_mpi;
  EXPECT_NO_THROW(agree_on_error(c, ""));
  const bool last = c.rank() == c.size() - 1;
  try {
    agree_on_error(c, last ? "data.train = 'x.h5': test error of the last rank" : "");
    ADD_FAILURE() << "no ReportedError on rank " << c.rank();
  } catch (const ReportedError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m, last ? "data.train = 'x.h5': test error of the last rank"
                      : "reported by rank " + std::to_string(c.size() - 1));
  }
  EXPECT_THROW(agree_on_error(c, "test error of every rank"), ReportedError);
  EXPECT_NO_THROW(agree_on_error(c, ""));  // the ranks are still in step
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank's report is enough; the others print their failures
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = 0;
  {
    auto comm = make_mpi_comm(/*timeout_s=*/60);
    g_mpi = comm.get();
    rc = RUN_ALL_TESTS();
    g_mpi = nullptr;
  }
  // Every rank must agree: any failure fails the whole run.
  int any = rc != 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
