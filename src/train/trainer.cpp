// The training loop (run.mode = train): data-parallel AdamW with gradient accumulation, clipping by
// global norm, warmup + decay schedule, periodic evaluation, checkpoints, samples, and resume.
//
// Loss normalisation: every rank divides its summed token losses by the GLOBAL number of target
// tokens of the step (all micro-batches, all ranks), and gradients are summed across ranks. N ranks
// with batch B therefore make exactly the update of 1 rank with batch N*B (up to fp32 summation order).
#include <sys/stat.h>

#include <algorithm>
#include <array>
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

namespace nlp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The identity (device, inode) of <output.dir>/checkpoints once a checkpoint was written to (or
// resumed from) it in this run. A folder that vanished, or was removed and created again (scratch
// purged, another job cleaning up, a removal racing with a write that recreated it), means the
// earlier checkpoints are gone: stop rather than quietly go on in a new folder.
struct CheckpointDir {
  bool known = false;
  dev_t dev = 0;
  ino_t ino = 0;
};

bool same_folder(const std::string& dir, const CheckpointDir& d) {
  struct stat sb {};
  return ::stat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_dev == d.dev && sb.st_ino == d.ino;
}

CheckpointDir identify(const std::string& dir) {
  struct stat sb {};
  CheckpointDir d;
  if (::stat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) d = {true, sb.st_dev, sb.st_ino};
  return d;
}

void check_checkpoint_dir(const std::string& dir, const CheckpointDir& d, int64_t step, const char* when) {
  if (d.known && !same_folder(dir, d))
    throw Error(cat("checkpoint directory '", dir, "' has disappeared since the last checkpoint of this run ",
                    "(removed, replaced or unmounted?) ", when, " step ", step,
                    "; stopping instead of going on in a new folder"));
}

// The split of parameter tensor `sp` over the ranks' shards: rank r owns elements [offset[r],
// offset[r] + count[r]) of the tensor (comm/shard.h's part of the tensor's arena range).
ShardLayout tensor_split(const ParamSpec& sp, const ShardLayout& sh) {
  ShardLayout t;
  t.total = sp.numel;
  const size_t a = sp.offset, b = sp.offset + sp.numel;
  for (int r = 0; r < sh.ranks(); ++r) {
    const auto [first, last] = sh.part(r, a, b);
    t.offset.push_back(std::min(first, b) - a);
    t.count.push_back(last - first);
  }
  return t;
}

// Moment `which` of tensor `sp` on rank 0 in `out` (sp.numel floats; null elsewhere), gathered from
// the ranks that own its parts (a collective with train.zero = 1 or 2: every rank calls it).
// which = -1: the parameters themselves, from the shards of train.zero = 3 (AdamW::params).
void gather_moment(Session& s, const AdamW& opt, const ShardLayout& sh, int which, const ParamSpec& sp, float* out) {
  auto read = [&](size_t a, size_t b, float* host) {
    if (which >= 0)
      opt.read_moment(which, a, b, host);
    else if (b > a)
      s.be.to_host(host, opt.params() + (a - opt.lo()), (b - a) * sizeof(float));
  };
  if (sh.ranks() == 1) {
    if (s.comm.rank() == 0) read(sp.offset, sp.offset + sp.numel, out);
    return;
  }
  const ShardLayout t = tensor_split(sp, sh);
  const int r = s.comm.rank();
  std::vector<float> mine(std::max<size_t>(t.count[r], 1));
  if (t.count[r] > 0) read(sp.offset + t.offset[r], sp.offset + t.offset[r] + t.count[r], mine.data());
  s.comm.gather_host(mine.data(), r == 0 ? out : nullptr, t, 0);
}

// The checkpoint, streamed a tensor at a time (io/checkpoint.h): rank 0 writes the weights from its
// copy and each moment tensor as gathered from its owners, so no rank holds more of the model state
// than its own plus one tensor. A collective: every rank calls it.
std::string checkpoint_now(Session& s, AdamW& opt, const ShardLayout& shards, const TrainState& st,
                           CheckpointDir& dir_id) {
  std::string path;
  ParamStore& ps = s.model.params();
  const auto& specs = ps.specs();
  if (s.comm.rank() == 0) {
    const std::string dir = s.cfg.output.dir + "/checkpoints";
    check_checkpoint_dir(dir, dir_id, st.step, "before writing");
    std::vector<NamedTensor> names;
    for (const auto& sp : specs) names.push_back({sp.name, sp.shape, nullptr});
    path = save_checkpoint(s.cfg.output.dir, st, names,
                           [&](int group, size_t i, float* out) {
                             if (group == 0 && opt.sharded_params())  // train.zero = 3
                               gather_moment(s, opt, shards, -1, specs[i], out);
                             else if (group == 0)
                               s.be.to_host(out, ps.data() + specs[i].offset, specs[i].numel * sizeof(float));
                             else
                               gather_moment(s, opt, shards, group - 1, specs[i], out);
                             // debug.kill_in_checkpoint: a crash with the weights written, the moments not
                             if (group == 1 && i == 0 && st.step == s.cfg.debug.kill_in_checkpoint) std::raise(SIGKILL);
                           },
                           [&](h5::File& f) {
                             s.model.write_attrs(f);
                             if (!s.log.run_id().empty()) f.set_attr(kRunIdAttr, s.log.run_id());
                           },
                           s.cfg.checkpoint.keep);
    // The first checkpoint fixes the folder; it must still be there right after the write (a removal
    // between the write and this point would otherwise let the next write start a new folder).
    if (!dir_id.known) {
      dir_id = identify(dir);
      if (!dir_id.known)
        throw Error(cat("checkpoint directory '", dir, "' has disappeared while writing step ", st.step,
                        " (removed or unmounted?); stopping instead of going on in a new folder"));
    }
    check_checkpoint_dir(dir, dir_id, st.step, "while writing");
  } else if (shards.ranks() > 1) {  // the writer's gathers, in its order
    if (opt.sharded_params())
      for (const auto& sp : specs) gather_moment(s, opt, shards, -1, sp, nullptr);
    for (int which = 0; which < 2; ++which)
      for (const auto& sp : specs) gather_moment(s, opt, shards, which, sp, nullptr);
  }
  s.comm.barrier();  // the checkpoint exists for every rank once this returns
  return path;
}

// train.resume: continue from the newest intact checkpoint (resume.h), report the damaged ones, and
// drop the metrics.jsonl records the interrupted run wrote after that checkpoint.
void resume(Session& s, AdamW& opt, TrainState& st, RunNotes& notes) {
  const Config& cfg = s.cfg;
  const ResumeOutcome r = resume_from_checkpoint(s, opt, st);
  for (size_t i = 0; i < r.damaged.size(); ++i) {
    const auto& [file, reason] = r.damaged[i];
    const std::string moved = i < r.moved_to.size() && !r.moved_to[i].empty()
                                  ? cat("; moved to '", r.moved_to[i], "'")
                                  : std::string("; could not be moved aside");
    const std::string w = cat("warning: checkpoint '", file, "' is damaged and was not used (", reason, ")",
                              moved);
    s.log.info(w);
    notes.warnings.push_back(w);
    notes.damaged_checkpoints.emplace_back(file, reason);
  }
  for (const auto& [file, id] : r.other_runs)
    s.log.info(cat("train.resume: not using '", file, "': it belongs to ",
                   id.empty() ? std::string("no recorded run") : cat("run ", id), ", not to run ", s.log.run_id(),
                   " that '", cfg.output.dir, "' holds (", kRunIdFile, ")"));
  // The run continued keeps its id; a folder written before run ids takes the checkpoint's or a new one.
  if (s.log.run_id().empty()) {
    s.log.set_run_id(r.run_id.empty() ? new_run_id() : r.run_id);
    if (s.comm.rank() == 0) write_run_id(cfg.output.dir, s.log.run_id());
  }
  if (r.path.empty()) {
    s.log.info(cat("train.resume: no checkpoint of run ", s.log.run_id(), " in '", cfg.output.dir,
                   "/checkpoints', starting from step 0"));
  } else {
    if (!r.damaged.empty()) {
      const std::string w = cat("warning: resuming from the older checkpoint '", r.path, "' (step ", st.step,
                                ") because ", r.damaged.size(), " newer one(s) are damaged");
      s.log.info(w);
      notes.warnings.push_back(w);
    }
    if (st.seed != cfg.train.seed)
      s.log.info(cat("warning: checkpoint was written with train.seed = ", st.seed,
                     "; continuing with its seed"));
    s.log.info(cat("resumed from '", r.path, "' at step ", st.step, " (data position ", st.next_batch, "), run ",
                   s.log.run_id()));
    notes.resumed_from = r.path;
    notes.resumed_step = st.step;
    stop_note_checkpoint(r.path, st.step, -1);  // the newest checkpoint, its write not timed here
    const TrainConfig& tc = cfg.train;
    const std::string where = tc.schedule_steps > 0 ? cat("train.schedule_steps, ", cfg.where("train.schedule_steps"))
                              : cat("train.steps = ", tc.steps, ", ", tc.epochs > 0 ? std::string("from train.epochs")
                                                                                     : cfg.where("train.steps"));
    const std::string sched = resume_schedule_note(tc.schedule, tc.lr, tc.min_lr_ratio, tc.warmup_steps,
                                                   static_cast<int>(st.schedule_steps),
                                                   schedule_length(tc.schedule_steps, tc.steps), where,
                                                   static_cast<int>(st.step));
    if (!sched.empty() && st.step < tc.steps) {
      s.log.info(sched);
      notes.warnings.push_back(sched);
    }
  }
}

// After begin_output (metrics.jsonl is open): the records an interrupted run wrote after its last
// checkpoint are removed, since the resumed run writes those steps again.
void drop_metrics_after_resume(Session& s, const TrainState& st, RunNotes& notes) {
  notes.metrics_dropped = s.log.drop_metrics_after(st.step);
  if (notes.metrics_dropped > 0)
    s.log.info(cat("train.resume: removed ", notes.metrics_dropped, " metrics.jsonl line(s) after step ",
                   st.step, " (written by the interrupted run after its last checkpoint; they are "
                   "written again)"));
}

bool listed(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

void log_eval(Session& s, int step, const EvalResult& r) {
  s.log.info(cat("eval  step ", step, " | ", format_eval(r)));
  Json j;
  j.integer("step", step);
  eval_json(j, r);
  s.log.metrics(j.done());
}

// <output.dir>/best.h5: the weights (HF layout) with the best eval metric so far.
void save_best(Session& s, const TrainState& st, const EvalResult& r) {
  if (s.comm.rank() == 0) {
    std::vector<float> hp;
    ParamStore& ps = s.model.params();
    auto params = ps.host_views(hp);
    if (ps.params_released())  // train.zero = 3: the gathered tensors (ParamShards::gather_all)
      for (size_t i = 0; i < ps.specs().size(); ++i)
        s.be.to_host(params[i].data, ps.p(static_cast<int>(i)), ps.specs()[i].numel * sizeof(float));
    else
      ps.download(hp);
    save_weights(s.cfg.output.dir + "/best.h5", params, [&](h5::File& f) {
      s.model.write_attrs(f);
      f.set_attr("nlptrain_step", int64_t(st.step));
      f.set_attr("nlptrain_best_metric", r.primary_value);
      f.set_attr("nlptrain_best_metric_name", r.primary);
    });
  }
  s.log.info(cat("best: ", r.primary, " ", r.primary_value, " at step ", st.step, " -> ",
                 s.cfg.output.dir, "/best.h5"));
}

void log_sample(Session& s, int step) {
  if (s.comm.rank() != 0) return;
  std::string text = generate_sample(s, derive_seed(s.cfg.generate.seed, step));
  s.log.info(cat("sample step ", step, ":\n", text, "\n--- end of sample ---"));
}

// ---- Set-up ---------------------------------------------------------------------------------------

// What the run reads: data.train (with its MLM masking spec where the file holds no labels) and
// data.eval, opened and validated on every rank.
struct TrainData {
  TokenDataset train;
  std::unique_ptr<TokenDataset> eval;
  std::unique_ptr<MlmSpec> mlm;
  int T = 0;  // data.train's window length
};

TrainData open_train_data(Session& s) {
  const Config& cfg = s.cfg;
  const TrainConfig& tc = cfg.train;
  const int world = s.comm.size();
  TrainData d{open_dataset(s, cfg.data.train, "data.train"), nullptr, nullptr, 0};
  if (tc.sample_interval > 0) check_sample_tokenizer(s);
  if (s.task == Task::Mlm && !d.train.has_token_labels())
    d.mlm = std::make_unique<MlmSpec>(read_mlm_spec(d.train, s.model.config().vocab_size));
  d.T = d.train.seq_len();
  if (d.train.size() < static_cast<int64_t>(world) * tc.batch_size)
    throw Error(cat("data.train = '", cfg.data.train, "' has ", d.train.size(), " examples, fewer than one "
                    "global batch of ", static_cast<int64_t>(world) * tc.batch_size, " (", world, " ranks x "
                    "train.batch_size = ", tc.batch_size, "): use fewer ranks or a smaller train.batch_size"));
  if (!cfg.data.eval.empty()) d.eval = std::make_unique<TokenDataset>(open_dataset(s, cfg.data.eval, "data.eval"));
  return d;
}

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
          return std::make_unique<ParamShards>(s.comm, s.be, s.model.params(), shards, zero ? s.comm.rank() : 0,
                                               s.cfg.train.zero_prefetch);
        }()),
        grads(stage_ >= 2 ? std::make_unique<GradShards>(s.comm, s.be, s.model.params(), shards,
                                                         zero ? s.comm.rank() : 0,
                                                         s.cfg.comm.overlap && s.comm.size() > 1)
                          : nullptr),
        opt(s.model.params(), s.be, s.cfg.train, shards.lo(zero ? s.comm.rank() : 0),
            shards.hi(zero ? s.comm.rank() : 0), s.cfg.train.offload == "optimizer"),
        model(s.model) {
    if (grads) opt.set_grads(grads->shard());
    if (params) {
      opt.set_params(params->shard());
      opt.load_master();  // train.offload = optimizer: the master weights from the shard (no arena now)
      ParamShards* p = params.get();
      s.model.set_block_hook([p](int l) { p->use_block(l); });
    }
  }
  ~Optimizer() {
    if (params) model.set_block_hook(nullptr);
  }
  bool sharded_grads() const { return zero || grads; }  // the gradient is summed in this rank's range only
};

