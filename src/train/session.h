// What every run mode needs: the config, the communicator, the backend, the log, the model.
// app/main.cpp builds a Session and calls one of the run_* functions.
#pragma once
#include <string>

#include "comm/comm.h"
#include "config/config.h"
#include "core/backend.h"
#include "io/dataset.h"
#include "model/model.h"
#include "model/task.h"
#include "train/log.h"

namespace nlp {

struct Session {
  const Config& cfg;
  Task task;
  Comm& comm;
  Backend& be;
  Log& log;
  Model& model;
  // Parameters that did not come from model.weights (initialised: a new task head or pooler);
  // gradients mode writes their values so that a reference can be given the same weights.
  std::vector<std::string> initialised;
  // The memory plan (train/memory_plan.h) as a JSON object, for summary.json; empty = none.
  std::string memory_plan_json;
};

struct EvalResult {
  double loss = 0, perplexity = 0;
  int64_t tokens = 0;  // loss units (target tokens, sequences or questions)
  double positions = 0, real_tokens = 0;  // positions computed (rows x trimmed length), non-padding ones
  int64_t examples = 0;                   // rows evaluated (on every rank together)
  double seconds = 0;                     // wall time of the evaluation on rank 0
  double padding_fraction() const { return positions > 0 ? 1 - real_tokens / positions : 0; }
  std::vector<std::pair<std::string, double>> metrics;  // task metrics: accuracy, f1, exact_match, ...
  std::string primary = "loss";  // the metric that picks the best checkpoint
  double primary_value = 0;
  bool higher_is_better = false;
};

int run_train(Session& s);       // run.mode = train; returns the exit code (0, or kExitRequeue)
void run_eval(Session& s);       // run.mode = eval
void run_generate(Session& s);   // run.mode = generate
void run_gradients(Session& s);  // run.mode = gradients

// Loss and task metrics over the eval set (all ranks take part, each on examples rank, rank+world,
// ...; dropout off). max_batches 0 = all. With write_predictions, rank 0 writes the task's predictions
// to output.dir (predictions.jsonl, or predictions.json for qa).
EvalResult evaluate(Session& s, const TokenDataset& ds, int max_batches, bool write_predictions = false);
void run_predict(Session& s);  // run.mode = predict
std::string format_eval(const EvalResult& r);  // "loss 2.31 | accuracy 0.8123 | ..." for the log
// The fields of an evaluation's metrics.jsonl record: split, loss, the task metrics, padding_fraction.
void eval_json(Json& j, const EvalResult& r);
// One log line saying that evaluation runs longest first, where eval.sort_by_length applies.
void log_eval_order(Session& s);
// Sample text from the prompt with the generate.* settings (call on one rank only).
std::string generate_sample(Session& s, uint64_t seed);
// Before training with train.sample_interval: the samples' tokenizer is the model's (else an error now,
// not at the first sample).
void check_sample_tokenizer(Session& s);

// Opens a dataset for the model (window length data.seq_len or n_positions), checking T fits, and
// validates every value in it: each rank checks its share of the examples (TokenDataset::validate),
// so bad input anywhere in the file stops the run before the first step.
TokenDataset open_dataset(const Session& s, const std::string& path, const std::string& key);
// The checks of open_dataset that read no values (the file's layout, its length against the model's
// positions, the columns the task needs): what --check does with each dataset. Throws an Error naming
// the key (the caller adds "key = 'path': " when missing).
TokenDataset open_dataset_header(const Config& cfg, const ModelConfig& mc, Task task, const std::string& path,
                                 const std::string& key);
// Examples (rows, or windows of a 1-D token stream) of the dataset at path as open_dataset cuts it:
// for train.epochs, before the Session exists.
int64_t count_examples(const Config& cfg, const ModelConfig& mc, const std::string& path);
// With data.pack_batch = rows: the packed steps of data.train's first epoch on `world` ranks
// (PackedSampler; reads every example's length), for train.epochs.
int64_t count_packed_steps(const Config& cfg, const ModelConfig& mc, int world);

// Each mode calls this once its inputs are open and validated, before it writes anything: it waits
// for every rank (a rank that found bad input has stopped the run by then) and starts the log, so a
// run stopped by bad input leaves output.dir as it was.
void begin_output(Session& s);

}  // namespace nlp
