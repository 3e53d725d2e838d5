#include "train/batches.h"

#include "core/backend.h"

namespace nlp {

int64_t HostBatch::valid_targets() const {
  int64_t n = 0;
  for (int32_t t : targets) n += (t != kIgnoreIndex);
  return n;
}

HostBatch make_clm_batch(const TokenBatch& tb) {
  HostBatch hb;
  hb.B = tb.n;
  hb.T = tb.T;
  hb.ids = tb.input_ids;
  hb.mask = tb.attention_mask;
  hb.targets.resize(size_t(tb.n) * tb.T);
  for (int b = 0; b < tb.n; ++b) {
    const int32_t* lab = tb.labels.data() + size_t(b) * tb.T;
    int32_t* tgt = hb.targets.data() + size_t(b) * tb.T;
    for (int t = 0; t + 1 < tb.T; ++t) tgt[t] = lab[t + 1];
    tgt[tb.T - 1] = tb.label_next[b];
  }
  for (int32_t m : hb.mask)
    if (m == 0) {
      hb.has_padding = true;
      break;
    }
  return hb;
}

DeviceBatchBuffer::~DeviceBatchBuffer() { be_.release(buf_); }

DeviceBatch DeviceBatchBuffer::upload(const HostBatch& hb) {
  const size_t n = size_t(hb.B) * hb.T;
  if (3 * n > cap_) {
    be_.release(buf_);
    buf_ = static_cast<int32_t*>(be_.alloc(3 * n * sizeof(int32_t)));
    cap_ = 3 * n;
  }
  be_.to_device(buf_, hb.ids.data(), n * sizeof(int32_t));
  be_.to_device(buf_ + n, hb.mask.data(), n * sizeof(int32_t));
  be_.to_device(buf_ + 2 * n, hb.targets.data(), n * sizeof(int32_t));
  DeviceBatch db;
  db.B = hb.B;
  db.T = hb.T;
  db.ids = buf_;
  db.mask = hb.has_padding ? buf_ + n : nullptr;
  db.targets = buf_ + 2 * n;
  return db;
}

}  // namespace nlp