// ---- Resume ---------------------------------------------------------------------------------------

// The batch shape: the configured one, or on resume at another world size (or batch shape) the one
// that keeps the checkpoint's global batch, with the data position re-derived (resume.h).
struct BatchShape {
  int B = 0, A = 0;     // examples (rows) per rank and micro-batch; micro-batches per step
  TrainState from;      // as the checkpoint left it (packed steps re-derive their position)
  bool reshaped = false;
};

BatchShape resume_batch_shape(Session& s, const TrainData& d, TrainState& st, RunNotes& notes) {
  const TrainConfig& tc = s.cfg.train;
  BatchShape b{tc.batch_size, tc.grad_accum, st, false};
  if (!notes.resumed_from.empty()) {
    const BatchPlan plan = plan_resume_batches(st, s.comm.size(), d.train.size(), s.cfg);
    b.reshaped = plan.changed;
    if (plan.changed) {
      b.B = plan.batch_size;
      b.A = plan.grad_accum;
      st.next_batch = plan.next_batch;
      for (const auto& line : plan.info) s.log.info(line);
      for (const auto& w : plan.warnings) {
        s.log.info(w);
        notes.warnings.push_back(w);
      }
      notes.resume_world_json = plan.json;
    }
  }
  return b;
}

// summary.json's batch and optimizer fields, and the log line of the optimizer state's size.
void note_optimizer(Session& s, const Optimizer& o, const BatchShape& b, RunNotes& notes) {
  const TrainConfig& tc = s.cfg.train;
  const int world = s.comm.size();
  const AdamW& opt = o.opt;
  const size_t total = s.model.params().total();
  notes.batch_size = b.B;
  notes.grad_accum = b.A;
  notes.zero = o.sharded_grads() ? o.stage : 0;
  notes.optimizer_bytes = static_cast<int64_t>(opt.state_bytes());
  notes.optimizer_bytes_total = static_cast<int64_t>(2 * total * sizeof(float));
  notes.offload = tc.offload;
  notes.optimizer_host_bytes = static_cast<int64_t>(opt.host_bytes());
  const double mib = 1024.0 * 1024.0;
  char buf[320];
  if (o.zero)
    std::snprintf(buf, sizeof buf,
                  "optimizer: AdamW m+v %.1f MiB on this rank (train.zero = %d: shard [%zu, %zu) of %zu "
                  "parameters, 1/%d of the %.1f MiB every rank holds with train.zero = 0)",
                  double(opt.state_bytes()) / mib, tc.zero, opt.lo(), opt.hi(), total, world,
                  double(notes.optimizer_bytes_total) / mib);
  else
    std::snprintf(buf, sizeof buf, "optimizer: AdamW m+v %.1f MiB per rank (train.zero = %d%s)",
                  double(opt.state_bytes()) / mib, tc.zero,
                  tc.zero == 1 ? ": one rank, nothing to shard" : world > 1 ? "; 1 would shard it" : "");
  s.log.info(buf);
  if (o.grads) {
    const size_t shard_b = o.grads->shard_size() * sizeof(float), buf_b = o.grads->buffer_bytes();
    s.log.info(cat("gradients: train.zero = ", tc.zero, ": the gradient shard [", opt.lo(), ", ", opt.hi(), ") ",
                   std::lround(double(shard_b) / mib * 10) / 10.0, " MiB and the backward's buffers (the tensors "
                   "outside the blocks, two block slots) ", std::lround(double(buf_b) / mib * 10) / 10.0,
                   " MiB on this rank, instead of the ", std::lround(double(total * sizeof(float)) / mib * 10) / 10.0,
                   " MiB arena; each block's gradients reduce-scattered as its backward ends, every micro-batch"));
    notes.gradient_bytes = static_cast<int64_t>(shard_b + buf_b);
  } else {
    notes.gradient_bytes = static_cast<int64_t>(total * sizeof(float));
  }
  if (o.params) {
    const size_t shard_b = o.params->shard_size() * sizeof(float), buf_b = o.params->buffer_bytes();
    s.log.info(cat("parameters: train.zero = 3: the parameter shard [", opt.lo(), ", ", opt.hi(), ") ",
                   std::lround(double(shard_b) / mib * 10) / 10.0, " MiB and the tensors outside the blocks with "
                   "1 + ", tc.zero_prefetch, " block buffer(s) ", std::lround(double(buf_b) / mib * 10) / 10.0,
                   " MiB on this rank, instead of the ", std::lround(double(total * sizeof(float)) / mib * 10) / 10.0,
                   " MiB arena; each block all-gathered before it is used, the next ", tc.zero_prefetch,
                   " started ahead (train.zero_prefetch); evaluation and samples gather the whole arena for their "
                   "duration"));
  }
  if (opt.offloaded())
    s.log.info(cat("optimizer: train.offload = optimizer: the fp32 master weights, AdamW m and v and a gradient "
                   "copy of [", opt.lo(), ", ", opt.hi(), ") in host memory (",
                   std::lround(double(opt.host_bytes()) / mib * 10) / 10.0, " MiB on this rank", 
                   s.be.name() == "cuda" ? ", page-locked" : "", "); AdamW runs on the host"));
}

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

