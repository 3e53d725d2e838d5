// The parts of a training run (run_train, train/trainer.cpp) and what they share: the data, the
// optimizer and its shards, the batch shape and example order, the state of the step loop. Internal
// to train/trainer*.cpp; the rest of the program calls run_train (train/session.h).
#pragma once
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "backend/op_account_backend.h"
#include "backend/step_graph.h"
#include "comm/agree.h"
#include "comm/grad_reducer.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/packed_sampler.h"
#include "io/weights.h"
#include "train/batches.h"
#include "train/grad_shards.h"
#include "train/optimizer.h"
#include "train/param_shards.h"
#include "train/resume.h"
#include "train/run_folder.h"
#include "train/schedule.h"
#include "train/session.h"
#include "train/signals.h"
#include "train/summary.h"

namespace nlp::trainer {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);

// The identity (device, inode) of <output.dir>/checkpoints once a checkpoint was written to (or
// resumed from) it in this run. A folder that vanished, or was removed and created again (scratch
// purged, another job cleaning up, a removal racing with a write that recreated it), means the
// earlier checkpoints are gone: stop rather than quietly go on in a new folder.
struct CheckpointDir {
  bool known = false;
  dev_t dev = 0;
  ino_t ino = 0;
};

CheckpointDir identify(const std::string& dir);

// What the run reads: data.train (with its MLM masking spec where the file holds no labels) and
// data.eval, opened and validated on every rank.
struct TrainData {
  TokenDataset train;
  std::unique_ptr<TokenDataset> eval;
  std::unique_ptr<MlmSpec> mlm;
  int T = 0;  // data.train's window length
};

