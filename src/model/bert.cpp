// BERT (HF BertModel + task heads) on the shared transformer block (post-LN, padding mask, erf GELU),
// and the encoders that differ from it only in their embeddings, heads and names (model.type):
//   roberta (RobertaModel, names under "roberta."): position ids are pad_token_id + the running count
//       of non-pad tokens (pads at pad_token_id, whose position row is a padding_idx: no gradient),
//       so sequences reach max_position_embeddings - pad_token_id - 1; no pooler; doc_cls/pair_cls by
//       RobertaClassificationHead (first token -> dropout -> classifier.dense -> tanh -> dropout ->
//       classifier.out_proj); mlm by lm_head (dense -> GELU -> layer_norm -> decoder tied to the word
//       embeddings + lm_head.bias); ner and qa as BERT's.
//   electra (ElectraModel, the discriminator, names under "electra."): embeddings of width
//       embedding_size E, projected to hidden_size H by embeddings_project when E != H; no pooler;
//       doc_cls/pair_cls by ElectraClassificationHead (as RoBERTa's with GELU (erf) for tanh); ner
//       and qa as BERT's; no mlm (the discriminator's objective is not one; config/config_checks.cpp refuses it).
// Embeddings: LayerNorm(word + position + token_type) then dropout (then electra's projection).
// Heads by run.task, with the HF state_dict names and nn.Linear [out, in] layout:
//   doc_cls, pair_cls (BertForSequenceClassification): pooler tanh(dense([CLS])) -> dropout -> classifier
//   ner (BertForTokenClassification): dropout -> classifier on every token, ignore -100; in training
//       on the labelled positions only (DeviceBatch::rows): the others carry no loss
//   qa (BertForQuestionAnswering): qa_outputs -> start/end logits; loss = mean of the two CEs
//   mlm (BertForMaskedLM): transform (dense, GELU, LayerNorm) -> decoder tied to the word embeddings
//       + cls.predictions.bias, applied to the masked positions only (DeviceBatch::rows): the other
//       positions carry no loss, so HF's logits there are never used; this saves ~85% of the head,
//       which is most of the work of a small BERT (V x C against 12 C^2 per layer).
// The last block runs after its attention at the rows the head reads only (block.h OutRows): the
// [CLS] rows (doc_cls, pair_cls), the masked positions (mlm), or in training the labelled positions
// (ner: the first sub-token of each word, about 43% of KLUE NER's tokens with kcbert's vocabulary);
// qa reads every row. For a 4-layer BERT on short fine-tuning rows that is about a sixth of the
// encoder's work (doc_cls), a tenth (ner).
// set_last_block_all_rows(true) computes every row, as transformers does (the tests compare the two).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "model/block.h"
#include "model/activation_arena.h"
#include "model/carver.h"
#include "model/model.h"
#include "model/task.h"
#include "text/json_min.h"

