// nlptrain: parse the configuration, bootstrap MPI, build the backend and the model, run the mode.
// The only file that knows every layer. Errors: a message naming the file/key/value on stderr and a
// non-zero exit on every rank: configuration and input-file errors are agreed on by every rank and
// printed once before MPI_Finalize; a later error calls MPI_Abort when more than one rank is
// running, so nothing hangs.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <utility>
#include <vector>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/factory.h"
#include "backend/op_account_backend.h"
#include "backend/step_graph.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/backend.h"
#include "core/cpu_affinity.h"
#include "core/crash_report.h"
#include "core/error.h"
#include "io/h5.h"
#include "model/model.h"
#include "model/task.h"
#include "train/batches.h"
#include "train/input_check.h"
#include "train/log.h"
#include "train/memory_plan.h"
#include "train/run_folder.h"
#include "train/run_lock.h"
#include "train/schedule.h"
#include "train/session.h"
#include "train/signals.h"

#ifndef NLPTRAIN_VERSION
#define NLPTRAIN_VERSION "0.1.0"
#endif

namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// The memory plan of one rank (train/memory_plan.h), from the model's parameter table without its
// arenas. When it exceeds the memory this rank may use (the device's free memory, run.memory_limit_gb)
// on any rank, the lowest such rank reports it with the keys that would make it fit and every rank
// throws ReportedError (comm/agree.h): nothing large has been allocated and nothing written to
// output.dir.
bool check_memory_plan(const nlp::Config& cfg, nlp::Comm& comm, const nlp::ModelConfig& mc,
                       nlp::Backend& be, int T, int device, nlp::MemoryPlan& plan) {
  using namespace nlp;
  const bool recompute = cfg.recompute() == nlp::Recompute::Block;
  auto shell = make_model(mc, be, cfg.run.task, /*allocate=*/false);
  shell->set_recompute(recompute);
  plan = plan_memory(cfg, *shell, T, comm.size());
  std::string avail_what;
  const size_t avail = available_memory(cfg, device, comm.local_size(), &avail_what);
  const double limit = double(cfg.run.memory_limit_gb) * 1e9;
  std::string why;
  if (limit > 0 && double(plan.total()) > limit)
    why = cat("run.memory_limit_gb = ", cfg.run.memory_limit_gb, " (", cat(std::lround(mib(size_t(limit)))), " MiB)");
  else if (avail > 0 && plan.total() > avail)
    why = cat("the ", cat(std::lround(mib(avail))), " MiB available (", avail_what, ")");
  double over = why.empty() ? 0.0 : 1.0;
  comm.allreduce_sum_host(&over, 1);
  if (over == 0.0) return true;
  if (why.empty()) agree_on_error(comm, "");  // another rank reports it (the lowest that does not fit)
  // What would fit: the largest batch size, and the plan with recomputation.
  const double budget = !(limit > 0) ? double(avail) : avail > 0 ? std::min(limit, double(avail)) : limit;
  std::string hints;
  int fit_b = 0;
  const bool generate = cfg.mode() == nlp::RunMode::Generate;  // one sequence at a time: no batch to lower
  for (int b = cfg.train.batch_size - 1; b >= 1 && fit_b == 0 && !generate; --b) {
    Config c2 = cfg;
    c2.train.batch_size = b;
    if (double(plan_memory(c2, *shell, T, comm.size()).total()) <= budget) fit_b = b;
  }
  if (fit_b > 0) {
    const BatchSuggestion sb = suggest_batch(cfg.train.batch_size, cfg.train.grad_accum, fit_b);
    const int64_t now = int64_t(cfg.train.batch_size) * cfg.train.grad_accum;
    hints += cat("train.batch_size = ", sb.batch_size, " with train.grad_accum = ", sb.grad_accum, " fits: ",
                 sb.batch_size, " x ", sb.grad_accum, " = ", sb.product(), " sequences per rank and step (now ",
                 cfg.train.batch_size, " x ", cfg.train.grad_accum, " = ", now, sb.product() == now ? ", the same"
                 : "", "; train.batch_size up to ", fit_b, " fits)");
  } else if (generate)
    hints += "generation holds the weights and one sequence's KV cache: a smaller model, or a node with "
             "more memory";
  else
    hints += "no train.batch_size fits (train.grad_accum does not reduce memory by itself: it only keeps "
             "the global batch when train.batch_size is lowered)";
  if (!recompute && !generate) {
    shell->set_recompute(true);
    const MemoryPlan with = plan_memory(cfg, *shell, T, comm.size());
    hints += cat("; train.recompute = block needs ", cat(std::lround(mib(with.total()))), " MiB (",
                 double(with.total()) <= budget ? "fits" : "does not fit by itself", ")");
    shell->set_recompute(false);
  }
  if (cfg.mode() == nlp::RunMode::Train && cfg.train.zero == 0) {
    Config c2 = cfg;
    c2.train.zero = 1;
    const MemoryPlan with = plan_memory(c2, *shell, T, comm.size());
    hints += comm.size() > 1
                 ? cat("; train.zero = 1 needs ", cat(std::lround(mib(with.total()))), " MiB (AdamW state / ",
                       comm.size(), "; ", double(with.total()) <= budget ? "fits" : "does not fit by itself", ")")
                 : std::string("; train.zero = 1 shards the AdamW state over more ranks (one rank now)");
  }
  if (cfg.mode() == nlp::RunMode::Train) {  // the smallest ZeRO stage / recompute / offload setting that fits
    const std::vector<PlanOption> opts = plan_options(cfg, *shell, T, comm.size());
    const PlanOption* fit = smallest_fitting(opts, budget);
    hints += fit ? cat("; the smallest train.zero / train.recompute / train.offload setting that fits: ", fit->keys(),
                       " (", std::lround(mib(fit->plan.total())), " MiB)")
                 : std::string("; no train.zero / train.recompute / train.offload setting fits by itself");
  }
  char acts_mib[32];
  std::snprintf(acts_mib, sizeof acts_mib, "%.1f", mib(plan.activations));
  const std::string acts = plan.decoder ? cat(plan.activations_label(), " ", acts_mib)
                                        : cat("activations ", acts_mib, " for train.batch_size = ", plan.B, ", T = ",
                                              plan.T, ", train.recompute = ", cfg.train.recompute);
  char head[512];
  std::snprintf(head, sizeof head,
                "the memory plan does not fit: %.0f MiB per rank (weights %.1f, gradients %.1f, AdamW %.1f "
                "(train.zero = %d), %s, workspace %.1f MiB) exceeds ",
                mib(plan.total()), mib(plan.weights), mib(plan.grads), mib(plan.optimizer), cfg.train.zero,
                acts.c_str(), mib(plan.workspace));
  agree_on_error(comm, cat(head, why, "; stopped before allocating. ",
                           generate ? "" : "Keys that make it fit: train.batch_size, train.grad_accum, "
                                           "train.recompute, train.zero: ",
                           hints));
  return false;  // not reached: agree_on_error throws on every rank
}

