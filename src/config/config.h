// The run configuration: one typed, validated object built from an INI file plus
// `--section.key=value` command-line overrides. Every key is declared once in the schema table in
// config_schema.cpp (name, type, default, validation, help); nothing else in nlptrain reads INI text.
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
enum class CpuBf16 { Auto, Emulate, Native };                      // run.cpu_bf16 (as given)
enum class ModelType { Gpt2, Bert, Roberta, Electra };             // model.type
enum class Task { Clm, Mlm, DocCls, PairCls, Ner, Qa };           // run.task (model/task.h)
enum class Schedule { Linear, Cosine, Constant };                 // train.schedule
enum class FusedHead { Auto, On, Off };                            // model.fused_head (as given)
enum class PadVocab { Auto, Off, Pad128 };                         // model.pad_vocab (as given)
enum class Precision;   // train.precision resolved: Fp32 | Tf32 | Bf16 (core/backend.h)
enum class GroupOrder;  // data.group_order: LongestFirst | Shuffled (io/dataset.h)

// The text of run.task, model.type and train.schedule as enums, for code that holds the text
// without its Config (make_model's task, a schedule name); throw nlp::Error naming the key on a
// value outside its choices.
Task parse_task(const std::string& text);
ModelType parse_model_type(const std::string& text);
Schedule parse_schedule(const std::string& text);

struct RunConfig {
  std::string mode = "train";  // train | eval | predict | generate | gradients
  std::string task = "clm";    // clm (gpt2); mlm, doc_cls, pair_cls, ner, qa (bert)
  std::string backend = "cpu"; // cpu | cuda
  int threads = 0;             // CPU threads per rank; 0 = cores / ranks on this node
  int log_interval = 1;        // log a line every N steps
  float peak_tflops = 0.f;     // peak TFLOP/s per rank (for MFU); 0 = unknown
  bool sync_check = false;     // cuda: synchronise and check for errors after every op (debugging)
  bool profile = false;        // per-op account (time, bytes, FLOPs, floor) logged at the end of training
  bool cuda_graph = false;     // cuda: replay each training micro-batch as a CUDA graph (backend/step_graph.h)
  float memory_limit_gb = 0.f; // refuse to start when the memory plan exceeds this (GB = 1e9 bytes); 0 = no limit
  std::string cpu_gemm = "auto";  // cpu: GEMM library, auto | openblas | onednn (auto: backend/cpu/gemm.h auto_gemm_lib)
  std::string cpu_bf16 = "auto";  // cpu, train.precision = bf16: auto | emulate | native
  bool verbose = false;        // the log also holds the full effective configuration (always in config.ini)
  bool bf16_weights = false;      // train.precision = bf16: GEMMs read a persistent bf16 copy of the weights
  bool bf16_activations = false;  // train.precision = bf16: activations and their gradients stored in bf16
};

