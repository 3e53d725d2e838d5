// Token datasets in HDF5 with Hugging Face column names. Two layouts:
//   2-D:    input_ids [N,T] int32, optional attention_mask [N,T] int32 (0/1), labels [N,T] int32 (-100 = ignore)
//   stream: tokens [L] int32, cut into N = (L-1)/T windows of T+1 tokens: window i = tokens[i*T, i*T+T+1)
// Reads go through hyperslabs, a few rows at a time, unless the file is small enough to be held in
// memory (hold_in_memory, data.cache_mb): fine-tuning sets are, and a batch is then a copy of its rows.
// Every value read is validated (ids in [0, vocab), labels in [0, vocab) or -100, mask 0/1) and a bad
// value is an error naming the file, column, example index and value.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/h5.h"

namespace nlp {

// BERT task columns (2-D layout only), all int32:
//   token_type_ids [N,T] (segment ids, 0 when absent), labels [N] (sequence classification) instead of
//   [N,T], start_positions / end_positions [N] (extractive QA, token positions in [0,T)).

// A batch of n examples of length T, host memory, row-major [n,T].
struct TokenBatch {
  int n = 0, T = 0;
  std::vector<int32_t> input_ids;       // [n,T]
  std::vector<int32_t> attention_mask;  // [n,T], all 1 when the file has none
  std::vector<int32_t> labels;          // [n,T], unshifted: = input_ids where the file has no
                                        // token-level labels
  bool token_labels = false;            // the file has token-level labels (else labels = input_ids)
  std::vector<int32_t> label_next;      // [n]: label of the position after the window
                                        // (stream: tokens[i*T+T]; 2-D: -100)
  std::vector<int32_t> token_type_ids;  // [n,T], 0 when the file has none
  std::vector<int32_t> seq_labels;      // [n], -100 when the file has no 1-D labels
  std::vector<int32_t> start_positions, end_positions;  // [n], -100 when absent
};

// Value ranges checked on read (0 = the default given).
struct DatasetLimits {
  int label_range = 0;  // token-level and sequence-level labels in [0, label_range); 0 = vocab_size
  int type_vocab = 2;   // token_type_ids in [0, type_vocab)
  std::string type_note;  // appended to the message of a token type out of range (the model's rule)
  std::string label_key;  // what sets label_range, for messages ("model.num_labels = 2 (command line)")
};

class TokenDataset {
 public:
  // Opens and validates layout, dtypes and shapes. `seq_len` is the window length for stream
  // datasets; for 2-D datasets it must be 0 or equal to the stored T (else an error).
  TokenDataset(const std::string& path, int seq_len, int vocab_size, DatasetLimits limits = {});

  const h5::File& file() const { return file_; }  // for task attributes (num_labels, special ids)
  bool has_token_labels() const { return has_labels_; }
  bool has_seq_labels() const { return has_seq_labels_; }
  bool has_positions() const { return has_positions_; }

  const std::string& path() const { return path_; }
  int64_t size() const { return n_; }     // number of examples (rows or windows)
  int seq_len() const { return T_; }
  bool is_stream() const { return stream_; }

  // Read examples idx[0..count) (any order, each in [0, size())) into batch (resized).
  void read(const int64_t* idx, int count, TokenBatch& batch) const;

  // Reads every int32 column the dataset uses into memory when together they take at most max_bytes,
  // so that read() copies rows instead of asking HDF5 for each (a random row costs a chunk read
  // there); returns whether it did. Values are still checked by read(), as from the file.
  bool hold_in_memory(size_t max_bytes);
  bool in_memory() const { return !mem_.empty(); }
  size_t column_bytes() const;  // the int32 columns the dataset uses, in bytes

  // Each example's length: one past its last attention_mask position of 1 (T for files without a
  // mask and for token streams). Reads only the mask, in chunks, on the first call (for
  // data.group_by_length and the length-sorted evaluation, which asks at every evaluation).
  const std::vector<int32_t>& lengths() const;