// The AdamW optimizer and its sharding. train.zero = 1: this rank keeps AdamW state for, and updates,
// only its shard of the arena.
// train.offload = optimizer: that state (and the master weights) on the host (optimizer.h).
// train.zero = 2: also no gradient arena, only this rank's gradient shard and the buffers the
// backward writes into (grad_shards.h); AdamW reads the shard.
// Made in this order (the members' order): the gradient arena freed (train.zero >= 2: nothing in it is
// needed), the parameter shard taken and the parameter arena freed (3), the gradient shard and buffers
// (2, 3), then the AdamW state; so no arena is ever resident beside what replaces it and the optimizer
// state, and the set-up stays below the steps' peak (made the other way round, it was the peak of
// every stage-2 and stage-3 run: GPT-2 124M on 4 ranks at stage 3, the whole parameter arena beside
// every shard).
struct Optimizer {
  bool zero;  // sharded: train.zero >= 1 on several ranks
  int stage;  // train.zero
  ShardLayout shards;
  std::unique_ptr<ParamShards> params;  // train.zero = 3
  std::unique_ptr<GradShards> grads;  // train.zero = 2 and 3
  AdamW opt;
  Model& model;
  Optimizer(Session& s, int stage_)
      : zero(stage_ >= 1 && s.comm.size() > 1), stage(stage_),
        shards(ShardLayout::even(s.model.params().total(), zero ? s.comm.size() : 1)),
        params([&]() -> std::unique_ptr<ParamShards> {
          if (stage_ != 3) return nullptr;
          s.model.params().release_grads();  // before the parameter shard and buffers are allocated
          // a run from scratch has no parameter arena (app/main.cpp): each rank initialises its shard
          auto init = [&s] {
            const auto t0 = std::chrono::steady_clock::now();
            s.model.init_weights(s.cfg.train.seed);
            char b[32];
            std::snprintf(b, sizeof b, "%.1f",
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            s.log.info(cat("model: ", s.cfg.model.type, " initialised from scratch (seed ", s.cfg.train.seed,
                           ") into each rank's parameter shard (train.zero = 3: every tensor drawn, this "
                           "rank's part kept) in ", b, " s"));
          };
          return std::make_unique<ParamShards>(s.comm, s.be, s.model.params(), shards, zero ? s.comm.rank() : 0,
                                               s.cfg.train.zero_prefetch, s.model.weights_then_grads(), init);
        }()),
        // train.zero = 3: the weights-then-gradients tensors' gradients in their weights' buffers, the
        // resident regions summed in pieces of a block's size (param_shards.h, grad_shards.h)
        grads(stage_ >= 2 ? std::make_unique<GradShards>(s.comm, s.be, s.model.params(), shards,
                                                         zero ? s.comm.rank() : 0,
                                                         s.cfg.comm.overlap && s.comm.size() > 1, 2,
                                                         params ? params->grad_buffers() : std::vector<GradBuffer>{},
                                                         params ? params->block_floats() : 0)
                          : nullptr),
        opt(s.model.params(), s.be, s.cfg.train, shards.lo(zero ? s.comm.rank() : 0),
            shards.hi(zero ? s.comm.rank() : 0), s.cfg.offload() == Offload::Optimizer),
        model(s.model) {
    if (grads) {
      opt.set_grads(grads->shard());
      AdamW* o = &opt;  // offload on cuda: each region's final gradients start to the host at once
      if (opt.offloaded()) grads->set_final_hook([o](size_t a, size_t b) { o->grads_final(a, b); });
    }
    if (params) {
      opt.set_params(params->shard());
      opt.load_master();  // train.offload = optimizer: the master weights from the shard (no arena now)
      ParamShards* p = params.get();
      s.model.set_block_hook([p](int l) { p->use_block(l); });
      s.model.set_weights_hook([p](int i, bool done) { done ? p->done(i) : p->need(i); });
    }
  }
  ~Optimizer() {
    if (params) {
      model.set_block_hook(nullptr);
      model.set_weights_hook(nullptr);
    }
  }
  bool sharded_grads() const { return zero || grads; }  // the gradient is summed in this rank's range only
};

// The batch shape: the configured one, or on resume at another world size (or batch shape) the one
// that keeps the checkpoint's global batch, with the data position re-derived (resume.h).
struct BatchShape {
  int B = 0, A = 0;     // examples (rows) per rank and micro-batch; micro-batches per step
  TrainState from;      // as the checkpoint left it (packed steps re-derive their position)
  bool reshaped = false;
};

// The example order of the run and how its micro-batches are shaped (trimmed, packed).
struct TrainOrder {
  int B = 0, A = 0;
  bool by_rows = false;  // packed steps (data.pack_batch = rows)
  bool pack = false;     // data.packing
  bool trim = false;     // data.padding = longest
  int pack_multiple = 0;
  int64_t tokens_per_step = 0;  // global batch at the file's length
  // data.group_by_length and packed steps: every example's length (the dataset's own copy), else empty
  const std::vector<int32_t>* lengths = nullptr;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<PackedSampler> packed;  // data.pack_batch = rows
};

// What a step's micro-batches hold: on this rank as read, then summed over ranks in one host sum
// per step (sum_over_ranks).
struct StepCounts {
  double loss_units = 0;   // what the loss is divided by (target tokens, sequences or questions)
  double computed = 0;     // positions computed: rows x the micro-batch's length
  double real_tokens = 0;  // positions that are not padding
  double length_sum = 0;   // the micro-batches' lengths, summed
  double rows = 0;
  double examples = 0;
  void sum_over_ranks(Comm& comm);
};

// What the steps share, set up once before the first: the batches, the buffers, the gradient
// reducer, the timers and the checkpoint folder's identity.
struct StepLoop {
  Session& s;
  const Config& cfg;
  const TrainConfig& tc;
  const TrainData& data;
  const TrainOrder& order;
  Optimizer& optim;
  TrainState& st;
  RunNotes& notes;
  const int rank, world, A;
  const uint64_t seed;
  const std::vector<int64_t> inject_nonfinite;  // debug.inject_nonfinite_step
  const bool skip_nonfinite;                    // train.nonfinite = skip
  CheckpointDir ckpt_dir_id;

  DeviceBatchBuffer dbuf;
  // a step's loss sum, added up in backend memory by the forwards (Model::forward_into) and read once
  // after the backward: on a GPU no micro-batch waits for its forward before the backward is queued
  std::unique_ptr<double, std::function<void(double*)>> loss_dev;
  TokenBatch tb;
  // The micro-batches of a step, read on the host. Those of the next step are read while the GPU
  // runs this step's backward (the ops are queued asynchronously), so the data read is hidden
  // behind the compute; the batches depend only on (seed, step, data position), so reading ahead
  // changes no result, and a run that stops discards them.
  std::vector<HostBatch> micro, next_micro;
  StepCounts next_count{};
  bool have_next = false;
  // run.cuda_graph: each micro-batch's forward and backward run through the StepGraph the model
  // was built on (app/main.cpp), replayed where a recording of their calls exists; the gradients are
  // then reduced after the backward (a recording holds no communication).
  StepGraph* graph;
  // Gradient sums: in buckets of comm.bucket_mb during the last micro-batch's backward
  // (comm.overlap), waited for before clipping. t_comm counts only time this thread is blocked in
  // communication (starting buckets, the final wait, the small host sums): the exposed part.
  GradReducer reducer;
  double t_hook = 0;  // time inside the model's grad-ready hook (bucket starts) during a step
  Clock::time_point t_start;
  int steps_done_here = 0;
  double train_seconds = 0;
  StepTimes times;  // summed over steps after the first (which includes one-time allocation)
  // What the backend ran in the timed steps (core/path_counts.h: each step's difference, so
  // evaluation and checkpoints between steps are left out); has_paths: the backend keeps such counts
  // (cuda) and a step was timed.
  PathCounts paths;
  bool has_paths = false;
  // The gradient arena is known to be all zero: the last update zeroed it as it read it (not with
  // train.zero = 1, where each rank updates only its shard, nor after a skipped step).
  bool grads_zero = false;

