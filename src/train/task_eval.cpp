#include "train/task_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "metrics/metrics.h"
#include "text/json_min.h"
#include "train/log.h"

namespace nlp {
namespace {

constexpr int kMaxAnswerTokens = 30;  // as HF's run_qa.py max_answer_length

// Byte offset of every code point of a UTF-8 string, plus its size at the end: HF offsets count
// characters (Python code points), C++ strings count bytes.
std::vector<size_t> codepoint_offsets(const std::string& s) {
  std::vector<size_t> o;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) o.push_back(i);
  o.push_back(s.size());
  return o;
}

std::string substr_chars(const std::string& s, const std::vector<size_t>& cp, int64_t a, int64_t b) {
  const int64_t n = static_cast<int64_t>(cp.size()) - 1;
  a = std::clamp<int64_t>(a, 0, n);
  b = std::clamp<int64_t>(b, a, n);
  return s.substr(cp[a], cp[b] - cp[a]);
}

int argmax(const float* v, int n) {
  return static_cast<int>(std::max_element(v, v + n) - v);
}

// Softmax of n logits into out (double; the max is subtracted first).
void softmax_into(const float* v, int n, double* out) {
  const double m = *std::max_element(v, v + n);
  double z = 0;
  for (int k = 0; k < n; ++k) z += out[k] = std::exp(double(v[k]) - m);
  for (int k = 0; k < n; ++k) out[k] /= z;
}

std::string json_numbers(const double* v, size_t n) {
  std::string s = "[";
  char buf[32];
  for (size_t k = 0; k < n; ++k) {
    std::snprintf(buf, sizeof buf, "%s%.6g", k ? "," : "", v[k]);
    s += buf;
  }
  return s + "]";
}

}  // namespace

TaskEval::TaskEval(Task task, const TokenDataset& ds, int num_labels, const std::vector<std::string>& id2label)
    : task_(task), ds_(ds), NL_(num_labels), N_(ds.size()), T_(ds.seq_len()),
      labelled_(is_seq_cls(task) ? ds.has_seq_labels() : task == Task::Qa ? ds.has_positions()
                                                                          : ds.has_token_labels() || task == Task::Clm) {
  const h5::File& f = ds.file();
  if (f.has_attr("id2label")) id2label_ = text::parse_string_array(f.attr_string("id2label"), ds.path() + ":id2label");
  else id2label_ = id2label;
  if (task == Task::Ner) {
    if (id2label_.size() != static_cast<size_t>(NL_))
      throw Error(cat("file '", ds.path(), "': ner needs the root attribute id2label with ", NL_,
                      " tags (found ", id2label_.size(), ")"));
    pred_.assign(size_t(N_) * T_, 0);
    gold_.assign(size_t(N_) * T_, 0);
  }
  if (task == Task::Ner) {
    prob_.assign(size_t(N_) * T_, 0);
    if (!ds.has_token_labels()) {
      if (!f.has("word_ids"))
        throw Error(cat("file '", ds.path(), "': ner without 'labels' needs 'word_ids' [examples, seq_len] to "
                        "know each word's first sub-token (tools/prep_ner.py writes it)"));
      word_ids_.resize(size_t(N_) * T_);
      f.read_i32("word_ids", {N_, T_}, word_ids_.data());
    }
  }
  if (is_seq_cls(task)) {
    pred_.assign(size_t(N_), 0);
    prob_.assign(size_t(N_) * NL_, 0);
  }
  if (task == Task::Qa) {
    for (const char* col : {"offset_mapping", "example_index", "context", "answers", "example_id"})
      if (!f.has(col))
        throw Error(cat("file '", ds.path(), "': qa evaluation needs the dataset '", col,
                        "' (tools/prep_qa.py writes it)"));
    span_.assign(size_t(N_) * 4, 0);
    offsets_.resize(size_t(N_) * T_ * 2);
    f.read_i32("offset_mapping", {N_, T_, 2}, offsets_.data());
  }
}

