// The schema table, built from config_keys.def (every configuration key once: field, type,
// default, check, help), the lists of allowed choices, and which model type each key belongs to.
#include "config/config_schema.h"

#include <algorithm>

namespace nlp::cfg {

// ---- allowed choices: extend these lists (only) to accept new values ------------------------------
const std::vector<std::string> kModes = {"train", "eval", "predict", "generate", "gradients"};
const std::vector<std::string> kTasks = {"clm", "mlm", "doc_cls", "pair_cls", "ner", "qa"};
const std::vector<std::string> kBackends = {"cpu", "cuda"};
const std::vector<std::string> kModelTypes = {"gpt2", "bert", "roberta", "electra"};
const std::vector<std::string> kSchedules = {"linear", "cosine", "constant"};
const std::vector<std::string> kTokenizers = {"byte", "gpt2", "ids"};
const std::vector<std::string> kPresets = {"", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                                           "bert-base", "bert-large"};
const std::vector<std::string> kPrecisions = {"auto", "fp32", "tf32", "bf16"};
const std::vector<std::string> kCpuGemm = {"auto", "openblas", "onednn"};
const std::vector<std::string> kCpuBf16 = {"auto", "emulate", "native"};
const std::vector<std::string> kAttention = {"auto", "cudnn", "native"};
const std::vector<std::string> kFusedHead = {"auto", "on", "off"};
const std::vector<std::string> kPadVocab = {"auto", "off", "128"};
const std::vector<std::string> kCommGpu = {"auto", "nccl", "staged"};
const std::vector<std::string> kNonfinite = {"stop", "skip"};
const std::vector<std::string> kRecompute = {"none", "block"};
const std::vector<std::string> kOffload = {"none", "optimizer"};
const std::vector<std::string> kPadding = {"longest", "max_length"};
const std::vector<std::string> kGroupOrder = {"longest_first", "shuffled"};
const std::vector<std::string> kPackBatch = {"rows", "examples"};

namespace {

Check none() { return {}; }
Check ge(double lo) { return {lo, std::nullopt, false, false}; }
Check gt(double lo) { return {lo, std::nullopt, true, false}; }
Check closed_open(double lo, double hi) { return {lo, hi, false, true}; }    // [lo, hi)
Check open_closed(double lo, double hi) { return {lo, hi, true, false}; }    // (lo, hi]
Check closed(double lo, double hi) { return {lo, hi, false, false}; }        // [lo, hi]
Check one_of(const std::vector<std::string>& c) {
  Check k;
  k.choices = &c;
  return k;
}
Check nonempty() {
  Check k;
  k.nonempty = true;
  return k;
}
Check step_list() {
  Check k;
  k.step_list = true;
  return k;
}

}  // namespace

// The table: config_keys.def's rows, each the key's name, an accessor of its field (whose type is
// the key's type), its check and help (and escapes).
#define NLP_KEY_ROW(sec, fld, type, value, check, ...) \
  {#sec "." #fld, FieldRef{+[](Config& c) { return &c.sec.fld; }}, check, __VA_ARGS__},
#define RUN_KEY(...) NLP_KEY_ROW(run, __VA_ARGS__)
#define MODEL_KEY(...) NLP_KEY_ROW(model, __VA_ARGS__)
#define DATA_KEY(...) NLP_KEY_ROW(data, __VA_ARGS__)
#define TRAIN_KEY(...) NLP_KEY_ROW(train, __VA_ARGS__)
#define EVAL_KEY(...) NLP_KEY_ROW(eval, __VA_ARGS__)
#define CHECKPOINT_KEY(...) NLP_KEY_ROW(checkpoint, __VA_ARGS__)
#define COMM_KEY(...) NLP_KEY_ROW(comm, __VA_ARGS__)
#define OUTPUT_KEY(...) NLP_KEY_ROW(output, __VA_ARGS__)
#define GENERATE_KEY(...) NLP_KEY_ROW(generate, __VA_ARGS__)
#define DEBUG_KEY(...) NLP_KEY_ROW(debug, __VA_ARGS__)

const std::vector<Entry>& schema() {
  static const std::vector<Entry> table = {
#include "config/config_keys.def"
  };
  return table;
}
#undef NLP_KEY_ROW

const Entry* find_entry(const std::string& name) {
  for (const auto& e : schema())
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const auto& e : schema())
    if (std::find(out.begin(), out.end(), e.section()) == out.end()) out.push_back(e.section());
  return out;
}

// A key set explicitly that the model type does not use is an error (a GPT-2 key given to BERT
// would otherwise be silently ignored), naming BERT's or GPT-2's name for it.
// Keys owned by "bert" serve every encoder on BERT's block (bert, roberta, electra).
bool key_applies(const std::string& owner, const std::string& type) {
  return owner.empty() || owner == type || (owner == "bert" && (type == "roberta" || type == "electra"));
}

}  // namespace nlp::cfg

namespace nlp {

// Both from the key's row (config_keys.def: its check's .only(type) and .path()).
std::string key_model_type(const std::string& key) {
  const cfg::Entry* e = cfg::find_entry(key);
  return e ? e->check.owner : "";
}

bool is_path_key(const std::string& key) {
  const cfg::Entry* e = cfg::find_entry(key);
  return e && e->check.names_path;
}

}  // namespace nlp
