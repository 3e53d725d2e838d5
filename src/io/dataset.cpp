// Token datasets (2-D input_ids/attention_mask/labels or a 1-D token stream) read by hyperslabs,
// and the deterministic data-parallel sampler.
#include "io/dataset.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace nlp {

namespace {

using h5::shape_str;

std::string join(const std::vector<std::string>& v) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + v[i];
  return r.empty() ? std::string("no datasets") : r;
}

void require_int32(const h5::File& f, const std::string& name) {
  h5::DType t = f.dtype(name);
  // A type outside the DType set (uint16, ...): the HDF5 layer's message names it precisely.
  if (t == h5::DType::Other) f.read_i32_rows(name, 0, 0, nullptr);
  if (t != h5::DType::I32)
    throw Error(cat("file '", f.path(), "': ", name, " has dtype ", h5::dtype_name(t),
                    ", expected int32"));
}

// Domain tag separating the shuffle stream from other streams derived from the run seed.
constexpr uint64_t kShuffleTag = 0x73687566666C6521ull;

}  // namespace

TokenDataset::TokenDataset(const std::string& path, int seq_len, int vocab_size, DatasetLimits limits)
    : path_(path), file_(h5::File::open_read(path)), vocab_(vocab_size), limits_(limits) {
  if (limits_.label_range <= 0) limits_.label_range = vocab_size;
  if (vocab_size < 1) throw Error(cat("file '", path, "': invalid vocab_size ", vocab_size));
  if (seq_len < 0) throw Error(cat("file '", path, "': invalid seq_len ", seq_len));
  if (file_.has("input_ids")) {
    stream_ = false;
    require_int32(file_, "input_ids");
    const auto shape = file_.shape("input_ids");
    if (shape.size() != 2)
      throw Error(cat("file '", path, "': input_ids has shape ", shape_str(shape),
                      ", expected 2-D [examples, seq_len]"));
    if (shape[0] < 1 || shape[1] < 1)
      throw Error(cat("file '", path, "': input_ids has shape ", shape_str(shape), ": no examples"));
    if (shape[1] > std::numeric_limits<int>::max())
      throw Error(cat("file '", path, "': input_ids rows of length ", shape[1], " are too long"));
    if (seq_len != 0 && seq_len != shape[1])
      throw Error(cat("file '", path, "': input_ids has sequence length ", shape[1], " but data.seq_len = ",
                      seq_len, " (use ", shape[1], " or 0)"));
    n_ = shape[0];
    T_ = static_cast<int>(shape[1]);
    for (const char* col : {"attention_mask", "labels", "token_type_ids"}) {
      if (!file_.has(col)) continue;
      require_int32(file_, col);
      const auto s = file_.shape(col);
      const std::string name = col;
      if (name == "labels" && s.size() == 1 && s[0] == shape[0]) {  // sequence classification
        has_seq_labels_ = true;
        continue;
      }
      if (s != shape)
        throw Error(cat("file '", path, "': ", col, " has shape ", shape_str(s),
                        ", expected the shape of input_ids ", shape_str(shape),
                        name == "labels" ? " (token labels) or [examples] (sequence labels)" : ""));
      (name == "labels" ? has_labels_ : name == "token_type_ids" ? has_types_ : has_mask_) = true;
    }
    const bool s_pos = file_.has("start_positions"), e_pos = file_.has("end_positions");
    if (s_pos != e_pos)
      throw Error(cat("file '", path, "': has ", s_pos ? "start_positions" : "end_positions",
                      " but not ", s_pos ? "end_positions" : "start_positions"));
    if (s_pos) {
      for (const char* col : {"start_positions", "end_positions"}) {
        require_int32(file_, col);
        if (file_.shape(col) != std::vector<int64_t>{shape[0]})
          throw Error(cat("file '", path, "': ", col, " has shape ", shape_str(file_.shape(col)),
                          ", expected [", shape[0], "]"));
      }
      has_positions_ = true;
    }
  } else if (file_.has("tokens")) {
    stream_ = true;
    require_int32(file_, "tokens");
    const auto shape = file_.shape("tokens");
    if (shape.size() != 1)
      throw Error(cat("file '", path, "': tokens has shape ", shape_str(shape), ", expected 1-D [length]"));
    if (seq_len < 1)
      throw Error(cat("file '", path, "': a token stream needs seq_len >= 1 (got ", seq_len, ")"));
    const int64_t L = shape[0];
    T_ = seq_len;
    n_ = L >= 1 ? (L - 1) / T_ : 0;
    if (n_ < 1)
      throw Error(cat("file '", path, "': tokens has ", L, " tokens, fewer than one window of seq_len + 1 = ",
                      static_cast<int64_t>(T_) + 1));
  } else {
    throw Error(cat("file '", path, "': no 'input_ids' (2-D) or 'tokens' (stream) dataset; the file has: ",
                    join(file_.list())));
  }
}

