// The model interface the trainer drives. GPT-2 (gpt2.cpp) implements it on the shared transformer
// block; BERT and its heads will implement the same interface.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/backend.h"
#include "core/error.h"
#include "io/h5.h"
#include "model/params.h"

namespace nlp {

// A batch in backend memory. targets are already aligned with positions (for CLM: shifted).
struct DeviceBatch {
  int B = 0, T = 0;
  // The row length the examples were stored with (the dataset's): a batch trimmed to its longest
  // row (data.padding = longest) has T < T_key, and dropout masks are keyed at (example, position)
  // of the T_key layout, so trimming changes no mask. 0 = T.
  int T_key = 0;
  const int32_t* ids = nullptr;       // [B,T]
  const int32_t* mask = nullptr;      // [B,T] key padding mask (1 keep, 0 pad); nullable
  const int32_t* targets = nullptr;   // [B,T] token targets (clm, mlm, ner; -100 = ignore)
  const int32_t* type_ids = nullptr;  // [B,T] token types (bert)
  const int32_t* labels = nullptr;    // [B] sequence labels (doc_cls, pair_cls)
  const int32_t* start = nullptr;     // [B] answer start positions (qa)
  const int32_t* end = nullptr;       // [B] answer end positions (qa)
  // mlm, ner: the flat positions b*T+t whose target is not -100, in order, and their targets
  // [nrows]. The MLM head scores only these rows (the others do not enter the loss), and so does the
  // NER head in training (evaluation and prediction score every row). row_keys [nrows]: their
  // dropout keys (example * T_key + position, backend.h DropRows; nullable: the model then computes
  // its last block at every position rather than at these rows only).
  const int32_t* rows = nullptr;
  const int32_t* row_targets = nullptr;
  const int32_t* row_keys = nullptr;
  int nrows = 0;
  // Packed rows (data.packing): E examples in the B rows; mask holds segment ids (0 = padding;
  // attention stays within a segment, backend.h), pos the position ids [B,T], first [E] the flat
  // position b*T+t of each example's first token ([CLS]), length [E] its positions (qa's
  // per-example softmax); first_host: first in host memory.
  // Unpacked: E = 0 (one example per row), pos/first null.
  // token_key [B,T]: each token's dropout key, example * T_key + position (backend.h DropRows), so
  // that a packed batch draws the padded batch's masks.
  int E = 0;
  // Packed: whether attention may take the E examples as ragged sequences (HostBatch::ragged): the
  // arena must then fit max(B, E) rows. Rows planned by a PackedSampler are not ragged.
  bool ragged = true;
  int attention_examples() const { return E > 0 && ragged ? E : 0; }
  const int32_t* pos = nullptr;
  // pos holds RoBERTa's position ids (DeviceBatchBuffer with a roberta ModelConfig: pad_token_id +
  // the running count of non-pad tokens per example, packed or not) rather than packing's 0-based ones
  bool pos_counted = false;
  const int32_t* token_key = nullptr;
  const int32_t* first = nullptr;
  const int32_t* length = nullptr;  // [E] each example's positions (qa's per-example softmax)
  const int32_t* first_host = nullptr;
  // cls_rows [2E]: each example's first flat position (b*T unpacked, first[e] packed), then its
  // dropout key e * T_key, for the heads that read one row per example (doc_cls, pair_cls). Part of
  // the batch's one upload (DeviceBatchBuffer); nullable: the model then copies them itself, which on
  // a GPU is one more synchronising copy per forward.
  const int32_t* cls_rows = nullptr;
  int examples() const { return E > 0 ? E : B; }
};

// DeviceBatch::cls_rows of E examples into out[2E]: out[e] = example e's first flat position
// (first[e] packed, else e * T), out[E + e] = its dropout key e * key_len (key_len: the T_key layout's
// row length, core/rng.h key_length).
inline void fill_cls_rows(int32_t* out, int E, int T, int key_len, const int32_t* first) {
  for (int e = 0; e < E; ++e) {
    out[e] = first ? first[e] : e * T;
    out[E + e] = e * key_len;
  }
}

// A named output of the last forward (backend memory), e.g. "logits" [B,T,V].
struct OutputView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// The losses a forward leaves in backend memory: the batch's loss sum is scale * sum(x[0..n)) (scale
// 0.5 for qa, the mean of its start and end losses); n = 0 when the batch has no targets (sum 0).
struct LossTerms {
  const float* x = nullptr;
  size_t n = 0;
  double scale = 1.0;
};
// Their sum read back (host double), or added to acc[0] in backend memory (Backend::sum_into), with
// the same arithmetic.
inline double loss_sum(Backend& be, const LossTerms& t) { return t.n ? t.scale * be.sum(t.x, t.n) : 0.0; }
inline void add_loss_sum(Backend& be, double* acc, const LossTerms& t) {
  if (t.n) be.sum_into(acc, t.x, t.n, t.scale);
}

class Model {
 public:
  virtual ~Model() = default;
  virtual ParamStore& params() = 0;
  virtual const ModelConfig& config() const = 0;
  // Writes model_type and the HF config names as root attributes.
  virtual void write_attrs(h5::File& f) const = 0;
  // Initialise from scratch, seeded (HF's initialisation scheme).
  virtual void init_weights(uint64_t seed) = 0;
  // Forward; returns the SUM of per-token losses over targets != -100 (host double: on a GPU a read
  // back, which waits for the forward to finish).
  virtual double forward(const DeviceBatch& b, bool training, uint64_t seed) = 0;
  // The same forward, adding that sum to *loss_acc (one double in backend memory) instead of reading
  // it back, so that a GPU goes on into the backward: the trainer reads a step's sum once, after it.
  // loss_acc then holds, bitwise, what `*loss_acc += forward(b, training, seed)` would.
  virtual void forward_into(const DeviceBatch& b, bool training, uint64_t seed, double* loss_acc) = 0;
  // Backward of dloss * (sum of losses) through the last forward, accumulating into params().grad().
  virtual void backward(const DeviceBatch& b, float dloss, bool training, uint64_t seed) = 0;
  virtual const float* logits() const = 0;  // [B,T,V] of the last forward (backend memory)
  // Every output of the last forward: logits (clm [B,T,V]; mlm [nrows,V], the masked positions only;
  // doc_cls/pair_cls [B,NL]; ner [B,T,NL]) or start/end logits (qa [B,T] each).
  virtual std::vector<OutputView> outputs() const = 0;
  // Parameters that may be absent from a weights file and keep their fresh initialisation
  // (a task head or pooler when fine-tuning an encoder). Others are required.
  virtual bool may_be_new(const std::string& name) const { (void)name; return false; }
  // transformers' base_model_prefix with its dot ("bert.", "transformer."): the parameters of the
  // base model start with it; a base-model checkpoint (BertModel, GPT2Model) stores them without it.
  virtual std::string base_prefix() const = 0;
  // train.recompute = block (true): keep only each transformer block's input and recompute the
  // block's forward just before its backward; gradients are bitwise the same, activations smaller.
  virtual void set_recompute(bool on) = 0;
  // true: the last transformer block computes every position, as transformers does. The default
  // (false) lets a model compute it at the positions its head reads only (BERT's doc_cls, pair_cls
  // and mlm heads, and ner's in training: block.h OutRows); losses, gradients and the outputs at
  // those positions are the same to fp32 rounding (ner's training outputs are then [nrows, NL]).
  virtual void set_last_block_all_rows(bool on) { (void)on; }
  // The rows the last block computed after its attention in the last forward; 0 = every row.
  virtual int last_block_rows() const { return 0; }
  // Carve the activation arena for batches of up to B rows x T positions now, once: a later batch
  // of that size or smaller (trimmed to its longest row, or an evaluation's partial last batch)
  // reuses it without reallocating. A larger batch grows it.
  virtual void reserve(int B, int T) = 0;
  // Bytes of activations needed for a batch of B x T (for the memory report), as set_recompute says.
  virtual size_t activation_bytes(int B, int T) const = 0;
  // The part of activation_bytes that the LM head's logits take (GPT-2: [B*T, V] logits and their
  // gradient, or the fused head's chunk), and whether the head is fused; 0 for a model without one.
  virtual size_t lm_head_bytes(int B, int T, bool* fused) const {
    (void)B, (void)T;
    if (fused) *fused = false;
    return 0;
  }
  // Training FLOPs per token at sequence length T: 6 x (parameters used in matrix products, i.e. not
  // the embedding tables, except a tied output head) + 12 x layers x T x width for attention.
  virtual double flops_per_token(int T) const = 0;
  virtual int num_layers() const = 0;
  virtual int width() const = 0;