namespace nlp {
namespace {

enum class Family { Bert, Roberta, Electra };

Family parse_family(ModelType type) {
  if (type == ModelType::Roberta) return Family::Roberta;
  if (type == ModelType::Electra) return Family::Electra;
  return Family::Bert;
}

class Bert final : public Model {
 public:
  Bert(const ModelConfig& mc, Backend& be, Task task, bool allocate)
      : mc_(mc), be_(be), task_(task), fam_(parse_family(mc.model_type())) {
    C_ = mc.hidden_size;
    V_ = mc.vocab_size;
    L_ = mc.num_hidden_layers;
    NL_ = mc.num_labels;
    pad_ = mc.pad_token_id;
    prefix_ = fam_ == Family::Roberta ? "roberta." : fam_ == Family::Electra ? "electra." : "bert.";
    E_ = fam_ == Family::Electra && mc.embedding_size > 0 ? mc.embedding_size : C_;
    project_ = E_ != C_;
    if (pad_ < -1 || pad_ >= V_)
      throw Error(cat("model.pad_token_id = ", pad_, " is outside [-1, vocab_size = ", V_, ")"));
    if (fam_ == Family::Roberta && (pad_ < 0 || mc.max_sequence_length() < 1))
      throw Error(cat("model.type = roberta needs a pad_token_id in [0, max_position_embeddings - 1) (its "
                      "positions start at pad_token_id + 1); pad_token_id = ", pad_,
                      ", max_position_embeddings = ", mc.max_position_embeddings));
    if (fam_ == Family::Electra && task == Task::Mlm)
      throw Error("run.task = mlm: model.type = electra is ELECTRA's discriminator, which has no mlm head "
                  "(fine-tune it on doc_cls, pair_cls, ner or qa)");
    if (has_classifier(task) && NL_ < 2)
      throw Error(cat("model.num_labels = ", NL_, ": run.task needs at least 2 labels"));
    // the block: post-LN, bidirectional, erf GELU, nn.Linear weights [out, in]
    bc_ = BlockConfig{.C = C_, .NH = mc.num_attention_heads, .FF = mc.intermediate_size, .pre_ln = false,
                      .causal = false, .gelu = Gelu::Erf, .layout = WLayout::OutIn, .ln_eps = mc.layer_norm_eps,
                      .attn_pdrop = mc.attention_probs_dropout_prob, .resid_pdrop = mc.hidden_dropout_prob,
                      .act = mc.bf16_activations ? DType::BF16 : DType::F32};

    const int64_t C = C_, FF = bc_.FF, E = E_;
    const std::string& pre = prefix_;
    wte_ = ps_.add(pre + "embeddings.word_embeddings.weight", {V_, E}, true);
    wpe_ = ps_.add(pre + "embeddings.position_embeddings.weight", {mc.max_position_embeddings, E}, true);
    wtt_ = ps_.add(pre + "embeddings.token_type_embeddings.weight", {mc.type_vocab_size, E}, true);
    eln_w_ = ps_.add(pre + "embeddings.LayerNorm.weight", {E}, false);
    eln_b_ = ps_.add(pre + "embeddings.LayerNorm.bias", {E}, false);
    if (project_) {  // electra: E -> H
      proj_w_ = ps_.add(pre + "embeddings_project.weight", {C, E}, true);
      proj_b_ = ps_.add(pre + "embeddings_project.bias", {C}, false);
    }
    for (int l = 0; l < L_; ++l) {
      const std::string p = cat(pre, "encoder.layer.", l, ".");
      BlockParamIdx li;
      // query/key/value stored back to back: one fused [3C, C] matmul (q | k | v), as the block expects.
      li.qkv_w = ps_.add(p + "attention.self.query.weight", {C, C}, true);
      ps_.add(p + "attention.self.key.weight", {C, C}, true, /*packed=*/true);
      ps_.add(p + "attention.self.value.weight", {C, C}, true, /*packed=*/true);
      li.qkv_b = ps_.add(p + "attention.self.query.bias", {C}, false);
      ps_.add(p + "attention.self.key.bias", {C}, false, /*packed=*/true);
      ps_.add(p + "attention.self.value.bias", {C}, false, /*packed=*/true);
      li.proj_w = ps_.add(p + "attention.output.dense.weight", {C, C}, true);
      li.proj_b = ps_.add(p + "attention.output.dense.bias", {C}, false);
      li.ln1_w = ps_.add(p + "attention.output.LayerNorm.weight", {C}, false);
      li.ln1_b = ps_.add(p + "attention.output.LayerNorm.bias", {C}, false);
      li.fc_w = ps_.add(p + "intermediate.dense.weight", {FF, C}, true);
      li.fc_b = ps_.add(p + "intermediate.dense.bias", {FF}, false);
      li.fcp_w = ps_.add(p + "output.dense.weight", {C, FF}, true);
      li.fcp_b = ps_.add(p + "output.dense.bias", {C}, false);
      li.ln2_w = ps_.add(p + "output.LayerNorm.weight", {C}, false);
      li.ln2_b = ps_.add(p + "output.LayerNorm.bias", {C}, false);
      stack_.layers.push_back(li);
    }
    // doc_cls, pair_cls: BERT's pooler and classifier, or RoBERTa's / ELECTRA's classification head
    // (its dense in pool_*, its out_proj in cls_*)
    const bool head2 = is_seq_cls(task) && fam_ != Family::Bert;
    if (is_seq_cls(task)) {
      pool_w_ = ps_.add(head2 ? "classifier.dense.weight" : "bert.pooler.dense.weight", {C, C}, true);
      pool_b_ = ps_.add(head2 ? "classifier.dense.bias" : "bert.pooler.dense.bias", {C}, false);
    }
    if (has_classifier(task)) {
      cls_w_ = ps_.add(head2 ? "classifier.out_proj.weight" : "classifier.weight", {NL_, C}, true);
      cls_b_ = ps_.add(head2 ? "classifier.out_proj.bias" : "classifier.bias", {NL_}, false);
    }
    if (task == Task::Qa) {
      qa_w_ = ps_.add("qa_outputs.weight", {2, C}, true);
      qa_b_ = ps_.add("qa_outputs.bias", {2}, false);
    }
    if (task == Task::Mlm && fam_ == Family::Roberta) {  // RobertaLMHead
      mlm_b_ = ps_.add("lm_head.bias", {V_}, false);
      tr_w_ = ps_.add("lm_head.dense.weight", {C, C}, true);
      tr_b_ = ps_.add("lm_head.dense.bias", {C}, false);
      tln_w_ = ps_.add("lm_head.layer_norm.weight", {C}, false);
      tln_b_ = ps_.add("lm_head.layer_norm.bias", {C}, false);
    } else if (task == Task::Mlm) {
      tr_w_ = ps_.add("cls.predictions.transform.dense.weight", {C, C}, true);
      tr_b_ = ps_.add("cls.predictions.transform.dense.bias", {C}, false);
      tln_w_ = ps_.add("cls.predictions.transform.LayerNorm.weight", {C}, false);
      tln_b_ = ps_.add("cls.predictions.transform.LayerNorm.bias", {C}, false);
      mlm_b_ = ps_.add("cls.predictions.bias", {V_}, false);
    }
    if (allocate) ps_.allocate(be_);
  }

  ~Bert() override {
    be_.release(mlm_logits_);
    be_.release(cls_rows_);
  }

  void set_last_block_all_rows(bool on) override { all_rows_ = on; }
  int last_block_rows() const override { return rows_.S; }

  ParamStore& params() override { return ps_; }
  const ModelConfig& config() const override { return mc_; }

  std::string base_prefix() const override { return prefix_; }

  bool may_be_new(const std::string& name) const override {
    return name.rfind(prefix_ + "embeddings.", 0) != 0 && name.rfind(prefix_ + "encoder.", 0) != 0 &&
           name.rfind(prefix_ + "embeddings_project.", 0) != 0;
  }