// --check (train mode): the memory plan per rank on `world` ranks for every train.zero / recompute /
// offload setting (train/memory_plan.h), against run.memory_limit_gb when set. The model's shape is the
// configuration's (no file is read: with model.weights, or data.seq_len = 0 and the length in the data,
// it says so and prints nothing); the activations are sized for the cpu backend's kernels.
void print_check_memory_plan(const nlp::Config& cfg, int world) {
  using namespace nlp;
  if (cfg.mode() != nlp::RunMode::Train) return;
  if (!cfg.model.weights.empty() || cfg.data.seq_len == 0) {
    std::printf("# memory plan: not computed by --check (%s); a run logs it before allocating\n",
                !cfg.model.weights.empty() ? "the model's shape is in model.weights"
                                           : "data.seq_len = 0: the length is in the data file");
    return;
  }
  try {
    ModelConfig mc = cfg.model;
    auto be = make_cpu_backend(1);
    auto shell = make_model(mc, *be, cfg.run.task, /*allocate=*/false);
    shell->set_recompute(cfg.recompute() == nlp::Recompute::Block);
    const std::vector<PlanOption> opts = plan_options(cfg, *shell, cfg.data.seq_len, world);
    const double budget = double(cfg.run.memory_limit_gb) * 1e9;
    std::string table = plan_options_table(opts, budget, world);
    if (cfg.on_cuda()) table += "  (activations as the cpu backend's kernels need them)\n";
    // as INI comments, so that the output stays a valid INI file
    std::istringstream in(table);
    for (std::string line; std::getline(in, line);) std::printf("# %s\n", line.c_str());
  } catch (const Error& e) {
    std::printf("# memory plan: not computed (%s)\n", e.what());
  }
}

// ---- The backend ----------------------------------------------------------------------------------

// What sums the gradients of several ranks: MPI on host buffers, or on the cuda backend (comm.gpu
// resolved) NCCL or the staged communicator.
enum class GradComm { Mpi, Nccl, Staged };
const char* grad_comm_name(GradComm g) {
  return g == GradComm::Nccl ? "nccl" : g == GradComm::Staged ? "staged" : "mpi";
}

// What the backend is built with: threads, precision, attention kernels, and on several ranks what
// sums the gradients (gpu_comm) and the device of this rank.
struct BackendChoice {
  nlp::CpuSet cpus;
  nlp::ThreadPlan tplan;
  nlp::Precision precision;
  nlp::BackendOptions bopts;
  std::string no_cudnn;             // why cuDNN's attention is not in this build
  bool auto_without_cudnn = false;  // model.attention = auto without cuDNN: the native kernels
  bool packed_native = false;       // model.attention = auto with data.packing: the native kernels
  bool cuda = false;
  GradComm gpu_comm = GradComm::Mpi;  // what sums the gradients
  int device = 0;
};

