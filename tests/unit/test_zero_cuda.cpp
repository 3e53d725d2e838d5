// The ZeRO stages' device side on the CUDA backend, on one GPU, each against a reference that does
// not share the code under test:
//  - the staged communicator (comm.gpu = staged) on device buffers: an all-gather and overlapped
//    reduce-scatter buckets through its host buffers, against a simulated second rank whose
//    contribution is a closed formula (the expected values are computed here, element by element);
//    the same test runs on the CPU backend (plain copies), so it also runs in CPU builds;
//  - ZeRO-3's parameters (train/param_shards.h) in device buffers: a GPT-2 forward and backward with
//    every block gathered into the block buffers (prefetch 0 and 1, recompute on and off) is bitwise
//    the same model's on the parameter arena (the CUDA backend is deterministic: no float atomics);
//  - train.offload = optimizer on cuda: the pipelined step (backend/cuda/host_copy.h, the shard in
//    chunks of 2^20 floats, here 2 or 3 of them) is bitwise the CPU backend's offloaded step (the same
//    host AdamW on the same gradients), the gradients zeroed when asked, over 3 steps, for a shard
//    that cuts tensors mid-way; also with ZeRO-2's early copies of the final regions (grads_final:
//    tiling the range in either order, a stale list replaced, a partial list falling back).
// Without a usable GPU (or in a CPU build) the CUDA tests are skipped with cuda_device_count()'s reason.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/host_copy.h"
#include "comm/comm.h"
#include "comm/shard.h"
#include "config/config.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/params.h"
#include "train/batches.h"
#include "train/optimizer.h"
#include "train/param_shards.h"
#include "small_models.h"

using namespace nlp;

namespace {

// The CUDA backend, or null with the reason (no device: skip).
std::unique_ptr<Backend> cuda_or_skip(std::string* why) {
  if (cuda_device_count(why) == 0) return nullptr;
  return make_cuda_backend(0);
}
#define NEED_CUDA(be)                                             \
  std::string why_;                                               \
  auto be = cuda_or_skip(&why_);                                  \
  if (!be) GTEST_SKIP() << "no usable CUDA device: " << why_

// Rank 0 of a simulated world of 2 on host memory: the other rank's range of an all-gather becomes
// other(i) = 0.25 i + 1 (arena index i), and a reduce-scatter bucket's part in rank 0's range gets the
// other rank's contribution added, contrib(i) = 0.5 i - 3, as MPI would leave it (this rank's sum in
// its place; the rest of the bucket left unspecified: poisoned here).
float other(size_t i) { return 0.25f * float(i) + 1.f; }
float contrib(size_t i) { return 0.5f * float(i) - 3.f; }

class SimulatedPair final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void allreduce_sum(float*, size_t) override { ADD_FAILURE() << "not used here"; }
  void allreduce_sum_host(double*, size_t) override {}
  void broadcast_host(void*, size_t, int) override {}
  void allreduce_sum_start(float*, size_t) override { ADD_FAILURE() << "not used here"; }
  void allreduce_wait() override { ++waits; }
  void reduce_scatter_sum(float*, const ShardLayout&) override { ADD_FAILURE() << "not used here"; }
  void reduce_scatter_sum_start(float* bucket, size_t lo, size_t n, const ShardLayout& sh) override {
    const auto [a, b] = sh.part(0, lo, lo + n);
    for (size_t i = lo; i < lo + n; ++i) {
      if (i >= a && i < b)
        bucket[i - lo] += contrib(i);
      else
        bucket[i - lo] = -999.f;
    }
  }
  void all_gather(float* buf, const ShardLayout& sh) override {
    for (size_t i = sh.lo(1); i < sh.hi(1); ++i) buf[i] = other(i);
  }
  void gather_host(const float*, float*, const ShardLayout&, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  int waits = 0;
};

// The staged communicator over `be`: an all-gather of a 1000-float arena split 2 ways, then two
// overlapped reduce-scatter buckets ([600, 1000) then [0, 600), the second straddling the ranks'
// boundary at 512), in chunks of 64 floats. Checked element by element against the formulas.
void staged_on(Backend& be) {
  const size_t total = 1000;
  const ShardLayout sh = ShardLayout::even(total, 2);
  const size_t mine = sh.hi(0);  // 512 (16-float aligned shards)
  ASSERT_TRUE(mine > 0 && mine < 600);
  std::vector<float> init(total);
  Rng r(5);
  for (auto& x : init) x = r.normal();
  auto* dev = static_cast<float*>(be.alloc(total * sizeof(float)));
  be.to_device(dev, init.data(), total * sizeof(float));
  SimulatedPair inner;
  auto staged = make_staged_comm(inner, be, 64);
  std::vector<float> out(total);

  staged->all_gather(dev, sh);
  be.to_host(out.data(), dev, total * sizeof(float));
  for (size_t i = 0; i < total; ++i) {
    const float want = i < mine ? init[i] : other(i);
    ASSERT_EQ(out[i], want) << "all_gather, element " << i;
  }

  be.to_device(dev, init.data(), total * sizeof(float));
  staged->reduce_scatter_sum_start(dev + 600, 600, 400, sh);  // no part of rank 0
  staged->reduce_scatter_sum_start(dev, 0, 600, sh);
  staged->allreduce_wait();
  EXPECT_EQ(inner.waits, 1);
  be.to_host(out.data(), dev, total * sizeof(float));
  for (size_t i = 0; i < mine; ++i) ASSERT_EQ(out[i], init[i] + contrib(i)) << "reduce-scatter, element " << i;
  be.release(dev);
}

}  // namespace