  // Read and check every value of this rank's share of the examples (contiguous ranges, together the
  // whole file) with the checks of read(); throws naming the file, column, row and value. Called once
  // at start-up, so a bad value anywhere stops the run before the first step, not when it is reached.
  void validate(int rank, int world) const;

 private:
  std::string path_;
  h5::File file_;
  int64_t n_ = 0;
  int T_ = 0;
  int vocab_ = 0;
  bool stream_ = false;
  bool has_mask_ = false, has_labels_ = false;
  bool has_types_ = false, has_seq_labels_ = false, has_positions_ = false;
  DatasetLimits limits_;
  struct Column {
    std::vector<int32_t> values;
    size_t row_len = 1;  // values per row: the second dimension of a 2-D column, 1 for a 1-D one
  };
  std::map<std::string, Column> mem_;  // hold_in_memory: column name -> its values
  mutable std::vector<int32_t> lengths_;  // lengths(), once read

  // rows [row0, row0 + nrows) of column `name` (each row_len values) from memory or the file
  void read_rows(const char* name, int64_t row0, int64_t nrows, int32_t* out) const;
  std::vector<const char*> columns() const;  // the columns read() reads
};

// Deterministic example order for data parallel training.
// Global batch g (of size world*B) of epoch e takes positions [g*world*B, (g+1)*world*B) of a
// permutation of [0, N) seeded by (seed, e); rank r takes the r-th slice of B. Shuffling off: identity.
// One rank with batch world*B therefore sees exactly the examples that `world` ranks see together.
//
// Length-grouped order (data.group_by_length; `lengths` non-null, one per example), as HF's
// LengthGroupedSampler: the epoch's permutation is cut into mega-batches of M groups of `group`
// examples (the optimizer step's global batch, world x B x grad_accum; default world x B), M =
// min(50, max(1, N / (4 x group))) as HF's rule; each mega-batch is sorted longest first (stable:
// equal lengths keep their shuffled order) and cut into groups, so an optimizer step holds examples
// of similar length and trims to little padding. The groups then run
//   GroupOrder::LongestFirst (data.group_order = longest_first, the default): in that order, so each
//     mega-batch runs from its longest to its shortest examples, mega-batch after mega-batch (HF's
//     order; HF also swaps the epoch's longest example into the first step, to fail early on memory,
//     which nlptrain's memory plan does not need);
//   GroupOrder::Shuffled: in an order shuffled over the epoch (seeded), so lengths do not cycle.
// A group's micro-batches are consecutive slices of it; within a micro-batch rank r takes positions
// r, r + world, ...: every rank gets the same spread of lengths (none is always the longest shard),
// and an optimizer step is the same set of examples at any world size with the same global batch
// (resume at another world size keeps the order).
enum class GroupOrder { LongestFirst, Shuffled };
class Sampler {
 public:
  static constexpr int kMegaBatches = 50;  // at most, as HF's LengthGroupedSampler
  Sampler(int64_t num_examples, int batch_per_rank, int rank, int world, uint64_t seed,
          bool shuffle, const std::vector<int32_t>* lengths = nullptr, int64_t group = 0,
          GroupOrder order = GroupOrder::LongestFirst);
  // Optimizer steps per mega-batch of the length-grouped order (0 without lengths).
  int64_t mega_batch_steps() const;
  int64_t batches_per_epoch() const;  // full global batches per epoch (the remainder is dropped)
  // Example indices of this rank for global batch number `global_batch` counted from the start
  // of training (epochs roll over automatically).
  std::vector<int64_t> indices(int64_t global_batch) const;
  // The whole example order of `epoch` (the permutation that indices() slices; length-grouped when
  // lengths were given): PackedSampler cuts it into steps of packed rows.
  const std::vector<int64_t>& order(int64_t epoch) const;
  int64_t size() const { return n_; }

 private:
  int64_t n_;
  int B_, rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<int32_t> lengths_;  // empty: no length grouping
  int64_t group_ = 0;             // examples per length group (a multiple of world x B)
  GroupOrder order_ = GroupOrder::LongestFirst;
  void group_by_length(int64_t epoch) const;  // perm_ of `epoch` -> length-grouped (see above)
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace nlp
