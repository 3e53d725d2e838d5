// The end of a training run: the closing log lines (done, profile, CUDA graphs) and summary.json.
#include "train/trainer_internal.h"

namespace nlp::trainer {
namespace {

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

}  // namespace

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

}  // namespace nlp::trainer
