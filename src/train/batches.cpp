#include "train/batches.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace nlp {

int64_t HostBatch::loss_units(Task task) const {
  const std::vector<int32_t>& v = is_token_task(task) ? targets : task == Task::Qa ? start : labels;
  int64_t n = 0;
  for (int32_t t : v) n += (t != kIgnoreIndex);
  return n;
}

MlmSpec read_mlm_spec(const TokenDataset& ds, int vocab_size) {
  MlmSpec m;
  m.vocab_size = vocab_size;
  const h5::File& f = ds.file();
  auto get = [&](const char* key) -> int32_t {
    if (!f.has_attr(key))
      throw Error(cat("file '", ds.path(), "': run.task = mlm without labels needs the root attribute '",
                      key, "' (special token ids; tools/prep_mlm.py writes them)"));
    const int64_t v = f.attr_int(key);
    if (v < 0 || v >= vocab_size)
      throw Error(cat("file '", ds.path(), "': attribute ", key, " = ", v,
                      " is outside the vocabulary (model.vocab_size = ", vocab_size, ")"));
    return static_cast<int32_t>(v);
  };
  m.mask_id = get("mask_id");
  m.cls_id = get("cls_id");
  m.sep_id = get("sep_id");
  m.pad_id = get("pad_id");
  return m;
}

namespace {

// mlm, ner: the positions the head's loss reads (rows) and their targets, in flat order.
void list_scored_positions(HostBatch& hb) {
  hb.rows.clear();
  hb.row_targets.clear();
  for (size_t i = 0; i < hb.targets.size(); ++i)
    if (hb.targets[i] != kIgnoreIndex) {
      hb.rows.push_back(static_cast<int32_t>(i));
      hb.row_targets.push_back(hb.targets[i]);
    }
}

}  // namespace

HostBatch make_batch(Task task, const TokenBatch& tb, const MlmSpec* mlm, uint64_t seed) {
  HostBatch hb;
  hb.B = tb.n;
  hb.T = tb.T;
  hb.T_key = tb.T;
  hb.ids = tb.input_ids;
  hb.mask = tb.attention_mask;
  hb.type_ids = tb.token_type_ids;
  hb.labels = tb.seq_labels;
  hb.start = tb.start_positions;
  hb.end = tb.end_positions;
  const size_t n = size_t(tb.n) * tb.T;
  if (task == Task::Clm) {
    hb.targets.resize(n);
    for (int b = 0; b < tb.n; ++b) {
      const int32_t* lab = tb.labels.data() + size_t(b) * tb.T;
      int32_t* tgt = hb.targets.data() + size_t(b) * tb.T;
      for (int t = 0; t + 1 < tb.T; ++t) tgt[t] = lab[t + 1];
      tgt[tb.T - 1] = tb.label_next[b];
    }
  } else if (task == Task::Mlm && mlm) {
    hb.targets.assign(n, kIgnoreIndex);
    for (size_t i = 0; i < n; ++i) {
      const int32_t id = hb.ids[i];
      if (hb.mask[i] == 0 || id == mlm->cls_id || id == mlm->sep_id || id == mlm->pad_id) continue;
      if (uniform01(seed, 4 * i) >= mlm->probability) continue;
      hb.targets[i] = id;
      const float r = uniform01(seed, 4 * i + 1);
      if (r < 0.8f) {
        hb.ids[i] = mlm->mask_id;
      } else if (r < 0.9f) {
        hb.ids[i] = static_cast<int32_t>(uniform01(seed, 4 * i + 2) * float(mlm->vocab_size)) %
                    mlm->vocab_size;
      }
    }
  } else if (is_token_task(task) && tb.token_labels) {
    hb.targets = tb.labels;  // mlm with given labels, ner (unlabelled ner: ignored targets, below)
  }
  if (hb.targets.empty()) hb.targets.assign(n, kIgnoreIndex);
  if (task == Task::Mlm || task == Task::Ner) list_scored_positions(hb);
  for (int32_t m : hb.mask) {
    hb.real_tokens += m != 0;
    hb.has_padding |= m == 0;
  }
  return hb;
}

