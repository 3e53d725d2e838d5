// Model configurations shared by the unit tests that run a whole (tiny) model on the CPU backend.
#pragma once
#include <cstdint>

#include "core/rng.h"
#include "model/model.h"
#include "train/batches.h"

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

// GPT-2: n_layer blocks of width 16, 2 heads, `vocab` tokens, 16 positions, dropout 0.1 on every site
// (the ZeRO-3 tests' model: small enough to run a block at a time, dropout keys exercised).
inline ModelConfig small_gpt2(int n_layer, int vocab) {
  ModelConfig mc;
  mc.type = "gpt2";
  mc.n_layer = n_layer;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.vocab_size = vocab;
  mc.n_positions = 16;
  mc.embd_pdrop = mc.attn_pdrop = mc.resid_pdrop = 0.1f;
  return mc;
}

// A causal-LM batch of B x T random ids below `vocab`, each target the next id (the last position of
// each row and position 5 ignored), no padding.
inline HostBatch clm_batch(int B, int T, uint64_t seed, int vocab = 300) {
  Rng r(seed);
  HostBatch hb;
  hb.B = B;
  hb.T = hb.T_key = T;
  const size_t n = size_t(B) * T;
  hb.ids.resize(n);
  hb.mask.assign(n, 1);
  hb.type_ids.assign(n, 0);
  for (auto& id : hb.ids) id = int32_t(r.uniform() * vocab) % vocab;
  hb.targets.assign(n, kIgnoreIndex);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t + 1 < T; ++t) hb.targets[size_t(b) * T + t] = hb.ids[size_t(b) * T + t + 1];
  hb.targets[5] = kIgnoreIndex;
  hb.labels.assign(B, kIgnoreIndex);
  hb.start.assign(B, kIgnoreIndex);
  hb.end.assign(B, kIgnoreIndex);
  hb.real_tokens = int64_t(n);
  return hb;
}

}  // namespace nlp::test