  // Called by backward() as soon as the gradients at offsets [lo, params().total()) of the gradient
  // arena are final for this backward (after the head, after each block in reverse order, after the
  // embeddings with lo = 0): the overlapped gradient reduction (comm/grad_reducer.h) starts their sum
  // while the earlier blocks' backward runs. On GPU backends "final" means "queued on the stream".
  // lo only decreases within one backward; an empty hook is not called.
  // train.zero = 3: `hook(l)` runs just before transformer block l's parameters are read, in the
  // forward, a recomputed forward and the backward (train/param_shards.h gathers them there); an
  // empty hook unsets it. A model without transformer blocks run this way refuses it.
  virtual void set_block_hook(std::function<void(int)> hook) {
    (void)hook;
    throw Error("train.zero = 3 is not available for this model (its blocks cannot be gathered one at a time)");
  }
  using GradReadyHook = std::function<void(size_t lo)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  // train.zero = 3 (train/param_shards.h): the tensors outside the blocks whose weights each backward
  // stops reading before it first writes their gradient, so that one buffer can hold the weights in
  // the forward and the gradient in the backward (GPT-2: the tied wte, unless the fused head reads it
  // while writing its gradient, and wpe; BERT: its three embedding tables, the word embeddings also
  // the tied MLM decoder's weight). With the hook set, the model calls hook(i, false) before a
  // forward first reads tensor i and hook(i, true) at that point of the backward (at least once per
  // backward; a second call does nothing).
  virtual std::vector<int> weights_then_grads() const { return {}; }
  using WeightsHook = std::function<void(int tensor, bool done)>;
  void set_weights_hook(WeightsHook hook) { weights_hook_ = std::move(hook); }