void trim_to_longest(HostBatch& hb, int multiple) {
  const int T = hb.T, B = hb.B;
  int longest = 0;
  for (int b = 0; b < B; ++b)
    for (int t = longest; t < T; ++t) {
      const size_t i = size_t(b) * T + t;
      if (hb.mask[i] != 0 || hb.targets[i] != kIgnoreIndex) longest = t + 1;
    }
  for (const auto* v : {&hb.start, &hb.end})
    for (int32_t p : *v) longest = std::max(longest, p + 1);
  multiple = std::max(1, multiple);
  const int Tn = std::min(T, std::max(multiple, (longest + multiple - 1) / multiple * multiple));
  if (Tn == T) return;
  auto cut = [&](std::vector<int32_t>& v) {
    for (int b = 0; b < B; ++b)
      std::copy_n(v.begin() + size_t(b) * T, Tn, v.begin() + size_t(b) * Tn);
    v.resize(size_t(B) * Tn);
  };
  cut(hb.ids);
  cut(hb.mask);
  cut(hb.targets);
  cut(hb.type_ids);
  for (int32_t& r : hb.rows) r = r / T * Tn + r % T;  // every row target sits before Tn
  hb.T = Tn;
  hb.has_padding = std::find(hb.mask.begin(), hb.mask.end(), 0) != hb.mask.end();
}

namespace {

// Each example's length: its attention_mask must be ones then zeros, and every target and answer
// position must lie within the ones.
std::vector<int> example_lengths(const HostBatch& hb) {
  const int B = hb.B, T = hb.T;
  std::vector<int> len(B);
  for (int b = 0; b < B; ++b) {
    const int32_t* m = hb.mask.data() + size_t(b) * T;
    const int32_t* tg = hb.targets.data() + size_t(b) * T;
    int n = 0;
    while (n < T && m[n] != 0) ++n;
    for (int t = n; t < T; ++t) {
      if (m[t] != 0)
        throw Error(cat("data.packing: example ", b, " of the batch has padding at position ", n,
                        " before a token at position ", t, " (packing needs each attention_mask to be "
                        "ones then zeros); set data.packing = false for this dataset"));
      if (tg[t] != kIgnoreIndex)
        throw Error(cat("data.packing: example ", b, " of the batch has a target at position ", t,
                        ", in its padding (attention_mask 0 from position ", n, ")"));
    }
    for (const auto* v : {&hb.start, &hb.end})
      if (!v->empty() && (*v)[b] >= n)
        throw Error(cat("data.packing: example ", b, " of the batch has an answer position ", (*v)[b],
                        " in its padding (attention_mask 0 from position ", n, ")"));
    if (n == 0)
      throw Error(cat("data.packing: example ", b, " of the batch has no token (attention_mask all 0)"));
    len[b] = n;
  }
  return len;
}

// Where each example goes: its row, its offset in the row, its segment id (1, 2, ... in the row).
struct Placement {
  std::vector<int> row_of, off_of, seg_of;
  std::vector<int> fill, count;  // per row: positions used, examples
  explicit Placement(int B) : row_of(B), off_of(B), seg_of(B) {}
  void put(int b, size_t r, int len) {
    row_of[b] = int(r);
    off_of[b] = fill[r];
    seg_of[b] = ++count[r];
    fill[r] += len;
  }
};

// First-fit in `order` (longest first, ties by index) into rows of L positions; returns the rows.
int place_first_fit(const std::vector<int>& len, const std::vector<int>& order, int L, Placement& p) {
  p.fill.clear();
  p.count.clear();
  for (int b : order) {
    size_t r = 0;
    while (r < p.fill.size() && p.fill[r] + len[b] > L) ++r;
    if (r == p.fill.size()) {
      p.fill.push_back(0);
      p.count.push_back(0);
    }
    p.put(b, r, len[b]);
  }
  return static_cast<int>(p.fill.size());
}

// Rows given (PackedSampler): each example at the end of its row so far, in index order; returns
// the longest row's length (at most T).
int place_given(const std::vector<int>& len, const std::vector<int32_t>& rows_of, int rows, int T, Placement& p) {
  p.fill.assign(static_cast<size_t>(rows), 0);
  p.count.assign(static_cast<size_t>(rows), 0);
  for (size_t b = 0; b < len.size(); ++b) {
    const int r = rows_of[b];
    NLP_ASSERT(r >= 0 && r < rows);
    p.put(static_cast<int>(b), static_cast<size_t>(r), len[b]);
  }
  const int longest = *std::max_element(p.fill.begin(), p.fill.end());
  if (longest > T)
    throw Error(cat("data.packing: a packed row holds ", longest, " tokens, more than the file's ", T,
                    " (the example lengths changed since the step was planned?)"));
  return longest;
}

// Without given rows, with multiple > 0: the multiple of `multiple` from the longest example up to T
// whose rows hold the fewest positions (rows x length; tried shortest first, so the shortest wins a
// tie).
int cheapest_row_length(const std::vector<int>& len, const std::vector<int>& order, int multiple, int T,
                        Placement& p) {
  const int shortest = std::min(T, (len[order[0]] + multiple - 1) / multiple * multiple);
  int64_t best = INT64_MAX;
  int Tn = T;
  for (int L = shortest;; L = std::min(T, L + multiple)) {
    if (const int64_t cost = int64_t(place_first_fit(len, order, L, p)) * L; cost < best) best = cost, Tn = L;
    if (L == T) break;
  }
  return Tn;
}

// The examples copied into R rows of Tn positions as placed: ids, segment ids, targets, token types,
// positions restarting per example, dropout keys of the padded layout (T_key Tk); first and length.
void write_rows(HostBatch& hb, const std::vector<int>& len, const Placement& p, int R, int Tn, int Tk) {
  const int B = hb.B, T = hb.T;
  const size_t n = size_t(R) * Tn;
  std::vector<int32_t> ids(n, 0), mask(n, 0), targets(n, kIgnoreIndex), types(n, 0), pos(n, 0), keys(n, 0);
  hb.first.resize(B);
  hb.length.resize(B);
  for (int b = 0; b < B; ++b) {
    const size_t src = size_t(b) * T, dst = size_t(p.row_of[b]) * Tn + p.off_of[b];
    for (int t = 0; t < len[b]; ++t) {
      ids[dst + t] = hb.ids[src + t];
      mask[dst + t] = p.seg_of[b];
      targets[dst + t] = hb.targets[src + t];
      types[dst + t] = hb.type_ids[src + t];
      pos[dst + t] = t;
      keys[dst + t] = b * Tk + t;
    }
    hb.first[b] = static_cast<int32_t>(dst);
    hb.length[b] = len[b];
  }
  hb.ids.swap(ids);
  hb.mask.swap(mask);
  hb.targets.swap(targets);
  hb.type_ids.swap(types);
  hb.pos.swap(pos);
  hb.token_key.swap(keys);
}

// Fixed examples: R x min(fixed_per_row, Tn) of them, the real B first; the others are ignored
// (label, start, end -100: no loss, no gradient, no loss unit), one position long, each at its own
// position where no example starts (the heads gather and scatter-add rows at `first`, and the
// scatter needs them distinct). There are enough: R x Tn positions, B of them firsts. Returns E.
int add_ignored_examples(HostBatch& hb, int R, int Tn, int fixed_per_row) {
  const int B = hb.B;
  const int E = R * std::min(fixed_per_row, Tn);
  NLP_ASSERT(E >= B);  // PackedSampler put at most fixed_per_row examples in a row, each a token or more
  std::vector<char> starts(size_t(R) * Tn, 0);
  for (int b = 0; b < B; ++b) starts[size_t(hb.first[b])] = 1;
  size_t at = 0;
  for (int e = B; e < E; ++e, ++at) {
    while (starts[at]) ++at;
    hb.first.push_back(static_cast<int32_t>(at));
    hb.length.push_back(1);
  }
  for (auto* v : {&hb.labels, &hb.start, &hb.end})
    if (v->size() == size_t(B)) v->resize(size_t(E), kIgnoreIndex);
  return E;
}

}  // namespace