  void write_attrs(h5::File& f) const override {
    write_tokenizer_attrs(f, mc_);
    static const char* heads[] = {"", "ForMaskedLM", "ForSequenceClassification", "ForSequenceClassification",
                                  "ForTokenClassification", "ForQuestionAnswering"};
    const char* family = fam_ == Family::Roberta ? "Roberta" : fam_ == Family::Electra ? "Electra" : "Bert";
    f.set_attr("model_type", mc_.type);
    f.set_attr("architectures", cat(family, heads[int(task_)]));
    if (fam_ == Family::Electra) f.set_attr("embedding_size", int64_t(E_));
    f.set_attr("hidden_act", std::string("gelu"));
    f.set_attr("hidden_size", int64_t(mc_.hidden_size));
    f.set_attr("num_hidden_layers", int64_t(mc_.num_hidden_layers));
    f.set_attr("num_attention_heads", int64_t(mc_.num_attention_heads));
    f.set_attr("intermediate_size", int64_t(mc_.intermediate_size));
    f.set_attr("max_position_embeddings", int64_t(mc_.max_position_embeddings));
    f.set_attr("type_vocab_size", int64_t(mc_.type_vocab_size));
    f.set_attr("vocab_size", int64_t(mc_.vocab_size));
    f.set_attr("layer_norm_eps", double(mc_.layer_norm_eps));
    f.set_attr("hidden_dropout_prob", double(mc_.hidden_dropout_prob));
    f.set_attr("attention_probs_dropout_prob", double(mc_.attention_probs_dropout_prob));
    f.set_attr("initializer_range", double(mc_.initializer_range));
    f.set_attr("num_labels", int64_t(has_classifier(task_) ? NL_ : 2));
    // label names (JSON list; tools/hf_export.py writes them as config.json's id2label / label2id)
    if (has_classifier(task_) && int(mc_.id2label.size()) == NL_)
      f.set_attr("id2label", text::write_string_array(mc_.id2label));
    f.set_attr("pad_token_id", int64_t(pad_));  // -1 = none (null in config.json)
  }

  // HF BertPreTrainedModel._init_weights: Linear and Embedding N(0, initializer_range), biases 0,
  // LayerNorm 1/0 (BERT's "LayerNorm" modules and RobertaLMHead's "layer_norm"), the padding row
  // (pad_token_id) of the word embeddings zero. A tensor at a time through one host buffer (the
  // largest tensor's size), the draws in the tensors' order as before: no whole-parameter host copy
  // beside the arena at start-up (with train.zero = 3 it was the start-up's peak, P floats on every
  // rank before the shards are taken).
  void init_weights(uint64_t seed) override {
    std::vector<float> host;
    Rng rng(derive_seed(seed, 0xBE27));
    const auto& specs = ps_.specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& n = specs[i].name;
      const size_t cnt = specs[i].numel;
      host.resize(cnt);
      const bool is_bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
      const bool norm = n.find("LayerNorm.") != std::string::npos || n.find("layer_norm.") != std::string::npos;
      if (norm && !is_bias) {
        std::fill(host.begin(), host.end(), 1.f);
      } else if (is_bias) {
        std::fill(host.begin(), host.end(), 0.f);
      } else {
        rng.fill_normal(host.data(), int64_t(cnt), mc_.initializer_range);
      }
      // padding_idx: the word embeddings' row, and RoBERTa's position table's
      if (pad_ >= 0 && (int(i) == wte_ || (fam_ == Family::Roberta && int(i) == wpe_)))
        std::fill(host.begin() + size_t(pad_) * E_, host.begin() + size_t(pad_ + 1) * E_, 0.f);
      ps_.upload_tensor(int(i), host.data());
    }
  }

  void set_block_hook(std::function<void(int)> hook) override { stack_.before_block = std::move(hook); }
  // train.zero = 3 (train/param_shards.h): the embedding tables, read in the forward's lookup (and
  // the word embeddings by the tied MLM decoder's input gradient, run apart from its weight gradient
  // when the hook is set), their gradients first written after that
  std::vector<int> weights_then_grads() const override { return {wte_, wpe_, wtt_}; }
  void set_recompute(bool on) override {
    if (stack_.recompute == on) return;
    stack_.recompute = on;
    arena_.invalidate();  // the activations carved anew at the next forward
  }

  size_t activation_bytes(int B, int T) const override {
    size_t n = acts_numel(B, T);
    // mlm logits and their gradient, [rows, V] each; rows ~ 15% of the positions, reported as 20%
    if (task_ == Task::Mlm) n += 2 * (size_t(B) * T / 5 + 1) * size_t(V_);
    return n * sizeof(float);
  }

  double flops_per_token(int T) const override {
    // embedding tables are lookups. The MLM head (transform C x C, decoder tied to the V x C word
    // embeddings) runs on the masked 15% of the tokens only.
    const double tables = double(V_ + mc_.max_position_embeddings + mc_.type_vocab_size) * E_;
    double dense = double(ps_.total()) - tables;
    if (task_ == Task::Mlm) {
      const double head = double(C_) * C_ + double(V_) * C_;
      dense += 0.15 * head - double(C_) * C_;
    }
    // the last block's projection and MLP at the head's rows only: one row in T (doc_cls, pair_cls;
    // mlm: 15%), the pooler and classifier on one row in T. ner's labelled share depends on the data
    // and the tokenizer: counted as every row (an upper bound)
    const double tail = double(C_) * C_ + 2.0 * C_ * bc_.FF;
    if (L_ > 0 && !all_rows_ && is_seq_cls(task_)) dense -= tail * (1.0 - 1.0 / T);
    if (L_ > 0 && !all_rows_ && task_ == Task::Mlm) dense -= tail * 0.85;
    if (is_seq_cls(task_)) dense -= (double(C_) * C_ + double(NL_) * C_) * (1.0 - 1.0 / T);
    return 6.0 * dense + 12.0 * L_ * double(T) * C_;
  }
  int num_layers() const override { return L_; }
  int width() const override { return C_; }