void TokenDataset::read(const int64_t* idx, int count, TokenBatch& batch) const {
  if (count < 0) throw Error(cat("file '", path_, "': negative example count ", count));
  for (int k = 0; k < count; ++k)
    if (idx[k] < 0 || idx[k] >= n_)
      throw Error(cat("file '", path_, "': example index ", idx[k], " is out of range for ", n_,
                      " examples"));
  const size_t T = static_cast<size_t>(T_);
  const size_t total = static_cast<size_t>(count) * T;
  batch.n = count;
  batch.T = T_;
  batch.input_ids.resize(total);
  batch.attention_mask.resize(total);
  batch.labels.resize(total);
  batch.token_labels = has_labels_;
  batch.label_next.resize(static_cast<size_t>(count));
  batch.token_type_ids.assign(total, 0);
  batch.seq_labels.assign(static_cast<size_t>(count), -100);
  batch.start_positions.assign(static_cast<size_t>(count), -100);
  batch.end_positions.assign(static_cast<size_t>(count), -100);

  std::vector<int32_t> buf;
  int k = 0;
  while (k < count) {
    // Coalesce a run of consecutive indices into one hyperslab read.
    int run = 1;
    while (k + run < count && idx[k + run] == idx[k] + run) ++run;
    const int64_t first = idx[k];
    if (stream_) {
      // Windows first..first+run-1 cover tokens [first*T, (first+run)*T + 1).
      const int64_t t0 = first * T_;
      const int64_t len = static_cast<int64_t>(run) * T_ + 1;
      buf.resize(static_cast<size_t>(len));
      read_rows("tokens", t0, len, buf.data());
      for (int64_t j = 0; j < len; ++j) {
        const int32_t v = buf[static_cast<size_t>(j)];
        if (v < 0 || v >= vocab_)
          throw Error(cat("file '", path_, "': tokens[", t0 + j, "] (window ", first + std::min<int64_t>(j / T_, run - 1),
                          ") = ", v, " is out of range for vocab_size ", vocab_));
      }
      for (int r = 0; r < run; ++r) {
        const size_t dst = static_cast<size_t>(k + r) * T;
        const int32_t* src = buf.data() + static_cast<size_t>(r) * T;
        std::copy(src, src + T, batch.input_ids.begin() + dst);
        std::copy(src, src + T, batch.labels.begin() + dst);
        std::fill(batch.attention_mask.begin() + dst, batch.attention_mask.begin() + dst + T, 1);
        batch.label_next[static_cast<size_t>(k + r)] = src[T];
      }
    } else {
      const size_t dst = static_cast<size_t>(k) * T;
      const size_t len = static_cast<size_t>(run) * T;
      int32_t* ids = batch.input_ids.data() + dst;
      read_rows("input_ids", first, run, ids);
      for (size_t j = 0; j < len; ++j)
        if (ids[j] < 0 || ids[j] >= vocab_)
          throw Error(cat("file '", path_, "': input_ids[row ", first + static_cast<int64_t>(j / T), ", pos ",
                          j % T, "] = ", ids[j], " is out of range for vocab_size ", vocab_));
      int32_t* mask = batch.attention_mask.data() + dst;
      if (has_mask_) {
        read_rows("attention_mask", first, run, mask);
        for (size_t j = 0; j < len; ++j)
          if (mask[j] != 0 && mask[j] != 1)
            throw Error(cat("file '", path_, "': attention_mask[row ", first + static_cast<int64_t>(j / T),
                            ", pos ", j % T, "] = ", mask[j], " is not 0 or 1"));
      } else {
        std::fill(mask, mask + len, 1);
      }
      int32_t* lab = batch.labels.data() + dst;
      if (has_labels_) {
        read_rows("labels", first, run, lab);
        for (size_t j = 0; j < len; ++j)
          if (lab[j] != -100 && (lab[j] < 0 || lab[j] >= limits_.label_range))
            throw Error(cat("file '", path_, "': labels[row ", first + static_cast<int64_t>(j / T), ", pos ",
                            j % T, "] = ", lab[j], " is out of range [0, ", limits_.label_range,
                            ") (and is not -100)", limits_.label_key.empty() ? "" : cat(" of ", limits_.label_key)));
      } else {
        std::copy(ids, ids + len, lab);
      }
      if (has_types_) {
        int32_t* tt = batch.token_type_ids.data() + dst;
        read_rows("token_type_ids", first, run, tt);
        for (size_t j = 0; j < len; ++j)
          if (tt[j] < 0 || tt[j] >= limits_.type_vocab)
            throw Error(cat("file '", path_, "': token_type_ids[row ", first + static_cast<int64_t>(j / T),
                            ", pos ", j % T, "] = ", tt[j], " is out of range for type_vocab_size ",
                            limits_.type_vocab, limits_.type_note));
      }
      auto read_col = [&](const char* col, std::vector<int32_t>& out, int lo, int hi) {
        int32_t* p = out.data() + k;
        read_rows(col, first, run, p);
        for (int j = 0; j < run; ++j)
          if (p[j] != -100 && (p[j] < lo || p[j] >= hi))
            throw Error(cat("file '", path_, "': ", col, "[", first + j, "] = ", p[j],
                            " is out of range [", lo, ", ", hi, ")"));
      };
      if (has_seq_labels_) {
        try {
          read_col("labels", batch.seq_labels, 0, limits_.label_range);
        } catch (const Error& e) {
          if (limits_.label_key.empty()) throw;
          throw Error(cat(e.what(), " of ", limits_.label_key));
        }
      }
      if (has_positions_) {
        read_col("start_positions", batch.start_positions, 0, T_);
        read_col("end_positions", batch.end_positions, 0, T_);
        for (int j = 0; j < run; ++j) {
          const int32_t a = batch.start_positions[static_cast<size_t>(k + j)];
          const int32_t b = batch.end_positions[static_cast<size_t>(k + j)];
          if ((a == -100) != (b == -100) || b < a)
            throw Error(cat("file '", path_, "': end_positions[", first + j, "] = ", b,
                            " and start_positions[", first + j, "] = ", a,
                            " are not an answer span (the end must be at or after the start)"));
        }
      }
      for (int r = 0; r < run; ++r) batch.label_next[static_cast<size_t>(k + r)] = -100;
    }
    k += run;
  }
}

