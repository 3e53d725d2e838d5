// ZeRO-1's optimizer side (train.zero = 1): AdamW run on each rank's shard of the arena must make
// exactly the update of one AdamW over the whole arena, whatever the shard boundaries cut through
// (mid-tensor, inside an alignment gap, tensors with and without weight decay). The communication
// side (reduce-scatter, all-gather, gather) is tested with real ranks in tests/mpi/test_comm_mpi.cpp
// and the whole training loop against train.zero = 0 in tests/python/test_zero.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comm/shard.h"
#include "core/rng.h"
#include "core/error.h"
#include "model/model.h"
#include "model/params.h"
#include "train/grad_shards.h"
#include "train/optimizer.h"
#include "train/param_shards.h"
#include "train/batches.h"
#include "small_models.h"

using namespace nlp;

namespace {

void fill(ParamStore& ps, Backend& be, uint64_t seed) {
  ps.add("a.weight", {7, 5}, true);
  ps.add("a.bias", {5}, false);
  ps.add("b.weight", {33, 3}, true);
  ps.add("ln.weight", {17}, false);
  ps.add("c.weight", {301}, true);
  ps.allocate(be);
  Rng r(seed);
  for (size_t i = 0; i < ps.total(); ++i) ps.data()[i] = r.normal();
}

void set_grads(ParamStore& ps, uint64_t seed) {
  Rng r(seed);
  for (size_t i = 0; i < ps.total(); ++i) ps.grad()[i] = 3.f * r.normal();
}

}  // namespace

TEST(ZeroAdamW, ShardedStepsEqualTheWholeArenaBitwise) {
  auto be = make_cpu_backend(1);
  TrainConfig tc;
  tc.weight_decay = 0.1f;
  for (int ranks : {2, 3, 4, 7}) {
    ParamStore whole, sharded;
    fill(whole, *be, 5);
    fill(sharded, *be, 5);
    const ShardLayout sh = ShardLayout::even(whole.total(), ranks);
    AdamW full(whole, *be, tc, 0, whole.total());
    std::vector<std::unique_ptr<AdamW>> parts;
    for (int r = 0; r < ranks; ++r)
      parts.push_back(std::make_unique<AdamW>(sharded, *be, tc, sh.lo(r), sh.hi(r)));
    for (int t = 1; t <= 3; ++t) {
      set_grads(whole, 100 + t);
      set_grads(sharded, 100 + t);
      full.step(1e-2f, 0.7f, t, /*zero_grad=*/true);  // zeroing in the pass changes no update
      for (auto& p : parts) p->step(1e-2f, 0.7f, t, false);
    }
    ASSERT_EQ(std::memcmp(whole.data(), sharded.data(), whole.total() * sizeof(float)), 0) << ranks;
    std::vector<float> m_full, v_full, m_part, v_part;
    full.download(full.exp_avg(), m_full);
    full.download(full.exp_avg_sq(), v_full);
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(parts[r]->state_bytes(), 2 * sh.count[r] * sizeof(float));
      parts[r]->download(parts[r]->exp_avg(), m_part);
      parts[r]->download(parts[r]->exp_avg_sq(), v_part);
      ASSERT_EQ(m_part.size(), sh.count[r]);
      for (size_t i = 0; i < sh.count[r]; ++i) {
        ASSERT_EQ(m_part[i], m_full[sh.lo(r) + i]) << ranks << " " << r << " " << i;
        ASSERT_EQ(v_part[i], v_full[sh.lo(r) + i]) << ranks << " " << r << " " << i;
      }
    }
    // upload takes this rank's range from a whole-arena host copy (a checkpoint's)
    std::vector<float> back(whole.total(), 0.f);
    for (size_t i = 0; i < back.size(); ++i) back[i] = float(i);
    parts[1]->upload(parts[1]->exp_avg(), back);
    parts[1]->download(parts[1]->exp_avg(), m_part);
    for (size_t i = 0; i < m_part.size(); ++i) ASSERT_EQ(m_part[i], float(sh.lo(1) + i));
  }
}

