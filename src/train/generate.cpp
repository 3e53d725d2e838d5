// Generation (run.mode = generate, and samples during training): prompt text -> tokens, then sampling
// with temperature, top-k and top-p through the KV-cache decoder, one new token at a time.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <cmath>
#include <numeric>

#include "comm/agree.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "text/json_min.h"
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

// Continuations of one prompt: num_samples samples of up to max_new_tokens ids each (an end-of-text
// id ends a sample and is kept). The random stream starts at `seed` and runs on across the samples.
// A prompt's ids (the eos or newline token when empty) fit the model: each in its vocabulary, with room
// to generate after them.
static void check_prompt(const Config& cfg, const ModelConfig& mc, const std::vector<int32_t>& prompt,
                  const std::string& what) {
  for (int32_t id : prompt)
    if (id >= mc.vocab_size)
      throw Error(cat(what, ": token id ", id, " (tokenizer ", cfg.generate.tokenizer,
                      ") is outside the model's vocabulary (model.vocab_size = ", mc.vocab_size, ")"));
  if (static_cast<int>(std::max<size_t>(prompt.size(), 1)) >= mc.n_positions)
    throw Error(cat(what, " has ", prompt.size(), " tokens; model.n_positions = ", mc.n_positions,
                    " leaves no room to generate"));
}