std::vector<const char*> TokenDataset::columns() const {
  if (stream_) return {"tokens"};
  std::vector<const char*> c{"input_ids"};
  if (has_mask_) c.push_back("attention_mask");
  if (has_labels_ || has_seq_labels_) c.push_back("labels");
  if (has_types_) c.push_back("token_type_ids");
  if (has_positions_) c.insert(c.end(), {"start_positions", "end_positions"});
  return c;
}

size_t TokenDataset::column_bytes() const {
  size_t bytes = 0;
  for (const char* col : columns()) {
    size_t n = 1;
    for (int64_t d : file_.shape(col)) n *= static_cast<size_t>(d);
    bytes += n * sizeof(int32_t);
  }
  return bytes;
}

bool TokenDataset::hold_in_memory(size_t max_bytes) {
  if (in_memory()) return true;
  if (column_bytes() > max_bytes) return false;
  std::map<std::string, Column> mem;
  for (const char* col : columns()) {
    const std::vector<int64_t> shape = file_.shape(col);
    Column& c = mem[col];
    c.row_len = shape.size() == 2 ? static_cast<size_t>(shape[1]) : 1;
    c.values.resize(static_cast<size_t>(shape[0]) * c.row_len);
    file_.read_i32_rows(col, 0, shape[0], c.values.data());
  }
  mem_ = std::move(mem);
  return true;
}