  double forward(const DeviceBatch& b, bool training, uint64_t seed) override {
    return loss_sum(be_, run_forward(b, training, seed));
  }
  void forward_into(const DeviceBatch& b, bool training, uint64_t seed, double* loss_acc) override {
    add_loss_sum(be_, loss_acc, run_forward(b, training, seed));
  }

  LossTerms run_forward(const DeviceBatch& b, bool training, uint64_t seed) {
    // packed rows hold more examples than rows. The per-example head tensors ([E,C], [E,NL]) fit the
    // [B,T,...] slots (an example has at least one position); ragged attention's state needs
    // max(B, E) rows, which the trainer reserves as train.batch_size examples (data.pack_batch =
    // examples). Rows planned by data.pack_batch = rows are not ragged: the arena stays at B rows.
    arena_.reserve(std::max(b.B, b.attention_examples()), b.T);
    arena_.use(b.B, b.T);
    curE_ = b.examples();
    // first: without the batch's cls_rows, a copy to the device (which on a GPU synchronises)
    const OutRows* rows = head_rows(b, training);
    const int B = b.B, T = b.T, BT = B * T, E = E_;
    if (T > mc_.max_sequence_length())
      throw Error(cat("sequence length ", T, " exceeds model.", mc_.max_sequence_key(), " = ",
                      mc_.max_sequence_length()));
    const float p_hidden = training ? mc_.hidden_dropout_prob : 0.f;
    const size_t ne = size_t(BT) * E;
    // xe[BT,E] = drop(LN(wte[ids] + wpe[pos] + wtt[types])); x0[BT,C] = xe, or (electra, E != C)
    // xe Wproj^T + bproj
    const int32_t* pos = positions(b);
    for (int i : weights_then_grads()) weights_needed(i);  // train.zero = 3: gathered here
    be_.embedding_forward(emb_, b.ids, b.type_ids, ps_.p(wte_), ps_.p(wpe_), ps_.p(wtt_), B, T, E, 0, pos);
    be_.layernorm_forward(xe_, emb_mean_, emb_rstd_, emb_, ps_.p(eln_w_), ps_.p(eln_b_), BT, E,
                          mc_.layer_norm_eps);
    be_.dropout_forward(xe_, xe_, ne, p_hidden, derive_seed(seed, 0xE3B),
                        drop_rows(T, b.T_key, E, b.token_key));
    if (project_)
      be_.matmul_forward(x0_, xe_, ps_.p(proj_w_), ps_.p(proj_b_), BT, E, C_, WLayout::OutIn);
    xL_ = stack_.forward(be_, ps_, x0_, b.mask, training, seed, B, T, b.T_key, b.token_key, b.attention_examples(), rows);
    return head_forward(b, training, seed);
  }

  void backward(const DeviceBatch& b, float dloss, bool training, uint64_t seed) override {
    const int B = b.B, T = b.T, BT = B * T, C = C_;
    NLP_ASSERT(B == arena_.B() && T == arena_.T());
    const size_t n = size_t(BT) * C, f = sizeof(float);
    be_.zero_act(dres_a_, n);
    head_backward(b, dloss, training, seed);  // d xL into dres_a_
    // Final from here: the head's own tensors (after the last block; the tied MLM decoder weight is
    // the word embedding, at offset 0, which also gets the embedding backward below).
    const int emb_last = project_ ? proj_b_ : eln_b_;
    grads_ready(L_ > 0 ? stack_.layer_end(ps_, L_ - 1) : ps_.specs()[emb_last].offset + ps_.specs()[emb_last].numel);
    stack_.backward(be_, ps_, dres_a_, dres_b_, x0_, b.mask, training, seed, B, T, b.T_key,
                    &grad_ready_, b.token_key, b.attention_examples(), compact() ? &rows_ : nullptr);
    const float p_hidden = training ? mc_.hidden_dropout_prob : 0.f;
    const int E = E_;
    const size_t ne = size_t(BT) * E;
    (void)n;
    // d x0 in dres_a_; with electra's projection d xe = d x0 Wproj (dres_b_), moved back to dres_a_'s
    // role by swapping the two views for the rest
    Act dx = dres_a_, tmp = dres_b_;
    if (project_) {
      be_.matmul_backward(overwrite(dres_b_), ps_.g(proj_w_), ps_.g(proj_b_), dres_a_, xe_, ps_.p(proj_w_), BT, E,
                          C, WLayout::OutIn);
      dx = dres_b_;
      tmp = dres_a_;
    }
    be_.dropout_backward(overwrite(tmp), dx, ne, p_hidden, derive_seed(seed, 0xE3B),
                         drop_rows(T, b.T_key, E, b.token_key));
    be_.layernorm_backward(overwrite(dx), ps_.g(eln_w_), ps_.g(eln_b_), tmp, emb_, ps_.p(eln_w_),
                           emb_mean_, emb_rstd_, BT, E);
    // transformers' nn.Embedding(padding_idx = pad_token_id): the lookup adds nothing to the pad
    // row's gradient (the tied MLM decoder, accumulated above, and earlier micro-steps still do):
    // keep the row as it is before the scatter and put it back after. RoBERTa's position table has
    // the same padding_idx (the pads' position).
    for (int i : weights_then_grads()) weights_done(i);  // train.zero = 3: their gradients from here
    float* pad_grad = pad_ >= 0 ? ps_.g(wte_) + size_t(pad_) * E : nullptr;
    float* pos_pad_grad = fam_ == Family::Roberta ? ps_.g(wpe_) + size_t(pad_) * E : nullptr;
    if (pad_grad) be_.copy(pad_save_, pad_grad, size_t(E) * f);
    if (pos_pad_grad) be_.copy(pad_save_ + E, pos_pad_grad, size_t(E) * f);
    be_.embedding_backward(ps_.g(wte_), ps_.g(wpe_), ps_.g(wtt_), dx, b.ids, b.type_ids, B, T, E, 0,
                           positions(b));
    if (pad_grad) be_.copy(pad_grad, pad_save_, size_t(E) * f);
    if (pos_pad_grad) be_.copy(pos_pad_grad, pad_save_ + E, size_t(E) * f);
    grads_ready(0);
  }