BackendChoice choose_backend(const nlp::Config& cfg, nlp::Comm& comm) {
  using namespace nlp;
  BackendChoice c;
  // CPU threads from the CPUs the launcher gave this rank (core/cpu_affinity.h)
  c.cpus = current_cpu_set();
  c.tplan = plan_threads(cfg.run.threads, comm.local_size(), c.cpus);
  c.precision = cfg.precision();
  BackendOptions& bopts = c.bopts;
  bopts.precision = c.precision;
  bopts.sync_check = cfg.run.sync_check;
  bopts.cpu_gemm = cfg.cpu_gemm();
  bopts.cpu_bf16 = cfg.cpu_bf16();
  bopts.bf16_weights = cfg.run.bf16_weights;
  bopts.fused_attention = parse_fused_attention(cfg.model.attention, cfg.run.backend, c.precision);
  // auto in a build without cuDNN: the native kernels (logged below); an explicit "cudnn" is an
  // error of make_backend instead
  c.auto_without_cudnn = bopts.fused_attention && cfg.attention() == nlp::AttentionImpl::Auto &&
                         !cuda_fused_attention_available(&c.no_cudnn);
  if (c.auto_without_cudnn) bopts.fused_attention = false;
  // data.packing: auto keeps packed rows on the native kernels; cuDNN's paths for them (ragged
  // sequences, or a block-diagonal bias: attention_cudnn.h) are selected by model.attention = cudnn
  // alone until a GPU run has checked them (CudaOpsCudnn.PackedRowsMatchCpu*)
  c.packed_native = bopts.fused_attention && cfg.data.packing && cfg.attention() == nlp::AttentionImpl::Auto;
  if (c.packed_native) bopts.fused_attention = false;
  // Several ranks on one GPU (comm.gpu = staged, or auto with more local ranks than GPUs) share the
  // devices round-robin; NCCL needs a GPU per rank.
  c.cuda = cfg.on_cuda();
  const int ndev = c.cuda ? cuda_device_count() : 0;
  std::string no_nccl;
  const bool have_nccl = nccl_available(&no_nccl);
  if (c.cuda && comm.size() > 1) {
    const CommGpu asked = cfg.comm_gpu();
    const bool nccl = asked == CommGpu::Nccl ||
                      (asked == CommGpu::Auto && have_nccl && comm.local_size() <= std::max(ndev, 1));
    c.gpu_comm = nccl ? GradComm::Nccl : GradComm::Staged;
    if (nccl && !have_nccl)
      throw Error(cat("comm.gpu = nccl: nlptrain was built without NCCL (", no_nccl,
                      "); use comm.gpu = staged or auto"));
  } else if (!c.cuda && comm.size() > 1 && cfg.comm_gpu() == nlp::CommGpu::Staged) {
    c.gpu_comm = GradComm::Staged;  // on the CPU backend the staging copies are plain copies (for testing)
  } else if (!c.cuda && cfg.comm_gpu() == nlp::CommGpu::Nccl) {
    throw Error("comm.gpu = nccl needs run.backend = cuda (NCCL sums GPU buffers)");
  }
  c.device = comm.local_rank();
  if (c.cuda && c.gpu_comm == GradComm::Staged && ndev > 0) c.device = comm.local_rank() % ndev;
  return c;
}

// The backend and the communicator the model's gradients are summed with.
struct Devices {
  std::unique_ptr<nlp::Backend> be;
  // Declared after the backend, so destroyed before it: the GPU communicators use the backend.
  std::unique_ptr<nlp::Comm> gpu;
  nlp::Comm* dcomm = nullptr;  // gpu, or the MPI communicator
};

// ---- The model's configuration --------------------------------------------------------------------

// The effective configuration: the model as loaded (shape from model.weights, num_labels resolved)
// and train.steps from train.epochs, with the log lines that say where its values came from.
struct Resolved {
  nlp::Config eff;
  nlp::Task task;
  std::string num_labels_source;
  std::vector<std::string> vocab_warnings;
  std::string epochs_line, warmup;
};

Resolved resolve_config(const nlp::Config& cfg, nlp::Comm& comm, const BackendChoice& c) {
  using namespace nlp;
  ModelConfig mc = resolve_model_config(cfg);
  const Task task = cfg.task();
  std::string num_labels_source;
  if (has_classifier(task)) {
    const NumLabels nl = resolve_num_labels(cfg, mc);
    mc.num_labels = nl.n;
    num_labels_source = nl.source;
    std::string names_source;
    mc.id2label = resolve_label_names(cfg, mc, &names_source);
    if (!mc.id2label.empty()) num_labels_source += cat("; label names from ", names_source);
  }
  std::vector<std::string> vocab_warnings = resolve_tokenizer(cfg, mc);
  // Everything after this point reads the effective configuration.
  Config eff = cfg;
  eff.model = mc;
  if (eff.data.pad_multiple == 0) eff.data.pad_multiple = auto_pad_multiple(c.cuda, c.bopts.fused_attention);
  std::string epochs_line;
  if (cfg.mode() == nlp::RunMode::Train && cfg.train.epochs > 0) {
    const int64_t n = count_examples(cfg, mc, cfg.data.train);
    const int64_t global = int64_t(comm.size()) * cfg.train.batch_size * cfg.train.grad_accum;
    // packed steps (data.pack_batch = rows) hold a varying number of examples: the first epoch's count
    const int64_t packed_steps = packs_by_rows(cfg) ? count_packed_steps(cfg, mc, comm.size()) : 0;
    const double steps = packed_steps > 0 ? std::ceil(double(cfg.train.epochs) * double(packed_steps))
                                          : std::ceil(double(cfg.train.epochs) * double(n) / double(global));
    if (steps > double(std::numeric_limits<int>::max()))
      throw Error(cat("train.epochs = ", cfg.train.epochs, " (", cfg.where("train.epochs"), ") gives ", steps,
                      " steps, more than the ", std::numeric_limits<int>::max(), " that train.steps holds"));
    eff.train.steps = std::max(1, static_cast<int>(steps));
    epochs_line = packed_steps > 0
        ? cat("train.epochs = ", cfg.train.epochs, ": ", n, " examples in data.train make ", packed_steps,
              " packed steps of ", global, " rows in the first epoch (", comm.size(), " ranks x batch_size ",
              cfg.train.batch_size, " x grad_accum ", cfg.train.grad_accum, ", data.pack_batch = rows) -> "
              "train.steps = ", eff.train.steps)
        : cat("train.epochs = ", cfg.train.epochs, ": ", n, " examples in data.train / global batch ",
              global, " (", comm.size(), " ranks x batch_size ", cfg.train.batch_size, " x grad_accum ",
              cfg.train.grad_accum, ") -> train.steps = ", eff.train.steps);
  }
  const std::string warmup =
      cfg.mode() == nlp::RunMode::Train
          ? warmup_warning(cfg.train.schedule, cfg.train.lr, cfg.train.min_lr_ratio, cfg.train.warmup_steps,
                           cfg.where("train.warmup_steps"), eff.train.steps,
                           cfg.train.epochs > 0 ? "from train.epochs" : cfg.where("train.steps"))
          : std::string();
  return Resolved{std::move(eff), task, std::move(num_labels_source), std::move(vocab_warnings),
                  std::move(epochs_line), warmup};
}