void TokenDataset::read_rows(const char* name, int64_t row0, int64_t nrows, int32_t* out) const {
  const auto it = mem_.find(name);
  if (it == mem_.end()) return file_.read_i32_rows(name, row0, nrows, out);
  const Column& c = it->second;
  const size_t lo = static_cast<size_t>(row0) * c.row_len, len = static_cast<size_t>(nrows) * c.row_len;
  if (row0 < 0 || nrows < 0 || lo + len > c.values.size())
    throw Error(cat("file '", path_, "': dataset '", name, "': rows [", row0, ", ", row0 + nrows,
                    ") are out of range"));
  std::copy_n(c.values.data() + lo, len, out);
}

void TokenDataset::validate(int rank, int world) const {
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(cat("file '", path_, "': invalid rank ", rank, " of ", world, " for validation"));
  const int64_t lo = n_ * rank / world, hi = n_ * (rank + 1) / world;
  // Chunks of about 256 Ki tokens: bounded memory whatever the file size.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 18) / std::max(1, T_));
  std::vector<int64_t> idx;
  TokenBatch tb;
  for (int64_t r0 = lo; r0 < hi; r0 += chunk) {
    const int64_t n = std::min(chunk, hi - r0);
    idx.resize(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), r0);
    read(idx.data(), static_cast<int>(n), tb);
  }
}

// ---- Sampler --------------------------------------------------------------------------------------

Sampler::Sampler(int64_t num_examples, int batch_per_rank, int rank, int world, uint64_t seed,
                 bool shuffle, const std::vector<int32_t>* lengths, int64_t group, GroupOrder order)
    : n_(num_examples), B_(batch_per_rank), rank_(rank), world_(world), seed_(seed), shuffle_(shuffle),
      order_(order) {
  if (lengths) {
    if (static_cast<int64_t>(lengths->size()) != num_examples)
      throw Error(cat("Sampler: ", lengths->size(), " lengths for ", num_examples, " examples"));
    lengths_ = *lengths;
  }
  if (world < 1) throw Error(cat("Sampler: invalid world size ", world));
  if (rank < 0 || rank >= world) throw Error(cat("Sampler: rank ", rank, " is out of range for world size ", world));
  if (batch_per_rank < 1) throw Error(cat("Sampler: invalid batch size per rank ", batch_per_rank));
  const int64_t micro = static_cast<int64_t>(world) * batch_per_rank;
  group_ = group > 0 ? group : micro;
  if (group_ % micro != 0)
    throw Error(cat("Sampler: length group of ", group_, " examples is not a multiple of the ", micro,
                    " of a micro-batch over all ranks"));
  if (num_examples < 0) throw Error(cat("Sampler: invalid number of examples ", num_examples));
  const int64_t global = static_cast<int64_t>(world) * batch_per_rank;
  if (num_examples / global == 0)
    throw Error(cat("the dataset has ", num_examples, " examples, fewer than one global batch of ", global,
                    " (", world, " ranks x batch size ", batch_per_rank, " per rank)"));
}

int64_t Sampler::batches_per_epoch() const { return n_ / (static_cast<int64_t>(world_) * B_); }

std::vector<int64_t> Sampler::indices(int64_t global_batch) const {
  if (global_batch < 0) throw Error(cat("Sampler: negative global batch number ", global_batch));
  const int64_t bpe = batches_per_epoch();
  const int64_t epoch = global_batch / bpe;
  const int64_t within = global_batch % bpe;
  const int64_t start = within * static_cast<int64_t>(world_) * B_ + static_cast<int64_t>(rank_) * B_;
  std::vector<int64_t> out(static_cast<size_t>(B_));
  if (!shuffle_ && lengths_.empty()) {
    std::iota(out.begin(), out.end(), start);
    return out;
  }
  order(epoch);
  if (!lengths_.empty()) {  // rank r: positions r, r + world, ... of the global batch
    const int64_t g0 = within * static_cast<int64_t>(world_) * B_;
    for (int i = 0; i < B_; ++i)
      out[static_cast<size_t>(i)] = perm_[static_cast<size_t>(g0 + rank_ + static_cast<int64_t>(i) * world_)];
    return out;
  }
  std::copy(perm_.begin() + start, perm_.begin() + start + B_, out.begin());
  return out;
}