void pack_rows(HostBatch& hb, int multiple, const std::vector<int32_t>* rows_of, int rows, int fixed_per_row) {
  const int B = hb.B, T = hb.T;
  NLP_ASSERT(hb.E == 0 && T > 0);
  NLP_ASSERT(!rows_of || (static_cast<int>(rows_of->size()) == B && rows >= 1));
  const std::vector<int> len = example_lengths(hb);
  std::vector<int> order(B);
  for (int b = 0; b < B; ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return len[a] > len[b]; });
  Placement placed(B);
  // The row length: the file's, or (multiple > 0) the cheapest multiple; with the rows given, the
  // longest row rounded up to `multiple`
  int Tn = T;
  if (rows_of) {
    const int longest = place_given(len, *rows_of, rows, T, placed);
    if (multiple > 0) Tn = std::min(T, std::max(1, (longest + multiple - 1) / multiple * multiple));
  } else if (multiple > 0) {
    Tn = cheapest_row_length(len, order, multiple, T, placed);
  }
  const int R = rows_of ? rows : place_first_fit(len, order, Tn, placed);
  const int Tk = key_length(T, hb.T_key);  // dropout keys: the padded batch's layout
  write_rows(hb, len, placed, R, Tn, Tk);
  if (!hb.rows.empty()) list_scored_positions(hb);  // mlm, ner: again, in the packed rows' order
  const int E = rows_of && fixed_per_row > 0 ? add_ignored_examples(hb, R, Tn, fixed_per_row) : B;
  hb.E = E;
  hb.B = R;
  hb.T = Tn;
  hb.T_key = Tk;
  hb.has_padding = true;  // the segment ids always go to attention
  hb.ragged = rows_of == nullptr;
}

void score_every_position(HostBatch& hb) {
  hb.rows.clear();
  hb.row_targets.clear();
}