// The name of the effective configuration's copy in output.dir, by mode.
const char* config_file_name(nlp::RunMode mode) {
  switch (mode) {
    case nlp::RunMode::Train: return "config.ini";
    case nlp::RunMode::Eval: return "config.eval.ini";
    case nlp::RunMode::Predict: return "config.predict.ini";
    case nlp::RunMode::Generate: return "config.generate.ini";
    case nlp::RunMode::Gradients: break;
  }
  return "config.gradients.ini";
}

// ---- The memory plan ------------------------------------------------------------------------------

// T for the memory plan: data.seq_len, else a 2-D dataset's row length, else the stream default.
int plan_length(const nlp::Config& cfg, const nlp::ModelConfig& mc) {
  const int positions = mc.max_sequence_length();
  int T = cfg.data.seq_len > 0 ? cfg.data.seq_len : std::min(positions, 1024);
  const std::string rows_file = cfg.reads_train() ? cfg.data.train : cfg.reads_eval() ? cfg.data.eval : "";
  if (cfg.data.seq_len == 0 && !rows_file.empty()) {
    nlp::h5::File f = nlp::h5::File::open_read(rows_file);
    if (f.has("input_ids") && f.shape("input_ids").size() == 2) T = static_cast<int>(f.shape("input_ids")[1]);
  }
  return T;
}

// ---- The model ------------------------------------------------------------------------------------

// The model and the backends it calls through, declared in the order they are destroyed in reverse:
// the model first, then the StepGraph, then the account, all before the backend (Devices).
// run.cuda_graph: the model makes its op calls through a StepGraph (backend/step_graph.h), which the
// trainer asks to run each training micro-batch as a replayed recording; every other call passes
// through to the backend.
// run.profile: the per-op account (backend/op_account_backend.h) between them and the backend.
struct ModelStack {
  std::unique_ptr<nlp::AccountBackend> account;
  std::unique_ptr<nlp::StepGraph> graph;
  nlp::Backend* model_be = nullptr;  // what the model calls: the graph, the account or the backend
  std::unique_ptr<nlp::Model> model;
};

ModelStack build_model(const nlp::Config& cfg, const nlp::ModelConfig& mc, nlp::Backend& be,
                       const BackendChoice& c) {
  using namespace nlp;
  ModelStack m;
  if (cfg.run.profile)
    m.account = std::make_unique<AccountBackend>(be, mc.vocab_size, c.precision);
  Backend& base_be = m.account ? static_cast<Backend&>(*m.account) : be;
  if (cfg.run.cuda_graph && cfg.mode() == nlp::RunMode::Train)
    m.graph = std::make_unique<StepGraph>(base_be, /*emulate=*/!c.cuda);  // cpu: NLPTRAIN_STEP_GRAPH_EMULATE (config_checks.cpp)
  m.model_be = m.graph ? static_cast<Backend*>(m.graph.get()) : &base_be;
  // train.zero >= 2 trains without the gradient arena (train/grad_shards.h): never allocated, so that
  // it is never resident beside the weights and what replaces it (the backend zeroes what it
  // allocates: allocated and freed at once, it was beside the parameter arena, the start-up peak of
  // stage 3 on GPT-2 124M, 4 ranks)
  const bool no_grad_arena = cfg.mode() == nlp::RunMode::Train && cfg.train.zero >= 2;
  // train.zero = 3 from scratch: no parameter arena either; each rank initialises only its shard
  // (train/param_shards.h), so no rank ever holds the whole parameters
  const bool no_param_arena = no_grad_arena && cfg.train.zero == 3 && mc.weights.empty();
  m.model = make_model(mc, *m.model_be, cfg.run.task, /*allocate=*/!no_grad_arena);
  if (no_grad_arena) m.model->params().allocate(*m.model_be, /*grads=*/false, /*params=*/!no_param_arena);
  m.model->set_recompute(cfg.recompute() == nlp::Recompute::Block);
  return m;
}

// The run's first log lines: version, mode, ranks, backend, precision, attention, threads; then the
// warnings about the configuration and, with run.verbose, the effective configuration.
void log_run_header(const nlp::Config& cfg, nlp::Comm& comm, nlp::Log& log, nlp::Backend& be,
                    const BackendChoice& c, const Resolved& r) {
  using namespace nlp;
  log.info(cat("nlptrain ", NLPTRAIN_VERSION, " | mode ", cfg.run.mode, " | task ", cfg.run.task,
               " | ", comm.size(), " rank(s) | backend ", be.name(),
               comm.size() > 1 ? cat(" (gradients: ", grad_comm_name(c.gpu_comm),
                                     cfg.train.zero >= 1 ? cat(", ZeRO-", cfg.train.zero) : std::string(),
                                     cfg.comm.overlap ? ", overlapped" : "", ")")
                               : std::string(),
               " | precision ",
               precision_name(c.precision), cfg.run.bf16_activations ? " (activations bf16)" : "",
               " | attention ",
               c.bopts.fused_attention ? "cudnn" : "native", " | ", c.tplan.threads, " thread(s) per rank on ",
               c.cpus.allowed, " CPU(s) (", c.cpus.list, ")"));
  if (const std::string d = be.details(); !d.empty()) log.info(cat("backend ", be.name(), ": ", d));
  if (std::string no_bf16; !cfg.on_cuda() && c.precision == Precision::Bf16 && cfg.cpu_bf16() == nlp::CpuBf16::Auto &&
                           !cpu_auto_native_bf16(&no_bf16))
    log.info(cat("warning: train.precision = bf16 is emulated on this CPU (run.cpu_bf16 = auto, ", no_bf16,
                 "). The GEMMs run in "
                 "fp32 on bf16-rounded operands, slower than fp32: for speed here use train.precision = fp32. "
                 "(run.cpu_bf16 = emulate asks for the emulation, the reference a GPU's bf16 is checked "
                 "against, without this warning.)"));
  if (!cfg.on_cuda())
    for (const std::string& w : c.tplan.warnings) log.info(w);
  if (cfg.attention() == nlp::AttentionImpl::Cudnn && !cfg.on_cuda())
    log.info(cat("model.attention = cudnn is ignored by the ", cfg.run.backend,
                 " backend: it has only the native attention"));
  if (c.auto_without_cudnn) log.info(cat("model.attention = auto: native attention (", c.no_cudnn, ")"));
  if (c.packed_native)
    log.info("model.attention = auto: native attention for data.packing (model.attention = cudnn runs packed "
             "rows through cuDNN, each example a ragged sequence or under a block-diagonal mask bias, "
             "not yet checked on a GPU)");
  for (const std::string& w : r.vocab_warnings) log.info(w);
  if (!r.epochs_line.empty()) log.info(r.epochs_line);
  if (!r.warmup.empty()) log.info(r.warmup);
  if (cfg.run.verbose) {  // always written to config.ini (the log names it once the inputs are checked)
    log.info("effective configuration:");
    log.info(r.eff.to_ini());
  }
}

