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

}  // namespace

TaskEval::TaskEval(Task task, const TokenDataset& ds, int num_labels, const std::vector<std::string>& id2label)
    : task_(task), ds_(ds), NL_(num_labels), N_(ds.size()), T_(ds.seq_len()) {
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
  if (is_seq_cls(task)) pred_.assign(size_t(N_), 0);
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
        if (hb.labels[b] == kIgnoreIndex) continue;
        total_ += 1;
        correct_ += p == hb.labels[b];
      }
      return;
    }
    case Task::Ner: {
      std::vector<float> lg = fetch(0);
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) {
          const size_t i = size_t(b) * T + t, g = size_t(idx[b]) * T_ + t;  // T <= T_ (trimmed)
          pred_[g] = argmax(lg.data() + i * NL_, NL_) + 1;
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
      r.metrics = {{"accuracy", acc[1] > 0 ? acc[0] / acc[1] : 0}};
      r.primary = "accuracy";
      r.primary_value = r.metrics[0].second;
      r.higher_is_better = true;
      return;
    case Task::Ner: return finish_ner(r);
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
  for (size_t e = 0; e < E; ++e) {
    if (arg[e] < 0) continue;
    const int64_t i = arg[e];
    const auto cp = codepoint_offsets(contexts[e]);
    std::string text = substr_chars(contexts[e], cp, int64_t(span_[4 * i + 2]), int64_t(span_[4 * i + 3]));
    const auto golds = text::parse_string_array(answers[e], ds_.path() + ":answers");
    em += squad_exact_match(text, golds);
    f1 += squad_f1(text, golds);
    kem += korquad_exact_match(text, golds);
    kf1 += korquad_f1(text, golds);
    ++count;
    qa_ids_.push_back(ids[e]);
    qa_answers_.push_back(std::move(text));
  }
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
  const bool qa = task_ == Task::Qa;
  const std::string path = dir + (qa ? "/predictions.json" : "/predictions.jsonl");
  std::ostringstream out;
  {
    if (qa) {  // SQuAD prediction format: {"question id": "answer text", ...}
      out << "{";
      for (size_t i = 0; i < qa_ids_.size(); ++i)
        out << (i ? ",\n" : "\n") << text::json_quote(qa_ids_[i]) << ": " << text::json_quote(qa_answers_[i]);
      out << "\n}\n";
    } else if (is_seq_cls(task_)) {
      for (int64_t n = 0; n < N_; ++n) {
        if (pred_[n] <= 0) continue;
        const int k = int(pred_[n]) - 1;
        Json j;
        j.integer("index", n).integer("label", k);
        if (size_t(k) < id2label_.size()) j.str("label_name", id2label_[k]);
        out << j.done() << "\n";
      }
    } else {  // ner: entities over the labelled (first) sub-tokens, with character spans when known
      const h5::File& f = ds_.file();
      std::vector<int32_t> off;
      std::vector<std::string> texts, ids;
      if (f.has("offset_mapping") && f.has("text")) {
        off.resize(size_t(N_) * T_ * 2);
        f.read_i32("offset_mapping", {N_, T_, 2}, off.data());
        texts = f.read_strings("text");
      }
      if (f.has("example_id")) ids = f.read_strings("example_id");
      for (int64_t n = 0; n < N_; ++n) {
        std::vector<int> pos;
        std::vector<std::string> tags;
        for (int t = 0; t < T_; ++t) {
          const size_t i = size_t(n) * T_ + t;
          if (gold_[i] <= 0 || pred_[i] <= 0) continue;
          pos.push_back(t);
          tags.push_back(id2label_.at(size_t(pred_[i]) - 1));
        }
        if (pos.empty()) continue;
        std::string ents;
        for (const Entity& e : extract_entities(tags)) {
          Json j;
          j.str("type", e.type).integer("token_start", pos[e.begin]).integer("token_end", pos[e.end - 1] + 1);
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
        out << s << ",\"entities\":[" << ents << "]}\n";
      }
    }
  }
  write_text_atomically(path, out.str());
}

}  // namespace nlp