TrainOrder example_order(Session& s, const TrainData& d, const BatchShape& b, TrainState& st, RunNotes& notes) {
  static const std::vector<int32_t> no_lengths;
  const Config& cfg = s.cfg;
  const int rank = s.comm.rank(), world = s.comm.size();
  const int B = b.B, A = b.A;
  TrainOrder o;
  o.B = B;
  o.A = A;
  st.world_size = world;
  st.batch_size = B;
  st.grad_accum = A;
  // data.group_by_length and packed steps (data.pack_batch = rows): every rank reads all lengths (the
  // order is global), from the mask only. (a reference to the dataset's own copy: lengths() keeps
  // what it read)
  o.by_rows = packs_by_rows(cfg);
  const TrainState& from = b.from;
  if (!notes.resumed_from.empty() && (from.packed_rows != 0) != o.by_rows) {
    const std::string w =
        cat("warning: the checkpoint's data position (micro-batch ", from.next_batch, ") counts ",
            from.packed_rows ? "packed steps (data.pack_batch = rows)" : "micro-batches of train.batch_size examples",
            ", this run's ", o.by_rows ? "packed steps (data.pack_batch = rows)" : "micro-batches of examples",
            ": it continues at that micro-batch of its own order, so examples of the current epoch may be "
            "skipped or seen again");
    s.log.info(w);
    notes.warnings.push_back(w);
  }
  st.packed_rows = o.by_rows ? 1 : 0;
  o.lengths = cfg.data.group_by_length || o.by_rows ? &d.train.lengths() : &no_lengths;
  // Length groups are whole optimizer steps (world x B x A examples): the same sets of examples
  // at any world size that keeps the global batch (a resume at another world size does).
  o.sampler = std::make_unique<Sampler>(train_sampler(cfg, d.train.size(), B, A, rank, world, o.lengths));
  // Packed steps: the data position (st.next_batch) counts micro-batches, A to a step, as unpacked.
  if (o.by_rows) {
    o.packed = std::make_unique<PackedSampler>(*o.sampler, *o.lengths, d.T, int64_t(world) * B * A,
                                               cfg.data.pack_max_per_row);
    if (b.reshaped) {
      std::vector<std::string> lines;
      st.next_batch = packed_resume_position(from, world, B, A, cfg, *o.packed, *o.lengths, &lines);
      for (const auto& line : lines) s.log.info(line);
    }
  }
  o.trim = cfg.data.padding == "longest";
  o.pack = cfg.data.packing;
  o.pack_multiple = packing_multiple(cfg, s.be.name() == "cuda");
  o.tokens_per_step = int64_t(B) * d.T * A * world;
  return o;
}

