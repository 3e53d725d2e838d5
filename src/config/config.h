// The run configuration: one typed, validated object built from an INI file plus
// `--section.key=value` command-line overrides. Every key is declared once, as a row of
// config_keys.def (field, type, default, validation, help) that the structs below and the schema
// table in config_schema.cpp are expanded from; nothing else in nlptrain reads INI text.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace nlp {

// Validated one-of keys as enums (Config::mode() and the like; config_choices.cpp reads their text,
// the one place, in the order of the schema's choice lists). The strings in the structs below stay
// the INI text that to_ini() and --help show.
enum class RunMode { Train, Eval, Predict, Generate, Gradients };  // run.mode
enum class ComputeBackend { Cpu, Cuda };                           // run.backend
enum class Recompute { None, Block };                              // train.recompute
enum class Offload { None, Optimizer };                            // train.offload
enum class Padding { Longest, MaxLength };                         // data.padding
enum class PromptTokenizer { Byte, Gpt2, Ids };                    // generate.tokenizer
enum class Nonfinite { Stop, Skip };                               // train.nonfinite
enum class PackBatch { Rows, Examples };                           // data.pack_batch
enum class AttentionImpl { Auto, Cudnn, Native };                  // model.attention (as given)
enum class CommGpu { Auto, Nccl, Staged };                         // comm.gpu (as given)
enum class ModelType { Gpt2, Bert, Roberta, Electra };             // model.type
enum class Task { Clm, Mlm, DocCls, PairCls, Ner, Qa };           // run.task (model/task.h)
enum class Schedule { Linear, Cosine, Constant };                 // train.schedule
enum class FusedHead { Auto, On, Off };                            // model.fused_head (as given)
enum class PadVocab { Auto, Off, Pad128 };                         // model.pad_vocab (as given)
enum class Precision;   // train.precision resolved: Fp32 | Tf32 | Bf16 (core/backend.h)
enum class GroupOrder;  // data.group_order: LongestFirst | Shuffled (io/dataset.h)
enum class CpuGemm;     // run.cpu_gemm (as given): Auto | OpenBlas | OneDnn (core/backend.h)
enum class CpuBf16;     // run.cpu_bf16 (as given): Auto | Emulate | Native (core/backend.h)

// The text of run.task, model.type and train.schedule as enums, for code that holds the text
// without its Config (make_model's task, a schedule name); throw nlp::Error naming the key on a
// value outside its choices.
Task parse_task(const std::string& text);
ModelType parse_model_type(const std::string& text);
Schedule parse_schedule(const std::string& text);

// The keys' fields, one struct per section: SECTION_KEY(field, type, default, ...) rows of
// config_keys.def (type field = default;), in schema order; each struct then adds what is not a key.
#define NLP_KEY_FIELD(field, type, value, ...) type field = value;

struct RunConfig {
#define RUN_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

struct ModelConfig {
#define MODEL_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
  // Not an INI key: the label names of a classifier task (resolve_label_names: the dataset's
  // id2label, else model.weights'), written to checkpoints as the id2label attribute.
  std::vector<std::string> id2label;
  // Not INI keys: the tokenizer the model was trained with (HDF5 root attributes vocab_sha256,
  // tokenizer_sha256, tokenizer_files of the training dataset, or of model.weights), written to the
  // weights files nlptrain saves, so that data, model and prompts can be checked against each other.
  std::string vocab_sha256, tokenizer_sha256, tokenizer_files;
  // Not an INI key: how the transformer's activations and their gradients are stored (true: bf16),
  // run.bf16_activations resolved by resolve_model_config.
  bool bf16_activations = false;

  // model.type, model.fused_head and model.pad_vocab as enums (config_choices.cpp, as Config::mode())
  ModelType model_type() const;
  FusedHead fused_head_mode() const;
  PadVocab pad_vocab_mode() const;
  // bert, roberta, electra: the encoders on BERT's block and keys (model/bert.cpp)
  bool is_encoder() const { return model_type() != ModelType::Gpt2; }
  // The longest sequence the position table serves: n_positions (gpt2), max_position_embeddings
  // (bert, electra), max_position_embeddings - pad_token_id - 1 (roberta: positions start at
  // pad_token_id + 1, transformers' create_position_ids_from_input_ids).
  int max_sequence_length() const {
    if (!is_encoder()) return n_positions;
    if (model_type() == ModelType::Roberta) return max_position_embeddings - std::max(pad_token_id, 0) - 1;
    return max_position_embeddings;
  }
  // The key that bounds max_sequence_length(), for messages.
  std::string max_sequence_key() const {
    if (!is_encoder()) return "n_positions";
    if (model_type() == ModelType::Roberta) return "max_position_embeddings - pad_token_id - 1";
    return "max_position_embeddings";
  }
};

struct DataConfig {
#define DATA_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

struct TrainConfig {
#define TRAIN_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

struct EvalConfig {
#define EVAL_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

struct CheckpointConfig {
#define CHECKPOINT_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

struct CommConfig {
#define COMM_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
  // bucket_mb as a count of floats (at least 1): the trainer's buckets, the memory plan's MPI buffers
  size_t bucket_floats() const {
    const auto n = static_cast<size_t>(double(bucket_mb) * 1024 * 1024 / sizeof(float));
    return n > 0 ? n : 1;
  }
};

struct OutputConfig {
#define OUTPUT_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

struct GenerateConfig {
#define GENERATE_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};

// Test hooks (the debug.* keys); the defaults do nothing.
struct DebugConfig {
#define DEBUG_KEY NLP_KEY_FIELD
#include "config/config_keys.def"
};
#undef NLP_KEY_FIELD

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  CommConfig comm;
  OutputConfig output;
  GenerateConfig generate;
  DebugConfig debug;