void TaskEval::add(const HostBatch& hb, const int64_t* idx, const std::vector<OutputView>& outputs,
                   Backend& be) {
  const int B = hb.B, T = hb.T;
  auto fetch = [&](size_t k) {
    const OutputView& o = outputs.at(k);
    size_t n = 1;
    for (auto d : o.shape) n *= size_t(d);
    std::vector<float> h(n);
    be.to_host(h.data(), o.data, n * sizeof(float));
    return h;
  };
  switch (task_) {
    case Task::Clm: return;
    case Task::Mlm: {
      // logits [nrows, V]: one row per masked position, in the order of hb.rows
      const int V = static_cast<int>(outputs[0].shape[1]);
      NLP_ASSERT(size_t(outputs[0].shape[0]) == hb.row_targets.size());
      std::vector<float> lg = fetch(0);
      for (size_t i = 0; i < hb.row_targets.size(); ++i) {
        total_ += 1;
        correct_ += argmax(lg.data() + i * V, V) == hb.row_targets[i];
      }
      return;
    }
    case Task::DocCls:
    case Task::PairCls: {
      std::vector<float> lg = fetch(0);
      for (int b = 0; b < B; ++b) {
        const int p = argmax(lg.data() + size_t(b) * NL_, NL_);
        pred_[idx[b]] = p + 1;
        softmax_into(lg.data() + size_t(b) * NL_, NL_, prob_.data() + size_t(idx[b]) * NL_);
        if (hb.labels[b] == kIgnoreIndex) continue;
        total_ += 1;
        correct_ += p == hb.labels[b];
      }
      return;
    }
    case Task::Ner: {
      std::vector<float> lg = fetch(0);
      std::vector<double> probs(static_cast<size_t>(NL_));
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) {
          const size_t i = size_t(b) * T + t, g = size_t(idx[b]) * T_ + t;  // T <= T_ (trimmed)
          const int p = argmax(lg.data() + i * NL_, NL_);
          pred_[g] = p + 1;
          softmax_into(lg.data() + i * NL_, NL_, probs.data());
          prob_[g] = probs[size_t(p)];
          gold_[g] = hb.targets[i] == kIgnoreIndex ? 0 : hb.targets[i] + 1;
        }
      return;
    }
    case Task::Qa: {
      std::vector<float> st = fetch(0), en = fetch(1);
      for (int b = 0; b < B; ++b) {
        // best span of this feature: start i <= end j < i + 30, both inside the context
        // (offsets [T,2] are -1 outside it); score = start logit + end logit, as HF's run_qa.py
        const int64_t f = idx[b];
        const int32_t* o = offsets_.data() + size_t(f) * T_ * 2;  // the file's rows; T <= T_
        const float* s = st.data() + size_t(b) * T;
        const float* e = en.data() + size_t(b) * T;
        double best = -INFINITY;
        int bs = -1, bend = -1;
        for (int i = 0; i < T; ++i) {
          if (o[2 * i] < 0) continue;
          for (int j = i; j < std::min(T, i + kMaxAnswerTokens); ++j) {
            if (o[2 * j] < 0) continue;
            const double sc = double(s[i]) + double(e[j]);
            if (sc > best) { best = sc; bs = i; bend = j; }
          }
        }
        if (bs < 0) continue;
        span_[4 * f] = 1;
        span_[4 * f + 1] = best;
        span_[4 * f + 2] = o[2 * bs];
        span_[4 * f + 3] = o[2 * bend + 1];
      }
      return;
    }
  }
}

void TaskEval::finish(Comm& comm, EvalResult& r) {
  double acc[2] = {correct_, total_};
  comm.allreduce_sum_host(acc, 2);
  if (!pred_.empty()) comm.allreduce_sum_host(pred_.data(), pred_.size());
  if (!gold_.empty()) comm.allreduce_sum_host(gold_.data(), gold_.size());
  if (!span_.empty()) comm.allreduce_sum_host(span_.data(), span_.size());
  if (!prob_.empty()) comm.allreduce_sum_host(prob_.data(), prob_.size());
  r.perplexity = std::exp(r.loss);
  switch (task_) {
    case Task::Clm:
      r.metrics = {{"perplexity", r.perplexity}};
      r.primary = "loss";
      r.primary_value = r.loss;
      r.higher_is_better = false;
      return;
    case Task::Mlm:
      r.metrics = {{"accuracy", acc[1] > 0 ? acc[0] / acc[1] : 0}, {"perplexity", r.perplexity}};
      r.primary = "loss";
      r.primary_value = r.loss;
      r.higher_is_better = false;
      return;
    case Task::DocCls:
    case Task::PairCls:
      if (!labelled_) return;  // predictions only
      r.metrics = {{"accuracy", acc[1] > 0 ? acc[0] / acc[1] : 0}};
      r.primary = "accuracy";
      r.primary_value = r.metrics[0].second;
      r.higher_is_better = true;
      return;
    case Task::Ner: return labelled_ ? finish_ner(r) : void();
    case Task::Qa: return finish_qa(r);
  }
}