std::vector<std::vector<int32_t>> sample_continuations(Session& s, const Tokenizer& tok,
                                                       std::vector<int32_t> prompt, uint64_t seed,
                                                       const std::string& what) {
  const GenerateConfig& g = s.cfg.generate;
  const ModelConfig& mc = s.model.config();
  if (prompt.empty()) prompt.push_back(tok.eos_id() >= 0 ? tok.eos_id() : int32_t('\n'));
  check_prompt(s.cfg, mc, prompt, what);
  // Sample only ids the tokenizer can decode (a model's vocabulary may be padded beyond it).
  const int V = std::min(mc.vocab_size, tok.vocab_size());

  auto dec = make_decoder(s.model, s.be, 1);
  Rng rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int sample = 0; sample < g.num_samples; ++sample) {
    std::vector<int32_t> ids;
    const std::vector<float>* logits = nullptr;
    for (size_t pos = 0; pos < prompt.size(); ++pos) logits = &dec->step({prompt[pos]}, int(pos));
    const int limit = std::min<int>(mc.n_positions, int(prompt.size()) + g.max_new_tokens);
    for (int pos = int(prompt.size()); pos < limit; ++pos) {
      const int32_t next = sample_token(logits->data(), V, g.temperature, g.top_k, g.top_p, rng);
      ids.push_back(next);
      if (next == tok.eos_id()) break;
      if (pos + 1 < limit) logits = &dec->step({next}, pos);
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// generate.tokenizer = ids: prompts arrive as ids and samples leave as ids (tools/encode_prompts.py
// and tools/decode_generated.py hold the tokenizer); only the end-of-text id is needed here.
class IdsTokenizer : public Tokenizer {
 public:
  IdsTokenizer(int vocab, int eos) : vocab_(vocab), eos_(eos) {}
  std::vector<int32_t> encode(const std::string&) const override {
    throw Error("generate.tokenizer = ids has no text encoder: give prompt_ids (tools/encode_prompts.py)");
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    return cat("<", ids.size(), " ids>");
  }
  int vocab_size() const override { return vocab_; }
  int eos_id() const override { return eos_; }
  std::string vocab_sha256() const override { return ""; }  // the prompts carry theirs

 private:
  int vocab_, eos_;
};

std::unique_ptr<Tokenizer> open_tokenizer(const Config& c, Log* log) {
  if (c.tokenizer() == PromptTokenizer::Ids)
    throw Error("generate.tokenizer = ids: prompts come from generate.prompts_file (internal error)");
  if (c.tokenizer() != PromptTokenizer::Gpt2) return make_tokenizer(c.generate.tokenizer, "");
  const std::string dir = gpt2_vocab_dir(c);
  auto tok = make_tokenizer("gpt2", dir);
  if (log) {
    const Gpt2VocabFiles f = find_gpt2_vocab_files(dir);
    log->info(cat("generate: tokenizer gpt2 from ",
                  c.generate.vocab_dir.empty() ? "the folder of model.weights" : "generate.vocab_dir",
                  ": vocabulary '", f.vocab, "', merges '", f.merges, "'"));
  }
  return tok;
}

// One prompt of generate.prompts_file: its text, or with generate.tokenizer = ids its token ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  bool has_ids = false;
  std::string vocab_sha256;  // the tokenizer that made ids (tools/encode_prompts.py), when given
  int64_t eos_id = -1;       // its end-of-text id, when given
};

// The text tokenizer (byte, gpt2) must be the one the model was trained with, when the weights say
// (vocab_sha256, from the training data): another one would turn the samples into garbage.
void check_tokenizer(const Tokenizer& tok, const Config& cfg, const ModelConfig& mc) {
  if (mc.vocab_sha256.empty()) return;
  const std::string mine = tok.vocab_sha256();
  if (mine == mc.vocab_sha256) return;
  throw Error(cat("generate.tokenizer = ", cfg.generate.tokenizer,
                  cfg.tokenizer() == PromptTokenizer::Gpt2 ? cat(" ('", gpt2_vocab_dir(cfg), "')") : std::string(),
                  " has vocab_sha256 ", mine.substr(0, 12), "... but model.weights '", mc.weights,
                  "' was trained on vocab_sha256 ", mc.vocab_sha256.substr(0, 12),
                  "...: use the model's tokenizer (generate.tokenizer = ids with tools/generate_text.py "
                  "takes any Hugging Face tokenizer)"));
}

// Prompts of generate.prompts_file: one JSON object per line with a string "prompt" (with
// generate.tokenizer = ids: an array "prompt_ids", and optionally "prompt", "vocab_sha256" and
// "eos_id"); other string and integer fields are allowed and ignored; blank lines are skipped.
std::vector<Prompt> read_prompts_file(const std::string& path, bool want_ids, int vocab_size) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat("generate.prompts_file: cannot open '", path, "'"));
  std::vector<Prompt> prompts;
  std::string line;
  for (int lineno = 1; std::getline(f, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string at = cat("generate.prompts_file '", path, "' line ", lineno);
    std::vector<std::pair<std::string, text::FlatValue>> fields;
    try {
      fields = text::parse_flat_object(line, path);
    } catch (const Error& e) {
      throw Error(cat(at, ": ", e.what(), " (expected one JSON object per line, e.g. {\"prompt\": \"Hello\"}",
                      want_ids ? " or {\"prompt_ids\": [15496, 11]}" : "", ")"));
    }
    Prompt p;
    bool has_text = false;
    for (const auto& [key, v] : fields) {
      auto need = [&, &key = key, &v = v](text::FlatValue::Kind kind, const char* what) {
        if (v.kind != kind) throw Error(cat(at, ": \"", key, "\" must be ", what));
      };
      if (key == "prompt") {
        need(text::FlatValue::String, "a string");
        p.text = v.str;
        has_text = true;
      } else if (key == "prompt_ids") {
        need(text::FlatValue::IntArray, "an array of token ids");
        for (int64_t id : v.ints) {
          if (id < 0 || id >= vocab_size)
            throw Error(cat(at, ": prompt_ids holds ", id, ", outside the model's vocabulary [0, ", vocab_size,
                            "): the prompts were encoded with another tokenizer"));
          p.ids.push_back(static_cast<int32_t>(id));
        }
        p.has_ids = true;
      } else if (key == "vocab_sha256") {
        need(text::FlatValue::String, "a string");
        p.vocab_sha256 = v.str;
      } else if (key == "eos_id") {
        need(text::FlatValue::Integer, "an integer");
        p.eos_id = v.integer;
      }
    }
    if (want_ids && !p.has_ids)
      throw Error(cat(at, ": generate.tokenizer = ids needs \"prompt_ids\" (tools/encode_prompts.py writes them)"));
    if (!want_ids && !has_text) throw Error(cat(at, ": the object has no \"prompt\" field"));
    prompts.push_back(std::move(p));
  }
  if (f.bad()) throw Error(cat("generate.prompts_file: error reading '", path, "'"));
  if (prompts.empty()) throw Error(cat("generate.prompts_file '", path, "' holds no prompts"));
  return prompts;
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}


}  // namespace

void check_sample_tokenizer(Session& s) {
  check_tokenizer(*open_tokenizer(s.cfg, nullptr), s.cfg, s.model.config());
}

std::string generate_sample(Session& s, uint64_t seed) {
  auto tok = open_tokenizer(s.cfg, nullptr);
  check_tokenizer(*tok, s.cfg, s.model.config());
  std::vector<int32_t> prompt = tok->encode(s.cfg.generate.prompt);
  auto samples = sample_continuations(s, *tok, prompt, seed, "generate.prompt");
  if (prompt.empty()) prompt.push_back(tok->eos_id() >= 0 ? tok->eos_id() : int32_t('\n'));
  std::string out;
  for (size_t i = 0; i < samples.size(); ++i) {
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), samples[i].begin(), samples[i].end());
    if (i > 0) out += "\n--- sample " + std::to_string(i + 1) + " ---\n";
    out += tok->decode(ids);
  }
  return out;
}

