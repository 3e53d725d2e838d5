// The schema table: every configuration key once (name and field, validation, help), the lists of
// allowed choices, and which model type each key belongs to.
#include "config/config_schema.h"

#include <algorithm>
#include <set>

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
       "the CPU has AMX-BF16 (measured faster than fp32 there), else emulate, also on AVX512-BF16 "
       "without AMX (native measured 2.1x slower than fp32 there), with a warning: slower than fp32 "
       "(the log line 'backend cpu: ... bf16:' says which and why)"},
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
       "parameters for their duration; on cuda through comm.gpu = nccl or staged, not yet run on a GPU "
       "(docs/gpu.md); checkpoints hold the full state at every stage"},
      {KEY(train, zero_prefetch), ge(0),
       "train.zero = 3: the blocks whose parameter all-gather is started ahead of their use (the next ones "
       "in the forward, the previous ones in the backward), each in its own block buffer, so that it runs "
       "while the current block computes (MPI's communication thread, NCCL's communication stream; through "
       "the staged communicator the gathers are blocking); 0 = each block gathered when it is needed"},
      {KEY(train, offload), one_of(kOffload),
       "optimizer = this rank's fp32 master weights and AdamW m and v (its shard with train.zero = 1) live in "
       "host memory (page-locked on cuda): each step copies the shard's gradients to the host, runs a "
       "multithreaded host AdamW (bitwise the cpu backend's) and copies the updated weights back (on cuda "
       "in chunks on a copy stream, overlapping the host AdamW; not yet run on a GPU, docs/gpu.md); the "
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

// A key set explicitly that the model type does not use is an error (a GPT-2 key given to BERT
// would otherwise be silently ignored), naming BERT's or GPT-2's name for it.
// Keys owned by "bert" serve every encoder on BERT's block (bert, roberta, electra).
bool key_applies(const std::string& owner, const std::string& type) {
  return owner.empty() || owner == type || (owner == "bert" && (type == "roberta" || type == "electra"));
}

}  // namespace nlp::cfg

namespace nlp {

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

bool is_path_key(const std::string& key) {
  static const std::set<std::string> kPathKeys = {"model.weights", "data.train", "data.eval",
                                                  "output.dir", "generate.prompts_file",
                                                  "generate.vocab_dir"};
  return kPathKeys.count(key) > 0;
}

}  // namespace nlp
