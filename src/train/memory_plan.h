// The memory plan: what one rank will allocate, estimated before anything large is allocated
// (app/main.cpp builds the model's parameter table without its arenas, sizes everything from it, and
// stops with a message naming the keys that would make it fit when the plan exceeds the device's free
// memory or run.memory_limit_gb). Logged as a table at the start and written to summary.json.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/model.h"

namespace nlp {

struct MemoryPlan {
  size_t weights = 0;      // parameters (fp32), and their bf16 copy when there is one
  size_t bf16_copy = 0;    // of which the persistent bf16 copy (run.bf16_weights)
  size_t gathered = 0;     // train.zero = 3: of which the gathered buffers (the tensors outside the
                           // blocks and one block buffer, train/param_shards.h); the rest is the shard
  size_t grads = 0;        // their gradients (every mode allocates the arena: model/params.cpp)
  size_t optimizer = 0;    // AdamW m and v (train mode): this rank's shard with train.zero = 1; 0 when
                           // offloaded (train.offload = optimizer)
  size_t offload_host = 0; // train.offload = optimizer: the shard's master weights, m, v and gradient
                           // copy in host memory (counted in total() on the cpu, where host is the device)
  bool host_is_device = true;  // run.backend = cpu
  size_t activations = 0;  // Model::activation_bytes(B, T), with or without recomputation; generate:
                           // the KV-cache decoder's buffers (decoder_bytes, one sequence)
  size_t lm_head = 0;      // of which the LM head's logits (Model::lm_head_bytes: GPT-2's [B*T, V]
  bool lm_head_fused = false;  // logits and gradient, or one chunk of the fused head)
  size_t workspace = 0;    // batch buffers; cpu: the largest host buffer beside the arenas (outside
                           // training the parameters' host copy; in training the checkpoint's
                           // parameters, m and v, or MPI's buffers for the gradient sum)
  int B = 0, T = 0;
  bool recompute = false;
  bool decoder = false;     // run.mode = generate: activations are the decoder's (B = 1, T = n_positions)
  int zero = 0, ranks = 1;  // train.zero and the ranks the optimizer state is sharded over
  size_t total() const {
    return weights + grads + optimizer + activations + workspace + (host_is_device ? offload_host : 0);
  }
  std::string table() const;  // a few log lines
  // "activations (B=8, T=128, recompute none)", or for generate "KV cache (1 sequence, T=1024)"
  std::string activations_label() const;
  std::string json() const;   // a JSON object (bytes), for summary.json
};

// `m` may be a model whose arenas are not allocated (make_model(..., allocate = false)); `world` is
// the number of ranks (train.zero >= 1 divides the optimizer state by it, train.zero = 2 the
// gradients too: the shard plus train/grad_shards.h's buffers, train.zero = 3 the weights too: the
// shard plus train/param_shards.h's buffers, and the whole parameters in the workspace while an
// evaluation or a sample runs).
MemoryPlan plan_memory(const Config& cfg, const Model& m, int T, int world);

// The settings that shrink the plan, in the order they cost speed: train.zero from the configured
// stage up to 3, then the same with train.recompute = block, then with train.offload = optimizer, then
// both (the configured settings first; each setting at least as strong as the configured one). `m`
// is an unallocated model (its recompute flag is set per option and restored).
struct PlanOption {
  int zero = 0;
  bool recompute = false, offload = false;
  bool untried = false;  // a setting of run.backend = cuda not yet run on a GPU (train.zero = 3, docs/gpu.md)
  MemoryPlan plan;
  std::string keys() const;  // "train.zero = 2, train.recompute = block, train.offload = optimizer"
};
std::vector<PlanOption> plan_options(const Config& cfg, Model& m, int T, int world);
// The first option whose total fits `budget` bytes (nullptr: none does).
const PlanOption* smallest_fitting(const std::vector<PlanOption>& options, double budget);
// --check: the plan of every option as a table (model state, gradients, optimizer state on the device
// and on the host, activations, workspace, total per rank) and the first that fits `budget` (0: no
// budget known, none marked).
std::string plan_options_table(const std::vector<PlanOption>& options, double budget, int world);

// Memory this rank may use: cpu: MemAvailable of /proc/meminfo divided by the ranks on this node;
// cuda: cudaMemGetInfo's free bytes of `device`. 0 when unknown; `what` says where it came from.
size_t available_memory(const Config& cfg, int device, int local_ranks, std::string* what);

// A smaller micro-batch that keeps the optimizer step's batch: given train.batch_size = batch and
// train.grad_accum = accum (per rank: batch x accum sequences a step) and the largest batch_size that
// fits (largest_fit < batch), a batch_size <= largest_fit and a grad_accum whose product is within
// one sequence of batch x accum: the exact product with the largest such batch_size, unless that is
// below half of largest_fit, then the largest batch_size whose product is within one (8 x 1 with 7
// fitting: 4 x 2; 7 x 1 with 6 fitting: 6 x 1).
struct BatchSuggestion {
  int batch_size = 0, grad_accum = 0;
  int64_t product() const { return int64_t(batch_size) * grad_accum; }
};
BatchSuggestion suggest_batch(int batch, int accum, int largest_fit);

// The peak resident set of this process so far (getrusage ru_maxrss), bytes.
size_t peak_rss_bytes();

}  // namespace nlp
