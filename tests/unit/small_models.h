// Model configurations shared by the unit tests that run a whole (tiny) model on the CPU backend.
#pragma once
#include "model/model.h"

namespace nlp::test {

// BERT: 2 layers of width 32, 4 heads, 97 tokens, 64 positions, 3 labels, dropout 0.2 on both sites
// (so that dropout keys are exercised).
inline ModelConfig small_bert() {
  ModelConfig mc;
  mc.type = "bert";
  mc.vocab_size = 97;
  mc.hidden_size = 32;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 4;
  mc.intermediate_size = 48;
  mc.max_position_embeddings = 64;
  mc.num_labels = 3;
  mc.hidden_dropout_prob = 0.2f;
  mc.attention_probs_dropout_prob = 0.2f;
  mc.layer_norm_eps = 1e-12f;
  return mc;
}

}  // namespace nlp::test
