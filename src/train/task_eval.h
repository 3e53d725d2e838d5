// Per-task evaluation state: collects each batch's outputs on this rank, combines the ranks with
// sums (every example is owned by exactly one rank, so per-example arrays add up without overlap),
// then computes the task metrics and, on request, the predictions.
//   clm: loss, perplexity            mlm: masked-token accuracy, perplexity
//   doc_cls, pair_cls: accuracy      ner: entity precision/recall/F1 (seqeval) over first sub-tokens
//   qa: exact match and F1 (SQuAD v1.1 and KorQuAD 1.0) on answer text mapped back through offsets
// Predictions (run.mode = predict) carry per example its id, the label and the class probabilities
// (doc_cls, pair_cls), entities with scores (ner), or the answer span with its score (qa); a dataset
// without labels (the prep tools' --no-labels) is predicted without metrics.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "io/dataset.h"
#include "model/model.h"
#include "model/task.h"
#include "train/batches.h"
#include "train/session.h"

namespace nlp {

class TaskEval {
 public:
  // Label names: the dataset's id2label attribute, else `id2label` (from the model: its weights').
  TaskEval(Task task, const TokenDataset& ds, int num_labels, const std::vector<std::string>& id2label = {});
  // Outputs of the model's last forward on hb (examples idx[0..B)), copied from backend memory.
  void add(const HostBatch& hb, const int64_t* idx, const std::vector<OutputView>& outputs,
           Backend& be);
  // Sum across ranks and compute the metrics into r (loss and units already set).
  void finish(Comm& comm, EvalResult& r);
  // Rank 0 only, after finish(): predictions file(s) into dir.
  void write_predictions(const std::string& dir) const;

 private:
  void finish_ner(EvalResult& r);
  void finish_qa(EvalResult& r);

  Task task_;
  const TokenDataset& ds_;
  int NL_;
  int64_t N_;
  int T_;
  bool labelled_;                    // the dataset has the task's labels (else: predictions, no metrics)
  std::vector<std::string> id2label_;
  double correct_ = 0, total_ = 0;   // accuracy counts (cls, mlm)
  std::vector<double> pred_;         // cls: label+1 per example; ner: label+1 per token [N,T]
  std::vector<double> gold_;         // ner: label+1 per labelled token [N,T] (0 = not labelled)
  std::vector<double> prob_;         // cls: softmax [N, NL]; ner: probability of the predicted tag [N,T]
  std::vector<double> span_;         // qa: per feature (valid, score, start char, end char)
  std::vector<int32_t> word_ids_;    // ner without labels: word_ids [N,T] (predict each word's first token)
  std::vector<int32_t> offsets_;     // qa: offset_mapping [N,T,2]
  std::vector<std::string> qa_ids_, qa_answers_;  // qa: per example id and answer (rank 0)
  std::vector<double> qa_scores_;                 // qa: start + end logit of the answer
  std::vector<int64_t> qa_chars_;                 // qa: [start, end) characters in the context
};

}  // namespace nlp
