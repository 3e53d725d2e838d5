// How GPT-2's tied LM head runs (model.fused_head, model.head_chunk, model.pad_vocab): unfused
// (logits [B*T, V] and their gradient in the activation arena; what run.mode = gradients, logits
// outputs and generation need) or fused with the cross-entropy (Backend::lm_head_crossentropy: one
// chunk of rows at a time, the chunk's logits overwritten by their gradient; no [B*T, V] tensor).
//
// Where the padded vocabulary lives: only in the fused head's GEMM operands. The parameter arena,
// the gradients, AdamW's state, ZeRO's shards, checkpoints, weights files and the Hub export keep
// wte at [V, C]; the fused op stores the chunk's logits with row stride Vp (V rounded up to a
// multiple of 128) and a backend may run its GEMMs over a zero-padded copy of wte (the CUDA backend
// does: backend/cuda/README.md). The padded columns reach neither the loss nor any gradient.
#pragma once
#include <cstddef>
#include <string>

#include "config/config.h"

namespace nlp {

struct LmHeadPlan {
  bool fused = false;
  int Vp = 0;     // the fused head's row stride (>= V)
  int chunk = 0;  // rows per chunk of the fused head
};

// "auto" of model.fused_head and model.pad_vocab resolved for the backend ("cpu" | "cuda"), and
// fused_head off in the run modes that read the logits (gradients, predict, generate).
void resolve_lm_head(ModelConfig& mc, const std::string& backend, RunMode mode);

// The plan for a model of vocabulary V whose activations are carved for `rows` = B*T rows.
LmHeadPlan lm_head_plan(const ModelConfig& mc, const std::string& backend, int V, int rows);

// V rounded up to a multiple of `multiple` (multiple <= 1: V).
inline int padded_vocab(int V, int multiple) {
  return multiple > 1 ? (V + multiple - 1) / multiple * multiple : V;
}

}  // namespace nlp
