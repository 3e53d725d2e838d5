// nlptrain: parse the configuration, bootstrap MPI, build the backend and the model, run the mode.
// The only file that knows every layer. Errors: a message naming the file/key/value on stderr and a
// non-zero exit on every rank (MPI_Abort when more than one rank is running, so nothing hangs).
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/backend.h"
#include "core/error.h"
#include "io/h5.h"
#include "model/model.h"
#include "model/task.h"
#include "train/log.h"
#include "train/run_lock.h"
#include "train/session.h"
#include "train/signals.h"

#ifndef NLPTRAIN_VERSION
#define NLPTRAIN_VERSION "0.1.0"
#endif

namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

int run(const nlp::Config& cfg, nlp::Comm& comm) {
  using namespace nlp;
  const int rank = comm.rank();
  // Before anything is written to output.dir: a second run on the same folder is refused here.
  RunLock lock = RunLock::acquire(comm, cfg.output.dir);
  Log log(rank);
  const bool append = cfg.run.mode != "train" || cfg.train.resume;
  log.open(cfg.output.dir, append);

  int threads = cfg.run.threads;
  if (threads <= 0) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, hw / std::max(1, comm.local_size()));
  }
  const Precision precision = parse_precision(cfg.train.precision, cfg.run.backend);
  BackendOptions bopts;
  bopts.precision = precision;
  bopts.sync_check = cfg.run.sync_check;
  bopts.fused_attention = parse_fused_attention(cfg.model.attention, cfg.run.backend, precision);
  // auto in a build without cuDNN: the native kernels (logged below); an explicit "cudnn" is an
  // error of make_backend instead
  std::string no_cudnn;
  const bool auto_without_cudnn = bopts.fused_attention && cfg.model.attention == "auto" &&
                                  !cuda_fused_attention_available(&no_cudnn);
  if (auto_without_cudnn) bopts.fused_attention = false;
  auto be = make_backend(cfg.run.backend, threads, comm.local_rank(), bopts);
  if (cfg.run.backend == "cuda" && comm.size() > 1)
    throw Error(cat("run.backend = cuda with ", comm.size(),
                    " ranks: gradient allreduce on GPU memory needs the NCCL communicator, which is "
                    "not implemented yet (this Open MPI is not CUDA-aware); run one rank, or use "
                    "run.backend = cpu"));

  ModelConfig mc = resolve_model_config(cfg);
  const Task task = parse_task(cfg.run.task);
  if (has_classifier(task) && mc.num_labels == 0) {
    // model.num_labels = 0: take the dataset's num_labels attribute
    const std::string& data = cfg.data.train.empty() ? cfg.data.eval : cfg.data.train;
    h5::File f = h5::File::open_read(data);
    if (!f.has_attr("num_labels"))
      throw Error(cat("model.num_labels = 0 and dataset '", data,
                      "' has no num_labels attribute: set model.num_labels"));
    mc.num_labels = static_cast<int>(f.attr_int("num_labels"));
  }
  auto model = make_model(mc, *be, cfg.run.task);

  log.info(cat("nlptrain ", NLPTRAIN_VERSION, " | mode ", cfg.run.mode, " | task ", cfg.run.task,
               " | ", comm.size(), " rank(s) | backend ", be->name(), " | precision ",
               precision_name(precision), " | attention ",
               bopts.fused_attention ? "cudnn" : "native", " | ", threads, " thread(s) per rank"));
  if (cfg.model.attention == "cudnn" && cfg.run.backend != "cuda")
    log.info(cat("model.attention = cudnn is ignored by the ", cfg.run.backend,
                 " backend: it has only the native attention"));
  if (auto_without_cudnn) log.info(cat("model.attention = auto: native attention (", no_cudnn, ")"));
  log.info("effective configuration (also in " + cfg.output.dir + "/config.ini):");
  log.info(cfg.to_ini());
  if (rank == 0) {
    const std::string tmp = cfg.output.dir + "/config.ini.tmp";
    std::ofstream(tmp) << cfg.to_ini();
    std::filesystem::rename(tmp, cfg.output.dir + "/config.ini");
  }

  const size_t nparams = model->params().total();
  // Initialise unless every parameter will come from the weights file (a fine-tuned encoder's new
  // head keeps this initialisation).
  bool any_new = mc.weights.empty();
  for (const auto& sp : model->params().specs()) any_new = any_new || model->may_be_new(sp.name);
  if (any_new) model->init_weights(cfg.train.seed);
  if (mc.weights.empty()) {
    log.info(cat("model: ", mc.type, " initialised from scratch (seed ", cfg.train.seed, ")"));
  } else {
    std::vector<std::string> unused, fresh;
    load_model_weights(*model, mc.weights, &unused, &fresh);
    log.info(cat("model: loaded '", mc.weights, "'"));
    for (auto& n : fresh) log.info(cat("model: new tensor, not in the weights file (initialised): ", n));
    for (auto& n : unused) log.info(cat("model: unused tensor in the weights file: ", n));
  }
  const bool bert = mc.type == "bert";
  const int layers = bert ? mc.num_hidden_layers : mc.n_layer;
  const int heads = bert ? mc.num_attention_heads : mc.n_head;
  const int width = bert ? mc.hidden_size : mc.n_embd;
  const int positions = bert ? mc.max_position_embeddings : mc.n_positions;
  char buf[320];
  // T for the memory estimate: data.seq_len, else a 2-D dataset's row length, else the stream default.
  int T = cfg.data.seq_len > 0 ? cfg.data.seq_len : std::min(positions, 1024);
  if (cfg.data.seq_len == 0 && !cfg.data.train.empty()) {
    h5::File f = h5::File::open_read(cfg.data.train);
    if (f.has("input_ids") && f.shape("input_ids").size() == 2) T = static_cast<int>(f.shape("input_ids")[1]);
  }
  std::snprintf(buf, sizeof buf,
                "model: %s, %d layers, %d heads, width %d, vocab %d, %zu parameters (%.2fM) | "
                "memory per rank: weights+grads+AdamW %.1f MiB, activations (B=%d, T=%d) %.1f MiB",
                mc.type.c_str(), layers, heads, width, mc.vocab_size, nparams, nparams / 1e6,
                mib(4 * nparams * sizeof(float)), cfg.train.batch_size, T,
                mib(model->activation_bytes(cfg.train.batch_size, T)));
  log.info(buf);

  Session s{cfg, task, comm, *be, log, *model};
  if (cfg.run.mode == "train") return run_train(s);
  else if (cfg.run.mode == "eval") run_eval(s);
  else if (cfg.run.mode == "predict") run_predict(s);
  else if (cfg.run.mode == "generate") run_generate(s);
  else if (cfg.run.mode == "gradients") run_gradients(s);
  else throw Error(cat("run.mode: unknown mode '", cfg.run.mode, "'"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // From the start: a SIGUSR1/SIGTERM during set-up stops the run at the first step boundary
  // (with a checkpoint) instead of killing it.
  nlp::install_stop_handlers();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  // Configuration errors are the same on every rank: rank 0 reports, every rank exits with 2.
  nlp::ParseResult pr;
  try {
    pr = nlp::parse_config(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "nlptrain: error: %s\n", e.what());
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

  std::unique_ptr<nlp::Comm> comm;
  int code = 0;
  try {
    comm = nlp::make_mpi_comm();
    code = run(pr.config, *comm);
  } catch (const std::exception& e) {
    if (size > 1) std::fprintf(stderr, "nlptrain: error [rank %d of %d]: %s\n", rank, size, e.what());
    else std::fprintf(stderr, "nlptrain: error: %s\n", e.what());
    std::fflush(stderr);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    comm.reset();
    MPI_Finalize();
    return 1;
  }
  comm.reset();
  MPI_Finalize();
  return code;
}