// The model's weights: initialised, loaded from model.weights, or both (a fine-tuned encoder's new
// head). Returns the parameters initialised because model.weights lacks them.
std::vector<std::string> init_or_load_weights(const nlp::Config& cfg, const nlp::ModelConfig& mc, nlp::Model& model,
                                              nlp::Log& log, const std::string& num_labels_source) {
  using namespace nlp;
  const size_t nparams = model.params().total();
  std::vector<std::string> fresh;  // parameters initialised because model.weights lacks them
  // Initialise unless every parameter will come from the weights file (a fine-tuned encoder's new
  // head keeps this initialisation).
  bool any_new = mc.weights.empty();
  for (const auto& sp : model.params().specs()) any_new = any_new || model.may_be_new(sp.name);
  // A large model takes seconds to initialise and load: say so before, and how long it took after.
  const bool into_shards = model.params().data() == nullptr;
  if (nparams >= size_t(50) * 1000 * 1000 && !into_shards)
    log.info(cat("model: ", any_new ? "initialising" : "", any_new && !mc.weights.empty() ? " and " : "",
                 mc.weights.empty() ? "" : cat("loading '", mc.weights, "'"), " (", nparams, " parameters) ..."));
  const auto t_model = std::chrono::steady_clock::now();
  auto model_seconds = [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_model).count());
    return std::string(b);
  };
  // without a parameter arena (train.zero = 3 from scratch) each rank initialises its shard when the
  // optimizer is set up (train/trainer_internal.h)
  if (any_new && !into_shards) model.init_weights(cfg.train.seed);
  if (!num_labels_source.empty())
    log.info(cat("model: num_labels = ", mc.num_labels, " (", num_labels_source, ")"));
  if (mc.weights.empty() && into_shards) {
    log.info(cat("model: ", mc.type, " to be initialised from scratch (seed ", cfg.train.seed,
                 ") into each rank's parameter shard (train.zero = 3)"));
  } else if (mc.weights.empty()) {
    log.info(cat("model: ", mc.type, " initialised from scratch (seed ", cfg.train.seed, ") in ", model_seconds(), " s"));
  } else {
    std::vector<std::string> unused;
    std::string note;
    std::vector<std::string> reinit;
    load_model_weights(model, mc.weights, &unused, &fresh, &note, mc.reinit_mismatched ? &reinit : nullptr);
    log.info(cat("model: loaded '", mc.weights, "' in ", model_seconds(), " s"));
    if (!note.empty()) log.info(cat("model: ", note));
    for (auto& n : reinit) log.info(cat("model: initialised anew (model.reinit_mismatched): ", n));
    for (auto& n : fresh) log.info(cat("model: new tensor, not in the weights file (initialised): ", n));
    for (auto& n : unused) log.info(cat("model: unused tensor in the weights file: ", n));
  }
  return fresh;
}

// The model's shape and what this mode allocates (the memory plan's figures): every mode holds the
// weights and their gradient arena; only training holds AdamW's m and v (this rank's shard with
// train.zero = 1).
void log_model(const nlp::Config& cfg, const nlp::ModelConfig& mc, nlp::Model& model, nlp::Log& log,
               const nlp::MemoryPlan& plan) {
  const size_t nparams = model.params().total();
  const bool bert = mc.is_encoder();
  const int layers = bert ? mc.num_hidden_layers : mc.n_layer;
  const int heads = bert ? mc.num_attention_heads : mc.n_head;
  const int width = bert ? mc.hidden_size : mc.n_embd;
  char buf[384];
  const bool train_mode = cfg.mode() == nlp::RunMode::Train;
  std::snprintf(buf, sizeof buf,
                "model: %s, %d layers, %d heads, width %d, vocab %d, %zu parameters (%.2fM) | "
                "memory per rank: %s %.1f MiB, %s %.1f MiB",
                mc.type.c_str(), layers, heads, width, mc.vocab_size, nparams, nparams / 1e6,
                train_mode ? "weights+grads+AdamW" : "weights+grads (no AdamW outside training)",
                mib(plan.weights + plan.grads + plan.optimizer), plan.activations_label().c_str(),
                mib(plan.activations));
  log.info(buf);
  log.info(plan.table());
}

// ---- The mode -------------------------------------------------------------------------------------

int run_mode(nlp::Session& s) {
  using namespace nlp;
  switch (s.cfg.mode()) {
    case RunMode::Train: return run_train(s);
    case RunMode::Eval: run_eval(s); break;
    case RunMode::Predict: run_predict(s); break;
    case RunMode::Generate: run_generate(s); break;
    case RunMode::Gradients: run_gradients(s); break;
  }
  return 0;
}

