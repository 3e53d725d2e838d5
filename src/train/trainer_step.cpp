// One optimizer step: its micro-batches read, forward and backward, the gradient sums, the loss and
// norm, the update; and the step's log line and metrics record.
#include "train/trainer_internal.h"

namespace nlp::trainer {
namespace {

bool listed(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

}  // namespace

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The counts of every rank, summed (one host allreduce).
void StepCounts::sum_over_ranks(Comm& comm) {
  double v[6] = {loss_units, computed, real_tokens, length_sum, rows, examples};
  comm.allreduce_sum_host(v, 6);
  loss_units = v[0];
  computed = v[1];
  real_tokens = v[2];
  length_sum = v[3];
  rows = v[4];
  examples = v[5];
}

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
    c.examples += out[a].B;
    if (o.packed) {
      pack_rows(out[a], o.pack_multiple, &m.row, m.rows, cfg.data.pack_fixed_examples ? cfg.data.pack_max_per_row : 0);
      if (cfg.data.pack_fixed_examples && L.s.task == Task::Ner) score_every_position(out[a]);
    }
    else if (o.pack)
      pack_rows(out[a], o.pack_multiple);
    else if (o.trim)
      trim_to_longest(out[a], cfg.data.pad_multiple);
    c.loss_units += static_cast<double>(out[a].loss_units(L.s.task));
    c.computed += static_cast<double>(out[a].B) * out[a].T;
    c.real_tokens += static_cast<double>(out[a].real_tokens);
    c.length_sum += out[a].T;
    c.rows += out[a].B;
  }
  return c;
}

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
  counts.sum_over_ranks(L.s.comm);
  RunNotes& notes = L.notes;
  notes.micro_batches += double(L.A) * L.world;
  notes.batch_len_sum += counts.length_sum;
  notes.file_tokens += double(L.order.tokens_per_step);
  notes.computed_tokens += counts.computed;
  notes.real_tokens += counts.real_tokens;
  notes.rows += counts.rows;
  notes.examples += counts.examples;
  t_comm += seconds_since(tp);
  if (counts.loss_units <= 0)
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
      gs.begin(/*last=*/a + 1 == L.A);
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
  r.lr = learning_rate(parse_schedule(tc.schedule), tc.lr, tc.min_lr_ratio, tc.warmup_steps,
                       schedule_length(tc.schedule_steps, tc.steps), step);
  if (!L.grads_zero) {
    if (L.optim.grads)
      L.optim.grads->zero_shard();
    else
      s.be.zero(s.model.params().grad(), s.model.params().total() * sizeof(float));
  }
  L.grads_zero = false;

  r.counts = take_step_batches(L, step, t_data, t_comm);
  forward_backward(L, step, static_cast<float>(1.0 / r.counts.loss_units));
  t_comm += L.t_hook;
  finish_gradients(L, step, t_comm);
  loss_and_norm(L, r.counts.loss_units, r, t_comm);
  apply_update(L, r, t_comm);

  L.st.step = step + 1;
  L.st.next_batch += L.A;
  r.dt = seconds_since(t0);
  L.train_seconds += r.dt;
  ++L.steps_done_here;
  if (L.steps_done_here > 1) L.times.add(r.dt, t_data, t_comm, r.counts.computed, r.counts.real_tokens);
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
  const double tok_s = counts.computed / r.dt, real_s = counts.real_tokens / r.dt;  // positions computed; real tokens
  if (st.step % cfg.run.log_interval == 0 || st.step == tc.steps || st.step == 1 || !r.finite) {
    const double elapsed = seconds_since(L.t_start);
    const double eta = L.train_seconds / L.steps_done_here * (tc.steps - st.step);
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "step %6lld/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s (%.0f real, "
                  "len %.0f) | %.3f s/step | elapsed %s | eta %s",
                  static_cast<long long>(st.step), tc.steps, r.loss, r.lr, r.norm, tok_s, real_s,
                  counts.length_sum / (double(L.A) * L.world), r.dt,
                  format_duration(elapsed).c_str(), format_duration(eta).c_str());
    std::string line = buf;
    if (L.order.pack) {  // examples per computed row this step
      char ex[96];
      std::snprintf(ex, sizeof ex, " | %.0f examples, %.1f ex/row", counts.examples,
                    counts.rows > 0 ? counts.examples / counts.rows : 0.0);
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
  if (L.order.pack) rec.integer("examples", static_cast<int64_t>(counts.examples));
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

}  // namespace nlp::trainer
