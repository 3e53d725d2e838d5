// Evaluation and prediction: loss and task metrics over a dataset, sharded across ranks (rank r takes
// examples r, r+world, ...; every example is seen once, none dropped), and the predictions files.
// With data.padding = longest each rank runs its examples longest first (eval.sort_by_length), so
// that a batch trims to about its rows' own length.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "comm/agree.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/packed_sampler.h"
#include "text/json_min.h"
#include "train/batches.h"
#include "train/session.h"
#include "train/task_eval.h"

namespace nlp {

namespace {

// 2-D files carry their own T (data.seq_len, when set, must match it); a 1-D token stream is cut
// into windows of data.seq_len, by default min(n_positions, 1024).
int dataset_seq_len(const Config& cfg, const ModelConfig& mc, const std::string& path) {
  const int positions = mc.max_sequence_length();
  int seq_len = cfg.data.seq_len;
  if (seq_len == 0 && h5::File::open_read(path).has("tokens")) seq_len = std::min(positions, 1024);
  return seq_len;
}

// eval.sort_by_length applies: batches trim (data.padding = longest), and the task keeps its results
// per example. mlm's evaluation masks are seeded per batch and clm's windows all have the file's
// length: both keep the file's order.
bool sorts_by_length(const Config& cfg, Task task) {
  return cfg.eval.sort_by_length && cfg.padding() == Padding::Longest && task != Task::Mlm && task != Task::Clm;
}

// `idx` ordered by length, longest first; equal lengths keep their order (the file's).
void sort_longest_first(std::vector<int64_t>& idx, const std::vector<int32_t>& lengths) {
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return lengths[size_t(a)] > lengths[size_t(b)]; });
}

}  // namespace

int64_t count_examples(const Config& cfg, const ModelConfig& mc, const std::string& path) {
  if (path.empty()) throw Error("train.epochs needs data.train");
  return TokenDataset(path, dataset_seq_len(cfg, mc, path), mc.vocab_size, DatasetLimits{}).size();
}

int64_t count_packed_steps(const Config& cfg, const ModelConfig& mc, int world) {
  const TokenDataset ds(cfg.data.train, dataset_seq_len(cfg, mc, cfg.data.train), mc.vocab_size, DatasetLimits{});
  const std::vector<int32_t>& lengths = ds.lengths();
  const int B = cfg.train.batch_size, A = cfg.train.grad_accum;
  const Sampler order = train_sampler(cfg, ds.size(), B, A, 0, world, &lengths);
  return PackedSampler(order, lengths, ds.seq_len(), int64_t(world) * B * A, cfg.data.pack_max_per_row)
      .steps_in_epoch(0);
}

TokenDataset open_dataset_header(const Config& cfg, const ModelConfig& mc, Task task, const std::string& path,
                                 const std::string& key) {
  if (path.empty()) throw Error(cat(key, " is empty: a dataset is required for run.mode = ", cfg.run.mode));
  const bool encoder = mc.is_encoder();
  const int positions = mc.max_sequence_length();
  const int seq_len = dataset_seq_len(cfg, mc, path);
  DatasetLimits limits;
  if (has_classifier(task)) {
    limits.label_range = mc.num_labels;
    limits.label_key = cat("model.num_labels = ", mc.num_labels, " (",
                           !mc.weights.empty() ? cat("model.weights '", mc.weights, "' and ", cfg.where("model.num_labels"))
                           : cfg.is_set("model.num_labels") ? cfg.where("model.num_labels")
                                                              : std::string("from the data"),
                           "): set model.num_labels to the number of classes");
  }
  if (encoder) limits.type_vocab = mc.type_vocab_size;
  if (encoder && mc.type_vocab_size == 1)
    limits.type_note = cat(" (model.type = ", mc.type, " with type_vocab_size = 1: every token type must be 0; "
                           "prepare the data with the prep tools, which write zeros for this model)");
  TokenDataset ds(path, seq_len, mc.vocab_size, limits);
  if (ds.seq_len() > positions) {
    // The key to change: data.seq_len for a token stream (it cuts the windows), the rows' length
    // (the prep tool's) for a 2-D file; the model's positions unless model.weights fixes them.
    const std::string pos_key = encoder ? "model.max_position_embeddings" : "model.n_positions";
    const std::string pos_from = mc.weights.empty() ? cfg.where(pos_key) : cat("from model.weights '", mc.weights, "'");
    const std::string fix =
        ds.is_stream() ? cat("set data.seq_len to at most ", positions, " (now ", ds.seq_len(), ", ", cfg.where("data.seq_len"), ")")
                       : cat("make its rows at most ", positions, " tokens long (the prep tool's --max-seq-len, "
                             "make_dataset.py's --seq-len; data.seq_len must equal the rows' length)");
    // roberta's positions start at pad_token_id + 1: its bound is named as the formula it is
    const std::string bound = mc.model_type() == ModelType::Roberta ? cat("the model's ", mc.max_sequence_key()) : pos_key;
    throw Error(cat(key, " = '", path, "': sequence length ", ds.seq_len(), " exceeds ", bound, " = ", positions,
                    " (", pos_from, "): ", fix,
                    mc.weights.empty() ? cat(", or raise ", pos_key, " to ",
                                             mc.model_type() == ModelType::Roberta ? ds.seq_len() + std::max(mc.pad_token_id, 0) + 1
                                                                  : ds.seq_len())
                                       : std::string()));
  }
  // The columns the task needs (predict also takes unlabelled data: the prep tools' --no-labels).
  const bool predict = cfg.mode() == RunMode::Predict && key == "data.eval";
  if (is_seq_cls(task) && !ds.has_seq_labels() && !predict)
    throw Error(cat(key, " = '", path, "': run.task = ", cfg.run.task, " needs 1-D 'labels' [examples]"));
  if (task == Task::Ner && !ds.has_token_labels() && !predict)
    throw Error(cat(key, " = '", path, "': run.task = ner needs 2-D 'labels' [examples, seq_len]"));
  if (task == Task::Qa && !ds.has_positions() && !predict)
    throw Error(cat(key, " = '", path, "': run.task = qa needs 'start_positions' and 'end_positions'"));
  // RoBERTa's position ids count the tokens that are not pad_token_id: the data's padding must be it
  if (mc.model_type() == ModelType::Roberta && ds.file().has_attr("pad_id") && ds.file().attr_int("pad_id") != mc.pad_token_id)
    throw Error(cat(key, " = '", path, "': pad_id = ", ds.file().attr_int("pad_id"), " (its root attribute) but "
                    "the model's pad_token_id = ", mc.pad_token_id, ": roberta's position ids count the tokens "
                    "that are not pad_token_id; prepare the data with the model's own tokenizer"));
  return ds;
}

