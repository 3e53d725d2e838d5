// Evaluation metrics of the BERT tasks, host-side and exact:
//   accuracy (sequence classification),
//   entity-level precision/recall/F1 over BIO tags in the seqeval convention (default, non-strict mode),
//   SQuAD v1.1 / KorQuAD 1.0 exact match and F1 on answer strings with the official normalisation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nlp {

double accuracy(const std::vector<int32_t>& pred, const std::vector<int32_t>& gold);

struct Entity {
  std::string type;
  int begin = 0, end = 0;  // token positions [begin, end), within one sentence
  bool operator==(const Entity& o) const { return type == o.type && begin == o.begin && end == o.end; }
};

// Entities of one sentence of BIO tags ("O", "B-PER", "I-PER"; also accepts IOB1-style sequences the
// way seqeval's default mode does: an I- after O or after another type starts a new entity).
std::vector<Entity> extract_entities(const std::vector<std::string>& tags);

struct PRF {
  double precision = 0, recall = 0, f1 = 0;
  int64_t true_positives = 0, predicted = 0, gold = 0;
};
// Micro-averaged entity P/R/F1 over sentences (exact span and type), as seqeval.metrics.f1_score.
PRF entity_prf(const std::vector<std::vector<std::string>>& gold,
               const std::vector<std::vector<std::string>>& pred);

// SQuAD v1.1 official normalisation: lower-case, remove punctuation, remove English articles
// (a, an, the), collapse whitespace. UTF-8 aware (Korean text passes through unchanged).
std::string squad_normalize(const std::string& s);
// Max over the gold answers, as the official scripts do.
double squad_exact_match(const std::string& pred, const std::vector<std::string>& golds);
double squad_f1(const std::string& pred, const std::vector<std::string>& golds);
// KorQuAD 1.0 official evaluation (its F1 differs from SQuAD's: see metrics.cpp).
double korquad_exact_match(const std::string& pred, const std::vector<std::string>& golds);
double korquad_f1(const std::string& pred, const std::vector<std::string>& golds);

}  // namespace nlp