// train.offload = optimizer (train/optimizer.h, train/host_adamw.h): the master weights and moments on
// the host, updated by the host AdamW and copied back into the arena, make bitwise the CPU backend's
// update, whole or sharded, with the span list cut into the host AdamW's chunks (a tensor of 40000
// floats spans three chunks), on 1 and 3 threads; the gradients are zeroed on request as without it.
TEST(ZeroAdamW, OffloadedStepsEqualTheBackendsBitwise) {
  for (int threads : {1, 3}) {
    auto be = make_cpu_backend(threads);
    TrainConfig tc;
    tc.weight_decay = 0.1f;
    for (int ranks : {1, 3}) {
      ParamStore dev, host;
      dev.add("big.weight", {40000}, true);
      host.add("big.weight", {40000}, true);
      fill(dev, *be, 9);
      fill(host, *be, 9);
      ASSERT_EQ(std::memcmp(dev.data(), host.data(), dev.total() * sizeof(float)), 0);
      const ShardLayout sh = ShardLayout::even(dev.total(), ranks);
      std::vector<std::unique_ptr<AdamW>> a, b;
      for (int r = 0; r < ranks; ++r) {
        a.push_back(std::make_unique<AdamW>(dev, *be, tc, sh.lo(r), sh.hi(r), false));
        b.push_back(std::make_unique<AdamW>(host, *be, tc, sh.lo(r), sh.hi(r), true));
        ASSERT_TRUE(b.back()->offloaded());
        EXPECT_EQ(b.back()->host_bytes(), 4 * sh.count[r] * sizeof(float));
      }
      for (int t = 1; t <= 4; ++t) {
        set_grads(dev, 200 + t);
        set_grads(host, 200 + t);
        const bool zero_grad = t % 2 == 0;
        for (int r = 0; r < ranks; ++r) {
          a[r]->step(3e-3f, 0.6f, t, zero_grad);
          b[r]->step(3e-3f, 0.6f, t, zero_grad);
        }
        ASSERT_EQ(std::memcmp(dev.data(), host.data(), dev.total() * sizeof(float)), 0) << threads << " " << t;
        // the tensors' gradients (set_grads also fills the alignment gaps, which the backend leaves)
        for (const auto& sp : dev.specs())
          ASSERT_EQ(std::memcmp(dev.grad() + sp.offset, host.grad() + sp.offset, sp.numel * sizeof(float)), 0)
              << threads << " " << t << " " << sp.name;
      }
      // the update moved the weights (not a test of two no-ops)
      ParamStore fresh;
      fresh.add("big.weight", {40000}, true);
      fill(fresh, *be, 9);
      EXPECT_NE(std::memcmp(fresh.data(), host.data(), host.total() * sizeof(float)), 0);
      for (int r = 0; r < ranks; ++r) {
        std::vector<float> ma, mb, va, vb;
        a[r]->download(a[r]->exp_avg(), ma);
        b[r]->download(b[r]->exp_avg(), mb);
        a[r]->download(a[r]->exp_avg_sq(), va);
        b[r]->download(b[r]->exp_avg_sq(), vb);
        ASSERT_EQ(ma, mb);
        ASSERT_EQ(va, vb);
      }
      // resume: moments from a whole-arena copy, master weights re-read from the arena
      std::vector<float> whole(host.total());
      for (size_t i = 0; i < whole.size(); ++i) whole[i] = 1e-3f * float(i % 97);
      for (int r = 0; r < ranks; ++r) {
        a[r]->upload(a[r]->exp_avg(), whole);
        b[r]->upload(b[r]->exp_avg(), whole);
      }
      for (size_t i = 0; i < host.total(); ++i) dev.data()[i] = host.data()[i] = 0.5f * float(i % 13);
      for (int r = 0; r < ranks; ++r) b[r]->load_master();
      set_grads(dev, 300);
      set_grads(host, 300);
      for (int r = 0; r < ranks; ++r) {
        a[r]->step(3e-3f, 1.f, 5, true);
        b[r]->step(3e-3f, 1.f, 5, true);
      }
      ASSERT_EQ(std::memcmp(dev.data(), host.data(), dev.total() * sizeof(float)), 0) << threads;
    }
  }
}