  StepLoop(Session& s_, const TrainData& d, const TrainOrder& o, Optimizer& opt, TrainState& st_, RunNotes& n,
           CheckpointDir dir_id)
      : s(s_), cfg(s_.cfg), tc(s_.cfg.train), data(d), order(o), optim(opt), st(st_), notes(n),
        rank(s_.comm.rank()), world(s_.comm.size()), A(o.A), seed(st_.seed),
        inject_nonfinite(parse_step_list(s_.cfg.debug.inject_nonfinite_step)),
        skip_nonfinite(s_.cfg.nonfinite() == Nonfinite::Skip), ckpt_dir_id(dir_id), dbuf(s_.be, &s_.model.config()),
        loss_dev(static_cast<double*>(s_.be.alloc(sizeof(double))), [&be = s_.be](double* p) { be.release(p); }),
        micro(o.A), next_micro(o.A), graph(dynamic_cast<StepGraph*>(&s_.be)),
        reducer(s_.comm, s_.model.params().grad(), s_.model.params().total(), s_.cfg.comm.bucket_floats(),
                s_.cfg.comm.overlap && world > 1 && !graph, opt.zero ? &opt.shards : nullptr) {
    if (graph)
      s.log.info(cat("run.cuda_graph: each training micro-batch launches as one ",
                     graph->records() && s.be.name() == "cuda" ? "CUDA graph" : "recording (emulated on the cpu)",
                     " wherever its calls repeat those of an earlier one (recorded at the second micro-batch of a "
                     "shape, up to 8 shapes), else eagerly",
                     world > 1 && cfg.comm.overlap ? "; the gradient sums run after the backward (comm.overlap "
                                                     "does not apply)"
                                                   : ""));
    t_start = Clock::now();
  }
};

// What one step did, for its log line and metrics record.
struct StepResult {
  int step = 0;  // 0-based: the step just taken is step + 1
  float lr = 0;
  double loss = 0, norm = 0, dt = 0;
  bool finite = true;
  StepCounts counts{};
};

// ---- Set-up (trainer_setup.cpp) ---------------------------------------------------------------------
TrainData open_train_data(Session& s);
void note_optimizer(Session& s, const Optimizer& o, const BatchShape& b, RunNotes& notes);
TrainOrder example_order(Session& s, const TrainData& d, const BatchShape& b, TrainState& st, RunNotes& notes);
void log_data_plan(Session& s, const TrainData& d, const TrainOrder& o);

// ---- Checkpoints and resume (trainer_checkpoint.cpp) ------------------------------------------------
std::string checkpoint_now(Session& s, AdamW& opt, const ShardLayout& shards, const TrainState& st,
                           CheckpointDir& dir_id);
void resume(Session& s, AdamW& opt, TrainState& st, RunNotes& notes);
void drop_metrics_after_resume(Session& s, const TrainState& st, RunNotes& notes);
BatchShape resume_batch_shape(Session& s, const TrainData& d, TrainState& st, RunNotes& notes);

// ---- One optimizer step (trainer_step.cpp) ----------------------------------------------------------
StepCounts read_step(StepLoop& L, int step_no, int64_t first_batch, std::vector<HostBatch>& out);
StepCounts take_step_batches(StepLoop& L, int step, double& t_data, double& t_comm);
void forward_backward(StepLoop& L, int step, float dloss);
void finish_gradients(StepLoop& L, int step, double& t_comm);
void loss_and_norm(StepLoop& L, double loss_units, StepResult& r, double& t_comm);
void apply_update(StepLoop& L, const StepResult& r, double& t_comm);
StepResult optimizer_step(StepLoop& L, int step);
void report_step(StepLoop& L, const StepResult& r);

// ---- Evaluation, checkpoint, sample and stop (trainer_after_step.cpp) --------------------------------
bool stopped_during_startup(Session& s, const TrainState& st);
bool evaluate_and_checkpoint(StepLoop& L);

// ---- The end of the run (trainer_finish.cpp) --------------------------------------------------------
int finish_run(StepLoop& L, bool stopped);

}  // namespace nlp::trainer
