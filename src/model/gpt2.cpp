// GPT-2 (HF GPT2LMHeadModel): token + position embeddings, n_layer pre-LN blocks with causal attention
// and gelu_new, final LayerNorm, LM head tied to the token embedding, cross-entropy with ignore index.
// Parameters carry the HF state_dict names and shapes (Conv1D layout [in, out]).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "model/block.h"
#include "model/activation_arena.h"
#include "model/carver.h"
#include "model/lm_head.h"
#include "model/model.h"

namespace nlp {
namespace {

class Gpt2 final : public Model {
 public:
  Gpt2(const ModelConfig& mc, Backend& be, bool allocate) : mc_(mc), be_(be) {
    C_ = mc.n_embd;
    V_ = mc.vocab_size;
    L_ = mc.n_layer;
    // the block: pre-LN, causal, gelu_new, Conv1D weights [in, out]
    bc_ = BlockConfig{.C = C_, .NH = mc.n_head, .FF = 4 * C_, .pre_ln = true, .causal = true, .gelu = Gelu::Tanh,
                      .layout = WLayout::InOut, .ln_eps = mc.layer_norm_epsilon, .attn_pdrop = mc.attn_pdrop,
                      .resid_pdrop = mc.resid_pdrop, .act = mc.bf16_activations ? DType::BF16 : DType::F32};

    const int64_t C = C_, FF = bc_.FF;
    wte_ = ps_.add("transformer.wte.weight", {V_, C}, true);
    wpe_ = ps_.add("transformer.wpe.weight", {mc.n_positions, C}, true);
    for (int l = 0; l < L_; ++l) {
      const std::string p = cat("transformer.h.", l, ".");
      BlockParamIdx li;
      li.ln1_w = ps_.add(p + "ln_1.weight", {C}, false);
      li.ln1_b = ps_.add(p + "ln_1.bias", {C}, false);
      li.qkv_w = ps_.add(p + "attn.c_attn.weight", {C, 3 * C}, true);
      li.qkv_b = ps_.add(p + "attn.c_attn.bias", {3 * C}, false);
      li.proj_w = ps_.add(p + "attn.c_proj.weight", {C, C}, true);
      li.proj_b = ps_.add(p + "attn.c_proj.bias", {C}, false);
      li.ln2_w = ps_.add(p + "ln_2.weight", {C}, false);
      li.ln2_b = ps_.add(p + "ln_2.bias", {C}, false);
      li.fc_w = ps_.add(p + "mlp.c_fc.weight", {C, FF}, true);
      li.fc_b = ps_.add(p + "mlp.c_fc.bias", {FF}, false);
      li.fcp_w = ps_.add(p + "mlp.c_proj.weight", {FF, C}, true);
      li.fcp_b = ps_.add(p + "mlp.c_proj.bias", {C}, false);
      stack_.layers.push_back(li);
    }
    lnf_w_ = ps_.add("transformer.ln_f.weight", {C}, false);
    lnf_b_ = ps_.add("transformer.ln_f.bias", {C}, false);
    if (allocate) ps_.allocate(be_);
  }

  ParamStore& params() override { return ps_; }
  std::string base_prefix() const override { return "transformer."; }
  const ModelConfig& config() const override { return mc_; }

  void write_attrs(h5::File& f) const override {
    write_tokenizer_attrs(f, mc_);
    f.set_attr("model_type", std::string("gpt2"));
    f.set_attr("architectures", std::string("GPT2LMHeadModel"));
    f.set_attr("activation_function", std::string("gelu_new"));
    f.set_attr("n_layer", int64_t(mc_.n_layer));
    f.set_attr("n_head", int64_t(mc_.n_head));
    f.set_attr("n_embd", int64_t(mc_.n_embd));
    f.set_attr("vocab_size", int64_t(mc_.vocab_size));
    f.set_attr("n_positions", int64_t(mc_.n_positions));
    f.set_attr("n_ctx", int64_t(mc_.n_positions));
    f.set_attr("layer_norm_epsilon", double(mc_.layer_norm_epsilon));
    f.set_attr("embd_pdrop", double(mc_.embd_pdrop));
    f.set_attr("attn_pdrop", double(mc_.attn_pdrop));
    f.set_attr("resid_pdrop", double(mc_.resid_pdrop));
    f.set_attr("initializer_range", double(mc_.initializer_range));
    f.set_attr("tie_word_embeddings", int64_t(1));
  }

