// The training loop (run.mode = train): data-parallel AdamW with gradient accumulation, clipping by
// global norm, warmup + decay schedule, periodic evaluation, checkpoints, samples, and resume.
//
// Loss normalisation: every rank divides its summed token losses by the GLOBAL number of target
// tokens of the step (all micro-batches, all ranks), and gradients are summed across ranks. N ranks
// with batch B therefore make exactly the update of 1 rank with batch N*B (up to fp32 summation order).
#include "train/trainer_internal.h"

namespace nlp {

// The outline of a training run; each phase is a function of train/trainer_internal.h.
int run_train(Session& s) {
  const TrainConfig& tc = s.cfg.train;
  using namespace trainer;
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