TEST(StagedCommDevice, GatherAndBucketsThroughHostBuffersOnTheCpuBackend) {
  auto be = make_cpu_backend(1);
  staged_on(*be);
}

TEST(StagedCommDevice, GatherAndBucketsThroughHostBuffersOnCuda) {
  NEED_CUDA(be);
  staged_on(*be);
}

namespace {
// One rank: its collectives are no-ops (ParamShards copies its own part of each block).
class OneRank final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum_host(double*, size_t) override {}
  void broadcast_host(void*, size_t, int) override {}
  void allreduce_sum_start(float*, size_t) override {}
  void allreduce_wait() override {}
  void reduce_scatter_sum(float*, const ShardLayout&) override {}
  void reduce_scatter_sum_start(float*, size_t, size_t, const ShardLayout&) override {}
  void all_gather(float*, const ShardLayout&) override {}
  void gather_host(const float* mine, float* all, const ShardLayout& sh, int) override {
    std::memcpy(all, mine, sh.count[0] * sizeof(float));
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }
};
}  // namespace

TEST(Zero3ParamsCuda, GatheredBlocksInDeviceBuffersGiveTheArenasBitsOnCuda) {
  NEED_CUDA(be);
  const ModelConfig mc = test::small_gpt2(3, 50);
  const HostBatch hb = test::clm_batch(2, 8, 5, 50);
  for (bool recompute : {false, true})
    for (int prefetch : {0, 1}) {
      auto run = [&](bool zero3, std::vector<float>& grads) {
        auto m = make_model(mc, *be, "clm");
        m->init_weights(3);
        m->set_recompute(recompute);
        m->reserve(2, 8);
        ParamStore& ps = m->params();
        OneRank comm;
        std::unique_ptr<ParamShards> shards;
        if (zero3) {
          shards = std::make_unique<ParamShards>(comm, *be, ps, ShardLayout::even(ps.total(), 1), 0, prefetch);
          shards->refresh();
          m->set_block_hook([&](int l) { shards->use_block(l); });
        }
        DeviceBatchBuffer dbuf(*be);
        const DeviceBatch db = dbuf.upload(hb);
        const double loss = m->forward(db, true, 11);
        m->backward(db, 0.01f, true, 11);
        grads.resize(ps.total());
        be->to_host(grads.data(), ps.grad(), ps.total() * sizeof(float));
        if (zero3) {
          EXPECT_GE(shards->gathers(), mc.n_layer);
          if (prefetch > 0) EXPECT_GT(shards->prefetched(), 0);
          m->set_block_hook(nullptr);
        }
        return loss;
      };
      std::vector<float> g0, g3;
      const double l0 = run(false, g0), l3 = run(true, g3);
      EXPECT_EQ(l0, l3) << "recompute " << recompute << " prefetch " << prefetch;
      ASSERT_EQ(g0.size(), g3.size());
      EXPECT_EQ(0, std::memcmp(g0.data(), g3.data(), g0.size() * sizeof(float)))
          << "recompute " << recompute << " prefetch " << prefetch;
    }
}