// The log lines that say what the run reads and how its batches are shaped.
void log_data_plan(Session& s, const TrainData& d, const TrainOrder& o) {
  const Config& cfg = s.cfg;
  const int world = s.comm.size();
  const int B = o.B, A = o.A, T = d.T;
  const TokenDataset& train = d.train;
  const std::vector<int32_t>& lengths = *o.lengths;
  const int pack_multiple = o.pack_multiple;
  s.log.info(cat("train: ", train.size(), " examples of ", T, " tokens in '", cfg.data.train, "' (",
                 train.in_memory() ? cat("held in memory, ", train.column_bytes() >> 20, " MiB; ")
                                   : cat("read per batch: ", train.column_bytes() >> 20,
                                         " MiB > data.cache_mb; "),
                 o.packed ? cat(o.packed->steps_in_epoch(0), " packed steps in the first epoch")
                          : cat(o.sampler->batches_per_epoch(), " global batches per epoch"),
                 "); ", o.tokens_per_step, " tokens per step (", o.packed ? "rows " : "batch ", B, " x accum ", A,
                 " x ranks ", world, ")"));
  if (cfg.data.group_by_length) {
    double sum = 0;
    for (int32_t L : lengths) sum += L;
    s.log.info(cat("data: group_by_length: mega-batches of ", o.sampler->mega_batch_steps(), " optimizer steps (",
                   int64_t(world) * B * A, " examples each) sorted by length, steps in ",
                   cfg.data.group_order == "shuffled" ? "a shuffled order" : "each mega-batch's order, longest first",
                   " (data.group_order = ", cfg.data.group_order, "); mean example length ",
                   sum / double(lengths.size()), " of ", T));
  }
  if (o.packed) {
    const int64_t k = o.packed->steps_in_epoch(0);
    s.log.info(cat("data: packing: train.batch_size = ", B, " rows of ", T, " tokens per rank and micro-batch "
                   "(data.pack_batch = rows): each step takes the next examples of the order that fit its ",
                   int64_t(world) * B * A, " rows (first-fit, at most data.pack_max_per_row = ",
                   cfg.data.pack_max_per_row, " to a row; attention within each example, positions restarting)",
                   pack_multiple > 0 ? cat(", cut to the longest row rounded up to a multiple of ", pack_multiple)
                                     : std::string(), "; the first epoch: ", k, " steps of ",
                   std::lround(100.0 * double(train.size()) / double(k)) / 100.0,
                   " examples on average (the last partial step dropped); evaluation runs unpacked"));
    if (cfg.data.pack_fixed_examples) {
      const int per_row = std::min(cfg.data.pack_max_per_row, T);  // pack_rows' bound at the file's length
      std::string line = cat("data: packing: the heads run ", B, " x ", per_row,
                             " examples per micro-batch (data.pack_fixed_examples), those after the real ones ignored");
      if (pack_multiple > 0)
        line += cat("; the rows are cut to their longest, so the count follows the rows' length below ", per_row);
      if (s.task == Task::Ner) line += "; ner scores every position of the rows, those without a label ignored";
      s.log.info(line);
    }
  } else if (o.pack)
    s.log.info(cat("data: packing: the ", B, " examples of each micro-batch share rows (first-fit, longest "
                   "first; attention within each example, positions restarting) ",
                   pack_multiple > 0 ? cat("of the length, a multiple of ", pack_multiple, " up to ", T,
                                           ", that needs the fewest positions")
                   : o.trim ? cat("of ", T, " positions (cuDNN's attention: one row length, one graph for the "
                                  "run; data.pad_multiple = N packs into multiples of N)")
                            : cat("of ", T, " positions (data.padding = max_length)"),
                   "; evaluation runs unpacked"));
  else
    s.log.info(o.trim ? cat("data: padding = longest: each micro-batch runs at its longest row rounded up to a "
                            "multiple of ", cfg.data.pad_multiple, " (at most ", T, ")")
                      : cat("data: padding = max_length: every row runs at ", T, " positions"));
}

// counts of a step on this rank: loss units, computed positions, real tokens, the sum of the
// micro-batches' lengths, rows and examples (summed over ranks with the loss units: one host sum
// per step)
using StepCounts = std::array<double, 6>;

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
        skip_nonfinite(s_.cfg.train.nonfinite == "skip"), ckpt_dir_id(dir_id), dbuf(s_.be, &s_.model.config()),
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

std::string stop_file(const Session& s) { return s.cfg.output.dir + "/" + kStopFileName; }

// "stop file 'out/STOP' found by 1 of 2 rank(s) (each looks in its own output.dir) and removed"
std::string stop_file_found(const Session& s, double ranks) {
  return cat("stop file '", stop_file(s), "' found by ", std::lround(ranks), " of ", s.comm.size(),
             " rank(s) (each looks in its own output.dir) and removed");
}

// A stop signal during start-up ends the process at once (signals.h); one taken by the handler
// instead of the signal thread, on any rank, ends the run here, before its first step, and so does
// the stop file (removed).
bool stopped_during_startup(Session& s, const TrainState& st) {
  if (s.cfg.debug.startup_sleep_ms > 0)  // debug.startup_sleep_ms: a long start-up
    std::this_thread::sleep_for(std::chrono::milliseconds(s.cfg.debug.startup_sleep_ms));
  // [0]: a signal on some rank; [1]: some rank sees the stop file (output.dir may be node-local)
  double stop[2] = {static_cast<double>(stop_check(st.step + 1)),
                    stop_file_exists(s.cfg.output.dir) ? 1.0 : 0.0};
  s.comm.allreduce_sum_host(stop, 2);
  if (stop[1] > 0) remove_stop_file(s.cfg.output.dir);
  if ((stop[0] > 0 || stop[1] > 0) && st.step < s.cfg.train.steps) {
    s.log.info(cat(stop[0] > 0 ? std::string("stop signal received") : stop_file_found(s, stop[1]),
                   " during start-up: stopping before step ", st.step + 1,
                   ", no checkpoint written; exiting with code ", kExitRequeue,
                   st.step > 0 ? " (train.resume = true continues from the checkpoint resumed from)"
                               : " (run again to train)"));
    return true;
  }
  return false;
}

