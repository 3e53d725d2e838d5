#include "train/memory_plan.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <algorithm>

#include "backend/cuda/device.h"
#include "comm/shard.h"
#include "core/backend.h"
#include "core/error.h"
#include "train/grad_shards.h"
#include "train/param_shards.h"

namespace nlp {
namespace {
double mib(size_t b) { return double(b) / (1024.0 * 1024.0); }

// The largest single gradient sum the ranks hand MPI with comm.overlap, in floats: train.zero >= 2
// sums each region of train/grad_shards.h on its own (a block, or the tensors before or after the
// blocks: GPT-2's embeddings, 39.4M floats at 124M); stages 0 and 1 (comm/grad_reducer.h) start
// [lo, started) at a block's end once it holds `bucket` floats, and the rest (the embeddings and what
// is left) at the end. An arena the regions do not describe: one bucket.
size_t largest_sum_floats(const ParamStore& ps, size_t bucket, int zero) {
  std::vector<GradRegion> regions;
  try {
    regions = zero2_regions(ps);
  } catch (const Error&) {
    return std::min(ps.total(), bucket);
  }
  size_t largest = 0;
  if (zero >= 2) {
    for (const GradRegion& r : regions) largest = std::max(largest, r.hi - r.lo);
    // train.zero = 3 sums the resident regions in pieces of the largest block's size (grad_shards.h)
    const size_t block = largest_block_floats(regions);
    return zero == 3 && block > 0 ? block : largest;
  }
  size_t started = ps.total();
  for (auto it = regions.rbegin(); it != regions.rend(); ++it) {
    if (it->layer < 0 || started - it->lo < std::max<size_t>(bucket, 1)) continue;
    largest = std::max(largest, started - it->lo);
    started = it->lo;
  }
  return std::max(largest, started);
}
}  // namespace

MemoryPlan plan_memory(const Config& cfg, const Model& m, int T, int world) {
  MemoryPlan p;
  Model& mm = const_cast<Model&>(m);  // params() is not const; nothing is changed
  const size_t P = mm.params().total() * sizeof(float);
  const bool train = cfg.mode() == RunMode::Train;
  p.B = cfg.train.batch_size;
  p.T = T;
  p.recompute = cfg.recompute() == Recompute::Block;
  p.weights = P;
  // run.bf16_weights: the persistent bf16 copy beside the fp32 weights (core/backend.h), 2 bytes each
  if (cfg.run.bf16_weights && cfg.precision() == Precision::Bf16)
    p.bf16_copy = mm.params().total() * 2;
  p.weights += p.bf16_copy;
  p.grads = P;
  p.zero = cfg.train.zero;
  p.ranks = cfg.train.zero >= 1 ? std::max(1, world) : 1;
  // the largest shard (comm/shard.h), what the rank that holds it allocates
  const size_t shard = ShardLayout::even(mm.params().total(), p.ranks).largest() * sizeof(float);
  p.optimizer = train ? 2 * shard : 0;
  // train.zero = 2 (train/grad_shards.h): the shard and the backward's buffers instead of the arena
  if (train && cfg.train.zero >= 2) p.grads = shard + zero2_buffer_floats(mm.params(), 2) * sizeof(float);
  // train.zero = 3 (train/param_shards.h): the parameter shard and the gathered buffers instead of the
  // arena; no persistent bf16 copy (the arena it copies is freed)
  const bool zero3 = train && cfg.train.zero == 3;
  if (zero3) {
    // the weights-then-gradients tensors' gradients live in their weights' buffers (param_shards.h)
    size_t shared = 0;
    for (int i : m.weights_then_grads()) shared += mm.params().specs().at(size_t(i)).numel;
    p.grads -= shared * sizeof(float);
    p.bf16_copy = 0;
    p.gathered = zero3_buffer_floats(mm.params(), cfg.train.zero_prefetch) * sizeof(float);
    p.weights = shard + p.gathered;
  }
  p.host_is_device = !cfg.on_cuda();
  if (train && cfg.offload() == Offload::Optimizer) {  // train/optimizer.h: master, m, v, gradient copy
    p.optimizer = 0;
    p.offload_host = 4 * shard;
  }
  if (cfg.mode() == RunMode::Generate) {
    // generation runs no batch forward: one sequence at a time through the KV-cache decoder
    // (make_decoder(m, be, 1)), whose cache spans the model's positions
    p.decoder = true;
    p.B = 1;
    p.T = m.config().n_positions;
    p.activations = decoder_bytes(m, 1);
  } else {
    p.activations = m.activation_bytes(p.B, T);
    p.lm_head = m.lm_head_bytes(p.B, T, &p.lm_head_fused);
    // batch buffers (ids, mask, targets, types per micro-batch, the next one read ahead)
    p.workspace = 2 * 4 * size_t(p.B) * T * sizeof(int32_t);
  }
  if (!cfg.on_cuda()) {
    // Host buffers that live in the same memory as the arenas, at the peak; they never coincide, so
    // the largest counts. Outside training: the host copy of the parameters that initialisation and
    // weights files go through. In training that copy is freed before the first step touches the
    // optimizer state and the activations (measured:
    // bench/results/overlap-zero-20261123-epyc-zen3-5d8d630/overlap-zero-20261123.md), and
    // what can sit beside a full step is a checkpoint's two tensor buffers (written and read a
    // tensor at a time: the writer's or reader's buffer and the gathered or broadcast copy, each the
    // largest tensor), and MPI's temporary buffers for the gradient sum: with comm.overlap, twice the
    // largest sum started at once on 3 or more ranks, once on 2 (largest_sum_floats: Open MPI's
    // non-blocking reduce-scatter reduces to rank 0 along a binomial tree, and rank 0 receives into
    // and reduces in two buffers of the whole sum when it has two or more partners; measured by
    // tests/python/test_zero_peak_rss.py), up to the whole arena for one blocking collective.
    size_t host = train ? 0 : P;
    size_t largest = 0;
    for (const auto& sp : mm.params().specs()) largest = std::max(largest, sp.numel);
    if (train && (cfg.checkpoint.interval > 0 || cfg.train.resume)) host = 2 * largest * sizeof(float);
    if (train && world > 1) {
      host = std::max(host, cfg.comm.overlap
                                ? (world > 2 ? 2 : 1) *
                                      largest_sum_floats(mm.params(), cfg.comm.bucket_floats(), cfg.train.zero) * sizeof(float)
                                : P);
    }
    p.workspace += host;
  }
  // train.zero = 3: evaluation and samples run on the whole parameters, gathered for their duration
  if (zero3 && (!cfg.data.eval.empty() || cfg.train.sample_interval > 0)) p.workspace += P;
  return p;
}

std::string MemoryPlan::table() const {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "memory plan per rank (MiB): weights%s %.1f | gradients %.1f | AdamW m+v%s %.1f | "
                "%s %.1f | workspace %.1f | total %.1f",
                bf16_copy ? cat(" (with the bf16 copy ", cat(bf16_copy >> 20), " MiB)").c_str() : "",
                mib(weights), mib(grads), ranks > 1 ? cat(" (1/", ranks, ", train.zero = ", zero, ")").c_str() : "",
                mib(optimizer), activations_label().c_str(), mib(activations), mib(workspace), mib(total()));
  std::string out = buf;
  if (offload_host > 0) {
    char h[256];
    std::snprintf(h, sizeof h,
                  " | offloaded to the host (train.offload = optimizer: master weights, m, v, gradient copy) "
                  "%.1f%s",
                  mib(offload_host), host_is_device ? ", in the total" : ", not in the device total");
    out += h;
  }
  if (gathered > 0) {
    char h[192];
    std::snprintf(h, sizeof h, " | of the weights, gathered (train.zero = 3: the tensors outside the blocks, one block) %.1f",
                  mib(gathered));
    out += h;
  }
  return out;
}