void TaskEval::finish_ner(EvalResult& r) {
  std::vector<std::vector<std::string>> gold, pred;
  for (int64_t n = 0; n < N_; ++n) {
    std::vector<std::string> g, p;
    for (int t = 0; t < T_; ++t) {
      const size_t i = size_t(n) * T_ + t;
      if (gold_[i] <= 0) continue;
      g.push_back(id2label_.at(size_t(gold_[i]) - 1));
      p.push_back(id2label_.at(size_t(pred_[i]) - 1));
    }
    if (g.empty()) continue;
    gold.push_back(std::move(g));
    pred.push_back(std::move(p));
  }
  PRF prf = entity_prf(gold, pred);
  r.metrics = {{"precision", prf.precision}, {"recall", prf.recall}, {"f1", prf.f1}};
  r.primary = "f1";
  r.primary_value = prf.f1;
  r.higher_is_better = true;
}

void TaskEval::finish_qa(EvalResult& r) {
  const h5::File& f = ds_.file();
  std::vector<int32_t> ex(N_);
  f.read_i32("example_index", {N_}, ex.data());
  const auto contexts = f.read_strings("context");
  const auto answers = f.read_strings("answers");
  const auto ids = f.read_strings("example_id");
  const size_t E = contexts.size();
  if (answers.size() != E || ids.size() != E)
    throw Error(cat("file '", ds_.path(), "': context, answers and example_id differ in length"));
  // Best span per example over its features.
  std::vector<double> best(E, -INFINITY);
  std::vector<int64_t> arg(E, -1);
  for (int64_t i = 0; i < N_; ++i) {
    if (span_[4 * i] <= 0) continue;
    const int32_t e = ex[i];
    if (e < 0 || size_t(e) >= E)
      throw Error(cat("file '", ds_.path(), "': example_index[", i, "] = ", e, " is out of range"));
    if (span_[4 * i + 1] > best[e]) { best[e] = span_[4 * i + 1]; arg[e] = i; }
  }
  double em = 0, f1 = 0, kem = 0, kf1 = 0;
  int64_t count = 0;
  qa_ids_.clear();
  qa_answers_.clear();
  qa_scores_.clear();
  qa_chars_.clear();
  for (size_t e = 0; e < E; ++e) {
    if (arg[e] < 0) continue;
    const int64_t i = arg[e];
    const auto cp = codepoint_offsets(contexts[e]);
    std::string text = substr_chars(contexts[e], cp, int64_t(span_[4 * i + 2]), int64_t(span_[4 * i + 3]));
    const auto golds = text::parse_string_array(answers[e], ds_.path() + ":answers");
    if (!golds.empty()) {  // an unlabelled question (prep_qa.py --no-labels) is predicted, not scored
      em += squad_exact_match(text, golds);
      f1 += squad_f1(text, golds);
      kem += korquad_exact_match(text, golds);
      kf1 += korquad_f1(text, golds);
      ++count;
    }
    qa_ids_.push_back(ids[e]);
    qa_answers_.push_back(std::move(text));
    qa_scores_.push_back(span_[4 * i + 1]);
    qa_chars_.push_back(int64_t(span_[4 * i + 2]));
    qa_chars_.push_back(int64_t(span_[4 * i + 3]));
  }
  if (count == 0 && !labelled_) return;  // predictions only
  const double c = count > 0 ? double(count) : 1.0;
  r.metrics = {{"exact_match", 100 * em / c}, {"f1", 100 * f1 / c}, {"korquad_exact_match", 100 * kem / c},
               {"korquad_f1", 100 * kf1 / c}, {"questions", double(count)}};
  r.primary = "f1";
  r.primary_value = 100 * f1 / c;
  r.higher_is_better = true;
}

