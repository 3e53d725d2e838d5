// Evaluation: mean cross-entropy and perplexity over a dataset, sharded across ranks.
#include <cmath>

#include "core/error.h"
#include "train/batches.h"
#include "train/session.h"

namespace nlp {

TokenDataset open_dataset(const Session& s, const std::string& path, const std::string& key) {
  if (path.empty()) throw Error(cat(key, " is empty: a dataset is required for run.mode = ", s.cfg.run.mode));
  const ModelConfig& mc = s.model.config();
  // 2-D files carry their own T (data.seq_len, when set, must match it); a 1-D token stream is cut
  // into windows of data.seq_len, by default min(n_positions, 1024).
  int seq_len = s.cfg.data.seq_len;
  if (seq_len == 0 && h5::File::open_read(path).has("tokens")) seq_len = std::min(mc.n_positions, 1024);
  TokenDataset ds(path, seq_len, mc.vocab_size);
  if (ds.seq_len() > mc.n_positions)
    throw Error(cat(key, " = '", path, "': sequence length ", ds.seq_len(),
                    " exceeds model.n_positions = ", mc.n_positions));
  return ds;
}

EvalResult evaluate(Session& s, const TokenDataset& ds, int max_batches) {
  const Config& cfg = s.cfg;
  Sampler sampler(ds.size(), cfg.train.batch_size, s.comm.rank(), s.comm.size(), cfg.train.seed,
                  /*shuffle=*/false);
  int64_t nb = sampler.batches_per_epoch();
  if (max_batches > 0) nb = std::min<int64_t>(nb, max_batches);
  DeviceBatchBuffer dbuf(s.be);
  TokenBatch tb;
  double sums[2] = {0, 0};  // loss sum, target count
  for (int64_t g = 0; g < nb; ++g) {
    auto idx = sampler.indices(g);
    ds.read(idx.data(), static_cast<int>(idx.size()), tb);
    HostBatch hb = make_clm_batch(tb);
    sums[1] += static_cast<double>(hb.valid_targets());
    sums[0] += s.model.forward(dbuf.upload(hb), /*training=*/false, 0);
  }
  s.comm.allreduce_sum_host(sums, 2);
  EvalResult r;
  r.tokens = static_cast<int64_t>(sums[1]);
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  r.perplexity = std::exp(r.loss);
  return r;
}

void run_eval(Session& s) {
  TokenDataset ds = open_dataset(s, s.cfg.data.eval, "data.eval");
  EvalResult r = evaluate(s, ds, s.cfg.eval.batches);
  char buf[256];
  std::snprintf(buf, sizeof buf, "eval | loss %.6f | perplexity %.4f | %lld tokens", r.loss,
                r.perplexity, static_cast<long long>(r.tokens));
  s.log.info(buf);
  s.log.metrics(Json().str("split", "eval").num("loss", r.loss).num("perplexity", r.perplexity)
                    .integer("tokens", r.tokens).done());
}

}  // namespace nlp