  const float* logits() const override { return task_ == Task::Mlm ? mlm_logits_ : logits_; }

  std::vector<OutputView> outputs() const override {
    const int B = arena_.B(), T = arena_.T();
    switch (task_) {
      case Task::Qa:  // packed: the rows' positions (each example's at first/length)
        return {OutputView{"start_logits", {B, T}, logits_}, OutputView{"end_logits", {B, T}, logits_ + size_t(B) * T}};
      case Task::Mlm: return {OutputView{"logits", {mlm_rows_, V_}, mlm_logits_}};
      case Task::Ner:  // training: the labelled rows only (head_rows)
        if (compact()) return {OutputView{"logits", {rows_.S, NL_}, logits_}};
        return {OutputView{"logits", {B, T, NL_}, logits_}};
      default: return {OutputView{"logits", {curE_, NL_}, logits_}};  // one row per example
    }
  }

 private:
  BlockWeights weights(int l, bool grad) { return block_weights(ps_, stack_.layers[l], grad); }

  bool compact() const { return rows_.S > 0; }  // the last forward's xL is [rows_.S, C]

  // The rows of the last block's output that the head reads (OutRows; null: every row). doc_cls,
  // pair_cls: each example's [CLS], the flat position b*T (first[e] packed) with dropout key
  // e * T_key (position 0 of example e); mlm, and ner in training: the batch's rows with a target
  // and their keys. Sets rows_ (S = 0 when every row is computed).
  const OutRows* head_rows(const DeviceBatch& b, bool training) {
    rows_ = OutRows{};
    if (all_rows_ || L_ == 0) return nullptr;
    if (is_seq_cls(task_) && b.cls_rows) {  // uploaded with the batch
      const int E = b.examples();
      rows_ = OutRows{b.cls_rows, b.cls_rows + E, E};
    } else if (is_seq_cls(task_)) {
      const int E = b.examples(), Tk = key_length(b.T, b.T_key);
      host_rows_.resize(2 * size_t(E));
      fill_cls_rows(host_rows_.data(), E, b.T, Tk, b.E > 0 ? b.first_host : nullptr);
      if (E > cls_rows_cap_) {
        be_.release(cls_rows_);
        cls_rows_ = static_cast<int32_t*>(be_.alloc(2 * size_t(E) * sizeof(int32_t)));
        cls_rows_cap_ = E;
      }
      be_.to_device(cls_rows_, host_rows_.data(), host_rows_.size() * sizeof(int32_t));
      rows_ = OutRows{cls_rows_, cls_rows_ + E, E};
    } else if ((task_ == Task::Mlm || (task_ == Task::Ner && training)) && b.row_keys && b.nrows > 0) {
      rows_ = OutRows{b.rows, b.row_keys, b.nrows};
    } else {
      return nullptr;
    }
    return &rows_;
  }

  // The rows the ner head scores: every row of the batch ([B*T]: targets, dropout keyed by position),
  // or, when the last forward ran compact (training), the labelled rows xL holds ([nrows]: their
  // targets and dropout keys).
  struct NerRows {
    int N;
    const int32_t* targets;
    DropRows drop;
  };
  NerRows ner_rows(const DeviceBatch& b) const {
    if (compact()) return {rows_.S, b.row_targets, DropRows{0, 0, rows_.key, size_t(C_)}};
    return {b.B * b.T, b.targets, drop_rows(b.T, b.T_key, C_, b.token_key)};
  }

  // The position ids of the embedding lookup: the batch's (packed rows) or 0..T-1 (null); for roberta
  // the batch's counted ones (pos_counted: DeviceBatchBuffer made with the model's config fills them,
  // batches.h count_positions: transformers' create_position_ids_from_input_ids, on the host, so
  // that no read back waits for the GPU and a CUDA-graph step can replay).
  const int32_t* positions(const DeviceBatch& b) const {
    if (fam_ == Family::Roberta && !b.pos_counted)
      throw Error("internal error: a roberta batch without its position ids (DeviceBatchBuffer needs the "
                  "model's config)");
    return b.pos;
  }