void TaskEval::write_predictions(const std::string& dir) const {
  if (task_ == Task::Clm || task_ == Task::Mlm)
    throw Error("run.mode = predict supports doc_cls, pair_cls, ner and qa");
  const h5::File& f = ds_.file();
  auto strings = [&](const char* name) { return f.has(name) ? f.read_strings(name) : std::vector<std::string>{}; };
  if (task_ == Task::Qa) {
    // predictions.json: SQuAD's prediction format {"question id": "answer text", ...} (what the
    // official evaluation scripts read); predictions.jsonl: per question the span and its score.
    std::ostringstream json, lines;
    json << "{";
    for (size_t i = 0; i < qa_ids_.size(); ++i) {
      json << (i ? ",\n" : "\n") << text::json_quote(qa_ids_[i]) << ": " << text::json_quote(qa_answers_[i]);
      Json j;
      j.str("id", qa_ids_[i]).str("answer", qa_answers_[i]).integer("start", qa_chars_[2 * i])
          .integer("end", qa_chars_[2 * i + 1]).num("score", qa_scores_[i]);
      lines << j.done() << "\n";
    }
    json << "\n}\n";
    write_text_atomically(dir + "/predictions.json", json.str());
    write_text_atomically(dir + "/predictions.jsonl", lines.str());
    return;
  }
  std::ostringstream out;
  const std::vector<std::string> ids = strings("example_id");
  if (is_seq_cls(task_)) {
    // one line per example: index, id, predicted label (and name), its probability, every class's
    // probability (softmax of the logits), and the text when the dataset keeps it
    const std::vector<std::string> texts = strings("text"), pairs = strings("text_pair");
    for (int64_t n = 0; n < N_; ++n) {
      if (pred_[n] <= 0) continue;
      const int k = int(pred_[n]) - 1;
      const double* p = prob_.data() + size_t(n) * NL_;
      Json j;
      j.integer("index", n);
      if (size_t(n) < ids.size()) j.str("id", ids[n]);
      j.integer("label", k);
      if (size_t(k) < id2label_.size()) j.str("label_name", id2label_[k]);
      j.num("score", p[k]).raw("probabilities", json_numbers(p, size_t(NL_)));
      if (size_t(n) < texts.size()) j.str("text", texts[n]);
      if (size_t(n) < pairs.size()) j.str("text_pair", pairs[n]);
      out << j.done() << "\n";
    }
  } else {  // ner: entities over the labelled (first) sub-tokens, with character spans when known
    std::vector<int32_t> off;
    std::vector<std::string> texts;
    if (f.has("offset_mapping") && f.has("text")) {
      off.resize(size_t(N_) * T_ * 2);
      f.read_i32("offset_mapping", {N_, T_, 2}, off.data());
      texts = f.read_strings("text");
    }
    // The predicted positions: the labelled ones; without labels, each word's first sub-token (word_ids).
    auto predicted = [&](int64_t n, int t) {
      const size_t i = size_t(n) * T_ + t;
      if (pred_[i] <= 0) return false;
      if (labelled_) return gold_[i] > 0;
      return word_ids_[i] >= 0 && (t == 0 || word_ids_[i - 1] != word_ids_[i]);
    };
    for (int64_t n = 0; n < N_; ++n) {
      std::vector<int> pos;
      std::vector<std::string> tags;
      for (int t = 0; t < T_; ++t) {
        if (!predicted(n, t)) continue;
        pos.push_back(t);
        tags.push_back(id2label_.at(size_t(pred_[size_t(n) * T_ + t]) - 1));
      }
      if (pos.empty()) continue;
      std::string ents;
      for (const Entity& e : extract_entities(tags)) {
        double score = 0;  // mean probability of the entity's predicted tags
        for (int k = e.begin; k < e.end; ++k) score += prob_[size_t(n) * T_ + pos[k]];
        Json j;
        j.str("type", e.type).integer("token_start", pos[e.begin]).integer("token_end", pos[e.end - 1] + 1)
            .num("score", score / (e.end - e.begin));
        if (!texts.empty()) {
          // the entity ends where the last labelled word ends: before the next labelled token
          const int last = e.end < int(pos.size()) ? pos[e.end] : T_;
          int32_t c0 = off[(size_t(n) * T_ + pos[e.begin]) * 2], c1 = c0;
          for (int t = pos[e.end - 1]; t < last; ++t)
            c1 = std::max(c1, off[(size_t(n) * T_ + t) * 2 + 1]);
          const auto cp = codepoint_offsets(texts[n]);
          j.integer("start", c0).integer("end", c1).str("text", substr_chars(texts[n], cp, c0, c1));
        }
        ents += (ents.empty() ? "" : ",") + j.done();
      }
      Json line;
      line.integer("index", n);
      if (size_t(n) < ids.size()) line.str("id", ids[n]);
      std::string s = line.done();
      s.pop_back();
      out << s << ",\"entities\":[" << ents << "]";
      if (size_t(n) < texts.size()) out << ",\"text\":" << text::json_quote(texts[n]);
      out << "}\n";
    }
  }
  write_text_atomically(dir + "/predictions.jsonl", out.str());
}

}  // namespace nlp