// One run, in its phases; returns the exit code. Each start-up phase is agreed on by every rank
// (comm/agree.h): an error in it, the same on every rank or found by some, is printed once and every
// rank ends through MPI_Finalize (the mode's set-up agrees on its errors too: open_dataset, resume).
// A fresh output.dir that an error ends is left as it was found (RunLock::leave_as_found).
int run(const nlp::Config& cfg, nlp::Comm& comm) {
  using namespace nlp;
  // Before anything is written to output.dir: a second run on the same folder is refused here.
  RunLock lock = agreed(comm, [&] { return RunLock::acquire(comm, cfg.output.dir); });
  try {
    Log log(comm.rank());
    // One training run per folder (train/run_folder.h): refused, or the old run moved aside, here.
    agreed(comm, [&] { claim_run_folder(comm, cfg, log); });
    const bool append = cfg.mode() != nlp::RunMode::Train || cfg.train.resume;
    // Nothing in output.dir is written before the mode calls begin_output() (inputs validated).
    log.open(cfg.output.dir, append, cfg.to_ini());
    for (const std::string& note : cfg.notes) log.info(note);  // command-line keys that replaced the INI's

    // The backend, the gradient communicator, and the effective configuration.
    const BackendChoice choice = agreed(comm, [&] { return choose_backend(cfg, comm); });
    Devices dev;
    dev.be = agreed(comm, [&] {
      return make_backend(cfg.run.backend, choice.tplan.threads, choice.device, choice.bopts);
    });
    // The GPU communicators' set-up is collective itself: an error there ends the job (MPI_Abort)
    if (choice.gpu_comm == GradComm::Staged) dev.gpu = make_staged_comm(comm, *dev.be);
    else if (choice.gpu_comm == GradComm::Nccl) dev.gpu = make_nccl_comm(comm, *dev.be, cfg.comm.timeout_s);
    dev.dcomm = dev.gpu ? dev.gpu.get() : &comm;
    const Resolved r = agreed(comm, [&] { return resolve_config(cfg, comm, choice); });
    const ModelConfig& mc = r.eff.model;
    log.set_config(config_file_name(cfg.mode()), r.eff.to_ini());

    // The memory plan, before the model's arenas exist: stop here when it does not fit.
    MemoryPlan plan;
    const int plan_T = agreed(comm, [&] { return plan_length(cfg, mc); });
    check_memory_plan(cfg, comm, mc, *dev.be, plan_T, choice.device, plan);

    // The model, its weights, and what it holds.
    ModelStack m = agreed(comm, [&] { return build_model(cfg, mc, *dev.be, choice); });
    log_run_header(cfg, comm, log, *dev.be, choice, r);
    std::vector<std::string> fresh =
        agreed(comm, [&] { return init_or_load_weights(cfg, mc, *m.model, log, r.num_labels_source); });
    log_model(cfg, mc, *m.model, log, plan);

    Session s{r.eff, r.task, *dev.dcomm, *m.model_be, log, *m.model, std::move(fresh)};
    s.memory_plan_json = plan.json();
    return run_mode(s);
  } catch (...) {
    lock.leave_as_found();  // a fresh folder an error ends: as it was (removed when the run made it)
    throw;
  }
}

// Lines "key = value" of an effective configuration (Config::to_ini() without its header comment),
// as "section.key" -> value, in order.
std::vector<std::pair<std::string, std::string>> config_lines(const std::string& ini) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(ini);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out.emplace_back(section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

// What a path key's value is compared by across ranks: the size of the regular file it names (a
// node-local copy of the same file has the same size under another path); folders, empty values and
// paths that do not exist yet (output.dir) are not compared.
std::string path_identity(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) return "(not compared)";
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? std::string("(not compared)") : nlp::cat("a file of ", n, " bytes");
}