struct ModelConfig {
  std::string type = "gpt2";   // gpt2 | bert | roberta | electra (from model.weights when not set)
  std::string weights;         // HDF5 weights; empty = initialise from scratch
  std::string preset;          // "" | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | bert-base | bert-large:
                               // the shape keys of that architecture (HF --config_name); keys set
                               // explicitly override it (HF --config_overrides)
  bool reinit_mismatched = false;  // a classifier head of model.weights whose shape does not fit the
                                   // task is initialised anew (HF ignore_mismatched_sizes)
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 50257;
  int n_positions = 1024;
  float embd_pdrop = 0.1f;
  float attn_pdrop = 0.1f;
  float resid_pdrop = 0.1f;
  float layer_norm_epsilon = 1e-5f;
  float initializer_range = 0.02f;
  // BERT (model.type = bert), Hugging Face BertConfig names; vocab_size and initializer_range shared.
  int hidden_size = 256;
  int num_hidden_layers = 4;
  int num_attention_heads = 4;
  int intermediate_size = 1024;
  int max_position_embeddings = 512;
  int type_vocab_size = 2;
  float layer_norm_eps = 1e-12f;
  float hidden_dropout_prob = 0.1f;
  float attention_probs_dropout_prob = 0.1f;
  int num_labels = 2;          // doc_cls, pair_cls, ner (from the dataset's num_labels when 0; from
                               // model.weights' classifier when it has one: resolve_num_labels)
  // [PAD] id: its word-embedding row starts at zero and gets no gradient from the lookup
  // (transformers' padding_idx = pad_token_id); -1 = none. From model.weights when it says.
  int pad_token_id = 0;
  // ELECTRA (model.type = electra): width of the word/position/type embeddings and their layer norm,
  // projected to hidden_size by embeddings_project when it differs; 0 = hidden_size.
  int embedding_size = 0;
  // Not an INI key: the label names of a classifier task (resolve_label_names: the dataset's
  // id2label, else model.weights'), written to checkpoints as the id2label attribute.
  std::vector<std::string> id2label;
  // Not INI keys: the tokenizer the model was trained with (HDF5 root attributes vocab_sha256,
  // tokenizer_sha256, tokenizer_files of the training dataset, or of model.weights), written to the
  // weights files nlptrain saves, so that data, model and prompts can be checked against each other.
  std::string vocab_sha256, tokenizer_sha256, tokenizer_files;
  // Attention implementation: auto | cudnn | native. auto = cudnn (cuDNN's fused flash attention) on
  // the cuda backend when train.precision resolves to bf16, native otherwise; the cpu backend is
  // always native.
  std::string attention = "auto";
  // GPT-2's LM head fused with its cross-entropy (Backend::lm_head_crossentropy): auto | on | off.
  // on: training and evaluation losses by chunks of rows, no [B*T, V] logits; auto = off (both
  // backends, until the fused path has run on a GPU); resolved to off outside run.mode = train | eval.
  std::string fused_head = "auto";
  int head_chunk = 0;          // rows per chunk of the fused head; 0 = auto (<= ~1 GiB of logits)
  // The fused head's vocabulary padded to a multiple of 128 in its GEMMs: auto | off | 128.
  // auto = 128 on cpu (bitwise the same results), off on cuda (not yet run on a GPU).
  std::string pad_vocab = "auto";
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
  std::string train;           // HDF5 dataset for training (and gradients mode)
  std::string eval;            // HDF5 dataset for evaluation; empty = no evaluation
  int seq_len = 0;             // window length T for 1-D `tokens` datasets; 0 = min(n_positions, 1024)
  bool shuffle = true;         // reshuffle examples every epoch (seeded by train.seed)
  std::string padding = "longest";  // longest (trim each micro-batch to its longest row) | max_length
  int pad_multiple = 0;        // padding = longest: round the batch length up to a multiple of this;
                               // 0 = auto (resolved in the effective configuration: cpu 1, cuda 8)
  bool group_by_length = false;  // length-grouped batches (Sampler)
  std::string group_order = "longest_first";  // longest_first (HF's order) | shuffled (GroupOrder)
  bool packing = false;        // training micro-batches packed into fewer rows (batches.h pack_rows)
  std::string pack_batch = "rows";  // with packing, train.batch_size counts rows (PackedSampler) | examples
  int pack_max_per_row = 16;   // pack_batch = rows: at most this many examples share a row
  bool pack_fixed_examples = false;  // pack_batch = rows: heads at rows x pack_max_per_row examples (one shape)
  int cache_mb = 1024;         // a data file of at most this many MiB (its int32 columns) is held in
                               // memory on each rank; larger ones are read a batch at a time (0 = never)
};

struct TrainConfig {
  int steps = 1000;
  float epochs = 0.f;          // > 0: train.steps = ceil(epochs * examples / global batch) (resolve_steps)
  int batch_size = 8;          // sequences per rank per micro-step
  int grad_accum = 1;          // micro-steps per optimizer step
  float lr = 6e-4f;
  float min_lr_ratio = 0.0f;   // final lr = lr * min_lr_ratio (linear and cosine schedules)
  int warmup_steps = 0;
  int schedule_steps = 0;      // length of the lr schedule (its decay ends there); 0 = train.steps
  std::string schedule = "cosine";  // linear | cosine | constant
  float weight_decay = 0.01f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float clip = 1.0f;           // max global grad norm; 0 = no clipping
  uint64_t seed = 1234;
  bool resume = false;         // continue from the newest checkpoint in output.dir
  int sample_interval = 0;     // generate a sample every N steps and at the end (0 = off)
  std::string precision = "auto";  // auto | fp32 | tf32 | bf16 (auto: bf16 on cuda, fp32 on cpu)
  std::string nonfinite = "stop";  // stop | skip: a step whose loss or gradient norm is not finite
  int nonfinite_max = 5;       // skip: stop once this many consecutive steps were skipped
  std::string recompute = "none";  // none | block: keep only each block's input, recompute in backward
  int zero = 0;                // 0-3: ZeRO-1 (AdamW state and update sharded), ZeRO-2 (gradients too), ZeRO-3 (parameters too)
  int zero_prefetch = 1;       // train.zero = 3: blocks whose all-gather is started ahead of their use
  std::string offload = "none";  // none | optimizer: master weights and AdamW state on the host
};

