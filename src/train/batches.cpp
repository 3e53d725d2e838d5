#include "train/batches.h"

#include <algorithm>

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
  if (task == Task::Mlm)
    for (size_t i = 0; i < n; ++i)
      if (hb.targets[i] != kIgnoreIndex) {
        hb.rows.push_back(static_cast<int32_t>(i));
        hb.row_targets.push_back(hb.targets[i]);
      }
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

DeviceBatchBuffer::~DeviceBatchBuffer() { be_.release(buf_); }

DeviceBatch DeviceBatchBuffer::upload(const HostBatch& hb) {
  const size_t n = size_t(hb.B) * hb.T, b = size_t(hb.B);
  const size_t r = hb.rows.size();
  const size_t need = 4 * n + 3 * b + 2 * r;
  if (need > cap_) {
    be_.release(buf_);
    buf_ = static_cast<int32_t*>(be_.alloc(need * sizeof(int32_t)));
    cap_ = need;
  }
  int32_t* p = buf_;
  auto put = [&](const std::vector<int32_t>& v, size_t count) {
    NLP_ASSERT(v.size() == count);
    be_.to_device(p, v.data(), count * sizeof(int32_t));
    int32_t* r = p;
    p += count;
    return r;
  };
  DeviceBatch db;
  db.B = hb.B;
  db.T = hb.T;
  db.T_key = hb.T_key;
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
  return db;
}

}  // namespace nlp
