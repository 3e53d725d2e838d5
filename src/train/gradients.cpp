// Verification mode (run.mode = gradients): forward and backward on the first train.batch_size
// sequences of data.train, dropout off, no update. Rank 0 writes <output.dir>/gradients.h5: a scalar
// `loss`, the `logits` [B,T,V], and one dataset per parameter gradient, named and shaped as the
// parameter. Used to check nlptrain against Hugging Face transformers on the same weights and batch.
#include <numeric>

#include "core/error.h"
#include "io/weights.h"
#include "train/batches.h"
#include "train/session.h"

namespace nlp {

void run_gradients(Session& s) {
  const Config& cfg = s.cfg;
  TokenDataset ds = open_dataset(s, cfg.data.train, "data.train");
  const int B = cfg.train.batch_size;
  if (ds.size() < B)
    throw Error(cat("data.train = '", cfg.data.train, "' has ", ds.size(),
                    " examples, fewer than train.batch_size = ", B));
  std::vector<int64_t> idx(B);
  std::iota(idx.begin(), idx.end(), 0);
  TokenBatch tb;
  ds.read(idx.data(), B, tb);
  HostBatch hb = make_clm_batch(tb);
  const int64_t count = hb.valid_targets();
  if (count == 0) throw Error("gradients: the batch has no target tokens");

  ParamStore& ps = s.model.params();
  DeviceBatchBuffer dbuf(s.be);
  DeviceBatch db = dbuf.upload(hb);
  s.be.zero(ps.grad(), ps.total() * sizeof(float));
  const double loss = s.model.forward(db, /*training=*/false, 0) / double(count);
  s.model.backward(db, static_cast<float>(1.0 / double(count)), /*training=*/false, 0);
  char buf[128];
  std::snprintf(buf, sizeof buf, "gradients: loss %.8f over %lld target tokens", loss,
                static_cast<long long>(count));
  s.log.info(buf);
  if (s.comm.rank() != 0) return;

  const int T = hb.T, V = s.model.config().vocab_size;
  std::vector<float> logits(size_t(B) * T * V), grads(ps.total());
  s.be.to_host(logits.data(), s.model.logits(), logits.size() * sizeof(float));
  s.be.to_host(grads.data(), ps.grad(), grads.size() * sizeof(float));
  const std::string path = cfg.output.dir + "/gradients.h5";
  h5::write_atomically(path, [&](h5::File& f) {
    f.write_f64("loss", {}, &loss);
    f.write_f32("logits", {B, T, V}, logits.data());
    for (const auto& sp : ps.specs()) f.write_f32(sp.name, sp.shape, grads.data() + sp.offset);
    s.model.write_attrs(f);
  });
  s.log.info(cat("gradients: wrote '", path, "'"));
}

}  // namespace nlp