namespace {
void offload_store(ParamStore& ps, Backend& be) {
  ps.add("big.weight", {2400, 1000}, true);  // 2.4 M floats: the shards below span several 2^20 chunks
  ps.add("big.bias", {1000}, false);
  ps.add("ln.weight", {777}, false);
  ps.add("c.weight", {3001}, true);
  ps.allocate(be);
}
std::vector<float> normals(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  Rng r(seed);
  for (auto& x : v) x = scale * r.normal();
  return v;
}
}  // namespace

TEST(OffloadCuda, ThePipelinedStepIsBitwiseTheCpuBackendsOffloadedStep) {
  NEED_CUDA(gpu);
  auto cpu = make_cpu_backend(2);
  EXPECT_EQ(make_host_copier(*cpu), nullptr);  // the CPU backend keeps its synchronous path
  EXPECT_NE(make_host_copier(*gpu), nullptr);
  TrainConfig tc;
  tc.weight_decay = 0.1f;
  ParamStore pc, pg;
  offload_store(pc, *cpu);
  offload_store(pg, *gpu);
  const size_t total = pc.total();
  const std::vector<float> w0 = normals(total, 9, 1.f);
  std::memcpy(pc.data(), w0.data(), total * sizeof(float));
  gpu->to_device(pg.data(), w0.data(), total * sizeof(float));
  for (int ranks : {1, 2}) {
    const ShardLayout sh = ShardLayout::even(total, ranks);
    // the last rank's shard (3 chunks, or 2 starting inside big.weight), with the small tensors
    const int r = ranks - 1;
    AdamW a(pc, *cpu, tc, sh.lo(r), sh.hi(r), true), b(pg, *gpu, tc, sh.lo(r), sh.hi(r), true);
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = normals(total, 100 + t + 10 * ranks, 3.f);
      std::memcpy(pc.grad(), g.data(), total * sizeof(float));
      gpu->to_device(pg.grad(), g.data(), total * sizeof(float));
      const bool zero_grad = t != 2;
      // ZeRO-2's early copies (AdamW::grads_final, in the order a backward completes regions): step 1
      // starts the first half twice (a skipped step's list, then a new one) and the second half, which
      // tile the range; step 2 only the second half (no tiling: all copied again); step 3 both halves
      // in reverse order
      const size_t lo = sh.lo(r), mid = lo + sh.count[r] / 3, hi = sh.hi(r);
      if (t == 1) {
        b.grads_final(lo, mid);
        b.grads_final(lo, mid);
        b.grads_final(mid, hi);
      } else if (t == 2) {
        b.grads_final(mid, hi);
      } else {
        b.grads_final(mid, hi);
        b.grads_final(lo, mid);
      }
      a.grads_final(lo, hi);  // the CPU backend: a no-op
      a.step(3e-3f, 0.6f, t, zero_grad);
      b.step(3e-3f, 0.6f, t, zero_grad);
      std::vector<float> wg(total), gg(total);
      gpu->to_host(wg.data(), pg.data(), total * sizeof(float));
      gpu->to_host(gg.data(), pg.grad(), total * sizeof(float));
      ASSERT_EQ(0, std::memcmp(wg.data(), pc.data(), total * sizeof(float))) << ranks << " ranks, step " << t;
      for (const auto& sp : pc.specs())  // the tensors' gradients (the alignment gaps are left alone)
        ASSERT_EQ(0, std::memcmp(gg.data() + sp.offset, pc.grad() + sp.offset, sp.numel * sizeof(float)))
            << ranks << " ranks, step " << t << " " << sp.name;
    }
    std::vector<float> ma, mb, va, vb;
    a.download(a.exp_avg(), ma);
    b.download(b.exp_avg(), mb);
    a.download(a.exp_avg_sq(), va);
    b.download(b.exp_avg_sq(), vb);
    EXPECT_EQ(ma, mb) << ranks;
    EXPECT_EQ(va, vb) << ranks;
  }
  // the steps moved the weights (not a comparison of two no-ops)
  EXPECT_NE(0, std::memcmp(w0.data(), pc.data(), total * sizeof(float)));
}