  // HF GPT2PreTrainedModel._init_weights: weights N(0, initializer_range), residual projections
  // (attn.c_proj, mlp.c_proj) N(0, initializer_range / sqrt(2 n_layer)), biases 0, LayerNorm 1/0.
  // A tensor at a time through one host buffer (the largest tensor's size, not the whole parameters:
  // the set-up's resident memory stays below the optimizer step's with every train.zero).
  void init_weights(uint64_t seed) override {
    std::vector<float> host;
    Rng rng(derive_seed(seed, 0x1417));
    const float std0 = mc_.initializer_range;
    const float std_res = std0 / std::sqrt(2.0f * L_);
    const auto& specs = ps_.specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& n = specs[i].name;
      auto ends = [&n](const std::string& s) {
        return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
      };
      const size_t cnt = specs[i].numel;
      host.resize(cnt);
      if (ends(".bias")) {
        std::fill(host.begin(), host.end(), 0.f);
      } else if (n.find(".ln_") != std::string::npos) {
        std::fill(host.begin(), host.end(), 1.f);
      } else {
        const float sd = ends("c_proj.weight") ? std_res : std0;
        rng.fill_normal(host.data(), int64_t(cnt), sd);
      }
      ps_.upload_tensor(int(i), host.data());
    }
  }

  double flops_per_token(int T) const override {
    // everything but the position table: wte is used as the LM head
    const double dense = double(ps_.total()) - double(mc_.n_positions) * C_;
    return 6.0 * dense + 12.0 * L_ * double(T) * C_;
  }
  int num_layers() const override { return L_; }
  int width() const override { return C_; }

  void set_block_hook(std::function<void(int)> hook) override { stack_.before_block = std::move(hook); }
  // wte: read last by the unfused head's input gradient, its gradient written first by the head's
  // weight gradient (the backward runs the two products apart when the hook is set); the fused head
  // reads wte chunk by chunk as it writes its gradient. wpe: read in the forward only.
  std::vector<int> weights_then_grads() const override {
    if (lm_head_plan(mc_, be_.name(), V_, 1).fused) return {wpe_};
    return {wte_, wpe_};
  }
  void set_recompute(bool on) override {
    if (stack_.recompute == on) return;
    stack_.recompute = on;
    arena_.invalidate();  // the activations carved anew at the next forward
  }

  size_t activation_bytes(int B, int T) const override {
    return acts_numel(B, T) * sizeof(float) + 3 * size_t(B) * T * sizeof(int32_t);
  }
  size_t lm_head_bytes(int B, int T, bool* fused) const override {
    if (fused) *fused = head_plan(B, T).fused;
    return head_numel(B, T) * sizeof(float);
  }

  double forward(const DeviceBatch& b, bool training, uint64_t seed) override {
    return loss_sum(be_, run_forward(b, training, seed));
  }
  // The trainer's forward. With the fused head in training, the head waits for the backward, which
  // computes the losses with their gradient in one pass over each chunk's logits (no second logits
  // GEMM) and adds their sum to loss_acc then: the trainer always runs the backward of a training
  // micro-batch before it reads the sum, and the sums are added in the same order and arithmetic.
  void forward_into(const DeviceBatch& b, bool training, uint64_t seed, double* loss_acc) override {
    if (head_plan(b.B, b.T).fused && training && b.targets) {
      run_forward(b, training, seed, /*defer_head=*/true);
      pending_loss_ = loss_acc;
      return;
    }
    add_loss_sum(be_, loss_acc, run_forward(b, training, seed));
  }