  // ---- heads: forward leaves the losses of the batch's loss units (LossTerms) ----
  LossTerms head_forward(const DeviceBatch& b, bool training, uint64_t seed) {
    const int B = b.B, T = b.T, BT = B * T, C = C_;
    const float p_hidden = training ? mc_.hidden_dropout_prob : 0.f;
    const uint64_t hseed = derive_seed(seed, 0x4EAD);
    switch (task_) {
      case Task::DocCls:
      case Task::PairCls: {
        // E examples (B unpacked). cls[E,C] = xL at each example's first token (b*T unpacked,
        // b.first packed); pooled = tanh(cls Wp^T + bp); pd = drop(pooled); logits[E,NL]
        const int E = b.examples();
        // roberta, electra: cls dropped first (in place), pooled = tanh or gelu of the dense layer
        if (compact())  // xL is [E,C] already
          be_.copy_view(h1_, xL_, size_t(E) * C);
        else if (b.first)
          be_.rows_gather(h1_, xL_, E, C, C, b.first);
        else
          be_.rows_gather(h1_, xL_, B, C, size_t(T) * C);
        if (fam_ != Family::Bert) be_.dropout_forward(h1_, h1_, size_t(E) * C, p_hidden, derive_seed(seed, 0x4EAF));
        be_.matmul_forward(h2_, h1_, ps_.p(pool_w_), ps_.p(pool_b_), E, C, C, WLayout::OutIn);
        if (fam_ == Family::Electra)
          be_.gelu_forward(h3_, h2_, size_t(E) * C, Gelu::Erf);
        else
          be_.tanh_forward(h3_, h2_, size_t(E) * C);
        be_.dropout_forward(h4_, h3_, size_t(E) * C, p_hidden, hseed);
        be_.matmul_forward(logits_, h4_, ps_.p(cls_w_), ps_.p(cls_b_), E, C, NL_, WLayout::OutIn);
        if (!b.labels) return {};
        be_.crossentropy_forward(losses_, logits_, b.labels, E, NL_);
        return {losses_, size_t(E)};
      }
      case Task::Ner: {  // logits[N,NL] = drop(xL) Wc^T + bc over ner_rows' N rows
        const NerRows r = ner_rows(b);
        be_.dropout_forward(h1_, xL_, size_t(r.N) * C, p_hidden, hseed, r.drop);
        be_.matmul_forward(logits_, h1_, ps_.p(cls_w_), ps_.p(cls_b_), r.N, C, NL_, WLayout::OutIn);
        if (!r.targets) return {};
        be_.crossentropy_forward(losses_, logits_, r.targets, r.N, NL_);
        return {losses_, size_t(r.N)};
      }
      case Task::Qa: {
        // start[B,T] = xL qa_w[0]^T + qa_b[0]; end[B,T] = xL qa_w[1]^T + qa_b[1]
        float* start = logits_;
        float* end = logits_ + size_t(BT);
        be_.matmul_forward(start, xL_, ps_.p(qa_w_), ps_.p(qa_b_), BT, C, 1, WLayout::OutIn);
        be_.matmul_forward(end, xL_, ps_.p(qa_w_) + C, ps_.p(qa_b_) + 1, BT, C, 1, WLayout::OutIn);
        if (!b.start) return {};
        if (b.E > 0) {  // packed: each example's softmax over its own positions
          const int E = b.E;
          be_.segment_crossentropy_forward(losses_, start, b.first, b.length, b.start, E);
          be_.segment_crossentropy_forward(losses_ + E, end, b.first, b.length, b.end, E);
          return {losses_, 2 * size_t(E), 0.5};
        }
        be_.crossentropy_forward(losses_, start, b.start, B, T);
        be_.crossentropy_forward(losses_ + B, end, b.end, B, T);
        return {losses_, 2 * size_t(B), 0.5};
      }
      case Task::Mlm: {
        // M = b.nrows masked positions. h4[M,C] = xL[rows]; h2 = LN(gelu(h4 Wt^T + bt));
        // logits[M,V] = h2 wte^T + bias; loss against row_targets
        const int M = b.nrows;
        NLP_ASSERT(M == 0 || (b.rows && b.row_targets));
        ensure_mlm_rows(M);
        if (M == 0) return {};
        if (compact())  // xL is [M,C] already
          be_.copy_view(h4_, xL_, size_t(M) * C);
        else
          be_.rows_gather(h4_, xL_, M, C, C, b.rows);
        be_.matmul_forward(h1_, h4_, ps_.p(tr_w_), ps_.p(tr_b_), M, C, C, WLayout::OutIn);
        be_.gelu_forward(h3_, h1_, size_t(M) * C, Gelu::Erf);
        be_.layernorm_forward(h2_, hmean_, hrstd_, h3_, ps_.p(tln_w_), ps_.p(tln_b_), M, C,
                              mc_.layer_norm_eps);
        be_.matmul_forward(mlm_logits_, h2_, ps_.p(wte_), ps_.p(mlm_b_), M, C, V_, WLayout::OutIn);
        be_.crossentropy_forward(losses_, mlm_logits_, b.row_targets, M, V_);
        return {losses_, size_t(M)};
      }
      default: throw Error("bert: unsupported task");
    }
  }