// ---- One optimizer step ---------------------------------------------------------------------------

// The A micro-batches of a step on this rank, read from data position first_batch into out.
StepCounts read_step(StepLoop& L, int step_no, int64_t first_batch, std::vector<HostBatch>& out) {
  const Config& cfg = L.cfg;
  const TrainOrder& o = L.order;
  const int A = L.A;
  StepCounts c{};
  for (int a = 0; a < A; ++a) {
    PackedSampler::Micro m;
    if (o.packed) m = o.packed->micro(first_batch / A, a, A, L.rank, L.world, o.B);
    const std::vector<int64_t> idx = o.packed ? std::move(m.idx) : o.sampler->indices(first_batch + a);
    L.data.train.read(idx.data(), static_cast<int>(idx.size()), L.tb);
    out[a] = make_batch(L.s.task, L.tb, L.data.mlm.get(), derive_seed(L.seed, step_no, a, 1000 + L.rank));
    c[5] += out[a].B;  // examples
    if (o.packed) {
      pack_rows(out[a], o.pack_multiple, &m.row, m.rows, cfg.data.pack_fixed_examples ? cfg.data.pack_max_per_row : 0);
      if (cfg.data.pack_fixed_examples && L.s.task == Task::Ner) score_every_position(out[a]);
    }
    else if (o.pack)
      pack_rows(out[a], o.pack_multiple);
    else if (o.trim)
      trim_to_longest(out[a], cfg.data.pad_multiple);
    c[0] += static_cast<double>(out[a].loss_units(L.s.task));
    c[1] += static_cast<double>(out[a].B) * out[a].T;
    c[2] += static_cast<double>(out[a].real_tokens);
    c[3] += out[a].T;
    c[4] += out[a].B;  // rows
  }
  return c;
}

// What one step did, for its log line and metrics record.
struct StepResult {
  int step = 0;  // 0-based: the step just taken is step + 1
  float lr = 0;
  double loss = 0, norm = 0, dt = 0;
  bool finite = true;
  StepCounts counts{};
};

// Every micro-batch before the first forward: the global target count normalises the loss.
// t_data counts only a read that was not done ahead (the exposed data wait).
StepCounts take_step_batches(StepLoop& L, int step, double& t_data, double& t_comm) {
  StepCounts counts{};
  auto tp = Clock::now();
  if (L.have_next) {
    std::swap(L.micro, L.next_micro);
    counts = L.next_count;
    L.have_next = false;
  } else {
    counts = read_step(L, step, static_cast<int64_t>(L.st.next_batch), L.micro);
    t_data += seconds_since(tp);
  }
  tp = Clock::now();
  L.s.comm.allreduce_sum_host(counts.data(), counts.size());
  RunNotes& notes = L.notes;
  notes.micro_batches += double(L.A) * L.world;
  notes.batch_len_sum += counts[3];
  notes.file_tokens += double(L.order.tokens_per_step);
  notes.computed_tokens += counts[1];
  notes.real_tokens += counts[2];
  notes.rows += counts[4];
  notes.examples += counts[5];
  t_comm += seconds_since(tp);
  if (counts[0] <= 0)
    throw Error(cat("step ", step + 1, ": the batch has nothing to learn from (all labels are -100) in '",
                    L.cfg.data.train, "'"));
  return counts;
}

// The forwards and backwards of the step's micro-batches; the last one starts the gradient sums.
void forward_backward(StepLoop& L, int step, float dloss) {
  Session& s = L.s;
  s.be.zero(L.loss_dev.get(), sizeof(double));
  L.t_hook = 0;
  auto hook = [&L](size_t lo) {
    const auto th = Clock::now();
    L.reducer.ready(lo);
    L.t_hook += seconds_since(th);
  };
  if (L.optim.grads) {  // train.zero = 2: every micro-batch's gradients go to their shards
    GradShards& gs = *L.optim.grads;
    auto hook2 = [&L, &gs](size_t lo) {
      const auto th = Clock::now();
      gs.ready(lo);
      L.t_hook += seconds_since(th);
    };
    for (int a = 0; a < L.A; ++a) {
      DeviceBatch db = L.dbuf.upload(L.micro[a]);
      const uint64_t dseed = derive_seed(L.seed, step, a, L.rank);
      s.model.forward_into(db, /*training=*/true, dseed, L.loss_dev.get());
      gs.begin();
      s.model.set_grad_ready_hook(hook2);
      s.model.backward(db, dloss, /*training=*/true, dseed);
      s.model.set_grad_ready_hook(nullptr);
      if (a + 1 < L.A) {  // the last one's end() waits in finish_gradients, after the read-ahead
        const auto th = Clock::now();
        gs.end();
        L.t_hook += seconds_since(th);
      }
    }
    return;
  }
  for (int a = 0; a < L.A; ++a) {
    DeviceBatch db = L.dbuf.upload(L.micro[a]);
    const uint64_t dseed = derive_seed(L.seed, step, a, L.rank);
    const bool last_micro = a + 1 == L.A;  // only the summed gradients are reduced
    if (L.graph) {
      if (last_micro) L.reducer.begin();
      L.graph->run([&] {
        s.model.forward_into(db, /*training=*/true, dseed, L.loss_dev.get());
        s.model.backward(db, dloss, /*training=*/true, dseed);
      });
      continue;
    }
    s.model.forward_into(db, /*training=*/true, dseed, L.loss_dev.get());
    if (last_micro) {
      L.reducer.begin();
      s.model.set_grad_ready_hook(hook);
    }
    s.model.backward(db, dloss, /*training=*/true, dseed);
    if (last_micro) s.model.set_grad_ready_hook(nullptr);
  }
}

