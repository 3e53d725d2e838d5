// The persistent bf16 copy of the weights (run.bf16_weights, core/backend.h register_weights) on the
// CPU backend: after every kind of write to the parameter arena (loading, an AdamW step over the whole
// arena or one ZeRO shard, a collective's write followed by weights_written, copy and zero) the copy
// holds the round-to-nearest-even of every fp32 weight, bit for bit; and the dense layer computes the
// same bits from it as from today's per-call rounding (emulated and, where the CPU has it, native
// bf16). Whole-model runs with the copy on and off are compared in tests/python/test_bf16_weights.py.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/round.h"
#include "comm/shard.h"
#include "core/rng.h"
#include "model/params.h"
#include "train/optimizer.h"

using namespace nlp;

namespace {

void add_tensors(ParamStore& ps) {
  ps.add("a.weight", {7, 5}, true);
  ps.add("a.bias", {5}, false);
  ps.add("b.weight", {33, 3}, true);
  ps.add("ln.weight", {17}, false);
  ps.add("c.weight", {301}, true);
}

std::vector<float> random_host(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> h(n);
  for (auto& x : h) x = r.normal();
  return h;
}

// Every element of the copy equals to_bf16_bits of the master weight; returns the first mismatch.
::testing::AssertionResult copy_matches(Backend& be, ParamStore& ps) {
  const uint16_t* c = be.bf16_weights();
  if (!c) return ::testing::AssertionFailure() << "no bf16 copy";
  for (size_t i = 0; i < ps.total(); ++i)
    if (c[i] != cpu::to_bf16_bits(ps.data()[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << ps.total() << ": copy 0x" << std::hex << c[i]
             << ", master " << ps.data()[i] << " rounds to 0x" << cpu::to_bf16_bits(ps.data()[i]);
  return ::testing::AssertionSuccess();
}

std::unique_ptr<Backend> bf16_backend(CpuBf16 bf16 = CpuBf16::Emulate, bool copy = true) {
  return make_cpu_backend(1, Precision::Bf16, CpuGemm::Auto, bf16, copy);
}

}  // namespace

TEST(Bf16Weights, OffByDefaultAndOutsideBf16) {
  std::vector<std::unique_ptr<Backend>> bes;
  bes.push_back(make_cpu_backend(1, Precision::Bf16));
  bes.push_back(make_cpu_backend(1, Precision::Fp32, CpuGemm::Auto, CpuBf16::Emulate, true));
  bes.push_back(make_cpu_backend(1, Precision::Tf32, CpuGemm::Auto, CpuBf16::Emulate, true));
  for (auto& be : bes) {
    ParamStore ps;
    add_tensors(ps);
    ps.allocate(*be);
    EXPECT_EQ(be->bf16_weights(), nullptr);
  }
}

TEST(Bf16Weights, CopyAfterLoadingAndAfterAdamWSteps) {
  auto be = bf16_backend();
  ParamStore ps;
  add_tensors(ps);
  ps.allocate(*be);
  ASSERT_TRUE(copy_matches(*be, ps));  // zeros
  ps.upload(random_host(ps.total(), 3));  // loading weights, and resume (resume.cpp uploads the same way)
  ASSERT_TRUE(copy_matches(*be, ps));
  TrainConfig tc;
  tc.weight_decay = 0.1f;
  AdamW opt(ps, *be, tc, 0, ps.total());
  for (int t = 1; t <= 3; ++t) {
    const std::vector<float> g = random_host(ps.total(), 100 + t);
    std::memcpy(ps.grad(), g.data(), g.size() * sizeof(float));
    opt.step(1e-2f, 0.7f, t, /*zero_grad=*/t == 2);
    ASSERT_TRUE(copy_matches(*be, ps)) << "after step " << t;
  }
  // a resume uploads the checkpoint's weights over trained ones
  ps.upload(random_host(ps.total(), 9));
  ASSERT_TRUE(copy_matches(*be, ps));
}

TEST(Bf16Weights, AdamWWritesTheCopyInItsPass) {
  // Not through a refresh: a step whose update leaves the copy stale would fail here, since the
  // master is written only by adamw_update_spans between the two checks.
  auto be = bf16_backend();
  ParamStore ps;
  add_tensors(ps);
  ps.allocate(*be);
  ps.upload(random_host(ps.total(), 5));
  const std::vector<uint16_t> before(be->bf16_weights(), be->bf16_weights() + ps.total());
  TrainConfig tc;
  AdamW opt(ps, *be, tc, 0, ps.total());
  const std::vector<float> g = random_host(ps.total(), 6);
  std::memcpy(ps.grad(), g.data(), g.size() * sizeof(float));
  opt.step(5e-2f, 1.f, 1, false);
  ASSERT_TRUE(copy_matches(*be, ps));
  size_t changed = 0;
  for (size_t i = 0; i < ps.total(); ++i) changed += before[i] != be->bf16_weights()[i];
  EXPECT_GT(changed, ps.total() / 2);  // the step moved most weights by more than half a bf16 ulp
}

TEST(Bf16Weights, ZeroShardsThenAllGatherThenWeightsWritten) {
  // Two ranks simulated on one arena each: rank r steps its shard (its copy written by AdamW), the
  // all-gather writes the other shard from outside the backend (here: memcpy), and the trainer's
  // weights_written over the ranges outside the own shard brings the copy up to date.
  TrainConfig tc;
  tc.weight_decay = 0.1f;
  for (int rank = 0; rank < 2; ++rank) {
    auto be_a = bf16_backend(), be_b = bf16_backend();
    ParamStore pa, pb;  // this rank's arena, and the other rank's (the source of the all-gather)
    add_tensors(pa);
    add_tensors(pb);
    pa.allocate(*be_a);
    pb.allocate(*be_b);
    const std::vector<float> w = random_host(pa.total(), 21);
    pa.upload(w);
    pb.upload(w);
    const ShardLayout sh = ShardLayout::even(pa.total(), 2);
    const int other = 1 - rank;
    AdamW mine(pa, *be_a, tc, sh.lo(rank), sh.hi(rank));
    AdamW theirs(pb, *be_b, tc, sh.lo(other), sh.hi(other));
    for (int t = 1; t <= 2; ++t) {
      const std::vector<float> g = random_host(pa.total(), 40 + t);
      std::memcpy(pa.grad(), g.data(), g.size() * sizeof(float));
      std::memcpy(pb.grad(), g.data(), g.size() * sizeof(float));
      mine.step(1e-2f, 1.f, t, false);
      theirs.step(1e-2f, 1.f, t, false);
      // the all-gather: the other rank's shard arrives in this rank's arena
      std::memcpy(pa.data() + sh.lo(other), pb.data() + sh.lo(other), sh.count[other] * sizeof(float));
      ASSERT_FALSE(copy_matches(*be_a, pa)) << "the collective's write should leave the copy stale here";
      be_a->weights_written(pa.data(), mine.lo());
      be_a->weights_written(pa.data() + mine.hi(), pa.total() - mine.hi());
      ASSERT_TRUE(copy_matches(*be_a, pa)) << "rank " << rank << " step " << t;
    }
  }
}

TEST(Bf16Weights, CopyAndZeroIntoTheArenaRefreshIt) {
  auto be = bf16_backend();
  ParamStore ps;
  add_tensors(ps);
  ps.allocate(*be);
  ps.upload(random_host(ps.total(), 7));
  const std::vector<float> src = random_host(100, 8);
  be->copy(ps.data() + 10, src.data(), src.size() * sizeof(float));
  ASSERT_TRUE(copy_matches(*be, ps));
  be->zero(ps.data() + 50, 200 * sizeof(float));
  ASSERT_TRUE(copy_matches(*be, ps));
  // writes outside the arena (the gradients) leave it alone
  be->zero(ps.grad(), ps.total() * sizeof(float));
  ASSERT_TRUE(copy_matches(*be, ps));
}

// The dense layer's outputs with the weight read from the copy equal those of today's per-call
// rounding, bitwise, forward and backward, both layouts, emulated and native bf16.
TEST(Bf16Weights, MatmulBitwiseEqualWithAndWithoutTheCopy) {
  std::vector<CpuBf16> modes = {CpuBf16::Emulate};
  if (cpu_native_bf16()) modes.push_back(CpuBf16::Native);
  const int M = 37, K = 24, N = 40;
  for (CpuBf16 mode : modes) {
    const char* name = mode == CpuBf16::Native ? "native" : "emulate";
    for (WLayout layout : {WLayout::InOut, WLayout::OutIn}) {
      auto on = bf16_backend(mode, true), off = bf16_backend(mode, false);
      ParamStore pon, poff;
      pon.add("w", {K, N}, true);
      pon.add("b", {N}, false);
      poff.add("w", {K, N}, true);
      poff.add("b", {N}, false);
      pon.allocate(*on);
      poff.allocate(*off);
      const std::vector<float> w = random_host(pon.total(), 31);
      pon.upload(w);
      poff.upload(w);
      ASSERT_NE(on->bf16_weights(), nullptr);
      const std::vector<float> x = random_host(size_t(M) * K, 32), dy = random_host(size_t(M) * N, 33);
      std::vector<float> y_on(size_t(M) * N), y_off(size_t(M) * N);
      on->matmul_forward(y_on.data(), x.data(), pon.p(0), pon.p(1), M, K, N, layout);
      off->matmul_forward(y_off.data(), x.data(), poff.p(0), poff.p(1), M, K, N, layout);
      ASSERT_EQ(std::memcmp(y_on.data(), y_off.data(), y_on.size() * sizeof(float)), 0) << name;
      std::vector<float> dx_on(size_t(M) * K, 0.5f), dx_off(size_t(M) * K, 0.5f);
      on->matmul_backward(dx_on.data(), pon.g(0), pon.g(1), dy.data(), x.data(), pon.p(0), M, K, N, layout);
      off->matmul_backward(dx_off.data(), poff.g(0), poff.g(1), dy.data(), x.data(), poff.p(0), M, K, N,
                           layout);
      ASSERT_EQ(std::memcmp(dx_on.data(), dx_off.data(), dx_on.size() * sizeof(float)), 0) << name;
      ASSERT_EQ(std::memcmp(pon.grad(), poff.grad(), pon.total() * sizeof(float)), 0) << name;
      // and not the unrounded fp32 product: the test would pass on a path that ignores bf16
      auto fp32 = make_cpu_backend(1, Precision::Fp32);
      std::vector<float> y32(size_t(M) * N);
      fp32->matmul_forward(y32.data(), x.data(), w.data() + pon.specs()[0].offset, w.data() + pon.specs()[1].offset,
                           M, K, N, layout);
      ASSERT_NE(std::memcmp(y32.data(), y_on.data(), y32.size() * sizeof(float)), 0);
    }
  }
}

// A stale copy would show: the GEMM reads the copy, not the master. Writing the master behind the
// backend's back (no weights_written) changes nothing in the output; after weights_written it does.
TEST(Bf16Weights, GemmReadsTheCopy) {
  auto be = bf16_backend();
  ParamStore ps;
  ps.add("w", {8, 8}, true);
  ps.allocate(*be);
  ps.upload(random_host(ps.total(), 1));
  const std::vector<float> x = random_host(4 * 8, 2);
  std::vector<float> y1(32), y2(32), y3(32);
  be->matmul_forward(y1.data(), x.data(), ps.p(0), nullptr, 4, 8, 8, WLayout::InOut);
  for (size_t i = 0; i < ps.total(); ++i) ps.data()[i] *= 2.f;  // behind the backend's back
  be->matmul_forward(y2.data(), x.data(), ps.p(0), nullptr, 4, 8, 8, WLayout::InOut);
  EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0);
  be->weights_written(ps.data(), ps.total());
  be->matmul_forward(y3.data(), x.data(), ps.p(0), nullptr, 4, 8, 8, WLayout::InOut);
  for (size_t i = 0; i < y3.size(); ++i) EXPECT_EQ(y3[i], 2.f * y1[i]) << i;  // exact: scaling by 2
}

// The copy goes with its weights: a ParamStore destroyed unregisters its arena (a later buffer at the
// same address is not read from a stale copy), and another arena can be registered after it.
TEST(Bf16Weights, ForgottenWithItsArena) {
  auto be = bf16_backend();
  {
    ParamStore ps;
    add_tensors(ps);
    ps.allocate(*be);
    ASSERT_NE(be->bf16_weights(), nullptr);
  }
  EXPECT_EQ(be->bf16_weights(), nullptr);
  ParamStore again;
  add_tensors(again);
  again.allocate(*be);
  again.upload(random_host(again.total(), 12));
  EXPECT_TRUE(copy_matches(*be, again));
}