  // d(dloss * loss sum)/d xL accumulated into dres_a_.
  void head_backward(const DeviceBatch& b, float dloss, bool training, uint64_t seed) {
    const int B = b.B, T = b.T, BT = B * T, C = C_;
    const float p_hidden = training ? mc_.hidden_dropout_prob : 0.f;
    const uint64_t hseed = derive_seed(seed, 0x4EAD);
    const size_t f = sizeof(float);
    switch (task_) {
      case Task::DocCls:
      case Task::PairCls: {
        const int E = b.examples();
        be_.zero(dlogits_, size_t(E) * NL_ * f);
        be_.crossentropy_backward(dlogits_, logits_, b.labels, dloss, E, NL_);
        be_.zero(dh1_, size_t(E) * C * f);
        be_.matmul_backward(dh1_, ps_.g(cls_w_), ps_.g(cls_b_), dlogits_, h4_, ps_.p(cls_w_), E, C,
                            NL_, WLayout::OutIn);
        be_.zero(dh2_, size_t(E) * C * f);
        be_.dropout_backward(dh2_, dh1_, size_t(E) * C, p_hidden, hseed);
        be_.zero(dh1_, size_t(E) * C * f);
        if (fam_ == Family::Electra)
          be_.gelu_backward(dh1_, h2_, dh2_, size_t(E) * C, Gelu::Erf);
        else
          be_.tanh_backward(dh1_, h3_, dh2_, size_t(E) * C);
        be_.zero(dh2_, size_t(E) * C * f);
        be_.matmul_backward(dh2_, ps_.g(pool_w_), ps_.g(pool_b_), dh1_, h1_, ps_.p(pool_w_), E, C,
                            C, WLayout::OutIn);
        float* dcls = dh2_;  // d cls [E,C]
        if (fam_ != Family::Bert) {  // the dropout before the dense layer
          be_.dropout_backward(overwrite(dh1_), dh2_, size_t(E) * C, p_hidden, derive_seed(seed, 0x4EAF));
          dcls = dh1_;
        }
        if (compact())  // d xL is [E,C]
          be_.accumulate(dres_a_, dcls, size_t(E) * C);
        else if (b.first)  // the examples' first tokens are distinct positions
          be_.rows_scatter_add(dres_a_, dcls, E, C, C, b.first);
        else
          be_.rows_scatter_add(dres_a_, dcls, B, C, size_t(T) * C);
        return;
      }
      case Task::Ner: {  // d xL [N,C] (compact: the labelled rows)
        const NerRows r = ner_rows(b);
        be_.zero(dlogits_, size_t(r.N) * NL_ * f);
        be_.crossentropy_backward(dlogits_, logits_, r.targets, dloss, r.N, NL_);
        be_.zero(dh1_, size_t(r.N) * C * f);
        be_.matmul_backward(dh1_, ps_.g(cls_w_), ps_.g(cls_b_), dlogits_, h1_, ps_.p(cls_w_), r.N, C,
                            NL_, WLayout::OutIn);
        be_.dropout_backward(dres_a_, dh1_, size_t(r.N) * C, p_hidden, hseed, r.drop);
        return;
      }
      case Task::Qa: {
        float* dstart = dlogits_;
        float* dend = dlogits_ + size_t(BT);
        be_.zero(dlogits_, 2 * size_t(BT) * f);
        if (b.E > 0) {
          be_.segment_crossentropy_backward(dstart, logits_, b.first, b.length, b.start, 0.5f * dloss, b.E);
          be_.segment_crossentropy_backward(dend, logits_ + size_t(BT), b.first, b.length, b.end, 0.5f * dloss,
                                            b.E);
        } else {
          be_.crossentropy_backward(dstart, logits_, b.start, 0.5f * dloss, B, T);
          be_.crossentropy_backward(dend, logits_ + size_t(BT), b.end, 0.5f * dloss, B, T);
        }
        be_.matmul_backward(dres_a_, ps_.g(qa_w_), ps_.g(qa_b_), dstart, xL_, ps_.p(qa_w_), BT, C,
                            1, WLayout::OutIn);
        be_.matmul_backward(dres_a_, ps_.g(qa_w_) + C, ps_.g(qa_b_) + 1, dend, xL_,
                            ps_.p(qa_w_) + C, BT, C, 1, WLayout::OutIn);
        return;
      }
      case Task::Mlm: {
        const int M = b.nrows;
        NLP_ASSERT(M == mlm_rows_);
        if (M == 0) return;
        const size_t n = size_t(M) * C;
        be_.zero(mlm_dlogits_, size_t(M) * V_ * f);
        be_.crossentropy_backward(mlm_dlogits_, mlm_logits_, b.row_targets, dloss, M, V_);
        be_.zero(dh2_, n * f);
        // dh2 = dlogits @ wte, dwte and the bias from dlogits^T @ h2 (train.zero = 3: one at a time,
        // wte's buffer turning into its gradient between them)
        tied_weights_backward(be_, wte_, dh2_, ps_.g(wte_), ps_.g(mlm_b_), mlm_dlogits_, h2_, ps_.p(wte_),
                              M, C, V_);
        be_.zero(dh1_, n * f);
        be_.layernorm_backward(dh1_, ps_.g(tln_w_), ps_.g(tln_b_), dh2_, h3_, ps_.p(tln_w_), hmean_,
                               hrstd_, M, C);
        be_.zero(dh2_, n * f);
        be_.gelu_backward(dh2_, h1_, dh1_, n, Gelu::Erf);
        be_.zero(dh1_, n * f);
        be_.matmul_backward(dh1_, ps_.g(tr_w_), ps_.g(tr_b_), dh2_, h4_, ps_.p(tr_w_), M, C, C,
                            WLayout::OutIn);
        if (compact())
          be_.accumulate(dres_a_, dh1_, size_t(M) * C);
        else
          be_.rows_scatter_add(dres_a_, dh1_, M, C, C, b.rows);  // rows are distinct positions
        return;
      }
      default: throw Error("bert: unsupported task");
    }
  }

  // The head's logits in the arena (mlm: a separate buffer sized by the masked rows).
  size_t logits_numel(int B, int T) const {
    const size_t BT = size_t(B) * T;
    switch (task_) {
      case Task::Mlm: return 0;
      case Task::Ner: return BT * NL_;
      case Task::Qa: return 2 * BT;
      default: return BT * NL_;  // [E, NL]: packed rows hold up to B*T examples
    }
  }