  LossTerms run_forward(const DeviceBatch& b, bool training, uint64_t seed, bool defer_head = false) {
    pending_loss_ = nullptr;
    arena_.use(b.B, b.T);
    const int B = b.B, T = b.T, BT = B * T, C = C_;
    NLP_ASSERT(T <= mc_.n_positions);
    const size_t n = size_t(BT) * C;
    for (int i : weights_then_grads()) weights_needed(i);  // train.zero = 3: gathered here
    // x0[BT,C] = drop(wte[ids] + wpe[t])
    be_.embedding_forward(x0_, b.ids, nullptr, ps_.p(wte_), ps_.p(wpe_), nullptr, B, T, C, 0);
    be_.dropout_forward(x0_, x0_, n, training ? mc_.embd_pdrop : 0.f, seed_embd(seed),
                        drop_rows(T, b.T_key, C));
    const CAct x = stack_.forward(be_, ps_, x0_, b.mask, training, seed, B, T, b.T_key);
    xL_ = x;
    // lnf[BT,C] = LN(x); logits[BT,V] = lnf @ wte^T (tied head); losses[BT]
    be_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, ps_.p(lnf_w_), ps_.p(lnf_b_), BT, C,
                          mc_.layer_norm_epsilon);
    if (head_.fused) {
      if (defer_head) return {};  // forward_into: the backward computes the losses
      // losses[BT] by chunks of rows; no logits kept (lm_head.h)
      if (!b.targets)
        throw Error("model.fused_head = on keeps no logits: a forward without targets needs it off");
      be_.lm_head_crossentropy(losses_, nullptr, nullptr, lnf_, ps_.p(wte_), b.targets, 0.0f, BT, C,
                               V_, head_.Vp, head_.chunk, head_scratch_);
      return {losses_, size_t(BT)};
    }
    be_.matmul_forward(logits_, lnf_, ps_.p(wte_), nullptr, BT, C, V_, WLayout::OutIn);
    if (!b.targets) return {};
    be_.crossentropy_forward(losses_, logits_, b.targets, BT, V_);
    return {losses_, size_t(BT)};
  }

  void backward(const DeviceBatch& b, float dloss, bool training, uint64_t seed) override {
    const int B = b.B, T = b.T, BT = B * T, C = C_;
    NLP_ASSERT(B == arena_.B() && T == arena_.T() && b.targets);
    const size_t n = size_t(BT) * C, f = sizeof(float);
    // the first writer of each activation gradient overwrites it (overwrite(), backend.h)
    if (head_.fused) {
      // the head's logits again, chunk by chunk, their gradient in place, then dlnf and dwte
      be_.lm_head_crossentropy(losses_, overwrite(dlnf_), ps_.g(wte_), lnf_, ps_.p(wte_), b.targets, dloss, BT,
                               C, V_, head_.Vp, head_.chunk, head_scratch_);
      if (pending_loss_) add_loss_sum(be_, pending_loss_, {losses_, size_t(BT)});
      pending_loss_ = nullptr;
    } else {
      be_.zero(dlogits_, size_t(BT) * V_ * f);
      be_.crossentropy_backward(dlogits_, logits_, b.targets, dloss, BT, V_);
      // dlnf = dlogits @ wte, dwte += dlogits^T @ lnf (train.zero = 3: one at a time, wte's buffer
      // turning into its gradient between them)
      tied_weights_backward(be_, wte_, overwrite(dlnf_), ps_.g(wte_), nullptr, dlogits_, lnf_, ps_.p(wte_),
                            BT, C, V_);
    }
    be_.layernorm_backward(overwrite(dres_a_), ps_.g(lnf_w_), ps_.g(lnf_b_), dlnf_, xL_, ps_.p(lnf_w_),
                           lnf_mean_, lnf_rstd_, BT, C);
    // Final from here: ln_f (the tied wte, at offset 0, also gets the embedding backward below).
    grads_ready(ps_.specs()[lnf_w_].offset);
    stack_.backward(be_, ps_, dres_a_, dres_b_, x0_, b.mask, training, seed, B, T, b.T_key,
                    &grad_ready_);
    // dres_a = d x0 (after embedding dropout)
    be_.dropout_backward(overwrite(dlnf_), dres_a_, n, training ? mc_.embd_pdrop : 0.f, seed_embd(seed),
                         drop_rows(T, b.T_key, C));
    weights_done(wpe_);  // train.zero = 3: wpe's buffer its gradient from here
    be_.embedding_backward(ps_.g(wte_), ps_.g(wpe_), nullptr, dlnf_, b.ids, nullptr, B, T, C, 0);
    grads_ready(0);
  }

  // null / none with the fused head, which keeps no logits
  const float* logits() const override { return head_.fused ? nullptr : logits_; }
  std::vector<OutputView> outputs() const override {
    if (head_.fused) return {};
    return {OutputView{"logits", {arena_.B(), arena_.T(), V_}, logits_}};
  }

