// Training objectives (run.task) and what each needs from a batch.
#pragma once
#include "config/config.h"  // enum Task, parse_task (run.task's text)

namespace nlp {

inline bool is_seq_cls(Task t) { return t == Task::DocCls || t == Task::PairCls; }
// Tasks whose loss is over token positions (targets [B,T]).
inline bool is_token_task(Task t) { return t == Task::Clm || t == Task::Mlm || t == Task::Ner; }
// Tasks with a num_labels-way classifier.
inline bool has_classifier(Task t) { return is_seq_cls(t) || t == Task::Ner; }

}  // namespace nlp
