// Training objectives (run.task) and what each needs from a batch.
#pragma once
#include <string>

#include "core/error.h"

namespace nlp {

enum class Task { Clm, Mlm, DocCls, PairCls, Ner, Qa };

inline Task parse_task(const std::string& s) {
  if (s == "clm") return Task::Clm;
  if (s == "mlm") return Task::Mlm;
  if (s == "doc_cls") return Task::DocCls;
  if (s == "pair_cls") return Task::PairCls;
  if (s == "ner") return Task::Ner;
  if (s == "qa") return Task::Qa;
  throw Error(cat("run.task: unknown task '", s, "'"));
}

inline bool is_seq_cls(Task t) { return t == Task::DocCls || t == Task::PairCls; }
// Tasks whose loss is over token positions (targets [B,T]).
inline bool is_token_task(Task t) { return t == Task::Clm || t == Task::Mlm || t == Task::Ner; }
// Tasks with a num_labels-way classifier.
inline bool has_classifier(Task t) { return is_seq_cls(t) || t == Task::Ner; }

}  // namespace nlp
