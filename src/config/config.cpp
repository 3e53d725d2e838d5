// The configuration layer: one schema table (every key once: type, field, validation, help) from
// which the --help text, INI and command-line parsing, validation and Config::to_ini() are generated.
//
// Parsing order: the INI file (optional, first positional argument) is read, then command-line
// overrides `--section.key=value` / `--section.key value` are applied (they win; on the command line
// the last occurrence of a key wins, in the INI a duplicate key is an error), then model.preset
// fills the shape keys set nowhere else. A command-line key replaces its alternative from the INI
// (resolve_alternatives). Type errors are reported
// where the text was read; range, choice and cross-key checks run on the final values and name where
// each value came from (INI file and line, command line, or default).
#include "config/config.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <variant>

#include "core/error.h"
#include "text/tokenizer.h"

namespace nlp {
namespace {

namespace po = boost::program_options;

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

// ---- schema ---------------------------------------------------------------------------------------

// Accessor of a field inside Config; the variant alternative is the key's type.
using FieldRef = std::variant<std::string* (*)(Config&), int* (*)(Config&), float* (*)(Config&),
                              bool* (*)(Config&), uint64_t* (*)(Config&)>;
enum class Type { String = 0, Int = 1, Float = 2, Bool = 3, UInt64 = 4 };
const char* const kTypeNames[] = {"string", "int", "float", "bool", "uint64"};

// Validation of one key's value: numeric bounds (open or closed) or a set of allowed strings.
struct Check {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  const std::vector<std::string>* choices = nullptr;
  bool nonempty = false;
  bool step_list = false;  // a string holding parse_step_list's format
};
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

struct Entry {
  std::string name;   // "section.key"
  FieldRef field;
  Check check;
  std::string help;   // one line
  bool escapes = false;  // string understands \n \t \r \\ \" escapes