std::string MemoryPlan::activations_label() const {
  if (decoder) return cat("KV cache (", B, " sequence, T=", T, ")");
  // the part of the activations the LM head's logits take (GPT-2), or the fused head's chunk
  std::string head;
  if (lm_head) {
    char h[96];
    std::snprintf(h, sizeof h, "; %s %.1f", lm_head_fused ? "fused LM head's chunk" : "LM head's logits",
                  mib(lm_head));
    head = h;
  }
  return cat("activations (B=", B, ", T=", T, ", recompute ", recompute ? "block" : "none", head, ")");
}

std::string MemoryPlan::json() const {
  std::ostringstream o;
  o << "{\"weights_bytes\":" << weights << ",\"bf16_weights_bytes\":" << bf16_copy
    << ",\"gathered_weights_bytes\":" << gathered << ",\"gradients_bytes\":" << grads
    << ",\"optimizer_bytes\":" << optimizer << ",\"offload_host_bytes\":" << offload_host << ",\"activations_bytes\":" << activations
    << ",\"lm_head_bytes\":" << lm_head << ",\"lm_head_fused\":" << (lm_head_fused ? "true" : "false")
    << ",\"workspace_bytes\":" << workspace << ",\"total_bytes\":" << total() << ",\"batch_size\":" << B
    << ",\"seq_len\":" << T << ",\"recompute\":\"" << (recompute ? "block" : "none")
    << "\",\"zero\":" << zero << ",\"optimizer_shards\":" << ranks << "}";
  return o.str();
}

std::string PlanOption::keys() const {
  std::string k = cat("train.zero = ", zero);
  if (recompute) k += ", train.recompute = block";
  if (offload) k += ", train.offload = optimizer";
  return k;
}

