// Verification mode (run.mode = gradients): forward and backward on the first train.batch_size
// sequences of data.train, dropout off, no update. Rank 0 writes <output.dir>/gradients.h5: a scalar
// `loss`, the model's outputs (`logits`, or `start_logits`/`end_logits` for qa, at the batch's length:
// trimmed to its longest row with data.padding = longest; for mlm `logits` has a row per masked
// position only, listed as flat indices b*T+t in `masked_positions`), and one dataset per
// parameter gradient, named and shaped as the parameter, and under `initialized/` the values of the
// parameters that model.weights lacked (a new head, seeded). With data.packing the batch is packed
// (batches.h pack_rows) and the file also holds each example's place in the rows. Used to check nlptrain against Hugging Face transformers on the same weights and batch.
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
  begin_output(s);
  std::vector<int64_t> idx(B);
  std::iota(idx.begin(), idx.end(), 0);
  TokenBatch tb;
  ds.read(idx.data(), B, tb);
  // mlm: the dataset's labels are used as given (no dynamic masking), so that a reference
  // implementation can be fed the same masked batch.
  HostBatch hb = make_batch(s.task, tb, nullptr, 0);
  // data.padding = longest: the batch at its longest row (outputs [B, T'] with T' <= the file's T)
  // data.packing: the batch's examples packed into rows (outputs per row for ner/qa/mlm, per example
  // for doc_cls/pair_cls; `example_first`/`example_length` say where each example sits)
  if (cfg.data.packing)
    pack_rows(hb, packing_multiple(cfg, s.be.name() == "cuda"));
  else if (cfg.padding() == Padding::Longest)
    trim_to_longest(hb, cfg.data.pad_multiple);
  const int64_t count = hb.loss_units(s.task);
  if (count == 0) throw Error("gradients: the batch has nothing to learn from (all labels are -100)");

  ParamStore& ps = s.model.params();
  DeviceBatchBuffer dbuf(s.be, &s.model.config());
  DeviceBatch db = dbuf.upload(hb);
  s.be.zero(ps.grad(), ps.total() * sizeof(float));
  const double loss = s.model.forward(db, /*training=*/false, 0) / double(count);
  s.model.backward(db, static_cast<float>(1.0 / double(count)), /*training=*/false, 0);
  char buf[128];
  std::snprintf(buf, sizeof buf, "gradients: loss %.8f over %lld target tokens", loss,
                static_cast<long long>(count));
  s.log.info(buf);
  if (s.comm.rank() != 0) return;

  std::vector<float> grads(ps.total());
  s.be.to_host(grads.data(), ps.grad(), grads.size() * sizeof(float));
  const std::string path = cfg.output.dir + "/gradients.h5";
  h5::write_atomically(path, [&](h5::File& f) {
    f.write_f64("loss", {}, &loss);
    f.set_attr("batch_len", int64_t(hb.T));  // the positions computed (< the file's T when trimmed)
    for (const OutputView& o : s.model.outputs()) {  // logits, or start_logits/end_logits
      size_t n = 1;
      for (auto d : o.shape) n *= size_t(d);
      std::vector<float> h(n);
      s.be.to_host(h.data(), o.data, n * sizeof(float));
      f.write_f32(o.name, o.shape, h.data());
    }
    if (hb.E > 0) {
      f.write_i32("example_first", {int64_t(hb.E)}, hb.first.data());
      f.write_i32("example_length", {int64_t(hb.E)}, hb.length.data());
    }
    if (s.task == Task::Mlm)
      f.write_i32("masked_positions", {int64_t(hb.rows.size())}, hb.rows.data());
    for (const auto& sp : ps.specs()) f.write_f32(sp.name, sp.shape, grads.data() + sp.offset);
    if (!s.initialised.empty()) {
      std::vector<float> host;
      ps.download(host);
      for (const auto& name : s.initialised) {
        const ParamSpec& sp = ps.specs()[ps.index(name)];
        f.write_f32("initialized/" + name, sp.shape, host.data() + sp.offset);
      }
    }
    s.model.write_attrs(f);
  });
  s.log.info(cat("gradients: wrote '", path, "'"));
}

}  // namespace nlp