  std::string source;                 // the INI path it was read from ("" when none)
  std::set<std::string> explicitly_set;  // "section.key" given in the INI or on the command line
  bool is_set(const std::string& key) const { return explicitly_set.count(key) > 0; }
  std::set<std::string> set_on_command_line;  // "section.key" given as --section.key=value
  // Where a key's value came from, for messages: "command line", "config file 'X'" or "default"
  // (preset keys: "model.preset = P").
  std::string where(const std::string& key) const;
  std::map<std::string, std::string> preset_keys;  // key -> preset that set it
  // Lines for the log: a key given on the command line that replaced its alternative from the INI
  // file (train.steps for train.epochs, ...; see parse_config).
  std::vector<std::string> notes;

  // The one-of keys as enums, read from the strings above on each call (so a Config whose strings
  // are set by hand, as tests do, never disagrees with them); throw nlp::Error naming the key on a
  // value outside its choices. precision(): train.precision with auto resolved (bf16 on cuda, fp32
  // on cpu), the one place it is.
  RunMode mode() const;
  ComputeBackend backend() const;
  Precision precision() const;
  Recompute recompute() const;
  Offload offload() const;
  Padding padding() const;
  PromptTokenizer tokenizer() const;
  Nonfinite nonfinite() const;
  PackBatch pack_batch() const;
  AttentionImpl attention() const;
  CommGpu comm_gpu() const;
  CpuGemm cpu_gemm() const;
  CpuBf16 cpu_bf16() const;
  Task task() const;
  Schedule schedule() const;
  GroupOrder group_order() const;
  bool on_cuda() const { return backend() == ComputeBackend::Cuda; }

  // The datasets run.mode reads: data.train (train, gradients) and data.eval (train, eval, predict).
  bool reads_train() const { return mode() == RunMode::Train || mode() == RunMode::Gradients; }
  bool reads_eval() const {
    const RunMode m = mode();
    return m == RunMode::Train || m == RunMode::Eval || m == RunMode::Predict;
  }

  // Effective configuration as INI text (every key, sections in schema order).
  std::string to_ini() const;
};

// Result of parsing the command line.
struct ParseResult {
  bool help = false;        // --help was given: help_text holds the usage
  bool version = false;     // --version was given
  bool check = false;       // --check was given: parse and validate only (no file but the INI is read)
  std::string help_text;
  Config config;
};

// argv: nlptrain [--help | --version | --check] [input.ini] [--section.key=value ...]
// Throws nlp::Error with the file, key and value on unknown keys, wrong types, out-of-range values
// and inconsistent combinations (e.g. n_embd not divisible by n_head).
ParseResult parse_config(int argc, const char* const* argv);

// model.type is taken from model.weights' model_type attribute: the INI does not set it (nor a
// model.preset) and model.weights is given. parse_config then leaves the checks that depend on the
// type to resolve_model_config.
bool model_type_from_weights(const Config& c);
// The checks that depend on model.type: keys of another type set explicitly, run.task and run.mode
// against the type. parse_config runs them when the type is known; resolve_model_config otherwise.
// type_where: where model.type came from, for messages (default: Config::where).
void check_model_type(const Config& c, const std::string& type_where = "");

// Usage and the full key reference (every key with type, default and meaning).
std::string config_help();

// Keys that name a file or folder (data.train, model.weights, output.dir, ...: .path() in their rows). Their values may
// differ between ranks (a job script that copies inputs to node-local scratch gives each node its
// own path), so the cross-rank agreement check compares the files they name, not the strings.
bool is_path_key(const std::string& key);

// The folder the gpt2 tokenizer reads: generate.vocab_dir, or when empty the folder of model.weights
// (a Hugging Face model folder imported with tools/hf_import.py keeps vocab.json and merges.txt there).
std::string gpt2_vocab_dir(const Config& c);

// The model type a key belongs to ("gpt2" for model.n_layer, "bert" for model.hidden_size, ...: its
// row's .only() in config_keys.def), or "" for keys shared by both. A key set for the other type is an error (parse_config); Config::to_ini()
// writes such keys as comments.
std::string key_model_type(const std::string& key);

// A list of step numbers "3, 7,12" (comma-separated integers >= 1; "" = none), in the given order.
// Throws nlp::Error saying which element is wrong (the caller adds the key and where it came from).
std::vector<int64_t> parse_step_list(const std::string& text);

}  // namespace nlp