std::vector<PlanOption> plan_options(const Config& cfg, Model& m, int T, int world) {
  const bool rc0 = cfg.recompute() == Recompute::Block, off0 = cfg.offload() == Offload::Optimizer;
  std::vector<PlanOption> out;
  for (int pass = 0; pass < 4; ++pass) {
    const bool rc = rc0 || (pass & 1), off = off0 || (pass & 2);
    if ((pass & 1 && rc0) || (pass & 2 && off0)) continue;  // the same as an earlier pass
    for (int z = cfg.train.zero; z <= 3; ++z) {
      Config c = cfg;
      c.train.zero = z;
      c.train.recompute = rc ? "block" : "none";
      c.train.offload = off ? "optimizer" : "none";
      m.set_recompute(rc);
      out.push_back({z, rc, off, cfg.on_cuda() && z == 3, plan_memory(c, m, T, world)});
    }
  }
  m.set_recompute(rc0);
  return out;
}

const PlanOption* smallest_fitting(const std::vector<PlanOption>& options, double budget) {
  for (const PlanOption& o : options)
    if (double(o.plan.total()) <= budget) return &o;
  return nullptr;
}

std::string plan_options_table(const std::vector<PlanOption>& options, double budget, int world) {
  std::ostringstream o;
  char line[256];
  o << "memory plan per rank on " << world << " rank(s) (MiB; the first row is the configured one):\n";
  std::snprintf(line, sizeof line, "  %-68s %9s %9s %9s %9s %9s %9s %9s %s\n", "settings", "weights", "gradients",
                "optimizer", "host", "activ.", "workspace", "total", budget > 0 ? "fits" : "");
  o << line;
  const PlanOption* fit = budget > 0 ? smallest_fitting(options, budget) : nullptr;
  for (const PlanOption& p : options) {
    const MemoryPlan& m = p.plan;
    std::snprintf(line, sizeof line, "  %-68s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %s\n", p.keys().c_str(),
                  mib(m.weights), mib(m.grads), mib(m.optimizer), mib(m.offload_host), mib(m.activations),
                  mib(m.workspace), mib(m.total()),
                  budget <= 0 ? "" : double(m.total()) <= budget ? (&p == fit ? "yes (smallest)" : "yes") : "no");
    o << line;
  }
  if (budget <= 0)
    o << "  (no budget: set run.memory_limit_gb to mark what fits)\n";
  else if (fit)
    o << "  smallest setting that fits " << std::lround(mib(size_t(budget))) << " MiB: " << fit->keys() << "\n";
  else
    o << "  nothing fits " << std::lround(mib(size_t(budget))) << " MiB: lower train.batch_size, or more ranks\n";
  o << "  (host: train.offload's master weights, m, v and gradient copy, outside the device on cuda and in the "
       "total on the cpu)\n";
  if (std::any_of(options.begin(), options.end(), [](const PlanOption& p) { return p.untried; }))
    o << "  (train.zero = 3 on cuda: selectable, not yet run on a GPU; docs/gpu.md)\n";
  return o.str();
}

size_t available_memory(const Config& cfg, int device, int local_ranks, std::string* what) {
  if (cfg.on_cuda()) {
    size_t free_b = 0, total_b = 0;
    if (!cuda_mem_info(device, &free_b, &total_b)) return 0;
    if (what) *what = cat("free memory of GPU ", device, " (cudaMemGetInfo)");
    return free_b;
  }
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      const int n = local_ranks > 0 ? local_ranks : 1;
      if (what)
        *what = n > 1 ? cat("MemAvailable of /proc/meminfo shared by the ", n, " ranks on this node")
                      : std::string("MemAvailable of /proc/meminfo");
      return kb * 1024 / size_t(n);
    }
  }
  return 0;
}

BatchSuggestion suggest_batch(int batch, int accum, int largest_fit) {
  const int64_t target = int64_t(batch) * accum;
  const int top = int(std::min<int64_t>(largest_fit, target));
  if (top < 1) return {};
  BatchSuggestion exact, near;
  for (int b = top; b >= 1 && (exact.batch_size == 0 || near.batch_size == 0); --b) {
    // the grad_accum nearest to target / b (rounded half up; at least 1)
    const int64_t a = std::max<int64_t>(1, (target + b / 2) / b);
    const int64_t diff = a * b - target;
    if (exact.batch_size == 0 && diff == 0) exact = {b, int(a)};
    if (near.batch_size == 0 && diff >= -1 && diff <= 1) near = {b, int(a)};
  }
  return 2 * exact.batch_size >= top ? exact : near;
}

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return size_t(u.ru_maxrss) * 1024;  // kilobytes on Linux
}

}  // namespace nlp
