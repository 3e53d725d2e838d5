// Generation (run.mode = generate, and samples during training): prompt text -> tokens, then sampling
// with temperature, top-k and top-p through the KV-cache decoder, one new token at a time.
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "text/tokenizer.h"
#include "train/session.h"

namespace nlp {
namespace {

// Draw a token from logits with temperature, top-k and top-p (nucleus) filtering.
int32_t sample_token(const float* logits, int V, float temperature, int top_k, float top_p, Rng& rng) {
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  int keep = V;
  if (top_k > 0 && top_k < V) {
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    keep = top_k;
  } else {
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  const double maxv = logits[order[0]];
  std::vector<double> p(keep);
  double total = 0;
  for (int i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[order[i]] - maxv) / temperature);
    total += p[i];
  }
  if (top_p < 1.f) {
    double cum = 0;
    int n = 0;
    while (n < keep) {
      cum += p[n] / total;
      ++n;
      if (cum >= top_p) break;
    }
    keep = n;
    total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double r = rng.uniform_double() * total;
  for (int i = 0; i < keep; ++i) {
    r -= p[i];
    if (r <= 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace

std::string generate_sample(Session& s, uint64_t seed) {
  const GenerateConfig& g = s.cfg.generate;
  const ModelConfig& mc = s.model.config();
  auto tok = make_tokenizer(g.tokenizer, g.vocab_dir);
  std::vector<int32_t> prompt = tok->encode(g.prompt);
  if (prompt.empty()) prompt.push_back(tok->eos_id() >= 0 ? tok->eos_id() : int32_t('\n'));
  for (int32_t id : prompt)
    if (id >= mc.vocab_size)
      throw Error(cat("generate.prompt: token id ", id, " (tokenizer ", g.tokenizer,
                      ") is outside the model's vocabulary (model.vocab_size = ", mc.vocab_size, ")"));
  // Sample only ids the tokenizer can decode (a model's vocabulary may be padded beyond it).
  const int V = std::min(mc.vocab_size, tok->vocab_size());
  if (static_cast<int>(prompt.size()) >= mc.n_positions)
    throw Error(cat("generate.prompt has ", prompt.size(), " tokens; model.n_positions = ",
                    mc.n_positions, " leaves no room to generate"));

  auto dec = make_decoder(s.model, s.be, 1);
  Rng rng(seed);
  std::string out;
  for (int sample = 0; sample < g.num_samples; ++sample) {
    std::vector<int32_t> ids = prompt;
    const std::vector<float>* logits = nullptr;
    for (size_t pos = 0; pos < prompt.size(); ++pos) logits = &dec->step({prompt[pos]}, int(pos));
    const int limit = std::min<int>(mc.n_positions, int(prompt.size()) + g.max_new_tokens);
    for (int pos = int(prompt.size()); pos < limit; ++pos) {
      const int32_t next = sample_token(logits->data(), V, g.temperature, g.top_k, g.top_p, rng);
      ids.push_back(next);
      if (next == tok->eos_id()) break;
      if (pos + 1 < limit) logits = &dec->step({next}, pos);
    }
    if (sample > 0) out += "\n--- sample " + std::to_string(sample + 1) + " ---\n";
    out += tok->decode(ids);
  }
  return out;
}

void run_generate(Session& s) {
  begin_output(s);
  if (s.comm.rank() != 0) return;
  std::string text = generate_sample(s, s.cfg.generate.seed);
  s.log.info(text);
  const std::string path = s.cfg.output.dir + "/generated.txt";
  std::FILE* f = std::fopen((path + ".tmp").c_str(), "wb");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f && std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove((path + ".tmp").c_str());
    throw Error(cat("cannot write '", path, "'"));
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

}  // namespace nlp
