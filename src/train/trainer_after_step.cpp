// Between the steps of a training run: evaluation (and best.h5), checkpoints, samples, and the stop
// checks (signals and the stop file, also once during start-up).
#include "train/trainer_internal.h"

namespace nlp::trainer {
namespace {

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

std::string stop_file(const Session& s) { return s.cfg.output.dir + "/" + kStopFileName; }

// "stop file 'out/STOP' found by 1 of 2 rank(s) (each looks in its own output.dir) and removed"
std::string stop_file_found(const Session& s, double ranks) {
  return cat("stop file '", stop_file(s), "' found by ", std::lround(ranks), " of ", s.comm.size(),
             " rank(s) (each looks in its own output.dir) and removed");
}

// A checkpoint of the state now; its path, step and write time go to the reports of stop signals.
std::string timed_checkpoint(StepLoop& L) {
  const auto t0 = Clock::now();
  const std::string path = checkpoint_now(L.s, L.optim.opt, L.optim.shards, L.st, L.ckpt_dir_id);
  stop_note_checkpoint(path, L.st.step, seconds_since(t0));
  return path;
}

}  // namespace

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

}  // namespace nlp::trainer