  // ---- used by the decoder ----
  BlockWeights weights(int l, bool grad) { return block_weights(ps_, stack_.layers[l], grad); }
  const BlockConfig& block_config() const { return bc_; }
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int lnf_w() const { return lnf_w_; }
  int lnf_b() const { return lnf_b_; }
  int n_layer() const { return L_; }

 private:
  static uint64_t seed_embd(uint64_t seed) { return derive_seed(seed, 0xE3B); }
  LmHeadPlan head_plan(int B, int T) const { return lm_head_plan(mc_, be_.name(), V_, B * T); }
  // The head's floats: logits and dlogits [BT, V], or the fused head's scratch (one chunk)
  size_t head_numel(int B, int T) const {
    const LmHeadPlan h = head_plan(B, T);
    if (h.fused) return be_.lm_head_scratch_floats(h.chunk, C_, V_, h.Vp);
    return 2 * size_t(B) * T * size_t(V_);
  }
  // Floats of the arena; the activations and their gradients at bc_.act (Carver, act_floats).
  size_t acts_numel(int B, int T) const {
    const size_t BT = size_t(B) * T, C = C_;
    const size_t a = act_floats(BT * C, bc_.act);
    return a                                       // x0
           + stack_.numel(be_, B, T)
           + a + 2 * BT                            // lnf, mean, rstd
           + head_numel(B, T)                      // logits, dlogits (fused: one chunk)
           + BT                                    // losses
           + 3 * a;                                // dlnf, dres_a, dres_b
  }

  void reserve(int B, int T) override { arena_.reserve(B, T); }

  // The activations laid out in the arena for B x T (ActivationArena::carve).
  void carve(Carver& take, int B, int T) {
    const size_t BT = size_t(B) * T, C = C_;
    x0_ = take.act(BT * C, bc_.act);
    stack_.carve(be_, take(stack_.numel(be_, B, T)), B, T);
    lnf_ = take.act(BT * C, bc_.act);
    lnf_mean_ = take(BT);
    lnf_rstd_ = take(BT);
    head_ = head_plan(B, T);
    if (head_.fused) {
      logits_ = dlogits_ = nullptr;
      head_scratch_ = take(head_numel(B, T));
    } else {
      logits_ = take(BT * V_);
      dlogits_ = take(BT * V_);
      head_scratch_ = nullptr;
    }
    losses_ = take(BT);
    dlnf_ = take.act(BT * C, bc_.act);
    dres_a_ = take.act(BT * C, bc_.act);
    dres_b_ = take.act(BT * C, bc_.act);
  }

  ModelConfig mc_;
  Backend& be_;
  BlockStack stack_;  // the transformer blocks: config, parameter indices, activations
  BlockConfig& bc_ = stack_.config;
  ParamStore ps_;
  int C_, V_, L_;
  int wte_, wpe_, lnf_w_, lnf_b_;

  // all activations, carved per (B, T); the last forward's batch shape (arena_.B(), T())
  ActivationArena arena_{be_, [this](int B, int T) { return acts_numel(B, T); },
                         [this](Carver& take, int B, int T) { carve(take, B, T); }};
  CAct xL_;  // the last block's output
  Act x0_, lnf_;  // [BT,C] at bc_.act
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  float *logits_ = nullptr, *dlogits_ = nullptr, *losses_ = nullptr;
  LmHeadPlan head_;                 // how the LM head runs (lm_head.h), set when carving
  float* head_scratch_ = nullptr;  // the fused head's chunk (and padded copies)
  double* pending_loss_ = nullptr;  // forward_into's sum, added by the backward (fused head)
  Act dlnf_, dres_a_, dres_b_;  // [BT,C] at bc_.act
};

// Floats of a decoder's arena for B sequences: k and v caches [B,NH,Tmax,HS] per layer, x, y, ln
// [B,C], mean and rstd [B], logits [B,V] and the blocks' decode scratch.
size_t decoder_numel(const ModelConfig& mc, const BlockConfig& bc, int n_layer, int B) {
  const size_t C = mc.n_embd, V = mc.vocab_size;
  const size_t cache = size_t(B) * mc.n_positions * C;
  return 2 * cache * n_layer + 2 * size_t(B) * C + size_t(B) * C + 2 * size_t(B) + size_t(B) * V +
         block_decode_scratch_numel(bc, B);
}