// Reads the next step's batches while the GPU works, then waits for the gradient sums.
void finish_gradients(StepLoop& L, int step, double& t_comm) {
  Session& s = L.s;
  if (L.cfg.debug.step_sleep_ms > 0)  // debug.step_sleep_ms: a long step
    std::this_thread::sleep_for(std::chrono::milliseconds(L.cfg.debug.step_sleep_ms));
  if (step + 1 < L.tc.steps) {  // read ahead while the GPU works
    L.next_count = read_step(L, step + 1, static_cast<int64_t>(L.st.next_batch) + L.A, L.next_micro);
    L.have_next = true;
  }
  s.be.synchronize();
  const auto tp = Clock::now();
  if (L.optim.grads)
    L.optim.grads->end();
  else
    L.reducer.finish();
  // NLPTRAIN_COMM_TRACE=1 (bench/overlap.sh): per rank and step, the bucket starts and the final wait
  static const bool trace = std::getenv("NLPTRAIN_COMM_TRACE") != nullptr;
  if (trace)
    std::fprintf(stderr, "[trace rank %d] step %d: hooks %.1f ms, finish %.1f ms, at %.3f\n", L.rank, step + 1,
                 L.t_hook * 1e3, seconds_since(tp) * 1e3,
                 std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
  if (listed(L.inject_nonfinite, step + 1)) {  // debug.inject_nonfinite_step, on every rank
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // the arena's first gradient (with train.zero = 2 in rank 0's shard only, as ZeRO-1 sums it)
    if (!L.optim.grads)
      s.be.to_device(s.model.params().grad(), &nan, sizeof nan);
    else if (L.rank == 0)
      s.be.to_device(L.optim.grads->shard(), &nan, sizeof nan);
  }
  t_comm += seconds_since(tp);
}

// The loss, and with train.zero = 1 the squared norm of this rank's shard (the gradient is summed
// only there), summed over ranks in one host call: the global norm for clipping. Every rank holds the
// same loss and norm (summed), so every rank decides the same.
void loss_and_norm(StepLoop& L, double loss_units, StepResult& r, double& t_comm) {
  Session& s = L.s;
  ParamStore& ps = s.model.params();
  const AdamW& opt = L.optim.opt;
  const bool zero = L.optim.sharded_grads();
  double loss_sum = 0;
  s.be.to_host(&loss_sum, L.loss_dev.get(), sizeof loss_sum);
  double host_sums[2] = {loss_sum, zero ? s.be.sumsq(L.optim.opt.grads(), opt.hi() - opt.lo()) : 0.0};
  const auto tp = Clock::now();
  s.comm.allreduce_sum_host(host_sums, 2);
  s.be.synchronize();
  t_comm += seconds_since(tp);
  r.loss = host_sums[0] / loss_units;
  r.norm = std::sqrt(zero ? host_sums[1] : s.be.sumsq(ps.grad(), ps.total()));
  r.finite = std::isfinite(r.loss) && std::isfinite(r.norm);
  if (!r.finite && !L.skip_nonfinite)
    throw Error(cat("step ", r.step + 1, ": loss or gradient norm is not finite (loss ", r.loss,
                    ", grad norm ", r.norm, "); lower train.lr or raise train.warmup_steps, or set "
                    "train.nonfinite = skip to drop such steps"));
}

// The AdamW update of a finite step (clipped by the global norm), or train.nonfinite = skip's count.
void apply_update(StepLoop& L, const StepResult& r, double& t_comm) {
  Session& s = L.s;
  ParamStore& ps = s.model.params();
  AdamW& opt = L.optim.opt;
  const bool zero = L.optim.zero;
  TrainState& st = L.st;
  if (r.finite) {
    // torch.nn.utils.clip_grad_norm_: scale by clip/(norm + 1e-6) when the norm exceeds clip.
    const float grad_scale =
        (L.tc.clip > 0 && r.norm > L.tc.clip) ? static_cast<float>(L.tc.clip / (r.norm + 1e-6)) : 1.f;
    // AdamW's bias correction counts the updates applied, not the steps taken.
    // train.zero = 2: the shard is all there is (the backward's buffers are zero after each micro-batch)
    const bool zero_grad = !zero || L.optim.grads != nullptr;
    opt.step(r.lr, grad_scale, static_cast<int>(st.optimizer_steps + 1), zero_grad);
    L.grads_zero = zero_grad;
    if (L.optim.params) {  // train.zero = 3: only the resident tensors are gathered now, the blocks as used
      const auto tp = Clock::now();
      L.optim.params->refresh();
      s.be.synchronize();
      t_comm += seconds_since(tp);
    } else if (zero) {  // every rank updated its shard: gather the whole parameter arena everywhere
      const auto tp = Clock::now();
      s.comm.all_gather(ps.data(), L.optim.shards);
      // the other ranks' shards were written by the collective: their bf16 copy (core/backend.h)
      s.be.weights_written(ps.data(), opt.lo());
      s.be.weights_written(ps.data() + opt.hi(), ps.total() - opt.hi());
      s.be.synchronize();
      t_comm += seconds_since(tp);
    }
    ++st.optimizer_steps;
    st.nonfinite_streak = 0;
  } else {
    // train.nonfinite = skip: no update and no AdamW step; the step still consumes its batches,
    // its dropout seeds and its place in the lr schedule, so the run stays aligned with train.steps.
    ++st.nonfinite_skipped;
    ++st.nonfinite_streak;
  }
  s.be.synchronize();
}

// One optimizer step (0-based `step`): read, forward and backward every micro-batch, sum the
// gradients, clip and update; the training state then points past it.
StepResult optimizer_step(StepLoop& L, int step) {
  Session& s = L.s;
  const TrainConfig& tc = L.tc;
  const auto t0 = Clock::now();
  double t_data = 0, t_comm = 0;
  StepResult r;
  PathCounts paths0;
  const bool counted = s.be.path_counts(&paths0);
  r.step = step;
  r.lr = learning_rate(tc.schedule, tc.lr, tc.min_lr_ratio, tc.warmup_steps,
                       schedule_length(tc.schedule_steps, tc.steps), step);
  if (!L.grads_zero) {
    if (L.optim.grads)
      L.optim.grads->zero_shard();
    else
      s.be.zero(s.model.params().grad(), s.model.params().total() * sizeof(float));
  }
  L.grads_zero = false;

  r.counts = take_step_batches(L, step, t_data, t_comm);
  forward_backward(L, step, static_cast<float>(1.0 / r.counts[0]));
  t_comm += L.t_hook;
  finish_gradients(L, step, t_comm);
  loss_and_norm(L, r.counts[0], r, t_comm);
  apply_update(L, r, t_comm);

  L.st.step = step + 1;
  L.st.next_batch += L.A;
  r.dt = seconds_since(t0);
  L.train_seconds += r.dt;
  ++L.steps_done_here;
  if (L.steps_done_here > 1) L.times.add(r.dt, t_data, t_comm, r.counts[1], r.counts[2]);
  PathCounts paths1;
  if (L.steps_done_here > 1 && counted && s.be.path_counts(&paths1)) {
    L.paths += paths1 - paths0;
    L.has_paths = true;
  }
  if (L.steps_done_here == 1 && L.cfg.run.profile) s.be.set_profiling(true);  // after one-time set-up
  return r;
}

// The step's log line (every run.log_interval steps, the first, the last and a skipped one), its
// metrics.jsonl record, and the stop after train.nonfinite_max skipped steps in a row.
void report_step(StepLoop& L, const StepResult& r) {
  Session& s = L.s;
  const Config& cfg = L.cfg;
  const TrainConfig& tc = L.tc;
  const TrainState& st = L.st;
  const StepCounts& counts = r.counts;
  const double tok_s = counts[1] / r.dt, real_s = counts[2] / r.dt;  // positions computed; real tokens
  if (st.step % cfg.run.log_interval == 0 || st.step == tc.steps || st.step == 1 || !r.finite) {
    const double elapsed = seconds_since(L.t_start);
    const double eta = L.train_seconds / L.steps_done_here * (tc.steps - st.step);
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "step %6lld/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s (%.0f real, "
                  "len %.0f) | %.3f s/step | elapsed %s | eta %s",
                  static_cast<long long>(st.step), tc.steps, r.loss, r.lr, r.norm, tok_s, real_s,
                  counts[3] / (double(L.A) * L.world), r.dt,
                  format_duration(elapsed).c_str(), format_duration(eta).c_str());
    std::string line = buf;
    if (L.order.pack) {  // examples per computed row this step
      char ex[96];
      std::snprintf(ex, sizeof ex, " | %.0f examples, %.1f ex/row", counts[5],
                    counts[4] > 0 ? counts[5] / counts[4] : 0.0);
      line += ex;
    }
    if (!r.finite)
      line += cat(" | non-finite: update skipped (", st.nonfinite_streak, " in a row, ",
                  st.nonfinite_skipped, " skipped in total)");
    else if (st.nonfinite_skipped > 0)
      line += cat(" | skipped ", st.nonfinite_skipped);
    s.log.info(line);
  }
  Json rec;
  rec.integer("step", st.step).exact("loss", r.loss).num("lr", r.lr).num("grad_norm", r.norm)
      .num("tokens_per_s", tok_s).num("computed_tokens_per_s", tok_s).num("real_tokens_per_s", real_s)
      .num("step_time_s", r.dt);
  if (L.order.pack) rec.integer("examples", static_cast<int64_t>(counts[5]));
  if (!r.finite) rec.boolean("skipped", true);
  if (st.nonfinite_skipped > 0) rec.integer("nonfinite_skipped", st.nonfinite_skipped);
  s.log.metrics(rec.done());
  if (cfg.debug.kill_at_step > 0 && st.step == cfg.debug.kill_at_step && L.rank == 0)
    std::raise(SIGKILL);  // debug.kill_at_step: a crash after this step's metrics
  if (st.nonfinite_streak >= tc.nonfinite_max)
    throw Error(cat("step ", st.step, ": ", st.nonfinite_streak,
                    " consecutive steps had a non-finite loss or gradient norm and were skipped "
                    "(train.nonfinite_max = ", tc.nonfinite_max, "; last: loss ", r.loss, ", grad norm ",
                    r.norm, ", ", st.nonfinite_skipped, " skipped in total); lower train.lr or raise "
                    "train.warmup_steps"));
}