namespace {

TokenDataset open_and_check(const Session& s, const std::string& path, const std::string& key) {
  TokenDataset ds = open_dataset_header(s.cfg, s.model.config(), s.task, path, key);
  // Reading and checking every value takes seconds on a large file: say so before and after.
  s.log.info(cat(key, ": reading and checking '", path, "' (", ds.size(), " examples of ", ds.seq_len(),
                 " tokens) ..."));
  ds.hold_in_memory(size_t(s.cfg.data.cache_mb) << 20);
  ds.validate(s.comm.rank(), s.comm.size());
  // The label names evaluation reads (TaskEval, at the first evaluation): read them here as well, so
  // that a malformed or damaged id2label attribute stops the run before anything is written to
  // output.dir.
  if (ds.file().has_attr("id2label"))
    (void)text::parse_string_array(ds.file().attr_string("id2label"), path + ":id2label");
  return ds;
}

}  // namespace

TokenDataset open_dataset(const Session& s, const std::string& path, const std::string& key) {
  // Every rank reaches this point together: a bad file (found by one rank in its share of the rows,
  // or by all) is printed once, naming its key, and every rank ends without MPI_Abort.
  std::optional<TokenDataset> ds;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ds.emplace(open_and_check(s, path, key));
  } catch (const std::exception& e) {
    error = e.what();
    if (error.find(key) == std::string::npos) error = cat(key, " = '", path, "': ", error);
  }
  agree_on_error(s.comm, error);
  char took[32];
  std::snprintf(took, sizeof took, "%.1f", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  s.log.info(cat(key, ": ", ds->size(), " examples checked in ", took, " s"));
  return std::move(*ds);
}

void begin_output(Session& s) {
  s.comm.barrier();
  s.log.start();
}

