// The checks across keys: the keys of the other model type, run.task and run.mode against
// model.type (check_model_type), and every other combination (check_cross_keys), on the final
// values, each message naming where every value came from.
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>

#include "config/config.h"
#include "config/config_schema.h"
#include "config/config_stages.h"
#include "config/config_values.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace nlp {
namespace {

using namespace cfg;

// A key set explicitly that the model type does not use is an error (a GPT-2 key given to BERT
// would otherwise be silently ignored), naming BERT's or GPT-2's name for it.
void check_model_type_keys(const Config& c, const std::string& type_where) {
  static const std::map<std::string, std::string> twin = {
      {"model.n_layer", "model.num_hidden_layers"},       {"model.n_head", "model.num_attention_heads"},
      {"model.n_embd", "model.hidden_size"},               {"model.n_positions", "model.max_position_embeddings"},
      {"model.layer_norm_epsilon", "model.layer_norm_eps"}, {"model.resid_pdrop", "model.hidden_dropout_prob"},
      {"model.embd_pdrop", "model.hidden_dropout_prob"},   {"model.attn_pdrop", "model.attention_probs_dropout_prob"}};
  for (const auto& e : schema()) {
    if (!c.is_set(e.name)) continue;
    const std::string owner = key_model_type(e.name);
    if (key_applies(owner, c.model.type)) continue;
    std::string other;
    for (const auto& [g, b] : twin) {
      if (g == e.name) other = b;
      if (b == e.name) other = g;
    }
    throw Error(cat(e.name, " = ", value_text(e, c), " (", c.where(e.name), ") applies only to model.type = ",
                    owner, ", but model.type = ", c.model.type, " (", type_where, ")",
                    other.empty() ? std::string() : cat("; its ", c.model.type, " key is ", other)));
  }
}

}  // namespace

bool model_type_from_weights(const Config& c) {
  return !c.is_set("model.type") && !c.preset_keys.count("model.type") && !c.model.weights.empty();
}

void check_model_type(const Config& c, const std::string& type_where) {
  const std::string where = type_where.empty() ? c.where("model.type") : type_where;
  check_model_type_keys(c, where);
  const std::string& type = c.model.type;
  const bool causal_task = c.run.task == "clm";
  if (type == "gpt2" && !causal_task)
    throw Error(cat("run.task = ", c.run.task, " (", c.where("run.task"),
                    ") needs model.type = bert, roberta or electra; model.type = gpt2 (", where,
                    ") trains run.task = clm"));
  if (c.model.is_encoder() && causal_task)
    throw Error(cat("run.task = clm (", c.where("run.task"), ") needs model.type = gpt2; with model.type = ", type,
                    " (", where, ") use mlm, doc_cls, pair_cls, ner or qa"));
  if (type == "electra" && c.run.task == "mlm")
    throw Error(cat("run.task = mlm (", c.where("run.task"), ") is not an objective of model.type = electra (",
                    where, "): nlptrain runs ELECTRA's discriminator, which is fine-tuned on doc_cls, "
                    "pair_cls, ner or qa (pre-train a small encoder with model.type = bert or roberta)"));
  if (c.mode() == RunMode::Generate && type != "gpt2")
    throw Error(cat("run.mode = generate (", c.where("run.mode"), ") needs model.type = gpt2"));
}

// ---- cross-key checks: run on the final values; each names where every value came from ----------