  size_t acts_numel(int B, int T) const {
    // floats; emb, x0, dres_a, dres_b at bc_.act (Carver, act_floats), the head fp32
    const size_t BT = size_t(B) * T, C = C_, E = E_;
    const size_t a = act_floats(BT * C, bc_.act), ae = act_floats(BT * E, bc_.act);
    const size_t ad = act_floats(BT * std::max(C, E), bc_.act);
    return ae + (project_ ? ae + a : ae) + 2 * BT  // emb, xe (and x0 when projected), emb mean/rstd
           + stack_.numel(be_, B, T)
           + 6 * BT * C + 2 * BT                  // head h1..h4, dh1, dh2, mean/rstd
           + 2 * logits_numel(B, T)               // logits, dlogits
           + 2 * BT                               // losses (qa uses 2B)
           + 2 * ad                               // dres_a, dres_b
           + 2 * E;                               // the pad rows' gradients, kept over the lookup
  }

  // mlm logits and dlogits [M,V]; M varies from batch to batch, the buffer only grows.
  void ensure_mlm_rows(int M) {
    mlm_rows_ = M;
    if (M <= mlm_cap_) return;
    be_.release(mlm_logits_);
    mlm_cap_ = M + M / 8;  // headroom: the next batches mask about as many positions
    mlm_logits_ = static_cast<float*>(be_.alloc(2 * size_t(mlm_cap_) * V_ * sizeof(float)));
    mlm_dlogits_ = mlm_logits_ + size_t(mlm_cap_) * V_;
  }

  void reserve(int B, int T) override { arena_.reserve(B, T); }

  // The activations laid out in the arena for B x T (ActivationArena::carve).
  void carve(Carver& take, int B, int T) {
    const size_t BT = size_t(B) * T, C = C_, E = E_;
    emb_ = take.act(BT * E, bc_.act);
    xe_ = take.act(BT * E, bc_.act);
    x0_ = project_ ? take.act(BT * C, bc_.act) : xe_;
    emb_mean_ = take(BT);
    emb_rstd_ = take(BT);
    stack_.carve(be_, take(stack_.numel(be_, B, T)), B, T);
    h1_ = take(BT * C);
    h2_ = take(BT * C);
    h3_ = take(BT * C);
    h4_ = take(BT * C);
    dh1_ = take(BT * C);
    dh2_ = take(BT * C);
    hmean_ = take(BT);
    hrstd_ = take(BT);
    logits_ = take(logits_numel(B, T));
    dlogits_ = take(logits_numel(B, T));
    losses_ = take(2 * BT);
    dres_a_ = take.act(BT * std::max(C, E), bc_.act);
    dres_b_ = take.act(BT * std::max(C, E), bc_.act);
    pad_save_ = take(2 * E);
  }

  ModelConfig mc_;
  Backend& be_;
  Task task_;
  Family fam_;
  std::string prefix_;  // transformers' base_model_prefix with its dot
  int E_ = 0;            // embedding width (electra's embedding_size; else C_)
  bool project_ = false;  // electra with E_ != C_: embeddings_project
  int proj_w_ = -1, proj_b_ = -1;
  Act xe_;  // [BT,E] the embeddings after LN and dropout (x0_ itself unless projected)
  BlockStack stack_;  // the transformer blocks: config, parameter indices, activations
  BlockConfig& bc_ = stack_.config;
  ParamStore ps_;
  int C_, V_, L_, NL_;
  int pad_ = -1;  // padding_idx of the word embeddings (-1 = none)
  int wte_, wpe_, wtt_, eln_w_, eln_b_;
  int pool_w_ = -1, pool_b_ = -1, cls_w_ = -1, cls_b_ = -1, qa_w_ = -1, qa_b_ = -1;
  int tr_w_ = -1, tr_b_ = -1, tln_w_ = -1, tln_b_ = -1, mlm_b_ = -1;

  // the activations; the last forward's batch shape (arena_.B(), T())
  ActivationArena arena_{be_, [this](int B, int T) { return acts_numel(B, T); },
                         [this](Carver& take, int B, int T) { carve(take, B, T); }};
  int curE_ = 0;  // the last forward's examples (arena_.B() unless packed)
  CAct xL_;
  Act emb_, x0_;  // [BT,C] at bc_.act
  float *emb_mean_ = nullptr, *emb_rstd_ = nullptr;
  float *h1_ = nullptr, *h2_ = nullptr, *h3_ = nullptr, *h4_ = nullptr, *dh1_ = nullptr, *dh2_ = nullptr;
  float *hmean_ = nullptr, *hrstd_ = nullptr;
  float *logits_ = nullptr, *dlogits_ = nullptr, *losses_ = nullptr;
  Act dres_a_, dres_b_;  // [BT,C] at bc_.act
  float* pad_save_ = nullptr;
  float *mlm_logits_ = nullptr, *mlm_dlogits_ = nullptr;  // [mlm_cap_, V] each, one allocation
  int mlm_rows_ = 0, mlm_cap_ = 0;
  // head_rows(): the last block's rows in the last forward (S = 0: every row); for a batch without
  // cls_rows, the [CLS] rows' positions and keys in backend memory ([2, cls_rows_cap_]) and their
  // host staging
  bool all_rows_ = false;
  OutRows rows_{};
  int32_t* cls_rows_ = nullptr;
  int cls_rows_cap_ = 0;
  std::vector<int32_t> host_rows_;
};

}  // namespace

std::unique_ptr<Model> make_bert(const ModelConfig& mc, Backend& be, const std::string& task,
                                 bool allocate) {
  return std::make_unique<Bert>(mc, be, parse_task(task), allocate);
}

}  // namespace nlp