void run_generate(Session& s) {
  const GenerateConfig& g = s.cfg.generate;
  const ModelConfig& mc = s.model.config();
  const bool by_ids = s.cfg.tokenizer() == PromptTokenizer::Ids;
  const bool from_file = !g.prompts_file.empty();
  std::vector<Prompt> prompts;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::vector<int32_t>> encoded;  // each prompt's ids
  auto what = [&](size_t i) {
    return from_file ? cat("generate.prompts_file '", g.prompts_file, "' prompt ", i + 1) : std::string("generate.prompt");
  };
  // The prompts and their tokenizer, on rank 0 before the output starts, agreed (comm/agree.h): a bad
  // prompt is printed once, every rank ends through MPI_Finalize, output.dir is left as it was.
  agreed(s.comm, [&] {
    if (s.comm.rank() != 0) return;
    if (from_file) {
      prompts = read_prompts_file(g.prompts_file, by_ids, mc.vocab_size);
      s.log.info(cat("generate: ", prompts.size(), " prompts from '", g.prompts_file, "'"));
    } else {
      prompts.emplace_back();
      prompts.back().text = g.prompt;
    }
    if (by_ids) {
      // The prompts' tokenizer must be the model's (vocab_sha256 of the weights, from the data it was
      // trained on), and every prompt must come from the same one.
      int64_t eos = -1;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const Prompt& p = prompts[i];
        if (!p.vocab_sha256.empty() && !mc.vocab_sha256.empty() && p.vocab_sha256 != mc.vocab_sha256)
          throw Error(cat("generate.prompts_file '", g.prompts_file, "' prompt ", i + 1, " was encoded with vocab_sha256 ",
                          p.vocab_sha256.substr(0, 12), "... but model.weights '", mc.weights,
                          "' was trained on vocab_sha256 ", mc.vocab_sha256.substr(0, 12),
                          "...: encode the prompts with the model's tokenizer"));
        if (p.eos_id >= 0) eos = p.eos_id;
      }
      tok = std::make_unique<IdsTokenizer>(mc.vocab_size, static_cast<int>(eos));
      s.log.info(cat("generate: prompts as token ids (generate.tokenizer = ids), end-of-text id ",
                     eos >= 0 ? std::to_string(eos) : std::string("none")));
    } else {
      tok = open_tokenizer(s.cfg, &s.log);
      check_tokenizer(*tok, s.cfg, mc);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      encoded.push_back(by_ids ? prompts[i].ids : tok->encode(prompts[i].text));
      check_prompt(s.cfg, mc, encoded.back().empty() ? std::vector<int32_t>{0} : encoded.back(), what(i));
    }
  });
  begin_output(s);
  if (s.comm.rank() != 0) return;

  char num[64];
  auto fmt = [&](double v) {
    std::snprintf(num, sizeof num, "%.9g", v);
    return std::string(num);
  };
  const std::string settings =
      cat("{\"max_new_tokens\":", g.max_new_tokens, ",\"temperature\":", fmt(g.temperature),
          ",\"top_k\":", g.top_k, ",\"top_p\":", fmt(g.top_p), ",\"seed\":", g.seed,
          ",\"num_samples\":", g.num_samples, ",\"tokenizer\":", text::json_quote(g.tokenizer), "}");
  std::string jsonl, txt;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> prompt = encoded[i];
    // Every prompt starts from generate.seed: its samples do not depend on its place in the file.
    auto samples = sample_continuations(s, *tok, prompt, g.seed, what(i));
    if (prompt.empty()) prompt.push_back(tok->eos_id() >= 0 ? tok->eos_id() : int32_t('\n'));
    std::string texts, idss;
    for (size_t k = 0; k < samples.size(); ++k) {
      if (!by_ids) texts += (k ? "," : "") + text::json_quote(tok->decode(samples[k]));
      idss += (k ? "," : "") + ids_json(samples[k]);
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), samples[k].begin(), samples[k].end());
      if (k > 0) txt += "\n--- sample " + std::to_string(k + 1) + " ---\n";
      txt += tok->decode(all);
    }
    if (i + 1 < prompts.size()) txt += "\n=== prompt " + std::to_string(i + 2) + " ===\n";
    jsonl += cat("{\"prompt\":", text::json_quote(prompts[i].text), ",\"prompt_ids\":", ids_json(prompt),
                 by_ids ? std::string() : cat(",\"samples\":[", texts, "]"), ",\"sample_ids\":[", idss,
                 "],\"settings\":", settings, "}\n");
  }
  if (!by_ids) s.log.info(txt);
  write_text_atomically(s.cfg.output.dir + "/generated.jsonl", jsonl);
  if (!from_file) write_text_atomically(s.cfg.output.dir + "/generated.txt", txt);
  if (by_ids)
    s.log.info(cat("generate: wrote ", s.cfg.output.dir, "/generated.jsonl (token ids); text: "
                   "python3 tools/decode_generated.py --tokenizer TOKENIZER ", s.cfg.output.dir, "/generated.jsonl"));
}

}  // namespace nlp