  Type type() const { return static_cast<Type>(field.index()); }
  std::string section() const { return name.substr(0, name.find('.')); }
  std::string key() const { return name.substr(name.find('.') + 1); }
};

// KEY(section, field) gives the key name and the field accessor from one spelling.
#define KEY(sec, fld) #sec "." #fld, FieldRef { +[](Config& c) { return &c.sec.fld; } }

const std::vector<Entry>& schema() {
  static const std::vector<Entry> table = {
      // [run]
      {KEY(run, mode), one_of(kModes),
       "what to do; train and gradients need data.train, eval needs data.eval"},
      {KEY(run, task), one_of(kTasks),
       "objective: clm (gpt2); mlm, doc_cls, pair_cls, ner, qa (bert)"},
      {KEY(run, backend), one_of(kBackends), "compute backend"},
      {KEY(run, threads), ge(0),
       "CPU threads per rank; 0 = the CPUs of the rank's affinity mask when the launcher bound it, "
       "else the node's CPUs / ranks on this node (a rank bound to 1 CPU of a larger node, or more "
       "threads than its mask, gets a warning with the launch fix)"},
      {KEY(run, cpu_gemm), one_of(kCpuGemm),
       "cpu: the GEMM library: onednn or openblas (docs/performance.md \"CPU GEMM libraries\"); auto = onednn "
       "when nlptrain was built with it (libdnnl-dev), except on CPUs without AVX-512 where OpenBLAS "
       "has AVX2 kernels for the core: there the weight gradients go to OpenBLAS (measured 2x "
       "faster on a Zen 3); without oneDNN, openblas. The log line 'backend cpu: GEMMs' says which"},
      {KEY(run, cpu_bf16), one_of(kCpuBf16),
       "cpu with train.precision = bf16: native = bf16 operands multiplied in hardware (oneDNN on "
       "AMX-BF16 / AVX512-BF16; fp32 accumulation, fp32 master weights), emulate = operands rounded "
       "to bf16 and multiplied in fp32 (the reference the GPU is compared with); auto = native where "
       "the CPU has it, else emulate, with a warning: slower than fp32 there (the log says which)"},
      {KEY(run, bf16_weights), none(),
       "with train.precision = bf16: keep a bf16 copy of the weights (2 bytes a parameter, in the memory "
       "plan), written by the AdamW update in the same pass and refreshed after loading, resume and "
       "the ZeRO all-gather, which the dense-layer GEMMs read instead of rounding each weight at every "
       "call; the same bits as without it. Not yet run on a GPU: off by default until a GPU run has "
       "checked it (docs/gpu.md, the status table)"},
      {KEY(run, bf16_activations), none(),
       "with train.precision = bf16: the transformer's activations and their gradients (the "
       "embedding output, every block's tensors, the final layer norm's output and the gradients "
       "flowing back through them) stored in bf16, half the bytes; weights, their gradients, the "
       "optimizer state, layer-norm statistics, logits and losses stay fp32 and every sum is fp32. "
       "The cpu rounds at the same stores (the reference). Not yet run on a GPU: off by default "
       "until a GPU run has checked it (docs/gpu.md, the status table; docs/design.md, precision)"},
      {KEY(run, log_interval), ge(1), "log a line every N steps"},
      {KEY(run, verbose), none(),
       "the log also lists the full effective configuration (every key); it is always written to "
       "config.ini (config.<mode>.ini outside training) in output.dir, which the log names"},
      {KEY(run, peak_tflops), ge(0),
       "peak TFLOP/s of one rank's device, for the MFU in summary.json; 0 = unknown (MFU not reported)"},
      {KEY(run, sync_check), none(),
       "cuda: synchronise and check for errors after every op, so a fault names its op (slow; debugging)"},
      {KEY(run, profile), none(),
       "time every op from step 2 on (cuda: CUDA events; cpu: the host clock) and log, and write to "
       "summary.json's \"profile\", an account of the step: per op and op family the bytes moved and "
       "FLOPs from the shapes, the floor at the bandwidth and GEMM rate measured at that point (a large "
       "copy and GEMM), the measured time and their ratio, and the step the floors predict"},
      {KEY(run, cuda_graph), none(),
       "cuda, run.mode = train: each training micro-batch's forward and backward launch as one CUDA "
       "graph, recorded at the second micro-batch of a shape and replayed whenever a micro-batch makes "
       "the same calls (every step of doc_cls, pair_cls, ner and qa with data.pack_fixed_examples, and of "
       "clm; mlm's masked positions vary; other shapes launch eagerly, "
       "up to 8 recordings), with its own dropout seeds and loss scale: the same bits as eager launches. "
       "The gradient reduction then runs after the backward (comm.overlap does not apply). Not yet run "
       "on a GPU: off by default until a GPU run has checked it (docs/gpu.md, the status table)"},
      {KEY(run, memory_limit_gb), ge(0),
       "refuse to start (before allocating) when the memory plan per rank exceeds this many GB (1e9 "
       "bytes); 0 = no limit (the device's free memory is always checked)"},
      // [model]
      {KEY(model, type), one_of(kModelTypes),
       "model architecture: gpt2, or an encoder on BERT's block (bert, roberta, electra: the model.* keys "
       "marked bert serve all three); not set = model.weights' model_type; an encoder's weights given with "
       "--model.weights replace an INI's other encoder type"},
      {KEY(model, weights), none(),
       "HDF5 weights to start from (a Hugging Face folder or .safetensors file is converted once with "
       "tools/hf_import.py); empty = initialise from scratch"},
      {KEY(model, preset), one_of(kPresets),
       "shape of a standard architecture (sets model.type and its size keys, as HF --config_name); keys "
       "set explicitly override it (as --config_overrides); empty = the keys below"},
      {KEY(model, reinit_mismatched), none(),
       "bert: a classifier head in model.weights whose number of labels differs from the task's "
       "(model.num_labels, else the dataset's) is initialised anew instead of an error, and the log names "
       "it (HF ignore_mismatched_sizes)"},
      {KEY(model, n_layer), ge(1), "number of transformer blocks"},
      {KEY(model, n_head), ge(1), "attention heads per block (must divide model.n_embd)"},
      {KEY(model, n_embd), ge(1), "hidden size"},
      {KEY(model, vocab_size), ge(1), "vocabulary size"},
      {KEY(model, n_positions), ge(1), "maximum sequence length (learned position embeddings)"},
      {KEY(model, embd_pdrop), closed_open(0, 1), "dropout probability on the embeddings"},
      {KEY(model, attn_pdrop), closed_open(0, 1), "dropout probability on the attention weights"},
      {KEY(model, resid_pdrop), closed_open(0, 1), "dropout probability on the residual branches"},
      {KEY(model, layer_norm_epsilon), gt(0), "epsilon added to the variance in layer norm"},
      {KEY(model, initializer_range), gt(0), "standard deviation of the initial weights"},
      {KEY(model, hidden_size), ge(1), "bert: hidden size"},
      {KEY(model, num_hidden_layers), ge(1), "bert: number of transformer blocks"},
      {KEY(model, num_attention_heads), ge(1), "bert: attention heads (must divide model.hidden_size)"},
      {KEY(model, intermediate_size), ge(1), "bert: MLP hidden size"},
      {KEY(model, max_position_embeddings), ge(1), "bert: maximum sequence length"},
      {KEY(model, type_vocab_size), ge(1), "bert: number of token types (segments)"},
      {KEY(model, layer_norm_eps), gt(0), "bert: epsilon added to the variance in layer norm"},
      {KEY(model, hidden_dropout_prob), closed_open(0, 1), "bert: dropout on embeddings and residual branches"},
      {KEY(model, attention_probs_dropout_prob), closed_open(0, 1), "bert: dropout on the attention weights"},
      {KEY(model, num_labels), ge(0),
       "bert: classes of doc_cls, pair_cls, ner; 0 = the dataset's num_labels; a classifier in model.weights "
       "sets it (a value given here that disagrees is an error)"},
      {KEY(model, pad_token_id), ge(-1),
       "bert: id of the padding token, whose word-embedding row starts at zero and gets no gradient from "
       "the embedding lookup (transformers' padding_idx); -1 = none; from model.weights when it has one"},
      {KEY(model, embedding_size), ge(0),
       "electra: width of the embeddings (projected to model.hidden_size by embeddings_project when it "
       "differs); 0 = model.hidden_size"},
      {KEY(model, attention), one_of(kAttention),
       "attention kernels: cudnn = cuDNN fused flash attention (bf16, no [T,T] matrix kept), native = "
       "nlptrain's own (fp32; on the cpu no [T,T] matrix kept either: the backward recomputes it); auto = "
       "cudnn on cuda with bf16 precision, else native (cpu: always native)"},
      {KEY(model, fused_head), one_of(kFusedHead),
       "gpt2: the LM head fused with the cross-entropy, by chunks of rows (no [batch x seq_len, "
       "vocab_size] logits in memory; the loss, dlogits in place, then the input and embedding "
       "gradients); on = in run.mode = train and eval (other modes keep the logits); auto = off"},
      {KEY(model, head_chunk), ge(0),
       "gpt2 with model.fused_head = on: rows per chunk of the fused head; 0 = auto (at most about 1 GiB "
       "of fp32 logits per chunk, the rows split evenly)"},
      {KEY(model, pad_vocab), one_of(kPadVocab),
       "gpt2 with model.fused_head = on: the head's GEMMs run over the vocabulary padded to a multiple "
       "of 128 (zero rows; the padding reaches no loss or gradient; weights, checkpoints and exports "
       "keep vocab_size); auto = 128 on cpu (bitwise the same results), off on cuda"},
      // [data]
      {KEY(data, train), none(), "HDF5 dataset for training (and gradients mode)"},
      {KEY(data, eval), none(), "HDF5 dataset for evaluation; empty = no evaluation"},
      {KEY(data, seq_len), ge(0), "window length for 1-D token datasets; 0 = min(n_positions, 1024)"},
      {KEY(data, shuffle), none(), "reshuffle the examples every epoch (seeded by train.seed)"},
      {KEY(data, padding), one_of(kPadding),
       "longest = each micro-batch runs at its longest row (from attention_mask) rounded up to "
       "data.pad_multiple, in train, eval, predict and gradients (the same losses, gradients and "
       "predictions as max_length, except qa's loss, whose softmax spans the batch's positions as "
       "HF's per-batch padding does); max_length = every row at the file's length"},
      {KEY(data, pad_multiple), closed(0, 4096),
       "with data.padding = longest: round the batch length up to a multiple of this; 0 = auto: 1 on "
       "the cpu backend (shapes cost nothing there; every extra position is wasted work); on cuda 64 "
       "with cuDNN's attention (its graphs are built per batch length, about a second of host time "
       "each on an H100, where a fine-tuning step takes milliseconds) and 8 with the native kernels "
       "(bounds the distinct shapes)"},
      {KEY(data, group_by_length), none(),
       "batch examples of similar length (HF group_by_length): each mega-batch of min(50, examples / "
       "(4 x global batch)) optimizer steps of the shuffled order is sorted longest first and cut into "
       "optimizer steps, run in the order of data.group_order; with data.padding = longest most "
       "padding is then never computed"},
      {KEY(data, group_order), one_of(kGroupOrder),
       "with data.group_by_length: longest_first = each mega-batch's steps run from its longest to its "
       "shortest examples, mega-batch after mega-batch (HF's LengthGroupedSampler order); shuffled = "
       "the epoch's steps in a seeded random order (no cycling of lengths; nlptrain's KorQuAD F1 was "
       "lower with it, by 0.4 over 8 seeds, HF's was not: docs/performance.md)"},
      {KEY(data, packing), none(),
       "training: several examples share each row, with a segment id per token: attention stays "
       "within each example, positions restart, and each keeps its own [CLS] pooling, labels or answer "
       "span and its dropout masks: the same losses and gradients as the same examples unpacked, up to "
       "fp32 summation order (qa: the softmax spans the example's own positions). Which examples make "
       "a step: data.pack_batch. "
       "Evaluation and run.mode = gradients run train.batch_size examples, unpacked or packed as "
       "data.pack_batch = examples packs them. "
       "Bert tasks; on cuda the native attention kernels (model.attention = auto picks them: at BERT-base "
       "on an H200 their step was as fast as cuDNN's; cudnn runs each packed example as a ragged cuDNN "
       "sequence on Hopper with data.pack_batch = examples, else under a block-diagonal mask bias (with "
       "pack_batch = rows: one shape, one graph for the run); both layouts matched the unpacked CPU "
       "run there)"},
      {KEY(data, pack_batch), one_of(kPackBatch),
       "with data.packing: rows = train.batch_size counts rows of the file's length (MLPerf BERT's "
       "packing): each step walks the example order (shuffled, length-grouped when asked) and takes "
       "as many examples as fit its ranks x batch_size x grad_accum rows (first-fit in that order, at "
       "most data.pack_max_per_row to a row), so every step has one shape and a varying number of "
       "examples (logged per step and on average; the loss is the mean over the step's examples); "
       "examples = train.batch_size counts examples, as without packing, and the examples of each "
       "micro-batch are packed into as few rows as they need (first-fit, longest first), as long as "
       "the multiple of data.pad_multiple, at least 16, up to the file's length that packs into the "
       "fewest positions (the file's length with data.padding = max_length, or on cuda with "
       "model.attention = cudnn unless data.pad_multiple is set): each step then equals the unpacked "
       "run's step"},
      {KEY(data, pack_max_per_row), closed(1, 4096),
       "with data.packing and data.pack_batch = rows: at most this many examples share a row (bounds "
       "the examples of a step at rows x this)"},
      {KEY(data, pack_fixed_examples), none(),
       "with data.packing and data.pack_batch = rows: every micro-batch's heads run at rows x "
       "min(data.pack_max_per_row, row length) examples, those after the real ones ignored (no loss, "
       "no gradient, not counted in the mean), so that the heads' shapes, like the rows', are the same "
       "at every step where the rows keep the file's length (cuda with model.attention = cudnn, or "
       "data.padding = max_length): what a CUDA graph of the step needs (run.cuda_graph); ner's head "
       "then scores every position of the rows, those without a label ignored, instead of the "
       "labelled ones only. The same losses and gradients up to fp32 summation order; the heads compute "
       "the ignored examples too (at pack_max_per_row = 16 often twice the real ones: small beside the "
       "encoder)"},
      {KEY(data, cache_mb), ge(0),
       "a dataset whose columns take at most this many MiB is read into memory once, on each rank, and "
       "batches are copied from there (a random row read from HDF5 costs a chunk read); larger files "
       "are read a batch at a time; 0 = always from the file. Host memory per rank, outside the "
       "memory plan (run.memory_limit_gb)"},
      // [train]
      {KEY(train, steps), ge(1), "optimizer steps"},
      {KEY(train, epochs), ge(0),
       "> 0: passes over data.train instead of train.steps (steps = ceil(epochs x examples / (ranks x "
       "batch_size x grad_accum)), or with data.packing and data.pack_batch = rows ceil(epochs x the "
       "packed steps of the first epoch), logged; HF num_train_epochs); 0 = use train.steps"},
      {KEY(train, batch_size), ge(1),
       "sequences per rank per micro-step (rows of several examples with data.packing and "
       "data.pack_batch = rows)"},
      {KEY(train, grad_accum), ge(1), "micro-steps per optimizer step"},
      {KEY(train, lr), gt(0), "peak learning rate"},
      {KEY(train, min_lr_ratio), closed(0, 1), "final lr = lr * min_lr_ratio (linear and cosine)"},
      {KEY(train, warmup_steps), ge(0), "linear warmup steps from 0 to lr"},
      {KEY(train, schedule_steps), ge(0),
       "length of the lr schedule: linear and cosine decay to lr * min_lr_ratio at this step and stay there "
       "after it; 0 = train.steps. Set it to the first run's train.steps to extend a run (a larger "
       "train.steps with train.resume) without stretching its schedule"},
      {KEY(train, schedule), one_of(kSchedules), "learning-rate schedule after warmup"},
      {KEY(train, weight_decay), ge(0), "AdamW decoupled weight decay"},
      {KEY(train, beta1), closed_open(0, 1), "AdamW beta1"},
      {KEY(train, beta2), closed_open(0, 1), "AdamW beta2"},
      {KEY(train, adam_eps), gt(0), "AdamW epsilon"},
      {KEY(train, clip), ge(0), "max global gradient norm; 0 = no clipping"},
      {KEY(train, seed), none(), "seed for initialisation, dropout and shuffling"},
      {KEY(train, resume), none(), "continue from the newest checkpoint in output.dir"},
      {KEY(train, sample_interval), ge(0), "generate a sample every N steps and at the end; 0 = off"},
      {KEY(train, precision), one_of(kPrecisions),
       "dense-layer arithmetic: fp32, tf32 or bf16 operands (fp32 accumulation, weights, optimizer); "
       "auto = bf16 on cuda, fp32 on cpu; the cpu backend rounds operands as the GPU does"},
      {KEY(train, nonfinite), one_of(kNonfinite),
       "a step whose loss or gradient norm is not finite: stop = end the run with an error; skip = drop "
       "that step's update (it still counts toward train.steps, the lr schedule and the data order)"},
      {KEY(train, nonfinite_max), ge(1),
       "with train.nonfinite = skip: stop the run when this many consecutive steps were skipped"},
      {KEY(train, recompute), one_of(kRecompute),
       "activation recomputation: none = keep every block's activations for the backward; block = keep "
       "only each transformer block's input and rerun its forward just before its backward (bitwise the "
       "same gradients, about one extra forward of the blocks, far less activation memory)"},
      {KEY(train, zero), closed(0, 3),
       "ZeRO stage: 0 = every rank holds the AdamW state and updates every parameter; 1 = the gradient "
       "is reduce-scattered, each rank keeps AdamW m and v for and updates only its 1/N of the "
       "parameters, which are then all-gathered (optimizer memory per rank / N; with comm.overlap the "
       "reduce-scatter goes out in buckets during the backward); 2 = also no gradient arena: each "
       "block's gradients are reduce-scattered as its backward ends (every micro-batch of "
       "train.grad_accum) and accumulated into this rank's 1/N gradient shard, the backward writing into "
       "two reused block buffers and the tensors outside the blocks; 3 = also no parameter arena: each rank "
       "keeps its 1/N parameter shard, the tensors outside the blocks whole (gathered after each update) "
       "and block buffers into which each block's parameters are all-gathered before its forward and its "
       "backward, the next ones ahead (train.zero_prefetch); evaluation and samples gather the whole "
       "parameters for their duration; cpu backend only; checkpoints hold the full state at every stage"},
      {KEY(train, zero_prefetch), ge(0),
       "train.zero = 3: the blocks whose parameter all-gather is started ahead of their use (the next ones "
       "in the forward, the previous ones in the backward), each in its own block buffer, so that it runs "
       "while the current block computes (MPI's communication thread; through the staged and nccl "
       "communicators the gathers are blocking); 0 = each block gathered when it is needed"},
      {KEY(train, offload), one_of(kOffload),
       "optimizer = this rank's fp32 master weights and AdamW m and v (its shard with train.zero = 1) live in "
       "host memory (page-locked on cuda): each step copies the shard's gradients to the host, runs a "
       "multithreaded host AdamW (bitwise the cpu backend's) and copies the updated weights back; the "
       "device holds no optimizer state. none = the optimizer state in backend memory"},
      // [eval]
      {KEY(eval, interval), ge(0), "evaluate every N steps and at the end; 0 = only at the end"},
      {KEY(eval, batches), ge(0), "batches per evaluation (per rank); 0 = the whole eval set"},
      {KEY(eval, sort_by_length), none(),
       "evaluation and prediction with data.padding = longest: each rank runs its examples from the "
       "longest to the shortest, so a batch holds rows of about one length and trims to it (HF's "
       "evaluation keeps the file's order). Predictions and metrics are kept per example and do not "
       "change; the loss is the same sum in another order (but qa's, whose softmax spans the batch's "
       "positions, moves with the batches' lengths). eval.batches still takes the first "
       "examples of the file's order. doc_cls, pair_cls, ner and qa; mlm and clm keep the file's order"},
      // [checkpoint]
      {KEY(checkpoint, interval), ge(0), "write a checkpoint every N steps and at the end; 0 = never"},
      {KEY(checkpoint, keep), ge(1), "number of newest checkpoints kept"},
      // [comm]
      {KEY(comm, gpu), one_of(kCommGpu),
       "GPU gradient communicator with several ranks: nccl (device buffers), staged (device -> pinned "
       "host -> MPI -> device, in chunks; for builds without NCCL or several ranks on one GPU); auto = "
       "nccl when available and every rank has its own GPU, else staged"},
      {KEY(comm, bucket_mb), open_closed(0, 4096),
       "gradient bucket size in MiB: buckets are reduced as soon as the blocks that produce them "
       "finish their backward (comm.overlap)"},
      {KEY(comm, overlap), none(),
       "overlap the gradient allreduce (with train.zero = 1: reduce-scatter) with the backward (buckets, "
       "reverse layer order); false = one allreduce (reduce-scatter) after the backward"},
      {KEY(comm, timeout_s), ge(0),
       "an overlapped gradient bucket or NCCL collective not finished after this many seconds ends "
       "every rank with an error (the blocking MPI allreduce of comm.overlap = false is not covered); "
       "0 = wait forever"},
      // [output]
      {KEY(output, dir), nonempty(), "folder for logs, metrics.jsonl, config, checkpoints, gradients"},
      {KEY(output, overwrite), none(),
       "a training run without train.resume refuses an output.dir that holds another run's checkpoints "
       "or metrics; true moves that run's files (all but nlptrain.lock) into output.dir/previous/<its run "
       "id>/ by renames before anything is written, and the log says where"},
      // [generate]
      {KEY(generate, prompt), none(), "prompt text (escapes \\n \\t \\r \\\\ \\\" \\xHH understood)", true},
      {KEY(generate, prompts_file), none(),
       "run.mode = generate: JSON lines file, one {\"prompt\": \"...\"} object per line (blank lines "
       "skipped); one sample set per prompt, written to generated.jsonl; conflicts with generate.prompt"},
      {KEY(generate, max_new_tokens), ge(0), "tokens generated per sample"},
      {KEY(generate, temperature), gt(0), "sampling temperature"},
      {KEY(generate, top_k), ge(0), "sample among the k most likely tokens; 0 = off"},
      {KEY(generate, top_p), open_closed(0, 1), "nucleus sampling probability mass; 1 = off"},
      {KEY(generate, seed), none(), "sampling seed"},
      {KEY(generate, num_samples), ge(1), "number of samples"},
      {KEY(generate, tokenizer), one_of(kTokenizers),
       "byte (one token per byte), gpt2 (BPE), or ids: generate.prompts_file lines carry \"prompt_ids\" "
       "made by tools/encode_prompts.py for any Hugging Face tokenizer, and generated.jsonl holds ids "
       "that tools/decode_generated.py turns into text"},
      {KEY(generate, vocab_dir), none(),
       "for tokenizer gpt2: folder with encoder.json and vocab.bpe (or HF's vocab.json and merges.txt); "
       "empty = the folder of model.weights"},
      // [debug]
      {KEY(debug, inject_nonfinite_step), step_list(),
       "testing: make the gradient NaN at these steps (1-based, comma-separated, e.g. 3,7); empty = never"},
      {KEY(debug, kill_at_step), ge(0),
       "testing: rank 0 kills itself with SIGKILL right after writing step N's metrics (a crash); 0 = never"},
      {KEY(debug, kill_in_checkpoint), ge(0),
       "testing: rank 0 kills itself with SIGKILL halfway through writing step N's checkpoint (the weights "
       "written, the AdamW moments not: a crash mid-write); 0 = never"},
      {KEY(debug, startup_sleep_ms), ge(0),
       "testing: training start-up ends with a sleep of this many milliseconds before the first step (a "
       "long start-up, to stop in it); 0 = never"},
      {KEY(debug, step_sleep_ms), ge(0),
       "testing: every training step sleeps this many milliseconds after its backward (a long step, to "
       "stop mid-step); 0 = never"},
  };
  return table;
}
#undef KEY

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

// ---- text helpers ---------------------------------------------------------------------------------

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Edit distance counting insertions, deletions, substitutions and adjacent transpositions as 1.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// Closest candidate to `bad` (case-insensitive edit distance) if it is close enough, else "".
std::string closest(const std::string& bad, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(lower(bad), lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= std::max<size_t>(1, bad.size() / 3) ? best : "";
}

// Explanation for a key that is not in the schema: unknown section, key outside a section or unknown
// key in a known section, with the closest known key (or section) as a suggestion. `cli`: the name
// came from a command-line option (--name) rather than an INI line.
std::string unknown_key_message(const std::string& name, bool cli) {
  const auto secs = sections();
  const auto dot = name.find('.');
  const std::string sec = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
  // Same key name in another section ("[model] lr" -> train.lr) beats edit distance.
  std::string suggestion;
  for (const auto& e : schema())
    if (e.key() == key) {
      suggestion = e.name;
      break;
    }
  if (suggestion.empty()) {
    std::vector<std::string> names;
    for (const auto& e : schema()) names.push_back(dot == std::string::npos ? e.key() : e.name);
    suggestion = closest(name, names);
    if (!suggestion.empty() && dot == std::string::npos) {
      for (const auto& e : schema())
        if (e.key() == suggestion) suggestion = e.name;
    }
  }
  std::string msg;
  if (dot == std::string::npos)
    msg = cli ? cat("unknown option '--", name, "'") : cat("key '", name, "' is not inside a [section]");
  else if (std::find(secs.begin(), secs.end(), sec) == secs.end())
    msg = cat("unknown section '", sec, "' in key '", name, "'");
  else
    msg = cat("unknown key '", name, "'");
  if (!suggestion.empty()) return cat(msg, "; did you mean ", suggestion, "?");
  if (dot != std::string::npos && std::find(secs.begin(), secs.end(), sec) != secs.end()) {
    std::vector<std::string> keys;
    for (const auto& e : schema())
      if (e.section() == sec) keys.push_back(e.key());
    return cat(msg, "; keys of [", sec, "]: ", join(keys, ", "));
  }
  if (dot == std::string::npos)
    return cli ? cat(msg, "; options are --help, --version and --section.key=value (see --help)")
               : cat(msg, "; keys belong under a [section] (see --help)");
  std::string sec_suggestion = closest(sec, secs);
  if (!sec_suggestion.empty()) return cat(msg, "; did you mean [", sec_suggestion, "]?");
  return cat(msg, "; sections are ", join(secs, ", "));
}

size_t utf8_length(const std::string& s, size_t i);  // below, with the INI text check

// s for an INI value with escapes: line breaks, tabs, quotes and backslashes escaped; other control
// bytes and bytes that are not UTF-8 text as \xHH, so that the written config.ini is text that reads
// back to the same bytes.
std::string escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const size_t n = utf8_length(s, i);
      if (n > 0) {
        out.append(s, i, n);
        i += n - 1;
        continue;
      }
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {  // \xHH
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[i + 1];
      const char* rep = n == 'n' ? "\n" : n == 't' ? "\t" : n == 'r' ? "\r" : n == '\\' ? "\\"
                        : n == '"' ? "\"" : nullptr;
      if (rep) {
        out += rep;
        ++i;
        continue;
      }
      auto hex = [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; };
      if (n == 'x' && i + 3 < s.size() && hex(s[i + 2]) && hex(s[i + 3])) {  // \xHH: one byte
        out += static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::string format_float(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return std::string(buf, r.ptr);
}

std::string format_bound(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// ---- field access -----------------------------------------------------------------------------------

// The value of e in c as INI text (strings quoted when needed, prompts escaped).
std::string value_text(const Entry& e, const Config& cc) {
  Config& c = const_cast<Config&>(cc);  // accessors take Config&; nothing is written
  return std::visit(
      [&](auto get) -> std::string {
        const auto& v = *get(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (e.escapes) return "\"" + escape(v) + "\"";
          bool quote = !v.empty() && (v != trim(v) || v.find_first_of("#;\"") != std::string::npos);
          return quote ? "\"" + v + "\"" : v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, float>) {
          return format_float(v);
        } else {
          return std::to_string(v);
        }
      },
      e.field);
}

// Where a value was read: "config file 'x.ini', line 4", "command line" or "default".
struct Origin {
  std::string where;
  std::string text;  // the value as given
};

[[noreturn]] void bad_value(const Entry& e, const Origin& o, const std::string& why) {
  throw Error(cat(o.where, ": ", e.name, " = '", o.text, "': ", why));
}

template <typename T>
bool parse_integer(const std::string& s, T& out) {
  std::string t = s;
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (t.empty() || t[0] == '+') return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

// [+-]digits: an integer in syntax (used to tell "out of range" from "not an integer").
bool integer_syntax(const std::string& t) {
  size_t i = !t.empty() && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  return t.size() > i && t.find_first_not_of("0123456789", i) == std::string::npos;
}

// Strip one pair of matching surrounding double quotes.
std::string unquote(const std::string& s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

// The first ASCII control byte other than a tab in s, or npos. A value without escapes may not hold
// one: it would not survive to_ini() and reading back (a line break splits the line, and 0x1F is the
// stand-in that protects '#' from Boost: it came back as '#', found by tests/fuzz/fuzz_cli). Values
// with escapes (generate.prompt) hold any byte: to_ini() writes control bytes as \n, \r, \xHH.
size_t find_control(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 && ch != '\t') return i;
  }
  return std::string::npos;
}

std::string hex_byte(char ch) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(ch)));
  return buf;
}

// Parse `raw` according to e's type and store it in c; throws on a wrong type.
void assign(const Entry& e, Config& c, const std::string& raw, const Origin& o) {
  // A value with escapes holds any byte (to_ini() writes control bytes as escapes); others may not.
  if (const size_t i = e.escapes ? std::string::npos : find_control(raw); i != std::string::npos)
    bad_value(e, o, cat("control character ", hex_byte(raw[i]), " in the value (only a tab is allowed)"));
  if (!e.escapes)  // config.ini must stay UTF-8 text (the INI reader requires it)
    for (size_t i = 0; i < raw.size();) {
      const size_t n = utf8_length(raw, i);
      if (n == 0) bad_value(e, o, cat("byte ", hex_byte(raw[i]), " at offset ", i, " is not UTF-8 text"));
      i += n;
    }
  const std::string t = trim(raw);
  std::visit(
      [&](auto get) {
        auto& v = *get(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          std::string s = t.size() >= 2 && t.front() == '"' && t.back() == '"' ? unquote(t) : raw;
          v = e.escapes ? unescape(s) : s;
        } else if constexpr (std::is_same_v<T, bool>) {
          const std::string l = lower(t);
          if (l == "true" || l == "1" || l == "yes" || l == "on") v = true;
          else if (l == "false" || l == "0" || l == "no" || l == "off") v = false;
          else bad_value(e, o, "expected a bool (true/false, 1/0, yes/no, on/off)");
        } else if constexpr (std::is_same_v<T, float>) {
          std::string s = !t.empty() && t[0] == '+' ? t.substr(1) : t;
          float f = 0;
          auto r = std::from_chars(s.data(), s.data() + s.size(), f);
          if (s.empty() || s[0] == '+' || r.ptr != s.data() + s.size() ||
              (r.ec != std::errc() && r.ec != std::errc::result_out_of_range))
            bad_value(e, o, "expected a number");
          if (r.ec == std::errc::result_out_of_range) bad_value(e, o, "number out of range for a float");
          if (!std::isfinite(f)) bad_value(e, o, "expected a finite number");
          v = f;
        } else if constexpr (std::is_same_v<T, int>) {
          long long x = 0;
          if (!parse_integer(t, x)) {
            if (integer_syntax(t)) bad_value(e, o, "integer out of range");
            bad_value(e, o, "expected an integer");
          }
          if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
            bad_value(e, o, "integer out of range");
          v = static_cast<int>(x);
        } else {
          uint64_t x = 0;
          if (!t.empty() && t[0] == '-') bad_value(e, o, "expected a non-negative integer");
          if (!parse_integer(t, x)) {
            if (integer_syntax(t)) bad_value(e, o, "integer out of range for uint64");
            bad_value(e, o, "expected a non-negative integer");
          }
          v = x;
        }
      },
      e.field);
}

// The constraint in words; `compact` (for --help) lists choices as a|b|c.
std::string check_text(const Check& k, bool compact = false) {
  if (k.choices) return compact ? join(*k.choices, "|") : "one of: " + join(*k.choices, ", ");
  if (k.nonempty) return "not empty";
  if (k.step_list) return compact ? "steps >= 1, comma-separated" : "a comma-separated list of steps >= 1";
  if (k.lo && k.hi)
    return cat("in ", k.lo_open ? "(" : "[", format_bound(*k.lo), ", ", format_bound(*k.hi),
               k.hi_open ? ")" : "]");
  if (k.lo) return cat(k.lo_open ? "> " : ">= ", format_bound(*k.lo));
  if (k.hi) return cat(k.hi_open ? "< " : "<= ", format_bound(*k.hi));
  return "";
}

// Range / choice / non-empty check of e's final value.
void validate(const Entry& e, const Config& cc, const Origin& o) {
  Config& c = const_cast<Config&>(cc);
  const Check& k = e.check;
  Origin shown{o.where, o.text.empty() && o.where == "default" ? value_text(e, cc) : o.text};
  std::visit(
      [&](auto get) {
        const auto& v = *get(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (k.choices && std::find(k.choices->begin(), k.choices->end(), v) == k.choices->end())
            bad_value(e, shown, "must be " + check_text(k));
          if (k.nonempty && v.empty()) bad_value(e, shown, "must not be empty");
          if (k.step_list) {
            try {
              parse_step_list(v);
            } catch (const Error& err) {
              bad_value(e, shown, cat(err.what(), "; expected ", check_text(k), ", e.g. 3,7"));
            }
          }
        } else if constexpr (!std::is_same_v<T, bool>) {
          const double x = static_cast<double>(v);
          bool ok = true;
          if (k.lo) ok = ok && (k.lo_open ? x > *k.lo : x >= *k.lo);
          if (k.hi) ok = ok && (k.hi_open ? x < *k.hi : x <= *k.hi);
          if (!ok) bad_value(e, shown, "must be " + check_text(k));
        }
      },
      e.field);
}

// ---- INI reading --------------------------------------------------------------------------------------

constexpr char kHashStandIn = '\x1f';  // protects '#' inside values from Boost's comment stripping

struct IniText {
  std::string text;                                 // cleaned text for Boost
  std::map<std::string, std::vector<int>> lines;    // "section.key" -> line numbers, in order
};

// Strip comments ('#' or ';' at the start of a line or after whitespace, outside double quotes),
// check the syntax line by line (so errors carry line numbers) and record where each key is.
IniText clean_ini(const std::string& path, std::istream& in) {
  IniText out;
  const auto secs = sections();
  std::string section, line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 byte order mark
    const std::string at = cat("config file '", path, "', line ", n);
    bool quoted = false;
    size_t cut = line.size();
    for (size_t i = 0; i < line.size(); ++i) {
      char ch = line[i];
      if (quoted && ch == '\\') {
        ++i;
        continue;
      }
      if (ch == '"') quoted = !quoted;
      if (!quoted && (ch == '#' || ch == ';') &&
          (i == 0 || std::isspace(static_cast<unsigned char>(line[i - 1])))) {
        cut = i;
        break;
      }
    }
    std::string s = trim(line.substr(0, cut));
    if (s.empty()) {
      out.text += "\n";
      continue;
    }
    if (s.front() == '[') {
      if (s.back() != ']') throw Error(cat(at, ": malformed section header '", s, "'"));
      section = trim(s.substr(1, s.size() - 2));
      if (std::find(secs.begin(), secs.end(), section) == secs.end()) {
        std::string sug = closest(section, secs);
        throw Error(cat(at, ": unknown section [", section, "]",
                        sug.empty() ? cat("; sections are ", join(secs, ", "))
                                    : cat("; did you mean [", sug, "]?")));
      }
      out.text += "[" + section + "]\n";
      continue;
    }
    if (const size_t i = find_control(s); i != std::string::npos)
      throw Error(cat(at, ": control character ", hex_byte(s[i]), " (only a tab is allowed)"));
    auto eq = s.find('=');
    if (eq == std::string::npos)
      throw Error(cat(at, ": expected 'key = value' or '[section]', got '", s, "'"));
    std::string key = trim(s.substr(0, eq));
    if (key.empty()) throw Error(cat(at, ": missing key before '=' in '", s, "'"));
    out.lines[section.empty() ? key : section + "." + key].push_back(n);
    std::replace(s.begin(), s.end(), '#', kHashStandIn);
    out.text += s + "\n";
  }
  return out;
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one (overlong forms, surrogates
// and code points above U+10FFFF are invalid).
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xF5 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
  if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // UTF-16 surrogates
  if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
  if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
  return n;
}

// An INI file is UTF-8 text: a NUL byte (an HDF5 or other binary file given by mistake) or invalid
// UTF-8 is an error naming the file, line and byte, rather than a confusing syntax error later.
void require_text(const std::string& path, const std::string& data) {
  int line = 1;
  for (size_t i = 0; i < data.size();) {
    if (data[i] == '\0')
      throw Error(cat("config file '", path, "', line ", line, ": is not a text file (NUL byte at offset ",
                      i, "); give an INI file, e.g. nlptrain input.ini"));
    const size_t n = utf8_length(data, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(data[i]));
      throw Error(cat("config file '", path, "', line ", line, ": is not a text file (invalid UTF-8 byte ",
                      hex, " at offset ", i, ")"));
    }
    if (data[i] == '\n') ++line;
    i += n;
  }
}

po::options_description key_options() {
  po::options_description desc("keys");
  for (const auto& e : schema()) desc.add_options()(e.name.c_str(), po::value<std::string>(), "");
  return desc;
}

// Read the INI file into c; records explicitly set keys and their origins.
void read_ini(const std::string& path, Config& c, std::map<std::string, Origin>& origins) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(cat("config file '", path, "' not found"));
  if (fs::is_directory(path, ec)) throw Error(cat("config file '", path, "' is a directory"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat("config file '", path, "' cannot be opened for reading"));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error(cat("config file '", path, "': read error"));
  require_text(path, data);
  std::istringstream in(data);
  IniText ini = clean_ini(path, in);

  std::istringstream text(ini.text);
  po::parsed_options parsed(nullptr);
  const auto desc = key_options();
  try {
    parsed = po::parse_config_file(text, desc, /*allow_unregistered=*/true);
  } catch (const po::error& err) {
    throw Error(cat("config file '", path, "': ", err.what()));
  }
  std::map<std::string, size_t> seen;
  for (const auto& opt : parsed.options) {
    const std::string& name = opt.string_key;
    std::string value = opt.value.empty() ? "" : opt.value.front();
    std::replace(value.begin(), value.end(), kHashStandIn, '#');
    const auto& where_lines = ini.lines[name];
    const size_t idx = seen[name]++;
    const int line = idx < where_lines.size() ? where_lines[idx] : 0;
    const std::string at =
        line ? cat("config file '", path, "', line ", line) : cat("config file '", path, "'");
    const Entry* e = opt.unregistered ? nullptr : find_entry(name);
    if (!e) throw Error(cat(at, ": ", unknown_key_message(name, false), " (value '", value, "')"));
    if (idx > 0)
      throw Error(cat(at, ": duplicate key ", name, " = '", value, "' (already set on line ",
                      where_lines.empty() ? 0 : where_lines.front(), ")"));
    Origin o{at, value};
    assign(*e, c, value, o);
    origins[name] = o;
    c.explicitly_set.insert(name);
  }
}

// model.preset: the shape keys of a standard architecture, for keys not set explicitly (HF's
// --config_name NAME --config_overrides k=v,...). The values are those of the Hub's config.json.
void apply_preset(Config& c, std::map<std::string, Origin>& origins) {
  if (c.model.preset.empty()) return;
  using KV = std::vector<std::pair<const char*, const char*>>;
  auto gpt2 = [](const char* layers, const char* heads, const char* width) {
    return KV{{"model.type", "gpt2"}, {"model.n_layer", layers}, {"model.n_head", heads},
              {"model.n_embd", width}, {"model.n_positions", "1024"}, {"model.vocab_size", "50257"}};
  };
  auto bert = [](const char* layers, const char* heads, const char* width, const char* mlp) {
    return KV{{"model.type", "bert"}, {"model.num_hidden_layers", layers},
              {"model.num_attention_heads", heads}, {"model.hidden_size", width},
              {"model.intermediate_size", mlp}, {"model.max_position_embeddings", "512"},
              {"model.type_vocab_size", "2"}, {"model.vocab_size", "30522"}};
  };
  const std::map<std::string, KV> presets = {
      {"gpt2", gpt2("12", "12", "768")},          {"gpt2-medium", gpt2("24", "16", "1024")},
      {"gpt2-large", gpt2("36", "20", "1280")},   {"gpt2-xl", gpt2("48", "25", "1600")},
      {"bert-base", bert("12", "12", "768", "3072")}, {"bert-large", bert("24", "16", "1024", "4096")}};
  const auto it = presets.find(c.model.preset);
  if (it == presets.end()) return;  // validate() names the allowed values
  for (const auto& [key, value] : it->second) {
    const Entry& e = *find_entry(key);
    if (c.is_set(key)) {
      if (std::string(key) == "model.type" && c.model.type != value)
        throw Error(cat("model.preset = ", c.model.preset, " (", c.where("model.preset"), ") is a ", value,
                        " architecture but model.type = ", c.model.type, " (", c.where("model.type"), ")"));
      continue;  // an explicit key overrides the preset
    }
    Origin o{"model.preset = " + c.model.preset, value};
    assign(e, c, value, o);
    origins[key] = o;
    c.preset_keys[key] = c.model.preset;
  }
}

// Keys that are alternatives to each other: train.steps or train.epochs, generate.prompt or
// generate.prompts_file, and model.type or a model.preset of another type. When both are given and
// one came from the command line, the other from the INI file, the command line wins (precedence:
// command line > INI file > model.preset > default): the INI's key goes back to its default, and
// Config::notes gets one line saying so. Both from the same source stay an error (parse_config's
// cross-key checks, apply_preset).
void resolve_alternatives(Config& c, std::map<std::string, Origin>& origins) {
  struct Pair {
    const char* a;
    const char* b;
    bool (*conflict)(const Config&);
  };
  static const Pair pairs[] = {
      {"train.steps", "train.epochs",
       [](const Config& k) { return k.is_set("train.steps") && k.train.epochs > 0; }},
      {"generate.prompt", "generate.prompts_file",
       [](const Config& k) {
         return k.is_set("generate.prompt") && !k.generate.prompt.empty() &&
                k.generate.prompt != GenerateConfig{}.prompt && !k.generate.prompts_file.empty();
       }},
      {"model.type", "model.preset",
       [](const Config& k) {
         const std::string& p = k.model.preset;
         return k.is_set("model.type") && !p.empty() &&
                std::find(kPresets.begin(), kPresets.end(), p) != kPresets.end() &&
                k.model.type != (p.rfind("bert", 0) == 0 ? "bert" : "gpt2");
       }},
  };
  const Config defaults;
  for (const Pair& pair : pairs) {
    if (!pair.conflict(c)) continue;
    const bool a_cli = c.set_on_command_line.count(pair.a) > 0;
    const bool b_cli = c.set_on_command_line.count(pair.b) > 0;
    if (a_cli == b_cli) continue;  // the same source: an error below
    const std::string won = a_cli ? pair.a : pair.b, lost = a_cli ? pair.b : pair.a;
    const Entry& w = *find_entry(won);
    const Entry& l = *find_entry(lost);
    const std::string lost_text = value_text(l, c);
    const std::string lost_where = origins.count(lost) ? origins[lost].where : c.where(lost);
    assign(l, c, value_text(l, defaults), Origin{"default", ""});
    origins.erase(lost);
    c.explicitly_set.erase(lost);
    c.notes.push_back(cat(won, " = ", value_text(w, c), " (command line) replaces ", lost, " = ", lost_text,
                          " (", lost_where, "): the command line wins over the INI file"));
  }
}

// A key set explicitly that the model type does not use is an error (a GPT-2 key given to BERT
// would otherwise be silently ignored), naming BERT's or GPT-2's name for it.
// Keys owned by "bert" serve every encoder on BERT's block (bert, roberta, electra).
bool key_applies(const std::string& owner, const std::string& type) {
  return owner.empty() || owner == type || (owner == "bert" && (type == "roberta" || type == "electra"));
}

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

// ---- public API ---------------------------------------------------------------------------------------

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
  if (c.run.mode == "generate" && type != "gpt2")
    throw Error(cat("run.mode = generate (", c.where("run.mode"), ") needs model.type = gpt2"));
}

std::string Config::to_ini() const {
  std::ostringstream os;
  os << "# nlptrain configuration" << (source.empty() ? "" : " (read from " + source + ")") << "\n";
  std::string section;
  for (const auto& e : schema()) {
    if (e.section() != section) {
      section = e.section();
      os << "\n[" << section << "]\n";
    }
    const std::string owner = key_model_type(e.name);
    if (e.name == "train.steps" && train.epochs > 0)
      os << "# " << e.key() << " = " << value_text(e, *this) << "   (from train.epochs)\n";
    else if (!key_applies(owner, model.type))
      os << "# " << e.key() << " = " << value_text(e, *this) << "   (" << owner
         << " only: unused with model.type = " << model.type << ")\n";
    else
      os << e.key() << " = " << value_text(e, *this) << "\n";
  }
  return os.str();
}

std::string Config::where(const std::string& key) const {
  if (set_on_command_line.count(key)) return "command line";
  if (explicitly_set.count(key)) return source.empty() ? "command line" : "config file '" + source + "'";
  if (auto it = preset_keys.find(key); it != preset_keys.end()) return "model.preset = " + it->second;
  return "default";
}

std::string key_model_type(const std::string& key) {
  static const std::set<std::string> gpt2 = {
      "model.n_layer", "model.n_head", "model.n_embd", "model.n_positions", "model.embd_pdrop",
      "model.attn_pdrop", "model.resid_pdrop", "model.layer_norm_epsilon", "train.sample_interval",
      "model.fused_head", "model.head_chunk", "model.pad_vocab"};
  static const std::set<std::string> bert = {
      "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
      "model.intermediate_size", "model.max_position_embeddings", "model.type_vocab_size",
      "model.layer_norm_eps", "model.hidden_dropout_prob", "model.attention_probs_dropout_prob",
      "model.num_labels", "model.pad_token_id", "model.reinit_mismatched"};
  if (gpt2.count(key) || key.rfind("generate.", 0) == 0) return "gpt2";
  if (bert.count(key)) return "bert";
  if (key == "model.embedding_size") return "electra";
  return "";
}

std::vector<int64_t> parse_step_list(const std::string& text) {
  std::vector<int64_t> out;
  if (trim(text).empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    long long v = 0;
    if (item.empty()) throw Error("empty element in the list");
    if (!parse_integer(item, v)) {
      if (integer_syntax(item)) throw Error(cat("'", item, "' is out of range"));
      throw Error(cat("'", item, "' is not an integer"));
    }
    if (v < 1) throw Error(cat("step ", v, " is not >= 1"));
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string config_help() {
  std::ostringstream os;
  os << "usage: nlptrain [--help] [--version] [--check] [input.ini] [--section.key=value ...]\n"
        "\n"
        "Reads input.ini (optional), then applies the command-line overrides. Precedence: command\n"
        "line > INI file > model.preset > default. A key given on the command line replaces its\n"
        "alternative from the INI file (train.steps for train.epochs and back, generate.prompt for\n"
        "generate.prompts_file and back, model.type for a model.preset of the other type), with a\n"
        "line in the log; both in the same place are an error.\n"
        "Each key below is written `key = value` under its [section] in the INI file, or given on\n"
        "the command line as --section.key=value or --section.key value (the last one wins).\n"
        "Without an INI file the defaults are used. INI comments start with # or ;.\n"
        "  --help      print this help and exit\n"
        "  --version   print the version and exit\n"
        "  --check     read and validate input.ini and the overrides (keys, types, ranges, combinations),\n"
        "              print the effective configuration and exit; no dataset or weights file is opened\n"
        "Types: int, uint64, float, bool (true/false, 1/0, yes/no, on/off), string (surrounding\n"
        "double quotes optional).\n";
  const Config defaults;
  size_t w_name = 4, w_def = 7;
  for (const auto& e : schema()) {
    w_name = std::max(w_name, e.name.size());
    std::string d = value_text(e, defaults);
    w_def = std::max(w_def, d.empty() ? 2 : d.size());
  }
  auto pad = [](std::string s, size_t w) { return s.size() < w ? s + std::string(w - s.size(), ' ') : s; };
  os << "\n  " << pad("KEY", w_name) << "  " << pad("TYPE", 6) << "  " << pad("DEFAULT", w_def)
     << "  MEANING (ALLOWED VALUES)\n";
  std::string section;
  for (const auto& e : schema()) {
    if (e.section() != section) {
      section = e.section();
      os << "\n[" << section << "]\n";
    }
    std::string d = value_text(e, defaults);
    if (d.empty()) d = "\"\"";
    std::string check = check_text(e.check, true);
    os << "  " << pad(e.name, w_name) << "  " << pad(kTypeNames[static_cast<int>(e.type())], 6) << "  "
       << pad(d, w_def) << "  " << e.help << (check.empty() ? "" : " (" + check + ")") << "\n";
  }
  return os.str();
}

ParseResult parse_config(int argc, const char* const* argv) {
  ParseResult result;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // "--section.key=" (empty value): Boost rejects it, so pass the empty value as the next token.
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.find('=') == a.size() - 1) {
      args.push_back(a.substr(0, a.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(a);
    }
  }

  po::options_description desc = key_options();
  desc.add_options()("help,h", "")("version", "")("check", "")("ini-file", po::value<std::vector<std::string>>(), "");
  po::positional_options_description pos;
  pos.add("ini-file", -1);
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next | po::command_line_style::allow_short |
                    po::command_line_style::short_allow_next |
                    po::command_line_style::allow_dash_for_short;
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args)
                 .options(desc)
                 .positional(pos)
                 .style(style)
                 .allow_unregistered()
                 .run();
  } catch (const po::error& err) {
    throw Error(cat("command line: ", err.what()));
  }

  std::vector<std::string> inis;
  std::vector<const po::option*> overrides;
  for (const auto& opt : parsed.options) {
    if (opt.string_key == "help") result.help = true;
    else if (opt.string_key == "version") result.version = true;
    else if (opt.string_key == "check") result.check = true;
    else if (opt.string_key == "ini-file") inis.insert(inis.end(), opt.value.begin(), opt.value.end());
    else overrides.push_back(&opt);
  }
  if (result.help) {
    result.help_text = config_help();
    return result;
  }
  if (result.version) return result;

  for (const auto* opt : overrides) {
    if (opt->unregistered || !find_entry(opt->string_key)) {
      std::string token = opt->original_tokens.empty() ? opt->string_key : opt->original_tokens.front();
      if (token.rfind("--", 0) != 0)
        throw Error(cat("command line: unknown option '", token, "' (see --help)"));
      std::string name = token.substr(2, token.find('=') == std::string::npos ? std::string::npos
                                                                               : token.find('=') - 2);
      throw Error(cat("command line: ", unknown_key_message(name, true), " (in '", token, "')"));
    }
  }
  if (inis.size() > 1)
    throw Error(cat("command line: more than one INI file given ('", join(inis, "', '"),
                    "'); keys are overridden with --section.key=value"));

  Config& c = result.config;
  std::map<std::string, Origin> origins;
  if (!inis.empty()) {
    c.source = inis.front();
    read_ini(c.source, c, origins);
  }
  for (const auto* opt : overrides) {
    const Entry& e = *find_entry(opt->string_key);
    const std::string value = opt->value.empty() ? "" : opt->value.front();
    Origin o{"command line", value};
    assign(e, c, value, o);
    origins[e.name] = o;
    c.explicitly_set.insert(e.name);
    c.set_on_command_line.insert(e.name);
  }

  resolve_alternatives(c, origins);
  apply_preset(c, origins);
  auto origin = [&](const std::string& name) {
    auto it = origins.find(name);
    return it != origins.end() ? it->second : Origin{"default", ""};
  };
  for (const auto& e : schema()) validate(e, c, origin(e.name));
  // model.type not given with model.weights: the weights' model_type decides, and
  // resolve_model_config runs these checks once it is known
  if (!model_type_from_weights(c)) check_model_type(c);

  // Cross-key checks.
  auto from = [&](const std::string& name) { return origin(name).where; };
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
  const bool causal_task = c.run.task == "clm";
  if (c.data.pack_fixed_examples && !(c.data.packing && c.data.pack_batch == "rows"))
    throw Error(cat("data.pack_fixed_examples = true (", from("data.pack_fixed_examples"),
                    ") pads the examples of packed rows; it needs data.packing = true (now ",
                    c.data.packing ? "true" : "false", ", ", from("data.packing"),
                    ") and data.pack_batch = rows (now ", c.data.pack_batch, ", ", from("data.pack_batch"), ")"));
  if (c.train.zero == 3 && c.run.backend == "cuda")
    throw Error(cat("train.zero = 3 (", from("train.zero"), ") has run on the cpu backend only; with run.backend "
                    "= cuda (", from("run.backend"), ") use train.zero = 2 (with train.offload = optimizer to move "
                    "the optimizer state to the host)"));
  if (c.train.zero >= 2 && c.run.cuda_graph)
    throw Error(cat("train.zero = ", c.train.zero, " (", from("train.zero"), ") reduces each block's gradients during the "
                    "backward; run.cuda_graph = true (", from("run.cuda_graph"), ") records a micro-batch without "
                    "communication: use train.zero = 1 with it"));
  if (c.run.cuda_graph) {
    // NLPTRAIN_STEP_GRAPH_EMULATE=1: the CPU backend emulates the recording (tests of the trainer's
    // graph path; no gain in speed)
    const char* emulate = std::getenv("NLPTRAIN_STEP_GRAPH_EMULATE");
    if (c.run.backend != "cuda" && !(emulate && std::string(emulate) == "1"))
      throw Error(cat("run.cuda_graph = true (", from("run.cuda_graph"), ") needs run.backend = cuda (now ",
                      c.run.backend, ", ", from("run.backend"), ")"));
    for (const auto& [key, on] : {std::pair<const char*, bool>{"run.profile", c.run.profile},
                                  {"run.sync_check", c.run.sync_check}})
      if (on)
        throw Error(cat("run.cuda_graph = true (", from("run.cuda_graph"), ") cannot be combined with ", key,
                        " = true (", from(key), "), which needs every op launched on its own"));
  }
  if (c.data.packing && causal_task)
    throw Error(cat("data.packing = true (", from("data.packing"), ") packs the bert tasks' short examples; "
                    "run.task = clm (", from("run.task"), ") rows are full windows, with nothing to pack"));
  if (c.run.mode == "predict" && c.data.eval.empty())
    throw Error(cat("run.mode = predict (", from("run.mode"),
                    ") requires data.eval (the examples to predict); set it with --data.eval=PATH"));
  if (c.generate.tokenizer == "gpt2" && c.generate.vocab_dir.empty()) {
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
    if (c.run.mode == "generate" && !std::filesystem::is_regular_file(c.generate.prompts_file, ec))
      throw Error(cat("generate.prompts_file = '", c.generate.prompts_file, "' (",
                      from("generate.prompts_file"), "): file not found"));
  }
  if (c.train.schedule_steps > 0 && c.train.schedule_steps <= c.train.warmup_steps && c.train.schedule != "constant")
    throw Error(cat("train.schedule_steps = ", c.train.schedule_steps, " (", from("train.schedule_steps"),
                    ") must exceed train.warmup_steps = ", c.train.warmup_steps, " (", from("train.warmup_steps"),
                    "): the ", c.train.schedule, " decay would never start"));
  if (c.run.mode == "predict" && (c.run.task == "clm" || c.run.task == "mlm"))
    throw Error(cat("run.mode = predict (", from("run.mode"), ") writes the predictions of run.task = doc_cls, "
                    "pair_cls, ner or qa, not run.task = ", c.run.task, " (", from("run.task"),
                    "): use run.mode = eval for its loss", c.run.task == "clm" ? ", run.mode = generate for text" : ""));
  if (c.train.epochs > 0 && c.is_set("train.steps"))
    throw Error(cat("train.epochs = ", c.train.epochs, " (", from("train.epochs"), ") and train.steps = ",
                    c.train.steps, " (", from("train.steps"), ") are both set; give one of them"));
  if (c.generate.tokenizer == "ids" && c.train.sample_interval > 0)
    throw Error(cat("train.sample_interval = ", c.train.sample_interval, " (", from("train.sample_interval"),
                    ") samples from generate.prompt, which generate.tokenizer = ids (",
                    from("generate.tokenizer"), ") cannot encode; use byte or gpt2, or run.mode = generate"));
  if (c.generate.tokenizer == "ids" && c.run.mode == "generate" && c.generate.prompts_file.empty())
    throw Error(cat("generate.tokenizer = ids (", from("generate.tokenizer"),
                    ") takes its prompts from generate.prompts_file (lines with \"prompt_ids\", written by "
                    "tools/encode_prompts.py); set generate.prompts_file"));
  if (c.reads_train() && c.data.train.empty())
    throw Error(cat("run.mode = ", c.run.mode, " (", from("run.mode"),
                    ") requires data.train (an HDF5 dataset); set it in the INI file or with "
                    "--data.train=PATH (see --help)"));
  if (c.run.mode == "eval" && c.data.eval.empty())
    throw Error(cat("run.mode = eval (", from("run.mode"),
                    ") requires data.eval (an HDF5 dataset); set it in the INI file or with "
                    "--data.eval=PATH (see --help)"));
  return result;
}

bool is_path_key(const std::string& key) {
  static const std::set<std::string> kPathKeys = {"model.weights", "data.train", "data.eval",
                                                  "output.dir", "generate.prompts_file",
                                                  "generate.vocab_dir"};
  return kPathKeys.count(key) > 0;
}

std::string gpt2_vocab_dir(const Config& c) {
  if (!c.generate.vocab_dir.empty()) return c.generate.vocab_dir;
  const std::filesystem::path p = std::filesystem::path(c.model.weights).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

}  // namespace nlp