// KV-cache decoding: one position at a time through the same weights; the cost of a new token is
// independent of the prefix length except for the attention over the cache.
class Gpt2Decoder final : public Decoder {
 public:
  Gpt2Decoder(Gpt2& m, Backend& be, int B) : m_(m), be_(be), B_(B) {
    const ModelConfig& mc = m.config();
    const BlockConfig& bc = m.block_config();
    Tmax_ = mc.n_positions;
    const size_t C = mc.n_embd, V = mc.vocab_size;
    const size_t cache = size_t(B) * Tmax_ * C;  // [B,NH,Tmax,HS] per layer, k and v
    const size_t total = decoder_numel(mc, bc, m.n_layer(), B);
    arena_ = static_cast<float*>(be.alloc(total * sizeof(float)));
    Carver take(arena_, total);
    for (int l = 0; l < m.n_layer(); ++l) {
      k_.push_back(take(cache));
      v_.push_back(take(cache));
    }
    x_ = take(size_t(B) * C);
    y_ = take(size_t(B) * C);
    ln_ = take(size_t(B) * C);
    mean_ = take(B);
    rstd_ = take(B);
    logits_ = take(size_t(B) * V);
    scratch_ = take(block_decode_scratch_numel(bc, B));
    take.done();
    ids_ = static_cast<int32_t*>(be.alloc(size_t(B) * sizeof(int32_t)));
    host_logits_.resize(size_t(B) * V);
  }
  ~Gpt2Decoder() override {
    be_.release(arena_);
    be_.release(ids_);
  }

  int max_positions() const override { return Tmax_; }

  const std::vector<float>& step(const std::vector<int32_t>& tokens, int pos) override {
    const ModelConfig& mc = m_.config();
    NLP_ASSERT(int(tokens.size()) == B_ && pos >= 0 && pos < Tmax_);
    const int C = mc.n_embd, V = mc.vocab_size;
    ParamStore& ps = m_.params();
    be_.to_device(ids_, tokens.data(), tokens.size() * sizeof(int32_t));
    // x[B,C] = wte[token] + wpe[pos]  (as a batch of B sequences of length 1 at offset pos)
    be_.embedding_forward(x_, ids_, nullptr, ps.p(m_.wte()), ps.p(m_.wpe()), nullptr, B_, 1, C,
                          pos);
    for (int l = 0; l < m_.n_layer(); ++l) {
      block_decode(be_, m_.block_config(), m_.weights(l, false), x_, y_, k_[l], v_[l], scratch_,
                   B_, pos, Tmax_);
      std::swap(x_, y_);
    }
    be_.layernorm_forward(ln_, mean_, rstd_, x_, ps.p(m_.lnf_w()), ps.p(m_.lnf_b()), B_, C,
                          mc.layer_norm_epsilon);
    be_.matmul_forward(logits_, ln_, ps.p(m_.wte()), nullptr, B_, C, V, WLayout::OutIn);
    be_.to_host(host_logits_.data(), logits_, host_logits_.size() * sizeof(float));
    return host_logits_;
  }

 private:
  Gpt2& m_;
  Backend& be_;
  int B_, Tmax_;
  float* arena_ = nullptr;
  std::vector<float*> k_, v_;
  float *x_, *y_, *ln_, *mean_, *rstd_, *logits_, *scratch_;
  int32_t* ids_ = nullptr;
  std::vector<float> host_logits_;
};

}  // namespace

std::unique_ptr<Model> make_gpt2(const ModelConfig& mc, Backend& be, bool allocate) {
  return std::make_unique<Gpt2>(mc, be, allocate);
}

size_t decoder_bytes(const Model& m, int B) {
  const auto* g = dynamic_cast<const Gpt2*>(&m);
  if (!g) return 0;
  return decoder_numel(g->config(), g->block_config(), g->n_layer(), B) * sizeof(float) + size_t(B) * sizeof(int32_t);
}

std::unique_ptr<Decoder> make_decoder(Model& m, Backend& be, int B) {
  auto* g = dynamic_cast<Gpt2*>(&m);
  if (!g) throw Error("generation needs a GPT-2 model (model.type=gpt2)");
  return std::make_unique<Gpt2Decoder>(*g, be, B);
}

}  // namespace nlp