 protected:
  void weights_needed(int tensor) {
    if (weights_hook_) weights_hook_(tensor, false);
  }
  void weights_done(int tensor) {
    if (weights_hook_) weights_hook_(tensor, true);
  }
  // A head whose weights w[N,K] (OutIn) are a weights-then-gradients tensor (the tied LM / MLM
  // decoder): dinp[M,K] = dout @ w, dw (+ dbias) += dout^T @ inp. With the weights hook set
  // (train.zero = 3: one buffer holds w, then dw) the input gradient runs first, the buffer turns
  // (weights_done), then the weight gradient: the same two products as the one call without it.
  void tied_weights_backward(Backend& be, int tensor, Act dinp, float* dw, float* dbias, CAct dout, CAct inp,
                             const float* w, int M, int K, int N) {
    if (!weights_hook_) {
      be.matmul_backward(dinp, dw, dbias, dout, inp, w, M, K, N, WLayout::OutIn);
      return;
    }
    be.matmul_backward(dinp, nullptr, nullptr, dout, inp, w, M, K, N, WLayout::OutIn);
    weights_done(tensor);
    be.matmul_backward(Act{}, dw, dbias, dout, inp, nullptr, M, K, N, WLayout::OutIn);
  }
  WeightsHook weights_hook_;
  void grads_ready(size_t lo) {
    if (grad_ready_) grad_ready_(lo);
  }
  GradReadyHook grad_ready_;
};

// Incremental decoding with a KV cache (GPT-2).
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Feed one token per sequence at position pos (0-based); returns logits [B,V] on the host.
  virtual const std::vector<float>& step(const std::vector<int32_t>& tokens, int pos) = 0;
  virtual int max_positions() const = 0;
};

// Model config from the run config, or from the weights file's root attributes when model.weights
// is set (then model keys given explicitly in the INI must agree, else an error naming both).
ModelConfig resolve_model_config(const Config& cfg);

// The label count of a classifier task (doc_cls, pair_cls, ner) and where it came from (for the
// log): from the classifier in model.weights when it has one (model.num_labels and the dataset must
// agree, else an error naming both values), else model.num_labels, or the dataset's when that is 0.
// With model.reinit_mismatched a classifier of another size is not an error: `reinit` is then set and
// the head is initialised anew (load_model_weights skips the tensors of the wrong shape).
struct NumLabels {
  int n = 0;
  std::string source;
  bool reinit = false;
};
NumLabels resolve_num_labels(const Config& cfg, const ModelConfig& mc);

// Label names of a classifier task with mc.num_labels labels: the id2label attribute (JSON list) of
// the dataset (data.train when the mode trains, data.eval for eval and predict; each falling back to
// the other when empty), else that of model.weights when it has mc.num_labels
// names; empty when neither has them. `source` says which (for the log).
std::vector<std::string> resolve_label_names(const Config& cfg, const ModelConfig& mc, std::string* source);

// allocate = false: the parameter table only, no arenas (for the memory plan: params().total() and
// activation_bytes() work; nothing else may be called).
std::unique_ptr<Model> make_model(const ModelConfig& mc, Backend& be, const std::string& task = "clm",
                                  bool allocate = true);
std::unique_ptr<Decoder> make_decoder(Model& m, Backend& be, int B);
// Bytes make_decoder(m, be, B) allocates (its KV cache and buffers); 0 for a model without a decoder.
size_t decoder_bytes(const Model& m, int B);

}  // namespace nlp

namespace nlp {
// Load model.weights into the model's parameters (HF names and shapes validated).
// `unused`: datasets in the file the model does not use (tied heads and buffers are not reported);
// `fresh`: parameters absent from the file that keep their initialisation (Model::may_be_new).
// A file with no name under Model::base_prefix() is read as a base-model checkpoint (BertModel,
// GPT2Model: names without the prefix); `note` (nullable) then says so, for the log.
// The tokenizer of the model (ModelConfig::vocab_sha256, tokenizer_sha256, tokenizer_files): from the
// training dataset's root attributes of those names, else model.weights'. Checks that the data,
// the evaluation data and the weights were tokenised with the same vocabulary (vocab_sha256; an error
// naming both files otherwise) and that the datasets' vocab_size attribute is not larger than the
// model's (an error: ids would overflow); a smaller one returns a warning.
std::vector<std::string> resolve_tokenizer(const Config& cfg, ModelConfig& mc);
// Root attributes of the tokenizer, for the weights files nlptrain writes (none when unknown).
void write_tokenizer_attrs(h5::File& f, const ModelConfig& mc);

// `reinit` (nullable): with it, a tensor the model may initialise itself (Model::may_be_new: heads) whose
// shape in the file differs is skipped and listed there (model.reinit_mismatched) instead of an error.
void load_model_weights(Model& m, const std::string& path, std::vector<std::string>* unused,
                        std::vector<std::string>* fresh, std::string* note = nullptr,
                        std::vector<std::string>* reinit = nullptr);
}  // namespace nlp