// Every rank must run with the same configuration. Ranks parse the INI themselves, so a node that
// sees another file under the same path (a stale copy in node-local scratch, a lagging shared file
// system) would train a different model or hang in a collective. Rank 0 broadcasts its effective
// configuration; a rank whose configuration differs reports the first differing key with both
// values. Path keys compare the files they name (nlp::is_path_key, path_identity), since job
// scripts legitimately give each node its own scratch path. Returns false (every rank) when any
// rank differs.
bool same_config_on_all_ranks(const nlp::Config& cfg, int rank, int size) {
  if (size == 1) return true;
  auto canonical = [](std::vector<std::pair<std::string, std::string>> lines) {
    for (auto& [key, value] : lines)
      if (nlp::is_path_key(key)) value = value + " (" + path_identity(value) + ")";
    return lines;
  };
  const auto b = canonical(config_lines(cfg.to_ini()));
  std::string root;
  for (const auto& [key, value] : b) root += key + " = " + value + "\n";
  uint64_t len = root.size();
  MPI_Bcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  root.resize(len);
  MPI_Bcast(root.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::pair<std::string, std::string>> a;
  {
    std::istringstream in(root);
    std::string line;
    while (std::getline(in, line)) {
      const auto eq = line.find(" = ");
      if (eq != std::string::npos) a.emplace_back(line.substr(0, eq), line.substr(eq + 3));
    }
  }
  auto same = [](const std::pair<std::string, std::string>& x, const std::pair<std::string, std::string>& y) {
    if (x.first != y.first) return false;
    if (!nlp::is_path_key(x.first)) return x.second == y.second;
    auto identity = [](const std::string& v) { return v.substr(v.rfind(" (")); };
    return identity(x.second) == identity(y.second);
  };
  size_t first_diff = a.size() == b.size() ? a.size() : std::min(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (!same(a[i], b[i])) {
      first_diff = i;
      break;
    }
  int differs = first_diff < a.size() || a.size() != b.size() ? 1 : 0, any = 0;
  MPI_Allreduce(&differs, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (any == 0) return true;
  const std::string file = cfg.source.empty() ? std::string("command line only")
                                              : "config file '" + cfg.source + "'";
  if (differs) {
    std::string what = "a different set of keys";
    if (first_diff < std::min(a.size(), b.size())) {
      const size_t i = first_diff;
      what = nlp::cat(b[i].first, " = ", b[i].second, " on rank ", rank, " but ", a[i].first, " = ",
                      a[i].second, " on rank 0");
    }
    std::fprintf(stderr,
                 "nlptrain: error [rank %d of %d]: the configuration differs between ranks (%s): %s; "
                 "every rank must read the same INI file and options (does this node see another "
                 "copy of the file?)\n",
                 rank, size, file.c_str(), what.c_str());
  } else if (rank == 0) {
    std::fprintf(stderr,
                 "nlptrain: error [rank 0 of %d]: %d other rank(s) have a configuration different "
                 "from rank 0's (%s); see their messages\n",
                 size, any, file.c_str());
  }
  std::fflush(stderr);
  return false;
}

// Configuration errors: every rank parses; if any rank fails, every rank exits with 2. Rank 0
// reports its error, and another rank reports its own only when it differs from rank 0's (the
// ranks read different files), so identical errors are printed once. Returns false on every rank
// when any rank failed.
bool parse_on_every_rank(int argc, char** argv, int rank, int size, nlp::ParseResult& pr) {
  std::string parse_error;
  int parsed_ok = 1;
  try {
    pr = nlp::parse_config(argc, argv);
  } catch (const std::exception& e) {
    parse_error = e.what();
    parsed_ok = 0;
  }
  int all_ok = parsed_ok;
  if (size > 1) MPI_Allreduce(&parsed_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_ok) return true;
  std::string root_error = parse_error;
  if (size > 1) {
    uint64_t len = root_error.size();
    MPI_Bcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    root_error.resize(len);
    MPI_Bcast(root_error.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  if (rank == 0 && parsed_ok)
    std::fprintf(stderr, "nlptrain: error [rank 0 of %d]: the configuration could not be read on "
                         "other ranks (see their messages); every rank must see the same INI file\n",
                 size);
  else if (!parsed_ok && rank == 0)
    std::fprintf(stderr, "nlptrain: error: %s\n", parse_error.c_str());
  else if (!parsed_ok && parse_error != root_error)
    std::fprintf(stderr, "nlptrain: error [rank %d of %d]: %s\n", rank, size, parse_error.c_str());
  std::fflush(stderr);
  return false;
}

// ---- --check ---------------------------------------------------------------------------------------

// Where a value of the effective configuration comes from, for --check: the INI, the command line, a
// preset or the default (Config::where), the weights file's attributes, or the data.
std::string value_source(const nlp::Config& cfg, const Resolved& r, const std::string& key, bool changed,
                         const nlp::h5::File* weights) {
  using namespace nlp;
  if (key == "model.num_labels" && !r.num_labels_source.empty()) return r.num_labels_source;
  if (key == "train.steps" && !r.epochs_line.empty()) return r.epochs_line;
  if (key.rfind("model.", 0) == 0 && weights && key != "model.weights" && weights->has_attr(key.substr(6)))
    return cfg.is_set(key) ? cat(cfg.where(key), ", the same in the weights '", weights->path(), "'")
                           : cat("the weights '", weights->path(), "'");
  if (changed) return cfg.is_set(key) ? cat(cfg.where(key), ", resolved at start-up") : "resolved at start-up";
  return cfg.where(key);
}

// The effective configuration as the run would write it to config.ini, each value marked with its source.
std::string annotated_config(const nlp::Config& cfg, const Resolved& r) {
  std::unique_ptr<nlp::h5::File> weights;
  if (!r.eff.model.weights.empty())
    weights = std::make_unique<nlp::h5::File>(nlp::h5::File::open_read(r.eff.model.weights));
  std::map<std::string, std::string> given;
  for (const auto& [key, value] : config_lines(cfg.to_ini())) given[key] = value;
  std::ostringstream out;
  std::istringstream in(r.eff.to_ini());
  std::string line, section;
  while (std::getline(in, line)) {
    const auto eq = line.find(" = ");
    if (!line.empty() && line[0] == '[') section = line.substr(1, line.find(']') - 1);
    if (line.empty() || line[0] == '#' || line[0] == '[' || eq == std::string::npos) {
      out << line << "\n";
      continue;
    }
    const std::string key = section + "." + line.substr(0, eq), value = line.substr(eq + 3);
    const auto g = given.find(key);
    out << line << "    # " << value_source(cfg, r, key, g == given.end() || g->second != value, weights.get()) << "\n";
  }
  return out.str();
}

// One line per dataset the mode reads: its layout as the run would cut it (headers only).
std::vector<std::string> check_datasets(const nlp::Config& cfg, const Resolved& r) {
  using namespace nlp;
  std::vector<std::string> lines;
  auto one = [&](const std::string& key, const std::string& path) {
    const TokenDataset ds = open_dataset_header(cfg, r.eff.model, r.task, path, key);
    lines.push_back(cat(key, " = '", path, "': ",
                        ds.is_stream() ? cat("a token stream: ", ds.size(), " windows of ", ds.seq_len(),
                                             " + 1 tokens (data.seq_len = ", ds.seq_len(),
                                             cfg.data.seq_len == 0 ? ", the model's positions up to 1024" : "", ")")
                                       : cat(ds.size(), " rows of ", ds.seq_len(), " tokens",
                                             cfg.data.seq_len == 0 ? " (data.seq_len = 0: the rows' length)" : ""),
                        ds.has_seq_labels() ? ", labels [examples]" : ds.has_token_labels() ? ", labels [examples, T]" : "",
                        ds.has_positions() ? ", start/end positions" : ""));
  };
  if (cfg.reads_train()) one("data.train", cfg.data.train);
  if (cfg.reads_eval() && !cfg.data.eval.empty()) one("data.eval", cfg.data.eval);
  return lines;
}

// --check: the configuration as the run would resolve it, run nothing. Every input file is opened
// (headers and attributes, no tensor or dataset values read): the weights' and datasets' attributes
// give the values the run takes from them, printed with their source; a missing or unreadable file,
// a wrong layout or values that do not fit together are errors, printed once, exit code 1.
int run_check(const nlp::Config& cfg, int rank) {
  using namespace nlp;
  std::unique_ptr<Comm> comm = make_mpi_comm(cfg.comm.timeout_s);
  try {
    agree_on_error(*comm, check_input_files(cfg));
    const BackendChoice choice = agreed(*comm, [&] { return choose_backend(cfg, *comm); });
    const Resolved r = agreed(*comm, [&] { return resolve_config(cfg, *comm, choice); });
    const std::string ini = agreed(*comm, [&] { return annotated_config(cfg, r); });
    const std::vector<std::string> data = agreed(*comm, [&] { return check_datasets(cfg, r); });
    if (rank != 0) return 0;
    std::printf("%s", ini.c_str());
    std::printf("\n# --check: the files were opened (headers and attributes; no tensor or dataset value read):\n");
    if (!cfg.model.weights.empty())
      std::printf("#   model.weights = '%s': model_type %s and the attributes marked above\n",
                  cfg.model.weights.c_str(), r.eff.model.type.c_str());
    for (const auto& l : data) std::printf("#   %s\n", l.c_str());
    for (const auto& w : r.vocab_warnings) std::printf("#   %s\n", w.c_str());
    if (!r.warmup.empty()) std::printf("#   %s\n", r.warmup.c_str());
    std::printf("# not checked without running: the datasets' values (ids, masks, labels in range), the weights' "
                "tensors (names, shapes, finite values), the memory plan against the device's memory, the "
                "devices and GPU communicators, writing output.dir and its lock\n");
    std::fflush(stdout);
  } catch (const ReportedError&) {
    return 1;
  }
  return 0;
}

// The MPI communicator, the input files, then the run; returns the exit code. An error after the
// configuration was read: reported on every rank, or once where the ranks agreed on it, and with
// more than one rank MPI_Abort, so nothing hangs.
int run_with_comm(const nlp::Config& cfg, int rank, int size) {
  std::unique_ptr<nlp::Comm> comm;
  int code = 0;
  try {
    comm = nlp::make_mpi_comm(cfg.comm.timeout_s);
    // The input files, before any other collective work: a problem is printed once (comm/agree.h)
    nlp::agree_on_error(*comm, nlp::check_input_files(cfg));
    code = run(cfg, *comm);
  } catch (const nlp::ReportedError&) {  // printed once already; every rank is here (comm/agree.h)
    return 1;
  } catch (const std::exception& e) {
    if (size > 1) std::fprintf(stderr, "nlptrain: error [rank %d of %d]: %s\n", rank, size, e.what());
    else std::fprintf(stderr, "nlptrain: error: %s\n", e.what());
    std::fflush(stderr);
    nlp::ignore_stop_signals();  // mpirun's SIGTERM after the abort is no stop to report
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // SERIALIZED: the communicator's background thread runs the overlapped gradient sums while the
  // main thread computes (never both inside MPI at once; comm_mpi.cpp).
  int provided = MPI_THREAD_SINGLE;
  nlp::block_stop_signals();
  // Before MPI_Init: a crash inside it is reported too, and Open MPI leaves these signals to it.
  nlp::install_crash_report();
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  // From the start: a SIGUSR1/SIGTERM during set-up stops the run at the first step boundary
  // (with a checkpoint) instead of killing it.
  nlp::install_stop_handlers();
  // A write past RLIMIT_FSIZE (ulimit -f, a quota-like limit) must fail with EFBIG, so that the
  // writer removes its temporary file and reports the path, instead of the process dying of SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  // When mpirun ends a job (Ctrl-C, SIGTERM to it), it closes the ranks' stdout and stderr before
  // their SIGTERM: a log line must then fail with EPIPE, not kill the rank that is writing its
  // checkpoint (log.txt still gets every line).
  std::signal(SIGPIPE, SIG_IGN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  nlp::set_crash_report_rank(rank);
  nlp::set_stop_rank(rank);

  nlp::ParseResult pr;
  if (!parse_on_every_rank(argc, argv, rank, size, pr)) {
    MPI_Finalize();
    return 2;
  }
  if (pr.help || pr.version) {
    if (rank == 0) {
      if (pr.version) std::printf("nlptrain %s (CUDA backend %s)\n", NLPTRAIN_VERSION,
                                  nlp::cuda_compiled() ? "compiled" : "not compiled");
      else std::printf("%s", pr.help_text.c_str());
    }
    MPI_Finalize();
    return 0;
  }
  if (!same_config_on_all_ranks(pr.config, rank, size)) {
    MPI_Finalize();
    return 2;
  }
  if (pr.check) {  // --check: the configuration and its files' headers, run nothing
    const int code = run_check(pr.config, rank);
    if (code == 0 && rank == 0) print_check_memory_plan(pr.config, size);
    MPI_Finalize();
    return code;
  }
  const int code = run_with_comm(pr.config, rank, size);  // the communicator is gone on return
  MPI_Finalize();
  return code;
}