const std::vector<int64_t>& Sampler::order(int64_t epoch) const {
  if (epoch < 0) throw Error(cat("Sampler: negative epoch ", epoch));
  if (cached_epoch_ != epoch) {
    perm_.resize(static_cast<size_t>(n_));
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
    if (shuffle_) {
      Rng rng(derive_seed(seed_, static_cast<uint64_t>(epoch), kShuffleTag));
      for (int64_t i = n_ - 1; i > 0; --i) {
        const uint64_t j = rng.next_u64() % static_cast<uint64_t>(i + 1);
        std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
      }
    }
    if (!lengths_.empty()) group_by_length(epoch);
    cached_epoch_ = epoch;
  }
  return perm_;
}

int64_t Sampler::mega_batch_steps() const {
  if (lengths_.empty()) return 0;
  return std::min<int64_t>(kMegaBatches, std::max<int64_t>(1, n_ / (4 * group_)));
}

void Sampler::group_by_length(int64_t epoch) const {
  const int64_t G = group_;  // an optimizer step's examples
  const int64_t mega = G * mega_batch_steps();
  auto longer = [this](int64_t a, int64_t b) {
    return lengths_[static_cast<size_t>(a)] > lengths_[static_cast<size_t>(b)];
  };
  for (int64_t m0 = 0; m0 < n_; m0 += mega)
    std::stable_sort(perm_.begin() + m0, perm_.begin() + std::min(n_, m0 + mega), longer);
  if (order_ == GroupOrder::LongestFirst) return;
  // Shuffle the order of the epoch's full groups (the remainder stays at the end).
  const int64_t nb = n_ / G;
  std::vector<int64_t> order(static_cast<size_t>(nb));
  std::iota(order.begin(), order.end(), int64_t{0});
  Rng rng(derive_seed(seed_, static_cast<uint64_t>(epoch), kShuffleTag, 0x9B1));
  for (int64_t i = nb - 1; i > 0; --i) {
    const uint64_t j = rng.next_u64() % static_cast<uint64_t>(i + 1);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  std::vector<int64_t> grouped(perm_.size());
  for (int64_t g = 0; g < nb; ++g)
    std::copy(perm_.begin() + order[static_cast<size_t>(g)] * G, perm_.begin() + (order[static_cast<size_t>(g)] + 1) * G,
              grouped.begin() + g * G);
  std::copy(perm_.begin() + nb * G, perm_.end(), grouped.begin() + nb * G);
  perm_.swap(grouped);
}

const std::vector<int32_t>& TokenDataset::lengths() const {
  if (static_cast<int64_t>(lengths_.size()) == n_) return lengths_;
  std::vector<int32_t> len(static_cast<size_t>(n_), T_);  // kept only once complete (a read may throw)
  if (stream_ || !has_mask_) return lengths_ = std::move(len);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 18) / std::max(1, T_));
  std::vector<int32_t> mask;
  for (int64_t r0 = 0; r0 < n_; r0 += chunk) {
    const int64_t n = std::min(chunk, n_ - r0);
    mask.resize(static_cast<size_t>(n * T_));
    read_rows("attention_mask", r0, n, mask.data());
    for (int64_t r = 0; r < n; ++r) {
      int32_t L = 0;
      for (int t = 0; t < T_; ++t)
        if (mask[static_cast<size_t>(r * T_ + t)] != 0) L = t + 1;
      len[static_cast<size_t>(r0 + r)] = L;
    }
  }
  return lengths_ = std::move(len);
}

}  // namespace nlp