// ---- Evaluation, checkpoint, sample and stop --------------------------------------------------------

// A checkpoint of the state now; its path, step and write time go to the reports of stop signals.
std::string timed_checkpoint(StepLoop& L) {
  const auto t0 = Clock::now();
  const std::string path = checkpoint_now(L.s, L.optim.opt, L.optim.shards, L.st, L.ckpt_dir_id);
  stop_note_checkpoint(path, L.st.step, seconds_since(t0));
  return path;
}

// After a step: evaluation (and best.h5), checkpoint and sample where their intervals (or the last
// step) say, then the stop check. Returns true when a stop signal ends the run here.
bool evaluate_and_checkpoint(StepLoop& L) {
  Session& s = L.s;
  const Config& cfg = L.cfg;
  TrainState& st = L.st;
  const bool last = st.step == L.tc.steps;
  const bool do_eval = L.data.eval && ((cfg.eval.interval > 0 && st.step % cfg.eval.interval == 0) || last);
  const bool do_sample = L.tc.sample_interval > 0 && (st.step % L.tc.sample_interval == 0 || last);
  // train.zero = 3: evaluation, best.h5 and the sample run on the whole parameters, gathered once here on
  // every rank (param_shards.h), so their data-dependent lengths issue no collective
  ParamShards* whole = (do_eval || do_sample) ? L.optim.params.get() : nullptr;
  if (whole) whole->gather_all();
  if (do_eval) {
    EvalResult r = evaluate(s, *L.data.eval, cfg.eval.batches);
    log_eval(s, static_cast<int>(st.step), r);
    const bool better = std::isnan(st.best_metric) ||
                        (r.higher_is_better ? r.primary_value > st.best_metric
                                            : r.primary_value < st.best_metric);
    if (better) {
      st.best_metric = r.primary_value;
      save_best(s, st, r);
    }
  }
  bool checkpointed = false;
  if (cfg.checkpoint.interval > 0 && (st.step % cfg.checkpoint.interval == 0 || last)) {
    const std::string path = timed_checkpoint(L);
    s.log.info(cat("checkpoint: ", path));
    checkpointed = true;
  }
  if (do_sample) log_sample(s, static_cast<int>(st.step));
  if (whole) whole->release_all();

  // A stop signal on any rank, or the stop file seen by any rank, stops every rank at the same step
  // boundary. [0]: a signal; [1]: the stop file (each rank looks in its own output.dir: node-local
  // scratch folders too).
  double stop[2] = {static_cast<double>(stop_check(st.step + 1)), stop_file_exists(cfg.output.dir) ? 1.0 : 0.0};
  s.comm.allreduce_sum_host(stop, 2);
  if (stop[1] > 0 && last) {
    remove_stop_file(cfg.output.dir);
    s.log.info(cat(stop_file_found(s, stop[1]), " after the last step: the run is done"));
  }
  if ((stop[0] > 0 || stop[1] > 0) && !last) {
    const std::string path = checkpointed ? latest_checkpoint(cfg.output.dir) : timed_checkpoint(L);
    if (stop[1] > 0) remove_stop_file(cfg.output.dir);  // after the checkpoint: a kill before it leaves the request
    s.log.info(cat(stop[0] > 0 ? std::string("stop signal received") : stop_file_found(s, stop[1]),
                   ": checkpoint '", path, "' written at step ", st.step, "; exiting with code ", kExitRequeue,
                   " (requeue and run again with train.resume = true)"));
    return true;
  }
  return false;
}

// ---- The end of the run ---------------------------------------------------------------------------

// The "done" line (steps, time, throughput, padding), or "nothing to do"; none after a stop.
void log_done(StepLoop& L, bool stopped) {
  Session& s = L.s;
  const RunNotes& notes = L.notes;
  const TrainState& st = L.st;
  if (stopped) {
    // no "done" line: the run is not done
  } else if (L.steps_done_here > 0) {
    // The throughput summary.json reports (summary.h throughput), in its words.
    const Throughput tp = throughput(L.times, L.order.tokens_per_step);
    char rates[320];
    if (tp.steps > 0)
      std::snprintf(rates, sizeof rates,
                    "over the last %d steps %.0f padded tokens/s (global batch at the file's length), %.0f "
                    "computed tokens/s (positions run), %.0f real tokens/s (no padding)",
                    tp.steps, tp.padded, tp.computed, tp.real);
    else
      std::snprintf(rates, sizeof rates, "no throughput: it is timed from the second step on");
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "done: %d steps in %s, %s; padding computed %.1f%% of the positions, %.1f%% at the "
                  "file's length",
                  L.steps_done_here, format_duration(L.train_seconds).c_str(), rates,
                  100.0 * notes.padding_fraction(), 100.0 * notes.padding_fraction_untrimmed());
    if (L.order.pack && notes.rows > 0)
      s.log.info(cat("data: packing held ", std::lround(100 * notes.examples / notes.rows) / 100.0,
                     " examples per row and ", std::lround(100 * notes.examples / L.steps_done_here) / 100.0,
                     " per step on average (", int64_t(notes.examples), " examples in ", int64_t(notes.rows),
                     " rows)"));
    s.log.info(st.nonfinite_skipped > 0
                   ? cat(buf, "; ", st.nonfinite_skipped, " step(s) skipped for a non-finite gradient")
                   : std::string(buf));
    if (tp.steps > 0 && L.has_paths)
      s.log.info(path_counts_line(L.paths, cat("over the last ", tp.steps, " steps")));
  } else {
    s.log.info(cat("nothing to do: already at step ", st.step, " of train.steps = ", L.tc.steps,
                   "; summary.json and config.ini are left as the run that reached it wrote them"));
  }
}