namespace cfg {
namespace {

// Where a key's final value came from: "config file 'x.ini', line 4", "command line",
// "model.preset = P" or "default".
struct From {
  const Origins& origins;
  std::string operator()(const std::string& name) const {
    const auto it = origins.find(name);
    return it != origins.end() ? it->second.where : "default";
  }
};

// The model's shape keys against each other.
void check_model_shape(const Config& c, const From& from) {
  if (c.model.n_embd % c.model.n_head != 0)
    throw Error(cat("model.n_embd = ", c.model.n_embd, " (", from("model.n_embd"),
                    ") must be divisible by model.n_head = ", c.model.n_head, " (",
                    from("model.n_head"), ")"));
  if (c.model.hidden_size % c.model.num_attention_heads != 0)
    throw Error(cat("model.hidden_size = ", c.model.hidden_size, " (", from("model.hidden_size"),
                    ") must be divisible by model.num_attention_heads = ",
                    c.model.num_attention_heads, " (", from("model.num_attention_heads"), ")"));
  if (c.model.is_encoder() && c.model.weights.empty() && c.model.pad_token_id >= c.model.vocab_size)
    throw Error(cat("model.pad_token_id = ", c.model.pad_token_id, " (", from("model.pad_token_id"),
                    ") must be below model.vocab_size = ", c.model.vocab_size, " (",
                    from("model.vocab_size"), ")"));
}

// data.packing and its keys.
void check_packing(const Config& c, const From& from) {
  if (c.data.pack_fixed_examples && !(c.data.packing && c.pack_batch() == PackBatch::Rows))
    throw Error(cat("data.pack_fixed_examples = true (", from("data.pack_fixed_examples"),
                    ") pads the examples of packed rows; it needs data.packing = true (now ",
                    c.data.packing ? "true" : "false", ", ", from("data.packing"),
                    ") and data.pack_batch = rows (now ", c.data.pack_batch, ", ", from("data.pack_batch"), ")"));
  if (c.data.packing && c.run.task == "clm")
    throw Error(cat("data.packing = true (", from("data.packing"), ") packs the bert tasks' short examples; "
                    "run.task = clm (", from("run.task"), ") rows are full windows, with nothing to pack"));
}

// train.zero and run.cuda_graph against the backend and each other.
void check_zero_and_graph(const Config& c, const From& from) {
  if (c.train.zero >= 2 && c.run.cuda_graph)
    throw Error(cat("train.zero = ", c.train.zero, " (", from("train.zero"), ") reduces each block's gradients during the "
                    "backward; run.cuda_graph = true (", from("run.cuda_graph"), ") records a micro-batch without "
                    "communication: use train.zero = 1 with it"));
  if (!c.run.cuda_graph) return;
  // NLPTRAIN_STEP_GRAPH_EMULATE=1: the CPU backend emulates the recording (tests of the trainer's
  // graph path; no gain in speed)
  const char* emulate = std::getenv("NLPTRAIN_STEP_GRAPH_EMULATE");
  if (!c.on_cuda() && !(emulate && std::string(emulate) == "1"))
    throw Error(cat("run.cuda_graph = true (", from("run.cuda_graph"), ") needs run.backend = cuda (now ",
                    c.run.backend, ", ", from("run.backend"), ")"));
  for (const auto& [key, on] : {std::pair<const char*, bool>{"run.profile", c.run.profile},
                                {"run.sync_check", c.run.sync_check}})
    if (on)
      throw Error(cat("run.cuda_graph = true (", from("run.cuda_graph"), ") cannot be combined with ", key,
                      " = true (", from(key), "), which needs every op launched on its own"));
}

// The generate.* keys: the gpt2 tokenizer's files, generate.prompt or generate.prompts_file, the ids
// tokenizer's prompts.
void check_generation(const Config& c, const From& from) {
  if (c.tokenizer() == PromptTokenizer::Gpt2 && c.generate.vocab_dir.empty()) {
    if (c.model.weights.empty())
      throw Error(cat("generate.tokenizer = gpt2 (", from("generate.tokenizer"),
                      ") requires generate.vocab_dir (folder with encoder.json and vocab.bpe, or "
                      "vocab.json and merges.txt), or model.weights in a folder that holds them"));
    const std::string dir = gpt2_vocab_dir(c);
    const Gpt2VocabFiles f = find_gpt2_vocab_files(dir);
    if (!f.complete())
      throw Error(cat("generate.tokenizer = gpt2 (", from("generate.tokenizer"),
                      ") without generate.vocab_dir: the folder of model.weights '", c.model.weights,
                      "' (", from("model.weights"), "), '", dir, "', has no ",
                      f.vocab.empty() ? "vocab.json (or encoder.json)" : "merges.txt (or vocab.bpe)",
                      "; set generate.vocab_dir"));
  }
  if (!c.generate.prompts_file.empty()) {
    // A prompt set to its default does not conflict: Config::to_ini() writes every key, so the
    // config.ini of a prompts_file run has both and must parse again.
    // An empty prompt (--generate.prompt=) clears an INI's prompt.
    if (c.is_set("generate.prompt") && !c.generate.prompt.empty() && c.generate.prompt != GenerateConfig{}.prompt)
      throw Error(cat("generate.prompt (", from("generate.prompt"), ") and generate.prompts_file = '",
                      c.generate.prompts_file, "' (", from("generate.prompts_file"),
                      ") are both set; give one of them"));
    std::error_code ec;
    if (c.mode() == RunMode::Generate && !std::filesystem::is_regular_file(c.generate.prompts_file, ec))
      throw Error(cat("generate.prompts_file = '", c.generate.prompts_file, "' (",
                      from("generate.prompts_file"), "): file not found"));
  }
  if (c.tokenizer() == PromptTokenizer::Ids && c.train.sample_interval > 0)
    throw Error(cat("train.sample_interval = ", c.train.sample_interval, " (", from("train.sample_interval"),
                    ") samples from generate.prompt, which generate.tokenizer = ids (",
                    from("generate.tokenizer"), ") cannot encode; use byte or gpt2, or run.mode = generate"));
  if (c.tokenizer() == PromptTokenizer::Ids && c.mode() == RunMode::Generate && c.generate.prompts_file.empty())
    throw Error(cat("generate.tokenizer = ids (", from("generate.tokenizer"),
                    ") takes its prompts from generate.prompts_file (lines with \"prompt_ids\", written by "
                    "tools/encode_prompts.py); set generate.prompts_file"));
}

// The length of training and its learning-rate schedule.
void check_schedule(const Config& c, const From& from) {
  if (c.train.schedule_steps > 0 && c.train.schedule_steps <= c.train.warmup_steps && c.train.schedule != "constant")
    throw Error(cat("train.schedule_steps = ", c.train.schedule_steps, " (", from("train.schedule_steps"),
                    ") must exceed train.warmup_steps = ", c.train.warmup_steps, " (", from("train.warmup_steps"),
                    "): the ", c.train.schedule, " decay would never start"));
  if (c.train.epochs > 0 && c.is_set("train.steps"))
    throw Error(cat("train.epochs = ", c.train.epochs, " (", from("train.epochs"), ") and train.steps = ",
                    c.train.steps, " (", from("train.steps"), ") are both set; give one of them"));
}

// run.mode against run.task and the datasets it reads.
void check_mode_inputs(const Config& c, const From& from) {
  if (c.mode() == RunMode::Predict && c.data.eval.empty())
    throw Error(cat("run.mode = predict (", from("run.mode"),
                    ") requires data.eval (the examples to predict); set it with --data.eval=PATH"));
  if (c.mode() == RunMode::Predict && (c.run.task == "clm" || c.run.task == "mlm"))
    throw Error(cat("run.mode = predict (", from("run.mode"), ") writes the predictions of run.task = doc_cls, "
                    "pair_cls, ner or qa, not run.task = ", c.run.task, " (", from("run.task"),
                    "): use run.mode = eval for its loss", c.run.task == "clm" ? ", run.mode = generate for text" : ""));
  if (c.reads_train() && c.data.train.empty())
    throw Error(cat("run.mode = ", c.run.mode, " (", from("run.mode"),
                    ") requires data.train (an HDF5 dataset); set it in the INI file or with "
                    "--data.train=PATH (see --help)"));
  if (c.mode() == RunMode::Eval && c.data.eval.empty())
    throw Error(cat("run.mode = eval (", from("run.mode"),
                    ") requires data.eval (an HDF5 dataset); set it in the INI file or with "
                    "--data.eval=PATH (see --help)"));
}

}  // namespace

void check_cross_keys(const Config& c, const Origins& origins) {
  const From from{origins};
  check_model_shape(c, from);
  check_packing(c, from);
  check_zero_and_graph(c, from);
  check_generation(c, from);
  check_schedule(c, from);
  check_mode_inputs(c, from);
}

}  // namespace cfg

}  // namespace nlp
