#include "train/summary.h"

#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "train/log.h"

namespace nlp {
namespace {

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(line.find_first_not_of(' ', p + 1));
    }
  }
  return "unknown CPU";
}

}  // namespace

Throughput throughput(const StepTimes& times, int64_t tokens_per_step) {
  Throughput t;
  t.steps = times.steps;
  if (times.total <= 0) return t;
  t.padded = double(tokens_per_step) * times.steps / times.total;
  t.computed = times.computed_tokens / times.total;
  t.real = times.real_tokens / times.total;
  return t;
}

void write_summary(Session& s, const StepTimes& times, int64_t tokens_per_step, int T,
                   bool completed, const RunNotes& notes) {
  // Nodes: ranks that are local rank 0 of their node.
  double nodes[1] = {s.comm.local_rank() == 0 ? 1.0 : 0.0};
  s.comm.allreduce_sum_host(nodes, 1);
  // Every rank's exposed communication of every kept step: row r holds rank r's (one sum of the
  // [ranks, steps] matrix, each rank filling its row). Every rank timed the same steps.
  const int world = s.comm.size();
  const size_t ns = times.comm_steps.size();
  std::vector<double> comm_all(size_t(world) * ns, 0.0);
  std::copy(times.comm_steps.begin(), times.comm_steps.end(), comm_all.begin() + size_t(s.comm.rank()) * ns);
  if (!comm_all.empty()) s.comm.allreduce_sum_host(comm_all.data(), comm_all.size());
  if (s.comm.rank() != 0) return;
  double comm_max = 0, comm_mean = 0, comm_min_step = 0;
  for (int r = 0; r < world; ++r) {
    double c = 0;
    for (size_t k = 0; k < ns; ++k) c += comm_all[r * ns + k];
    c = ns ? c / ns : 0;
    comm_max = std::max(comm_max, c);
    comm_mean += c / world;
  }
  for (size_t k = 0; k < ns; ++k) {
    double m = comm_all[k];
    for (int r = 1; r < world; ++r) m = std::min(m, comm_all[r * ns + k]);
    comm_min_step += m / ns;
  }

  const ModelConfig& mc = s.model.config();
  const size_t params = s.model.params().total();
  const int n = times.steps;
  const double step_s = n ? times.total / n : 0;
  const double data_s = n ? times.data / n : 0;
  const double comm_s = n ? times.comm / n : 0;
  const Throughput tp = throughput(times, tokens_per_step);
  const double computed_s = tp.computed;
  const double mean_len = notes.micro_batches > 0 ? notes.batch_len_sum / notes.micro_batches : T;
  const double fpt = s.model.flops_per_token(static_cast<int>(std::lround(mean_len)));
  const double achieved = computed_s * fpt;  // FLOP/s over all ranks
  const double peak = double(s.cfg.run.peak_tflops) * 1e12 * s.comm.size();
  const std::string device =
      s.be.name() == "cpu" ? cat("cpu: ", cpu_model_name()) : s.be.name();

  Json j;
  j.integer("world_size", s.comm.size())
      .integer("nodes", static_cast<long long>(nodes[0]))
      .integer("ranks_per_node", s.comm.local_size())
      .str("backend", s.cfg.run.backend)
      .str("device", device)
      .str("model_type", mc.type)
      .str("task", s.cfg.run.task)
      .integer("n_layer", s.model.num_layers())
      .integer("n_embd", s.model.width())
      .integer("parameters", static_cast<long long>(params))
      .integer("batch_size_per_rank", notes.batch_size > 0 ? notes.batch_size : s.cfg.train.batch_size)
      .integer("grad_accum", notes.grad_accum > 0 ? notes.grad_accum : s.cfg.train.grad_accum)
      .integer("global_batch", static_cast<long long>(s.comm.size()) *
                                   (notes.batch_size > 0 ? notes.batch_size : s.cfg.train.batch_size) *
                                   (notes.grad_accum > 0 ? notes.grad_accum : s.cfg.train.grad_accum))
      .integer("seq_len", T)
      .integer("tokens_per_step", tokens_per_step)
      .integer("timed_steps", n)
      .num("step_time_s", step_s)
      .num("compute_s", step_s - data_s - comm_s)
      .num("comm_s", comm_s)
      .num("comm_s_max_rank", comm_max)
      .num("comm_s_mean_rank", comm_mean)
      .num("comm_s_min_step", comm_min_step)
      .boolean("comm_overlap", s.cfg.comm.overlap && s.comm.size() > 1)
      .num("data_s", data_s)
      .num("padded_tokens_per_s", tp.padded)
      .num("computed_tokens_per_s", tp.computed)
      .num("real_tokens_per_s", tp.real)
      .num("tokens_per_s", tp.padded)  // = padded_tokens_per_s, under the name older readers use
      .str("padding", s.cfg.data.padding)
      .integer("pad_multiple", s.cfg.data.pad_multiple)
      .boolean("group_by_length", s.cfg.data.group_by_length)
      .str("group_order", s.cfg.data.group_by_length ? s.cfg.data.group_order : std::string("none"))
      .boolean("packing", s.cfg.data.packing)
      .num("mean_examples_per_row", notes.rows > 0 ? notes.examples / notes.rows : 1.0)
      .num("mean_batch_len", mean_len)
      .num("padding_fraction", notes.padding_fraction())
      .num("padding_fraction_untrimmed", notes.padding_fraction_untrimmed())
      .num("flops_per_token", fpt)
      .num("achieved_tflops", achieved / 1e12);
  j.num("mfu", peak > 0 ? achieved / peak : NAN);  // null when run.peak_tflops is not set
  j.boolean("completed", completed);
  j.str("run_id", s.log.run_id());
  j.raw("memory_plan", s.memory_plan_json.empty() ? "null" : s.memory_plan_json);
  j.integer("peak_rss_bytes", static_cast<long long>(peak_rss_bytes()));  // this rank's (rank 0), getrusage
  j.integer("zero", notes.zero);
  j.integer("optimizer_state_bytes_per_rank", notes.optimizer_bytes);
  j.integer("optimizer_state_bytes_total", notes.optimizer_bytes_total);
  j.str("offload", notes.offload);
  j.integer("gradient_bytes_per_rank", notes.gradient_bytes);
  j.integer("optimizer_host_bytes_per_rank", notes.optimizer_host_bytes);
  j.raw("resumed_from", notes.resumed_from.empty() ? "null" : json_string(notes.resumed_from));
  j.integer("resumed_step", notes.resumed_step);
  j.raw("resume_world", notes.resume_world_json.empty() ? "null" : notes.resume_world_json);
  j.raw("cuda_graph", notes.cuda_graph_json.empty() ? "null" : notes.cuda_graph_json);
  j.raw("profile", notes.profile_json.empty() ? "null" : notes.profile_json);
  if (!notes.gpu_paths_json.empty()) j.raw("gpu_paths", notes.gpu_paths_json);
  std::string damaged = "[";
  for (const auto& [file, reason] : notes.damaged_checkpoints)
    damaged += cat(damaged.size() > 1 ? "," : "", "{\"file\":", json_string(file), ",\"reason\":",
                   json_string(reason), "}");
  j.raw("damaged_checkpoints", damaged + "]");
  j.integer("metrics_dropped", notes.metrics_dropped);
  j.integer("nonfinite_skipped", notes.nonfinite_skipped);
  std::string warnings = "[";
  for (const auto& w : notes.warnings) warnings += cat(warnings.size() > 1 ? "," : "", json_string(w));
  j.raw("warnings", warnings + "]");
  write_text_atomically(s.cfg.output.dir + "/summary.json", j.done() + "\n");
}

}  // namespace nlp