Sampler train_sampler(const Config& cfg, int64_t num_examples, int B, int A, int rank, int world,
                      const std::vector<int32_t>* lengths) {
  const GroupOrder order = cfg.group_order();
  return Sampler(num_examples, B, rank, world, cfg.train.seed, cfg.data.shuffle,
                 cfg.data.group_by_length ? lengths : nullptr, int64_t(world) * B * A, order);
}

DeviceBatchBuffer::~DeviceBatchBuffer() {
  be_.release(buf_);
  be_.host_release(host_);
}

DeviceBatch DeviceBatchBuffer::upload(const HostBatch& hb) {
  const size_t n = size_t(hb.B) * hb.T, b = size_t(hb.E > 0 ? hb.E : hb.B);  // b: examples
  const size_t r = hb.rows.size();
  const size_t np = hb.pos.size(), nk = hb.token_key.size(), nf = hb.first.size();
  const size_t nc = count_pad_ >= 0 ? n : 0;  // RoBERTa's counted positions
  const size_t need = 4 * n + 5 * b + 3 * r + (nc ? nc : np) + nk + 2 * nf;
  if (need > cap_) {
    be_.release(buf_);
    be_.host_release(host_);
    host_ = nullptr;  // host_alloc may throw: no dangling pointer for the destructor
    buf_ = static_cast<int32_t*>(be_.alloc(need * sizeof(int32_t)));
    cap_ = need;
    host_ = static_cast<int32_t*>(be_.host_alloc(need * sizeof(int32_t)));
  }
  // Every array goes to its place in the host staging buffer, then one copy to the device: on a GPU
  // each to_device synchronises, so one copy instead of a dozen per micro-batch.
  // slot(count): the next count int32s, as (host staging to write, its place on the device)
  size_t used = 0;
  auto slot = [&](size_t count) {
    NLP_ASSERT(used + count <= cap_);
    const std::pair<int32_t*, const int32_t*> r{host_ + used, buf_ + used};
    used += count;
    return r;
  };
  auto put = [&](const std::vector<int32_t>& v, size_t count) {
    NLP_ASSERT(v.size() == count);
    const auto [h, d] = slot(count);
    std::copy(v.begin(), v.end(), h);
    return d;
  };
  DeviceBatch db;
  db.B = hb.B;
  db.T = hb.T;
  db.T_key = hb.T_key;
  db.ragged = hb.ragged;
  db.ids = put(hb.ids, n);
  const int32_t* mask = put(hb.mask, n);
  db.mask = hb.has_padding ? mask : nullptr;
  db.targets = put(hb.targets, n);
  db.type_ids = put(hb.type_ids, n);
  db.labels = put(hb.labels, b);
  db.start = put(hb.start, b);
  db.end = put(hb.end, b);
  db.rows = put(hb.rows, r);
  db.row_targets = put(hb.row_targets, r);
  db.nrows = static_cast<int>(r);
  // the rows' dropout keys, written in place: the packed rows' token keys, else (example, position)
  // at T_key
  const int Tk = key_length(hb.T, hb.T_key);
  const auto [keys, keys_dev] = slot(r);
  for (size_t i = 0; i < r; ++i) {
    const int32_t at = hb.rows[i];
    keys[i] = hb.E > 0 ? hb.token_key[size_t(at)] : at / hb.T * Tk + at % hb.T;
  }
  db.row_keys = keys_dev;
  // each example's [CLS] position and its dropout key (DeviceBatch::cls_rows), written in place
  const auto [cls, cls_dev] = slot(2 * b);
  fill_cls_rows(cls, static_cast<int>(b), hb.T, Tk, hb.E > 0 ? hb.first.data() : nullptr);
  db.cls_rows = cls_dev;
  if (hb.E > 0) {
    db.E = hb.E;
    if (!nc) db.pos = put(hb.pos, n);
    db.token_key = put(hb.token_key, n);
    db.first = put(hb.first, b);
    db.length = put(hb.length, b);
    db.first_host = hb.first.data();
  }
  if (nc) {
    db.pos = put(count_positions(hb, count_pad_), n);
    db.pos_counted = true;
  }
  be_.to_device(buf_, host_, used * sizeof(int32_t));
  return db;
}

std::vector<int32_t> count_positions(const HostBatch& hb, int pad) {
  std::vector<int32_t> pos(size_t(hb.B) * hb.T);
  const bool packed = hb.E > 0 && !hb.pos.empty();
  for (int r = 0; r < hb.B; ++r) {
    int count = 0;
    for (int t = 0; t < hb.T; ++t) {
      const size_t i = size_t(r) * hb.T + t;
      if (packed && hb.pos[i] == 0) count = 0;
      pos[i] = hb.ids[i] == pad ? pad : pad + ++count;
    }
  }
  return pos;
}

}  // namespace nlp