// ZeRO-2's regions (train/grad_shards.h): the blocks of the real models, found by name, tile the arena
// between the resident tensors in layer order; a resident tensor between blocks is refused by name.
TEST(Zero2Regions, BlocksOfGpt2AndBertTileTheArena) {
  auto be = make_cpu_backend(1);
  for (const char* type : {"gpt2", "bert"}) {
    ModelConfig mc;
    mc.type = type;
    mc.n_layer = mc.num_hidden_layers = 3;
    mc.n_head = mc.num_attention_heads = 2;
    mc.n_embd = mc.hidden_size = 16;
    mc.intermediate_size = 32;
    mc.vocab_size = 40;
    mc.n_positions = mc.max_position_embeddings = 8;
    auto m = make_model(mc, *be, std::string(type) == "bert" ? "mlm" : "clm", /*allocate=*/false);
    const ParamStore& ps = m->params();
    const auto regions = zero2_regions(ps);
    ASSERT_FALSE(regions.empty());
    EXPECT_EQ(regions.front().lo, 0u);
    EXPECT_EQ(regions.back().hi, ps.total());
    int next_layer = 0;
    for (size_t i = 0; i < regions.size(); ++i) {
      if (i > 0) EXPECT_EQ(regions[i].lo, regions[i - 1].hi) << type;
      if (regions[i].layer >= 0) EXPECT_EQ(regions[i].layer, next_layer++) << type;
    }
    EXPECT_EQ(next_layer, 3) << type;
    // every tensor lies in one region, of its own layer
    for (const auto& s : ps.specs()) {
      const auto it = std::find_if(regions.begin(), regions.end(),
                                   [&](const GradRegion& r) { return s.offset >= r.lo && s.offset < r.hi; });
      ASSERT_NE(it, regions.end()) << s.name;
      EXPECT_LE(s.offset + s.numel, it->hi) << s.name;
      const bool in_block = s.name.find(".h.") != std::string::npos || s.name.find(".layer.") != std::string::npos;
      EXPECT_EQ(it->layer >= 0, in_block) << s.name;
    }
    // the buffers: the resident tensors and two of the (equal) blocks
    size_t resident = 0, block = 0;
    for (const auto& r : regions) {
      if (r.layer < 0)
        resident += r.hi - r.lo;
      else
        block = std::max(block, r.hi - r.lo);
    }
    EXPECT_EQ(zero2_buffer_floats(ps, 2), resident + 2 * block) << type;
  }
  ParamStore bad;
  bad.add("transformer.h.0.w", {4}, true);
  bad.add("transformer.ln_mid.weight", {4}, false);
  bad.add("transformer.h.1.w", {4}, true);
  try {
    zero2_regions(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.ln_mid.weight"), std::string::npos) << e.what();
  }
}

namespace {
// One rank, no MPI: the collectives of a single rank are no-ops (ParamShards copies its own part).
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
  void all_gather(float*, const ShardLayout& sh) override { ++gathers; (void)sh; }
  void gather_host(const float* mine, float* all, const ShardLayout& sh, int) override {
    std::memcpy(all, mine, sh.count[0] * sizeof(float));
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  int gathers = 0;
};
}  // namespace

// ZeRO-3's parameters (train/param_shards.h) on one rank: after the arena is freed, every tensor reads
// from the resident buffers or the block buffer, the block hook gathers each block just before it is
// read (forward 0..L-1, backward L-1..0, the block held at the turn not gathered again; with recompute
// the same), and a forward and backward are bitwise those of the arena.
TEST(Zero3Params, BlocksGatheredInOrderAndResultsBitwiseTheArenas) {
  auto be = make_cpu_backend(1);
  const ModelConfig mc = test::small_gpt2(3, 50);
  const HostBatch hb = test::clm_batch(2, 8, 5, 50);
  for (bool recompute : {false, true}) {
    auto run = [&](bool zero3, std::vector<int>* order, std::vector<float>* grads) {
      auto m = make_model(mc, *be, "clm");
      m->init_weights(3);
      m->set_recompute(recompute);
      m->reserve(2, 8);
      ParamStore& ps = m->params();
      OneRank comm;
      std::unique_ptr<ParamShards> shards;
      if (zero3) {
        shards = std::make_unique<ParamShards>(comm, *be, ps, ShardLayout::even(ps.total(), 1), 0);
        EXPECT_EQ(ps.data(), nullptr);
        std::vector<float> host;
        EXPECT_THROW(ps.download(host), Error);
        shards->refresh();
        m->set_block_hook([&](int l) {
          order->push_back(l);
          shards->use_block(l);
        });
      }
      DeviceBatchBuffer dbuf(*be);
      const DeviceBatch db = dbuf.upload(hb);
      const double loss = m->forward(db, true, 11);
      m->backward(db, 0.01f, true, 11);
      grads->assign(ps.grad(), ps.grad() + ps.total());
      if (zero3) {
        EXPECT_EQ(shards->gathers(), 2 * mc.n_layer - 1);  // the last block kept for the turn
        // a whole gather maps every tensor into one arena, a release back to the buffers
        shards->gather_all();
        EXPECT_TRUE(shards->whole());
        for (size_t i = 1; i < ps.specs().size(); ++i)
          EXPECT_EQ(ps.p(int(i)) - ps.p(0), std::ptrdiff_t(ps.specs()[i].offset)) << ps.specs()[i].name;
        EXPECT_EQ(m->forward(db, true, 11), loss);  // no block gathered while whole
        EXPECT_EQ(shards->gathers(), 2 * mc.n_layer - 1);
        shards->release_all();
        m->set_block_hook(nullptr);
      }
      return loss;
    };
    std::vector<int> order;
    std::vector<float> g0, g3;
    const double l0 = run(false, nullptr, &g0);
    const double l3 = run(true, &order, &g3);
    EXPECT_EQ(l0, l3) << "recompute " << recompute;
    ASSERT_EQ(g0.size(), g3.size());
    EXPECT_EQ(0, std::memcmp(g0.data(), g3.data(), g0.size() * sizeof(float))) << "recompute " << recompute;
    // forward 0, 1, 2; backward 2, 1, 0 (once per block: its recomputed forward and its backward)
    std::vector<int> want = {0, 1, 2};
    for (int l = 2; l >= 0; --l) want.push_back(l);
    want.insert(want.end(), {0, 1, 2});  // the forward on the whole parameters: the hook runs, gathers nothing
    EXPECT_EQ(order, want) << "recompute " << recompute;
  }
  EXPECT_EQ(zero3_buffer_floats(make_model(mc, *be, "clm", false)->params(), 0),
            zero2_buffer_floats(make_model(mc, *be, "clm", false)->params(), 1));
  EXPECT_EQ(zero3_buffer_floats(make_model(mc, *be, "clm", false)->params(), 1),
            zero2_buffer_floats(make_model(mc, *be, "clm", false)->params(), 2));
}

// train.zero_prefetch = d: 1 + d block buffers, the next d blocks in the direction of travel gathered
// ahead; the results are bitwise those without prefetch, every block is gathered before it is read
// (no block read from a buffer that holds another), and ahead-of-use gathers happen.
TEST(Zero3Params, PrefetchedGathersChangeNoBit) {
  auto be = make_cpu_backend(1);
  const ModelConfig mc = test::small_gpt2(5, 50);  // dropout 0.1, the default
  for (bool recompute : {false, true}) {
    std::vector<std::vector<float>> grads;
    std::vector<double> losses;
    for (int depth : {0, 1, 2, 7}) {
      auto m = make_model(mc, *be, "clm");
      m->init_weights(3);
      m->set_recompute(recompute);
      m->reserve(2, 8);
      ParamStore& ps = m->params();
      OneRank comm;
      ParamShards shards(comm, *be, ps, ShardLayout::even(ps.total(), 1), 0, depth);
      shards.refresh();
      m->set_block_hook([&](int l) { shards.use_block(l); });
      DeviceBatchBuffer dbuf(*be);
      double loss = 0;
      for (int micro = 0; micro < 2; ++micro) {  // two micro-batches: the turn at block 0 too
        const DeviceBatch db = dbuf.upload(test::clm_batch(2, 8, 5 + micro, 50));
        loss += m->forward(db, true, 11 + micro);
        m->backward(db, 0.01f, true, 11 + micro);
      }
      losses.push_back(loss);
      grads.emplace_back(ps.grad(), ps.grad() + ps.total());
      if (depth == 0) EXPECT_EQ(shards.prefetched(), 0);
      if (depth > 0) EXPECT_GT(shards.prefetched(), 0) << depth;
      // buffers: resident + min(1 + depth, layers) blocks
      EXPECT_EQ(shards.buffer_bytes(),
                zero3_buffer_floats(ps, std::min(depth, mc.n_layer - 1)) * sizeof(float)) << depth;
      m->set_block_hook(nullptr);
    }
    for (size_t k = 1; k < losses.size(); ++k) {
      EXPECT_EQ(losses[k], losses[0]) << k;
      EXPECT_EQ(0, std::memcmp(grads[k].data(), grads[0].data(), grads[0].size() * sizeof(float))) << k;
    }
  }
}

// The embedding tables at train.zero = 3 (Model::weights_then_grads): one buffer each holds the weights
// in the forward and the gradient from the backward's turn on, GradShards sums the gradients outside
// the blocks in pieces (here of 100 floats: wte's 1600 in 16), and a model with no parameter arena
// initialises only the shard. On one rank the shard is the whole arena: the initial weights and the
// losses are bitwise those of the arena, the summed gradients of two micro-batches bitwise stage 2's
// (GradShards over the arena's weights: each micro-batch summed, then added to the shard) and equal
// to the arena's to summation order; the GPT-2 vocabulary 100 x width 16 makes wte larger than a piece.
TEST(Zero3Params, EmbeddingsHoldWeightsThenGradientsAndShardInitialisedAlone) {
  auto be = make_cpu_backend(1);
  const ModelConfig mc = test::small_gpt2(2, 100);
  auto run = [&](int stage, std::vector<float>* init, std::vector<float>* grads) {
    const bool zero3 = stage == 3;
    auto m = make_model(mc, *be, "clm", /*allocate=*/!zero3);
    ParamStore& ps = m->params();
    if (zero3) ps.allocate(*be, /*grads=*/false, /*params=*/false);
    m->reserve(2, 8);
    OneRank comm;
    const ShardLayout sh = ShardLayout::even(ps.total(), 1);
    std::unique_ptr<ParamShards> shards;
    std::unique_ptr<GradShards> gs;
    if (zero3) {
      const std::vector<int> both = m->weights_then_grads();
      EXPECT_EQ(both.size(), 2u);  // wte, wpe
      shards = std::make_unique<ParamShards>(comm, *be, ps, sh, 0, 1, both, [&] { m->init_weights(3); });
      EXPECT_EQ(ps.data(), nullptr);
      init->assign(shards->shard(), shards->shard() + ps.total());
      gs = std::make_unique<GradShards>(comm, *be, ps, sh, 0, true, 2, shards->grad_buffers(), 100);
      ParamShards* p = shards.get();
      m->set_block_hook([p](int l) { p->use_block(l); });
      m->set_weights_hook([p](int i, bool done) { done ? p->done(i) : p->need(i); });
      // the gradients of wte and wpe are their weights' buffers
      for (int i : both) EXPECT_EQ(ps.g(i), ps.p(i)) << ps.specs()[size_t(i)].name;
    } else {
      m->init_weights(3);
      init->assign(ps.data(), ps.data() + ps.total());
      if (stage == 2) gs = std::make_unique<GradShards>(comm, *be, ps, sh, 0, true, 2);
    }
    DeviceBatchBuffer dbuf(*be);
    double loss = 0;
    for (int micro = 0; micro < 2; ++micro) {
      const DeviceBatch db = dbuf.upload(test::clm_batch(2, 8, 5 + micro, 100));
      loss += m->forward(db, true, 11 + micro);
      if (gs) {
        gs->begin(micro == 1);
        m->set_grad_ready_hook([&](size_t lo) { gs->ready(lo); });
      }
      m->backward(db, 0.01f, true, 11 + micro);
      if (gs) {
        m->set_grad_ready_hook(nullptr);
        gs->end();
      }
    }
    if (gs) {
      grads->assign(gs->shard(), gs->shard() + ps.total());
      // the embeddings' regions summed in pieces: wte's and wpe's regions of their own
      bool wte_region = false;
      for (const auto& [lo, hi] : gs->buckets()) wte_region = wte_region || (lo == 0 && hi == 1600);
      EXPECT_EQ(wte_region, zero3);
      m->set_block_hook(nullptr);
      m->set_weights_hook(nullptr);
    } else {
      grads->assign(ps.grad(), ps.grad() + ps.total());
    }
    return loss;
  };
  std::vector<float> i0, i2, i3, g0, g2, g3;
  const double l0 = run(0, &i0, &g0);
  const double l2 = run(2, &i2, &g2);
  const double l3 = run(3, &i3, &g3);
  ASSERT_EQ(i0.size(), i3.size());
  EXPECT_EQ(0, std::memcmp(i0.data(), i3.data(), i0.size() * sizeof(float)));
  EXPECT_EQ(l0, l3);
  EXPECT_EQ(l2, l3);
  ASSERT_EQ(g2.size(), g3.size());
  EXPECT_EQ(0, std::memcmp(g2.data(), g3.data(), g2.size() * sizeof(float)));
  double d = 0, n = 0;
  for (size_t k = 0; k < g0.size(); ++k) d += double(g3[k] - g0[k]) * (g3[k] - g0[k]), n += double(g0[k]) * g0[k];
  EXPECT_GT(n, 0.0);
  EXPECT_LE(std::sqrt(d / n), 1e-6);
  // split_regions refuses a range across a block
  auto m = make_model(mc, *be, "clm", false);
  const auto regions = zero2_regions(m->params());
  size_t blocks_lo = 0;
  for (const auto& r : regions)
    if (r.layer == 0) blocks_lo = r.lo;
  EXPECT_THROW(split_regions(regions, {{blocks_lo - 4, blocks_lo + 4}}), Error);
}
