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
#include "comm/grad_reducer.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/packed_sampler.h"
#include "io/weights.h"
#include "train/batches.h"
#include "train/optimizer.h"
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

// The AdamW moments of the whole arena on rank 0, in `hm` and `hv`. train.zero = 1: gathered from
// every rank's shard (a collective: every rank calls it); checkpoints hold the full state either way.
void gather_moments(Session& s, AdamW& opt, const ShardLayout& sh, std::vector<float>& hm,
                    std::vector<float>& hv) {
  const bool root = s.comm.rank() == 0;
  if (sh.ranks() == 1) {  // not sharded: rank 0 holds it all
    if (root) {
      opt.download(opt.exp_avg(), hm);
      opt.download(opt.exp_avg_sq(), hv);
    }
    return;
  }
  std::vector<float> mine;
  for (auto [dev, out] : {std::pair{opt.exp_avg(), &hm}, std::pair{opt.exp_avg_sq(), &hv}}) {
    opt.download(dev, mine);
    if (root) out->resize(sh.total);
    s.comm.gather_host(mine.data(), root ? out->data() : nullptr, sh, 0);
  }
}

std::string checkpoint_now(Session& s, AdamW& opt, const ShardLayout& shards, const TrainState& st,
                           CheckpointDir& dir_id) {
  std::string path;
  std::vector<float> hm, hv;
  gather_moments(s, opt, shards, hm, hv);
  if (s.comm.rank() == 0) {
    const std::string dir = s.cfg.output.dir + "/checkpoints";
    check_checkpoint_dir(dir, dir_id, st.step, "before writing");
    std::vector<float> hp;
    auto params = s.model.params().host_views(hp);
    s.model.params().download(hp);
    auto m = s.model.params().host_views(hm);
    auto v = s.model.params().host_views(hv);
    path = save_checkpoint(s.cfg.output.dir, st, params, m, v,
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
    auto params = s.model.params().host_views(hp);
    s.model.params().download(hp);
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

}  // namespace

int run_train(Session& s) {
  const Config& cfg = s.cfg;
  const TrainConfig& tc = cfg.train;
  const int rank = s.comm.rank(), world = s.comm.size();
  TokenDataset train = open_dataset(s, cfg.data.train, "data.train");
  if (tc.sample_interval > 0) check_sample_tokenizer(s);
  std::unique_ptr<MlmSpec> mlm;
  if (s.task == Task::Mlm && !train.has_token_labels())
    mlm = std::make_unique<MlmSpec>(read_mlm_spec(train, s.model.config().vocab_size));
  const int T = train.seq_len();
  if (train.size() < static_cast<int64_t>(world) * tc.batch_size)
    throw Error(cat("data.train = '", cfg.data.train, "' has ", train.size(), " examples, fewer than one "
                    "global batch of ", static_cast<int64_t>(world) * tc.batch_size, " (", world, " ranks x "
                    "train.batch_size = ", tc.batch_size, "): use fewer ranks or a smaller train.batch_size"));
  std::unique_ptr<TokenDataset> eval;
  if (!cfg.data.eval.empty()) eval = std::make_unique<TokenDataset>(open_dataset(s, cfg.data.eval, "data.eval"));

  ParamStore& ps = s.model.params();
  // train.zero = 1: this rank keeps AdamW state for, and updates, only its shard of the arena.
  const bool zero = tc.zero == 1 && world > 1;
  const ShardLayout shards = ShardLayout::even(ps.total(), zero ? world : 1);
  AdamW opt(ps, s.be, tc, shards.lo(zero ? rank : 0), shards.hi(zero ? rank : 0));
  TrainState st;
  st.seed = tc.seed;
  st.world_size = world;
  st.best_metric = NAN;  // none yet

  RunNotes notes;
  if (tc.resume) resume(s, opt, st, notes);
  // Batch shape: the configured one, or on resume at another world size (or batch shape) the one
  // that keeps the checkpoint's global batch, with the data position re-derived (resume.h).
  int B = tc.batch_size, A = tc.grad_accum;
  const TrainState from = st;  // as the checkpoint left it (packed steps re-derive their position)
  bool reshaped = false;
  if (!notes.resumed_from.empty()) {
    const BatchPlan plan = plan_resume_batches(st, world, train.size(), cfg);
    reshaped = plan.changed;
    if (plan.changed) {
      B = plan.batch_size;
      A = plan.grad_accum;
      st.next_batch = plan.next_batch;
      for (const auto& line : plan.info) s.log.info(line);
      for (const auto& w : plan.warnings) {
        s.log.info(w);
        notes.warnings.push_back(w);
      }
      notes.resume_world_json = plan.json;
    }
  }
  notes.batch_size = B;
  notes.grad_accum = A;
  notes.zero = zero ? 1 : 0;
  notes.optimizer_bytes = static_cast<int64_t>(opt.state_bytes());
  notes.optimizer_bytes_total = static_cast<int64_t>(2 * ps.total() * sizeof(float));
  {
    const double mib = 1024.0 * 1024.0;
    char buf[320];
    if (zero)
      std::snprintf(buf, sizeof buf,
                    "optimizer: AdamW m+v %.1f MiB on this rank (train.zero = 1: shard [%zu, %zu) of %zu "
                    "parameters, 1/%d of the %.1f MiB every rank holds with train.zero = 0)",
                    double(opt.state_bytes()) / mib, opt.lo(), opt.hi(), ps.total(), world,
                    double(notes.optimizer_bytes_total) / mib);
    else
      std::snprintf(buf, sizeof buf, "optimizer: AdamW m+v %.1f MiB per rank (train.zero = %d%s)",
                    double(opt.state_bytes()) / mib, tc.zero,
                    tc.zero == 1 ? ": one rank, nothing to shard" : world > 1 ? "; 1 would shard it" : "");
    s.log.info(buf);
  }
  st.world_size = world;
  st.batch_size = B;
  st.grad_accum = A;
  // data.group_by_length and packed steps (data.pack_batch = rows): every rank reads all lengths (the
  // order is global), from the mask only. (a reference to the dataset's own copy: lengths() keeps
  // what it read)
  const bool by_rows = packs_by_rows(cfg);
  if (!notes.resumed_from.empty() && (from.packed_rows != 0) != by_rows) {
    const std::string w =
        cat("warning: the checkpoint's data position (micro-batch ", from.next_batch, ") counts ",
            from.packed_rows ? "packed steps (data.pack_batch = rows)" : "micro-batches of train.batch_size examples",
            ", this run's ", by_rows ? "packed steps (data.pack_batch = rows)" : "micro-batches of examples",
            ": it continues at that micro-batch of its own order, so examples of the current epoch may be "
            "skipped or seen again");
    s.log.info(w);
    notes.warnings.push_back(w);
  }
  st.packed_rows = by_rows ? 1 : 0;
  const std::vector<int32_t> no_lengths;
  const std::vector<int32_t>& lengths = cfg.data.group_by_length || by_rows ? train.lengths() : no_lengths;
  // Length groups are whole optimizer steps (world x B x A examples): the same sets of examples
  // at any world size that keeps the global batch (a resume at another world size does).
  const Sampler sampler = train_sampler(cfg, train.size(), B, A, rank, world, &lengths);
  // Packed steps: the data position (st.next_batch) counts micro-batches, A to a step, as unpacked.
  std::unique_ptr<PackedSampler> packed;
  if (by_rows) {
    packed = std::make_unique<PackedSampler>(sampler, lengths, T, int64_t(world) * B * A, cfg.data.pack_max_per_row);
    if (reshaped) {
      std::vector<std::string> lines;
      st.next_batch = packed_resume_position(from, world, B, A, cfg, *packed, lengths, &lines);
      for (const auto& line : lines) s.log.info(line);
    }
  }
  const bool trim = cfg.data.padding == "longest";
  const uint64_t seed = st.seed;
  // Resumed from a checkpoint in that folder: it must stay the same folder.
  CheckpointDir ckpt_dir_id = st.step > 0 ? identify(cfg.output.dir + "/checkpoints") : CheckpointDir{};
  begin_output(s);
  if (eval) log_eval_order(s);
  if (tc.resume) drop_metrics_after_resume(s, st, notes);
  const std::vector<int64_t> inject_nonfinite = parse_step_list(cfg.debug.inject_nonfinite_step);
  const bool skip_nonfinite = tc.nonfinite == "skip";

  const int64_t tokens_per_step = int64_t(B) * T * A * world;
  s.log.info(cat("train: ", train.size(), " examples of ", T, " tokens in '", cfg.data.train, "' (",
                 train.in_memory() ? cat("held in memory, ", train.column_bytes() >> 20, " MiB; ")
                                   : cat("read per batch: ", train.column_bytes() >> 20,
                                         " MiB > data.cache_mb; "),
                 packed ? cat(packed->steps_in_epoch(0), " packed steps in the first epoch")
                        : cat(sampler.batches_per_epoch(), " global batches per epoch"),
                 "); ", tokens_per_step, " tokens per step (", packed ? "rows " : "batch ", B, " x accum ", A,
                 " x ranks ", world, ")"));
  if (cfg.data.group_by_length) {
    double sum = 0;
    for (int32_t L : lengths) sum += L;
    s.log.info(cat("data: group_by_length: mega-batches of ", sampler.mega_batch_steps(), " optimizer steps (",
                   int64_t(world) * B * A, " examples each) sorted by length, steps in ",
                   cfg.data.group_order == "shuffled" ? "a shuffled order" : "each mega-batch's order, longest first",
                   " (data.group_order = ", cfg.data.group_order, "); mean example length ",
                   sum / double(lengths.size()), " of ", T));
  }
  const bool pack = cfg.data.packing;
  const int pack_multiple = packing_multiple(cfg, s.be.name() == "cuda");
  if (packed) {
    const int64_t k = packed->steps_in_epoch(0);
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
  } else if (pack)
    s.log.info(cat("data: packing: the ", B, " examples of each micro-batch share rows (first-fit, longest "
                   "first; attention within each example, positions restarting) ",
                   pack_multiple > 0 ? cat("of the length, a multiple of ", pack_multiple, " up to ", T,
                                           ", that needs the fewest positions")
                   : trim ? cat("of ", T, " positions (cuDNN's attention: one row length, one graph for the "
                                "run; data.pad_multiple = N packs into multiples of N)")
                          : cat("of ", T, " positions (data.padding = max_length)"),
                   "; evaluation runs unpacked"));
  else
    s.log.info(trim ? cat("data: padding = longest: each micro-batch runs at its longest row rounded up to a "
                          "multiple of ", cfg.data.pad_multiple, " (at most ", T, ")")
                    : cat("data: padding = max_length: every row runs at ", T, " positions"));
  s.model.reserve(B, T);  // the activation arena, once, at the largest batch

  DeviceBatchBuffer dbuf(s.be);
  // a step's loss sum, added up in backend memory by the forwards (Model::forward_into) and read once
  // after the backward: on a GPU no micro-batch waits for its forward before the backward is queued
  std::unique_ptr<double, std::function<void(double*)>> loss_dev(
      static_cast<double*>(s.be.alloc(sizeof(double))), [&be = s.be](double* p) { be.release(p); });
  TokenBatch tb;
  // The micro-batches of a step, read on the host. Those of the next step are read while the GPU
  // runs this step's backward (the ops are queued asynchronously), so the data read is hidden
  // behind the compute; the batches depend only on (seed, step, data position), so reading ahead
  // changes no result, and a run that stops discards them.
  std::vector<HostBatch> micro(A), next_micro(A);
  // counts of a step on this rank: loss units, computed positions, real tokens, the sum of the
  // micro-batches' lengths, rows and examples (summed over ranks with the loss units: one host sum
  // per step)
  using StepCounts = std::array<double, 6>;
  StepCounts next_count{};
  bool have_next = false;
  auto read_step = [&](int step_no, int64_t first_batch, std::vector<HostBatch>& out) {
    StepCounts c{};
    for (int a = 0; a < A; ++a) {
      PackedSampler::Micro m;
      if (packed) m = packed->micro(first_batch / A, a, A, rank, world, B);
      const std::vector<int64_t> idx = packed ? std::move(m.idx) : sampler.indices(first_batch + a);
      train.read(idx.data(), static_cast<int>(idx.size()), tb);
      out[a] = make_batch(s.task, tb, mlm.get(), derive_seed(seed, step_no, a, 1000 + rank));
      c[5] += out[a].B;  // examples
      if (packed) {
        pack_rows(out[a], pack_multiple, &m.row, m.rows, cfg.data.pack_fixed_examples ? cfg.data.pack_max_per_row : 0);
        if (cfg.data.pack_fixed_examples && s.task == Task::Ner) score_every_position(out[a]);
      }
      else if (pack)
        pack_rows(out[a], pack_multiple);
      else if (trim)
        trim_to_longest(out[a], cfg.data.pad_multiple);
      c[0] += static_cast<double>(out[a].loss_units(s.task));
      c[1] += static_cast<double>(out[a].B) * out[a].T;
      c[2] += static_cast<double>(out[a].real_tokens);
      c[3] += out[a].T;
      c[4] += out[a].B;  // rows
    }
    return c;
  };
  // Gradient sums: in buckets of comm.bucket_mb during the last micro-batch's backward
  // (comm.overlap), waited for before clipping. t_comm counts only time this thread is blocked in
  // communication (starting buckets, the final wait, the small host sums): the exposed part.
  // run.cuda_graph: each micro-batch's forward and backward run through the StepGraph the model
  // was built on (app/main.cpp), replayed where a recording of their calls exists; the gradients are
  // then reduced after the backward (a recording holds no communication).
  StepGraph* graph = dynamic_cast<StepGraph*>(&s.be);
  if (graph)
    s.log.info(cat("run.cuda_graph: each training micro-batch launches as one ",
                   graph->records() && s.be.name() == "cuda" ? "CUDA graph" : "recording (emulated on the cpu)",
                   " wherever its calls repeat those of an earlier one (recorded at the second micro-batch of a "
                   "shape, up to 8 shapes), else eagerly",
                   world > 1 && cfg.comm.overlap ? "; the gradient sums run after the backward (comm.overlap "
                                                   "does not apply)"
                                                 : ""));
  GradReducer reducer(s.comm, ps.grad(), ps.total(), cfg.comm.bucket_floats(),
                      cfg.comm.overlap && world > 1 && !graph, zero ? &shards : nullptr);
  double t_hook = 0;  // time inside the model's grad-ready hook (bucket starts) during a step
  auto hook = [&](size_t lo) {
    const auto th = Clock::now();
    reducer.ready(lo);
    t_hook += seconds_since(th);
  };
  const auto t_start = Clock::now();
  int steps_done_here = 0;
  double train_seconds = 0;
  StepTimes times;  // summed over steps after the first (which includes one-time allocation)
  // The gradient arena is known to be all zero: the last update zeroed it as it read it (not with
  // train.zero = 1, where each rank updates only its shard, nor after a skipped step).
  bool grads_zero = false;
  if (cfg.debug.startup_sleep_ms > 0)  // debug.startup_sleep_ms: a long start-up
    std::this_thread::sleep_for(std::chrono::milliseconds(cfg.debug.startup_sleep_ms));
  // A stop signal during start-up ends the process at once (signals.h); one taken by the handler
  // instead of the signal thread, on any rank, ends the run here, before its first step.
  {
    double sig[1] = {static_cast<double>(stop_check(st.step + 1))};
    s.comm.allreduce_sum_host(sig, 1);
    if (sig[0] > 0 && st.step < tc.steps) {
      s.log.info(cat("stop signal received during start-up: stopping before step ", st.step + 1,
                     ", no checkpoint written; exiting with code ", kExitRequeue,
                     st.step > 0 ? " (train.resume = true continues from the checkpoint resumed from)"
                                 : " (run again to train)"));
      return kExitRequeue;
    }
  }
  bool stopped = false;
  for (int step = static_cast<int>(st.step); step < tc.steps; ++step) {
    const auto t0 = Clock::now();
    double t_data = 0, t_comm = 0;
    const float lr =
        learning_rate(tc.schedule, tc.lr, tc.min_lr_ratio, tc.warmup_steps, tc.steps, step);
    if (!grads_zero) s.be.zero(ps.grad(), ps.total() * sizeof(float));
    grads_zero = false;

    // Every micro-batch before the first forward: the global target count normalises the loss.
    // t_data counts only a read that was not done ahead (the exposed data wait).
    StepCounts counts{};
    auto tp = Clock::now();
    if (have_next) {
      std::swap(micro, next_micro);
      counts = next_count;
      have_next = false;
    } else {
      counts = read_step(step, static_cast<int64_t>(st.next_batch), micro);
      t_data += seconds_since(tp);
    }
    tp = Clock::now();
    s.comm.allreduce_sum_host(counts.data(), counts.size());
    notes.micro_batches += double(A) * world;
    notes.batch_len_sum += counts[3];
    notes.file_tokens += double(tokens_per_step);
    notes.computed_tokens += counts[1];
    notes.real_tokens += counts[2];
    notes.rows += counts[4];
    notes.examples += counts[5];
    t_comm += seconds_since(tp);
    if (counts[0] <= 0)
      throw Error(cat("step ", step + 1, ": the batch has nothing to learn from (all labels are -100) in '",
                      cfg.data.train, "'"));
    const float dloss = static_cast<float>(1.0 / counts[0]);

    s.be.zero(loss_dev.get(), sizeof(double));
    t_hook = 0;
    for (int a = 0; a < A; ++a) {
      DeviceBatch db = dbuf.upload(micro[a]);
      const uint64_t dseed = derive_seed(seed, step, a, rank);
      const bool last_micro = a + 1 == A;  // only the summed gradients are reduced
      if (graph) {
        if (last_micro) reducer.begin();
        graph->run([&] {
          s.model.forward_into(db, /*training=*/true, dseed, loss_dev.get());
          s.model.backward(db, dloss, /*training=*/true, dseed);
        });
        continue;
      }
      s.model.forward_into(db, /*training=*/true, dseed, loss_dev.get());
      if (last_micro) {
        reducer.begin();
        s.model.set_grad_ready_hook(hook);
      }
      s.model.backward(db, dloss, /*training=*/true, dseed);
      if (last_micro) s.model.set_grad_ready_hook(nullptr);
    }
    t_comm += t_hook;
    if (cfg.debug.step_sleep_ms > 0)  // debug.step_sleep_ms: a long step
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg.debug.step_sleep_ms));
    if (step + 1 < tc.steps) {  // read ahead while the GPU works
      next_count = read_step(step + 1, static_cast<int64_t>(st.next_batch) + A, next_micro);
      have_next = true;
    }
    s.be.synchronize();
    tp = Clock::now();
    reducer.finish();
    // NLPTRAIN_COMM_TRACE=1 (bench/overlap.sh): per rank and step, the bucket starts and the final wait
    static const bool trace = std::getenv("NLPTRAIN_COMM_TRACE") != nullptr;
    if (trace)
      std::fprintf(stderr, "[trace rank %d] step %d: hooks %.1f ms, finish %.1f ms, at %.3f\n", rank, step + 1,
                   t_hook * 1e3, seconds_since(tp) * 1e3,
                   std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
    if (listed(inject_nonfinite, step + 1)) {  // debug.inject_nonfinite_step, on every rank
      const float nan = std::numeric_limits<float>::quiet_NaN();
      s.be.to_device(ps.grad(), &nan, sizeof nan);
    }
    t_comm += seconds_since(tp);
    // The loss, and with train.zero = 1 the squared norm of this rank's shard (the gradient is summed
    // only there), summed over ranks in one host call: the global norm for clipping.
    double loss_sum = 0;
    s.be.to_host(&loss_sum, loss_dev.get(), sizeof loss_sum);
    double host_sums[2] = {loss_sum, zero ? s.be.sumsq(ps.grad() + opt.lo(), opt.hi() - opt.lo()) : 0.0};
    tp = Clock::now();
    s.comm.allreduce_sum_host(host_sums, 2);
    s.be.synchronize();
    t_comm += seconds_since(tp);
    const double loss = host_sums[0] / counts[0];
    const double norm = std::sqrt(zero ? host_sums[1] : s.be.sumsq(ps.grad(), ps.total()));
    // Every rank holds the same loss and norm (summed), so every rank decides the same.
    const bool finite = std::isfinite(loss) && std::isfinite(norm);
    if (!finite && !skip_nonfinite)
      throw Error(cat("step ", step + 1, ": loss or gradient norm is not finite (loss ", loss,
                      ", grad norm ", norm, "); lower train.lr or raise train.warmup_steps, or set "
                      "train.nonfinite = skip to drop such steps"));
    if (finite) {
      // torch.nn.utils.clip_grad_norm_: scale by clip/(norm + 1e-6) when the norm exceeds clip.
      const float grad_scale =
          (tc.clip > 0 && norm > tc.clip) ? static_cast<float>(tc.clip / (norm + 1e-6)) : 1.f;
      // AdamW's bias correction counts the updates applied, not the steps taken.
      opt.step(lr, grad_scale, static_cast<int>(st.optimizer_steps + 1), /*zero_grad=*/!zero);
      grads_zero = !zero;
      if (zero) {  // every rank updated its shard: gather the whole parameter arena everywhere
        tp = Clock::now();
        s.comm.all_gather(ps.data(), shards);
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

    st.step = step + 1;
    st.next_batch += A;
    const double dt = seconds_since(t0);
    train_seconds += dt;
    ++steps_done_here;
    if (steps_done_here > 1) times.add(dt, t_data, t_comm, counts[1], counts[2]);
    if (steps_done_here == 1 && cfg.run.profile) s.be.set_profiling(true);  // after one-time set-up
    const double tok_s = counts[1] / dt, real_s = counts[2] / dt;  // positions computed; real tokens
    if (st.step % cfg.run.log_interval == 0 || st.step == tc.steps || st.step == 1 || !finite) {
      const double elapsed = seconds_since(t_start);
      const double eta = train_seconds / steps_done_here * (tc.steps - st.step);
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "step %6lld/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s (%.0f real, "
                    "len %.0f) | %.3f s/step | elapsed %s | eta %s",
                    static_cast<long long>(st.step), tc.steps, loss, lr, norm, tok_s, real_s,
                    counts[3] / (double(A) * world), dt,
                    format_duration(elapsed).c_str(), format_duration(eta).c_str());
      std::string line = buf;
      if (pack) {  // examples per computed row this step
        char ex[96];
        std::snprintf(ex, sizeof ex, " | %.0f examples, %.1f ex/row", counts[5],
                      counts[4] > 0 ? counts[5] / counts[4] : 0.0);
        line += ex;
      }
      if (!finite)
        line += cat(" | non-finite: update skipped (", st.nonfinite_streak, " in a row, ",
                    st.nonfinite_skipped, " skipped in total)");
      else if (st.nonfinite_skipped > 0)
        line += cat(" | skipped ", st.nonfinite_skipped);
      s.log.info(line);
    }
    Json rec;
    rec.integer("step", st.step).exact("loss", loss).num("lr", lr).num("grad_norm", norm)
        .num("tokens_per_s", tok_s).num("computed_tokens_per_s", tok_s).num("real_tokens_per_s", real_s)
        .num("step_time_s", dt);
    if (pack) rec.integer("examples", static_cast<int64_t>(counts[5]));
    if (!finite) rec.boolean("skipped", true);
    if (st.nonfinite_skipped > 0) rec.integer("nonfinite_skipped", st.nonfinite_skipped);
    s.log.metrics(rec.done());
    if (cfg.debug.kill_at_step > 0 && st.step == cfg.debug.kill_at_step && rank == 0)
      std::raise(SIGKILL);  // debug.kill_at_step: a crash after this step's metrics
    if (st.nonfinite_streak >= tc.nonfinite_max)
      throw Error(cat("step ", st.step, ": ", st.nonfinite_streak,
                      " consecutive steps had a non-finite loss or gradient norm and were skipped "
                      "(train.nonfinite_max = ", tc.nonfinite_max, "; last: loss ", loss, ", grad norm ",
                      norm, ", ", st.nonfinite_skipped, " skipped in total); lower train.lr or raise "
                      "train.warmup_steps"));

    const bool last = st.step == tc.steps;
    if (eval && ((cfg.eval.interval > 0 && st.step % cfg.eval.interval == 0) || last)) {
      EvalResult r = evaluate(s, *eval, cfg.eval.batches);
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
      const std::string path = checkpoint_now(s, opt, shards, st, ckpt_dir_id);
      s.log.info(cat("checkpoint: ", path));
      checkpointed = true;
    }
    if (tc.sample_interval > 0 && (st.step % tc.sample_interval == 0 || last))
      log_sample(s, static_cast<int>(st.step));

    // A stop signal on any rank stops every rank at the same step boundary.
    double sig[1] = {static_cast<double>(stop_check(st.step + 1))};
    s.comm.allreduce_sum_host(sig, 1);
    if (sig[0] > 0 && !last) {
      stopped = true;
      const std::string path = checkpointed ? latest_checkpoint(cfg.output.dir) : checkpoint_now(s, opt, shards, st, ckpt_dir_id);
      s.log.info(cat("stop signal received: checkpoint '", path, "' written at step ", st.step,
                     "; exiting with code ", kExitRequeue, " (requeue and run again with train.resume = true)"));
      break;
    }
  }
  if (stopped) {
    // no "done" line: the run is not done
  } else if (steps_done_here > 0) {
    // The throughput summary.json reports (summary.h throughput), in its words.
    const Throughput tp = throughput(times, tokens_per_step);
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
                  steps_done_here, format_duration(train_seconds).c_str(), rates,
                  100.0 * notes.padding_fraction(), 100.0 * notes.padding_fraction_untrimmed());
    if (pack && notes.rows > 0)
      s.log.info(cat("data: packing held ", std::lround(100 * notes.examples / notes.rows) / 100.0,
                     " examples per row and ", std::lround(100 * notes.examples / steps_done_here) / 100.0,
                     " per step on average (", int64_t(notes.examples), " examples in ", int64_t(notes.rows),
                     " rows)"));
    s.log.info(st.nonfinite_skipped > 0
                   ? cat(buf, "; ", st.nonfinite_skipped, " step(s) skipped for a non-finite gradient")
                   : std::string(buf));
  } else {
    s.log.info(cat("nothing to do: already at step ", st.step, " of train.steps = ", tc.steps));
  }
  if (cfg.run.profile) {
    // the account (app/main.cpp puts it between the model and the backend), over the timed steps
    auto* acct = dynamic_cast<AccountBackend*>(graph ? &graph->inner() : &s.be);
    const std::string rep = acct ? acct->report(times.steps, times.steps > 0 ? 1e3 * times.total / times.steps : 0,
                                                &notes.profile_json)
                                 : s.be.profile_report();
    s.log.info(rep.empty() ? cat("run.profile: the ", s.be.name(), " backend has no per-op profile")
                           : rep);
  }
  if (graph) {
    const StepGraph::Stats& g = graph->stats();
    std::string why, why_json;
    for (const auto& [reason, n] : g.eager_why) {
      why += cat(why.empty() ? "" : "; ", reason, ": ", n);
      why_json += cat(why_json.empty() ? "" : ", ", json_string(reason), ": ", n);
    }
    s.log.info(cat("run.cuda_graph: of this rank's training micro-batches, ", g.replayed, " replayed a recording, ",
                   g.recorded, " were recorded, ", g.eager, " ran eagerly", why.empty() ? "" : cat(" (", why, ")"),
                   g.failed > 0 ? cat("; ", g.failed, " recording(s) failed") : std::string(),
                   g.dropped > 0 ? cat("; ", g.dropped, " recording(s) dropped after a buffer grew") : std::string(),
                   g.checks > 0 ? cat("; checking a micro-batch's calls took ",
                                      std::lround(1e6 * g.check_seconds / double(g.checks)), " us on the host")
                                : std::string()));
    notes.cuda_graph_json = cat("{\"replayed\": ", g.replayed, ", \"recorded\": ", g.recorded, ", \"eager\": ",
                                g.eager, ", \"failed_recordings\": ", g.failed, ", \"dropped_recordings\": ", g.dropped,
                                ", \"check_us\": ", g.checks > 0 ? 1e6 * g.check_seconds / double(g.checks) : 0.0,
                                ", \"eager_reasons\": {", why_json,
                                "}}");
  }
  notes.nonfinite_skipped = st.nonfinite_skipped;
  write_summary(s, times, tokens_per_step, T, st.step == tc.steps, notes);
  return st.step == tc.steps ? 0 : kExitRequeue;
}

}  // namespace nlp
