// The checkpoints a training run writes (streamed, with the moments gathered from their shards) and
// train.resume: the checkpoint resumed from, the metrics after it dropped, the batch shape kept.
#include <csignal>
#include "train/trainer_internal.h"

namespace nlp::trainer {
namespace {

bool same_folder(const std::string& dir, const CheckpointDir& d) {
  struct stat sb {};
  return ::stat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_dev == d.dev && sb.st_ino == d.ino;
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

}  // namespace

CheckpointDir identify(const std::string& dir) {
  struct stat sb {};
  CheckpointDir d;
  if (::stat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) d = {true, sb.st_dev, sb.st_ino};
  return d;
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

}  // namespace nlp::trainer