EvalResult evaluate(Session& s, const TokenDataset& ds, int max_batches, bool write_predictions) {
  const Config& cfg = s.cfg;
  const int B = cfg.train.batch_size, rank = s.comm.rank(), world = s.comm.size();
  std::unique_ptr<MlmSpec> mlm;
  if (s.task == Task::Mlm && !ds.has_token_labels())
    mlm = std::make_unique<MlmSpec>(read_mlm_spec(ds, s.model.config().vocab_size));
  TaskEval te(s.task, ds, s.model.config().num_labels, s.model.config().id2label);

  // This rank's examples (eval.batches: the first max_batches x B of them, in the file's order), then
  // longest first where sorts_by_length. TaskEval keeps every result at its example's index, so the
  // order changes no prediction or metric; the loss is the same sum in another order (qa's softmax
  // spans its batch's positions, so its loss moves with the batches' lengths).
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < ds.size(); i += world) mine.push_back(i);
  if (max_batches > 0 && int64_t(mine.size()) > int64_t(max_batches) * B) mine.resize(size_t(max_batches) * B);
  if (sorts_by_length(cfg, s.task)) sort_longest_first(mine, ds.lengths());
  const int64_t nb = (static_cast<int64_t>(mine.size()) + B - 1) / B;

  DeviceBatchBuffer dbuf(s.be, &s.model.config());
  TokenBatch tb;
  const bool trim = cfg.padding() == Padding::Longest;
  s.model.reserve(B, ds.seq_len());  // no re-carving for trimmed or partial batches
  double sums[5] = {0, 0, 0, 0, 0};  // loss sum, loss units, positions computed, real tokens, examples
  for (int64_t g = 0; g < nb; ++g) {
    const int64_t* idx = mine.data() + g * B;
    const int count = static_cast<int>(std::min<int64_t>(B, int64_t(mine.size()) - g * B));
    ds.read(idx, count, tb);
    // Evaluation masking (mlm) is fixed: the same positions are masked at every evaluation.
    HostBatch hb = make_batch(s.task, tb, mlm.get(), derive_seed(cfg.train.seed, 0xE7A1, idx[0]));
    if (trim) trim_to_longest(hb, cfg.data.pad_multiple);
    sums[1] += static_cast<double>(hb.loss_units(s.task));
    sums[2] += static_cast<double>(hb.B) * hb.T;
    sums[3] += static_cast<double>(hb.real_tokens);
    sums[4] += count;
    sums[0] += s.model.forward(dbuf.upload(hb), /*training=*/false, 0);
    te.add(hb, idx, s.model.outputs(), s.be);
  }
  s.comm.allreduce_sum_host(sums, 5);
  EvalResult r;
  r.tokens = static_cast<int64_t>(sums[1]);
  r.positions = sums[2];
  r.real_tokens = sums[3];
  r.examples = static_cast<int64_t>(sums[4]);
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  te.finish(s.comm, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (write_predictions && rank == 0) te.write_predictions(cfg.output.dir);
  return r;
}

std::string format_eval(const EvalResult& r) {
  // No loss terms: unlabelled data (predict with the prep tools' --no-labels), no loss to report.
  std::string line = r.tokens > 0 ? cat("loss ", r.loss) : std::string("no labels: no loss");
  for (const auto& [k, v] : r.metrics) {
    char buf[96];
    if (k == "questions")  // a count, not a rate
      std::snprintf(buf, sizeof buf, " | %s %.0f", k.c_str(), v);
    else
      std::snprintf(buf, sizeof buf, " | %s %.4f", k.c_str(), v);
    line += buf;
  }
  char tail[160];
  std::snprintf(tail, sizeof tail, " | padding %.1f%% of %.0f positions | %.1f s, %.0f examples/s, %.0f real tokens/s",
                100 * r.padding_fraction(), r.positions, r.seconds, r.seconds > 0 ? r.examples / r.seconds : 0.0,
                r.seconds > 0 ? r.real_tokens / r.seconds : 0.0);
  return line + (r.tokens > 0 ? cat(" | ", r.tokens, " loss terms") : std::string()) + tail;
}

void eval_json(Json& j, const EvalResult& r) {
  j.str("split", "eval").exact("loss", r.loss);
  for (const auto& [k, v] : r.metrics) j.num(k, v);
  j.num("padding_fraction", r.padding_fraction());
}

namespace {

void log_eval_result(Session& s, const EvalResult& r, const char* what) {
  s.log.info(cat(what, " | ", format_eval(r)));
  Json j;
  eval_json(j, r);
  j.integer("tokens", r.tokens);
  s.log.metrics(j.done());
}

}  // namespace

void log_eval_order(Session& s) {
  if (sorts_by_length(s.cfg, s.task))
    s.log.info("eval: each rank's examples run longest first (eval.sort_by_length), so that each batch "
               "trims to about its rows' length; results are kept per example");
}

void run_eval(Session& s) {
  TokenDataset ds = open_dataset(s, s.cfg.data.eval, "data.eval");
  begin_output(s);
  log_eval_order(s);
  log_eval_result(s, evaluate(s, ds, s.cfg.eval.batches), "eval");
}

void run_predict(Session& s) {
  TokenDataset ds = open_dataset(s, s.cfg.data.eval, "data.eval");
  begin_output(s);
  log_eval_order(s);
  EvalResult r = evaluate(s, ds, s.cfg.eval.batches, /*write_predictions=*/true);
  log_eval_result(s, r, "predict");
  s.log.info(cat("predict: wrote ", s.cfg.output.dir,
                 s.task == Task::Qa ? "/predictions.json and predictions.jsonl" : "/predictions.jsonl"));
}

}  // namespace nlp
