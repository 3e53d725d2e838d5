// Batches for every task: from the dataset's columns to what the model's loss needs, then to backend
// memory. CLM: targets shifted (target[t] = label[t+1]; the last position takes the label after the
// window, -100 for 2-D rows), as HF shifts inside the loss. MLM: dynamic masking when the dataset has
// no labels (15% of real tokens; of those 80% [MASK], 10% a random token, 10% unchanged), seeded.
// MLM also lists the masked positions (rows), the only ones its head scores.
// NER: token labels as given, and (rows) the labelled positions, the only ones its training loss
// reads. doc_cls/pair_cls: sequence labels. QA: start/end positions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/backend.h"
#include "io/dataset.h"
#include "model/model.h"
#include "model/task.h"

namespace nlp {

struct HostBatch {
  int B = 0, T = 0;
  int T_key = 0;             // the file's row length (T until trim_to_longest cuts T below it)
  int64_t real_tokens = 0;   // positions with attention_mask 1 (the rest is padding)
  std::vector<int32_t> ids, mask, targets, type_ids;  // [B,T]
  std::vector<int32_t> labels, start, end;            // [B]
  std::vector<int32_t> rows, row_targets;  // mlm, ner: positions with a target, and the targets
  // Packed (pack_rows): B rows hold E examples; mask holds segment ids (1, 2, ... per row, 0 =
  // padding), pos the position ids (restarting in each example), token_key the dropout key of each
  // token (example * T_key + position: its place in the padded batch); per example e < E: first[e] =
  // the flat position (row * T + offset) of its first token, length[e] its positions. labels,
  // start, end stay per example (start/end relative to the example); with pack_rows' fixed_per_row the
  // examples after the real ones are ignored fillers. Unpacked: E = 0, all empty.
  int E = 0;
  std::vector<int32_t> pos, token_key, first, length;
  // Packed: attention may run the E examples as ragged sequences (cuDNN), which needs the activation
  // arena carved for max(B, E) rows. False for rows given by a PackedSampler (data.pack_batch = rows):
  // a fixed B x T for the whole run, whose examples outnumber the rows the arena is carved for; their
  // block-diagonal mask then serves (one cuDNN graph for the run).
  bool ragged = true;
  bool has_padding = false;  // any mask value 0 (else the mask is not passed to attention)
  // Number of loss terms (the loss is their mean): target tokens (clm, mlm, ner), labelled
  // sequences (doc_cls, pair_cls), or questions (qa).
  int64_t loss_units(Task task) const;
};

// Special token ids for MLM masking (dataset root attributes mask_id, cls_id, sep_id, pad_id).
struct MlmSpec {
  int32_t mask_id = -1, cls_id = -1, sep_id = -1, pad_id = -1;
  int vocab_size = 0;
  float probability = 0.15f;
};
// Reads the special ids from the dataset's attributes; an error names the file and attribute.
MlmSpec read_mlm_spec(const TokenDataset& ds, int vocab_size);

// mlm may be null unless task is mlm and the dataset has no labels; seed drives the masking.
HostBatch make_batch(Task task, const TokenBatch& tb, const MlmSpec* mlm, uint64_t seed);

// data.padding = longest: cut every [B,T] column to the batch's longest row (one past its last
// attention_mask 1, and past every position that carries a target or an answer position), rounded
// up to a multiple of `multiple` and at most T. Rows (mlm, ner) are renumbered b*T'+t. The cut
// positions are padding of every row: masked out of attention and of every loss except qa's
// (backend.h), so the model computes the same outputs at the kept positions. T_key keeps the file's T
// (dropout keys).
void trim_to_longest(HostBatch& hb, int multiple);

// data.packing: the B examples of the batch share rows, several to a row: first-fit of the examples
// longest first (ties by index), each keeping positions 0..len-1 of its own (len: its attention_mask
// ones). Segment ids number the examples of a row from 1 in the order placed; the tail of a row is
// padding (0). Rows (mlm, ner) are renumbered. The rows are the file's length T when multiple == 0
// (one shape for every step, as CUDA graphs want), else the multiple of `multiple` between the longest
// example and T that packs into the fewest positions (rows x length). Throws when an example's mask
// is not ones then zeros, when a target or answer lies in its padding, or when it has no token.
// rows_of (data.pack_batch = rows): the row of each example, in [0, rows), as PackedSampler planned
// it; the examples go into their rows in index order, there are `rows` rows, of the file's length T
// (multiple == 0) or of the longest row rounded up to `multiple`, and the batch is not ragged.
// fixed_per_row > 0 (rows given; data.pack_fixed_examples, with data.pack_max_per_row): E is
// rows x min(fixed_per_row, row length), the examples after the real ones ignored (labels, start,
// end -100; each one position long, at a position where no example starts), so that the heads run
// one shape at every step when the rows keep the file's length: the same losses and gradients.
void pack_rows(HostBatch& hb, int multiple, const std::vector<int32_t>* rows_of = nullptr, int rows = 0,
               int fixed_per_row = 0);

// ner with data.pack_fixed_examples: the head scores every position of the rows (those without a
// label ignored, as in evaluation) instead of the labelled positions only (rows, row_targets
// cleared), so that the step's shape does not follow its count of labelled tokens: the same loss and
// gradient (the same dropout keys; fp32 rounding of the last block's other row count at most).
void score_every_position(HostBatch& hb);

// RoBERTa's position ids [B,T] (transformers' create_position_ids_from_input_ids): pad + the running
// count of the tokens that are not `pad` in each example (restarting where a packed example starts,
// hb.pos 0), pad at a pad token.
std::vector<int32_t> count_positions(const HostBatch& hb, int pad);

// data.pad_multiple = 0 (auto): 1 on the cpu, where a shape costs nothing but its work; on cuda 64
// with cuDNN's attention, whose graphs are built per batch length (about a second of host time each
// on an H100, where a fine-tuning step takes milliseconds: two lengths at T = 128 instead of
// sixteen), else 8 (bounds the GEMM shapes).
inline int auto_pad_multiple(bool cuda, bool cudnn_attention) {
  return !cuda ? 1 : cudnn_attention ? 64 : 8;
}

// Packed rows keep the file's length on the cuda backend with model.attention = cudnn, unless
// data.pad_multiple is set: cuDNN's graphs of packed rows depend on the row length (the ragged
// layout on nothing else but the examples per micro-batch), and each build costs about a second of
// host time on an H100 (a BERT-base step there takes milliseconds), so one length means one graph
// for the run. Ragged attention computes no padding, so the longer rows cost little.
inline bool packs_full_rows(const Config& cfg, bool cuda) {
  return cuda && cfg.attention() == AttentionImpl::Cudnn && !cfg.is_set("data.pad_multiple");
}

// The `multiple` pack_rows gets from the configuration (cuda: the run's backend is cuda): 0 (rows of
// the file's length) with data.padding = max_length or where packs_full_rows, else data.pad_multiple
// but at least kPackRowMultiple. The row count varies from step to step as well, and every distinct
// rows x length is one more GEMM shape (the CPU's bf16 GEMMs build a oneDNN primitive per shape, a JIT
// compilation each): lengths in steps of 16 keep the shapes about as few as a length-grouped run's,
// for a few positions of padding per row.
constexpr int kPackRowMultiple = 16;
inline int packing_multiple(const Config& cfg, bool cuda) {
  if (cfg.padding() == Padding::MaxLength || packs_full_rows(cfg, cuda)) return 0;
  return std::max(cfg.data.pad_multiple, kPackRowMultiple);
}

// The training example order of this configuration (the trainer's, and train.epochs' count of
// packed steps): data.shuffle and train.seed, and with data.group_by_length (lengths non-null)
// length groups of a whole optimizer step, world x B x A examples, in data.group_order.
Sampler train_sampler(const Config& cfg, int64_t num_examples, int B, int A, int rank, int world,
                      const std::vector<int32_t>* lengths);

// data.packing with data.pack_batch = rows (train.batch_size counts rows).
inline bool packs_by_rows(const Config& cfg) { return cfg.data.packing && cfg.pack_batch() == PackBatch::Rows; }

// Backend copies of one batch.
class DeviceBatchBuffer {
 public:
  // mc: a RoBERTa (model.type = roberta) gets its position ids with every batch (count_positions).
  explicit DeviceBatchBuffer(Backend& be, const ModelConfig* mc = nullptr)
      : be_(be), count_pad_(mc && mc->model_type() == ModelType::Roberta ? mc->pad_token_id : -1) {}
  ~DeviceBatchBuffer();
  DeviceBatch upload(const HostBatch& hb);

 private:
  Backend& be_;
  int count_pad_ = -1;  // >= 0: DeviceBatch::pos holds count_positions(hb, count_pad_)
  int32_t* buf_ = nullptr;   // backend memory, cap_ int32s
  int32_t* host_ = nullptr;  // its host staging (Backend::host_alloc: page-locked on GPUs), cap_ int32s
  size_t cap_ = 0;
};

}  // namespace nlp