// run.profile: the per-op account (app/main.cpp puts it between the model and the backend), over
// the timed steps.
void log_profile(StepLoop& L) {
  Session& s = L.s;
  auto* acct = dynamic_cast<AccountBackend*>(L.graph ? &L.graph->inner() : &s.be);
  const std::string rep =
      acct ? acct->report(L.times.steps, L.times.steps > 0 ? 1e3 * L.times.total / L.times.steps : 0,
                          &L.notes.profile_json)
           : s.be.profile_report();
  s.log.info(rep.empty() ? cat("run.profile: the ", s.be.name(), " backend has no per-op profile") : rep);
}

// run.cuda_graph: how this rank's micro-batches ran (replayed, recorded, eager), in the log and
// summary.json.
void log_cuda_graph(StepLoop& L) {
  const StepGraph::Stats& g = L.graph->stats();
  std::string why, why_json;
  for (const auto& [reason, n] : g.eager_why) {
    why += cat(why.empty() ? "" : "; ", reason, ": ", n);
    why_json += cat(why_json.empty() ? "" : ", ", json_string(reason), ": ", n);
  }
  L.s.log.info(cat("run.cuda_graph: of this rank's training micro-batches, ", g.replayed, " replayed a recording, ",
                   g.recorded, " were recorded, ", g.eager, " ran eagerly", why.empty() ? "" : cat(" (", why, ")"),
                   g.failed > 0 ? cat("; ", g.failed, " recording(s) failed") : std::string(),
                   g.dropped > 0 ? cat("; ", g.dropped, " recording(s) dropped after a buffer grew") : std::string(),
                   g.checks > 0 ? cat("; checking a micro-batch's calls took ",
                                      std::lround(1e6 * g.check_seconds / double(g.checks)), " us on the host")
                                : std::string()));
  L.notes.cuda_graph_json = cat("{\"replayed\": ", g.replayed, ", \"recorded\": ", g.recorded, ", \"eager\": ",
                                g.eager, ", \"failed_recordings\": ", g.failed, ", \"dropped_recordings\": ", g.dropped,
                                ", \"check_us\": ", g.checks > 0 ? 1e6 * g.check_seconds / double(g.checks) : 0.0,
                                ", \"eager_reasons\": {", why_json,
                                "}}");
}

// The end of the run: its closing log lines and summary.json; the exit code (0 once train.steps
// are done, else kExitRequeue).
int finish_run(StepLoop& L, bool stopped) {
  log_done(L, stopped);
  if (L.cfg.run.profile) log_profile(L);
  if (L.graph) log_cuda_graph(L);
  L.notes.nonfinite_skipped = L.st.nonfinite_skipped;
  if (L.has_paths) L.notes.gpu_paths_json = path_counts_json(L.paths);
  // A no-op resume ("nothing to do") leaves the finished run's summary.json as it was.
  if (stopped || L.steps_done_here > 0)
    write_summary(L.s, L.times, L.order.tokens_per_step, L.data.T, L.st.step == L.tc.steps, L.notes);
  return L.st.step == L.tc.steps ? 0 : kExitRequeue;
}

}  // namespace

// The outline of a training run; each phase is a function above.
int run_train(Session& s) {
  const TrainConfig& tc = s.cfg.train;
  // Set-up: the data, the optimizer (sharded with train.zero = 1) and the state a checkpoint holds.
  const TrainData data = agreed(s.comm, [&] { return open_train_data(s); });
  Optimizer optim(s, tc.zero);
  TrainState st;
  st.seed = tc.seed;
  st.world_size = s.comm.size();
  st.best_metric = NAN;  // none yet

  // Resume: the newest intact checkpoint, the batch shape that keeps its global batch, the data
  // position in this run's example order.
  RunNotes notes;
  // (agreed: an error is printed once and every rank ends through MPI_Finalize, comm/agree.h)
  const BatchShape shape = agreed(s.comm, [&] {
    if (tc.resume) resume(s, optim.opt, st, notes);
    if (optim.params) optim.params->refresh();  // train.zero = 3: the resident tensors from the shards
    return resume_batch_shape(s, data, st, notes);
  });
  // A finished run resumed with the same steps: its results (summary.json, config.ini) stay as they are.
  const bool nothing_to_do = tc.resume && st.step > 0 && st.step >= tc.steps;
  if (nothing_to_do) s.log.keep_config_file();
  note_optimizer(s, optim, shape, notes);
  const TrainOrder order = agreed(s.comm, [&] { return example_order(s, data, shape, st, notes); });
  st.schedule_steps = schedule_length(tc.schedule_steps, tc.steps);  // recorded in the checkpoints
  // Resumed from a checkpoint in that folder: it must stay the same folder.
  const CheckpointDir ckpt_dir_id = st.step > 0 ? identify(s.cfg.output.dir + "/checkpoints") : CheckpointDir{};

  // The output starts here (every rank's input is valid by now).
  begin_output(s);
  if (data.eval) log_eval_order(s);
  if (tc.resume) drop_metrics_after_resume(s, st, notes);
  log_data_plan(s, data, order);
  s.model.reserve(order.B, data.T);  // the activation arena, once, at the largest batch
  StepLoop loop(s, data, order, optim, st, notes, ckpt_dir_id);
  // The reports of stop signals go to log.txt too, from now until the run returns.
  set_stop_log([&s](const std::string& line) { s.log.note(line); });
  struct Unset {
    ~Unset() { set_stop_log(nullptr); }
  } unset;
  if (stopped_during_startup(s, st)) return kExitRequeue;

  // The steps: each one optimizer step, its report, then evaluation, checkpoint and the stop check.
  bool stopped = false;
  for (int step = static_cast<int>(st.step); step < tc.steps; ++step) {
    const StepResult r = optimizer_step(loop, step);
    stop_note_step(r.dt);
    report_step(loop, r);
    stopped = evaluate_and_checkpoint(loop);
    if (stopped) break;
  }
  return finish_run(loop, stopped);
}

}  // namespace nlp