struct EvalConfig {
  int interval = 0;            // evaluate every N steps and at the end; 0 = only at the end
  int batches = 0;             // batches per evaluation (per rank); 0 = the whole eval set
  bool sort_by_length = true;  // each rank's examples longest first (with data.padding = longest)
};

struct CheckpointConfig {
  int interval = 0;            // write a checkpoint every N steps and at the end; 0 = never
  int keep = 2;                // newest checkpoints kept
};

struct CommConfig {
  std::string gpu = "auto";    // run.backend = cuda with several ranks: auto | nccl | staged
  float bucket_mb = 25.f;      // gradient bucket size for the overlapped allreduce (MiB of fp32)
  bool overlap = true;         // reduce gradient buckets during the backward (false: one allreduce after it)
  float timeout_s = 600.f;     // a collective that does not finish in this time ends every rank; 0 = never
  // bucket_mb as a count of floats (at least 1): the trainer's buckets, the memory plan's MPI buffers
  size_t bucket_floats() const {
    const auto n = static_cast<size_t>(double(bucket_mb) * 1024 * 1024 / sizeof(float));
    return n > 0 ? n : 1;
  }
};

struct OutputConfig {
  std::string dir = "out";     // logs, metrics.jsonl, config, checkpoints, gradients
  bool overwrite = false;      // a fresh training run moves an earlier run's files to dir/previous/<run id>
};

struct GenerateConfig {
  std::string prompt = "\n";
  std::string prompts_file;    // JSON lines {"prompt": ...}; run.mode = generate only
  int max_new_tokens = 128;
  float temperature = 1.0f;
  int top_k = 0;               // 0 = off
  float top_p = 1.0f;          // 1 = off
  uint64_t seed = 42;
  int num_samples = 1;
  std::string tokenizer = "byte";  // byte | gpt2 | ids (prompts_file holds prompt_ids; any tokenizer,
                                   // encoded and decoded by tools/encode_prompts.py, decode_generated.py)
  std::string vocab_dir;       // for gpt2: folder with encoder.json and vocab.bpe (or vocab.json and
                               // merges.txt); empty = the folder of model.weights
};

// Test hooks; the defaults do nothing.
struct DebugConfig {
  std::string inject_nonfinite_step;  // "3,7": NaN gradient at these (1-based) steps; "" = none
  int kill_at_step = 0;               // rank 0 SIGKILLs itself after step N's metrics; 0 = never
  int kill_in_checkpoint = 0;         // rank 0 SIGKILLs itself halfway through writing step N's checkpoint
  int startup_sleep_ms = 0;           // testing: start-up ends with a sleep this long
  int step_sleep_ms = 0;              // testing: every training step sleeps this long after its backward
};

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

// Keys that name a file or folder (data.train, model.weights, output.dir, ...). Their values may
// differ between ranks (a job script that copies inputs to node-local scratch gives each node its
// own path), so the cross-rank agreement check compares the files they name, not the strings.
bool is_path_key(const std::string& key);

// The folder the gpt2 tokenizer reads: generate.vocab_dir, or when empty the folder of model.weights
// (a Hugging Face model folder imported with tools/hf_import.py keeps vocab.json and merges.txt there).
std::string gpt2_vocab_dir(const Config& c);

// The model type a key belongs to ("gpt2" for model.n_layer, "bert" for model.hidden_size, ...), or ""
// for keys shared by both. A key set for the other type is an error (parse_config); Config::to_ini()
// writes such keys as comments.
std::string key_model_type(const std::string& key);

// A list of step numbers "3, 7,12" (comma-separated integers >= 1; "" = none), in the given order.
// Throws nlp::Error saying which element is wrong (the caller adds the key and where it came from).
std::vector<int64_t> parse_step_list(const std::string& text);

}  // namespace nlp
