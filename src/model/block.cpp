#include "model/block.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "model/carver.h"

namespace nlp {

BlockSeeds block_seeds(uint64_t seed, int layer, int T_key) {
  return BlockSeeds{derive_seed(seed, 100 + layer, 1), derive_seed(seed, 100 + layer, 2),
                    derive_seed(seed, 100 + layer, 3), T_key};
}

BlockWeights block_weights(ParamStore& ps, const BlockParamIdx& i, bool grad) {
  auto P = [&](int k) { return grad ? ps.g(k) : ps.p(k); };
  return BlockWeights{P(i.ln1_w), P(i.ln1_b), P(i.qkv_w), P(i.qkv_b), P(i.proj_w), P(i.proj_b),
                      P(i.ln2_w), P(i.ln2_b), P(i.fc_w),  P(i.fc_b),  P(i.fcp_w), P(i.fcp_b)};
}

AttnSizes attn_sizes(Backend& be, const BlockConfig& c, int B, int T) {
  const int HS = c.C / c.NH;
  return AttnSizes{be.attention_saved_floats(B, T, c.NH, HS, c.act),
                   be.attention_scratch_floats(B, T, c.NH, HS, c.act)};
}

size_t block_acts_numel(const BlockConfig& c, const AttnSizes& att, int B, int T) {
  const size_t BT = size_t(B) * T, C = c.C, FF = c.FF;
  auto A = [&](size_t n) { return act_floats(n, c.act); };
  return A(BT * C)          // ln1
         + 2 * BT           // ln1 mean, rstd
         + A(BT * 3 * C)    // qkv
         + att.saved        // att
         + A(BT * C)        // atty
         + A(BT * C)        // res1
         + A(BT * C)        // ln2
         + 2 * BT           // ln2 mean, rstd
         + 2 * A(BT * FF)   // fch, fch_gelu
         + A(BT * C)        // res2
         + A(BT * C);       // out
}

size_t block_scratch_numel(const BlockConfig& c, const AttnSizes& att, int B, int T) {
  const size_t BT = size_t(B) * T;
  auto A = [&](size_t n) { return act_floats(n, c.act); };
  return 3 * A(BT * c.C) + A(BT * 3 * c.C) + 2 * A(BT * c.FF) + att.scratch;
}

BlockActs carve_block_acts(float* p, const BlockConfig& c, const AttnSizes& att, int B, int T) {
  const size_t BT = size_t(B) * T, C = c.C, FF = c.FF;
  BlockActs a{};
  Carver take(p, block_acts_numel(c, att, B, T));
  const DType dt = c.act;
  a.ln1 = take.act(BT * C, dt);
  a.ln1_mean = take(BT);
  a.ln1_rstd = take(BT);
  a.qkv = take.act(BT * 3 * C, dt);
  a.att = take(att.saved);
  a.atty = take.act(BT * C, dt);
  a.res1 = take.act(BT * C, dt);
  a.ln2 = take.act(BT * C, dt);
  a.ln2_mean = take(BT);
  a.ln2_rstd = take(BT);
  a.fch = take.act(BT * FF, dt);
  a.fch_gelu = take.act(BT * FF, dt);
  a.res2 = take.act(BT * C, dt);
  a.out = take.act(BT * C, dt);
  take.done();
  return a;
}

BlockScratch carve_block_scratch(float* p, const BlockConfig& c, const AttnSizes& att, int B,
                                 int T) {
  const size_t BT = size_t(B) * T;
  BlockScratch s{};
  Carver take(p, block_scratch_numel(c, att, B, T));
  s.d_res1 = take.act(BT * c.C, c.act);
  s.d_c1 = take.act(BT * c.C, c.act);
  s.d_c2 = take.act(BT * c.C, c.act);
  s.d_qkv = take.act(BT * 3 * c.C, c.act);
  s.d_ff1 = take.act(BT * c.FF, c.act);
  s.d_ff2 = take.act(BT * c.FF, c.act);
  s.d_att = take(att.scratch);
  take.done();
  return s;
}

namespace {

// BERT: x1 = LN1(x + drop(proj(attn(x)))); y = LN2(x1 + drop(mlp(x1))).
// Saved: res1 = x + drop(proj) (LN1 input), ln1 = x1, res2 = x1 + drop(mlp) (LN2 input), out = y.
// out (nullable): everything after the attention runs on the rows out->idx only (OutRows); ln2, which
// post-LN does not use, keeps the gathered attention rows (the projection's input) for the backward.
void post_ln_forward(Backend& be, const BlockConfig& c, const BlockWeights& w, BlockActs& a,
                     CAct x, const int32_t* attn_mask, float p_attn, float p_resid,
                     BlockSeeds seeds, int B, int T, const OutRows* out) {
  const int BT = B * T, C = c.C, FF = c.FF, HS = C / c.NH;
  be.matmul_forward(a.qkv, x, w.qkv_w, w.qkv_b, BT, C, 3 * C, c.layout);
  be.attention_forward(a.atty, a.att, a.qkv, attn_mask, c.causal, p_attn, seeds.attn, B, T, c.NH,
                       HS, seeds.T_key, seeds.token_key, seeds.examples);
  // N rows from here: all BT, or the S of `out` ([S,C] each, keyed by out->key)
  int N = BT;
  CAct atty = a.atty;
  CAct xr = x;
  DropRows rows = drop_rows(T, seeds.T_key, C, seeds.token_key);
  if (out) {
    N = out->S;
    be.rows_gather(a.ln2, a.atty, N, C, C, out->idx);
    be.rows_gather(a.out, x, N, C, C, out->idx);  // x's rows, until LN2 writes the output there
    atty = a.ln2;
    xr = a.out;
    rows = DropRows{0, 0, out->key, size_t(C)};
  }
  be.matmul_forward(a.res1, atty, w.proj_w, w.proj_b, N, C, C, c.layout);
  be.residual_layernorm_forward(a.res1, a.ln1, a.ln1_mean, a.ln1_rstd, xr, a.res1, w.ln1_w, w.ln1_b, N,
                                C, c.ln_eps, p_resid, seeds.resid1, rows);
  be.matmul_gelu_forward(a.fch_gelu, a.fch, a.ln1, w.fc_w, w.fc_b, N, C, FF, c.layout, c.gelu);
  be.matmul_forward(a.res2, a.fch_gelu, w.fcp_w, w.fcp_b, N, FF, C, c.layout);
  be.residual_layernorm_forward(a.res2, a.out, a.ln2_mean, a.ln2_rstd, a.ln1, a.res2, w.ln2_w, w.ln2_b,
                                N, C, c.ln_eps, p_resid, seeds.resid2, rows);
}

void post_ln_backward(Backend& be, const BlockConfig& c, const BlockWeights& w,
                      const BlockWeights& gw, const BlockActs& a, BlockScratch& s, Act dx,
                      CAct dout, CAct x, const int32_t* attn_mask, float p_attn,
                      float p_resid, BlockSeeds seeds, int B, int T, const OutRows* out) {
  const int BT = B * T, C = c.C, FF = c.FF, HS = C / c.NH;
  // N rows down to the attention: all BT, or the S of `out` (dout is then [S,C])
  const int N = out ? out->S : BT;
  const DropRows rows = out ? DropRows{0, 0, out->key, size_t(C)} : drop_rows(T, seeds.T_key, C, seeds.token_key);
  // Every op that is the first to write a gradient here overwrites it (overwrite(), backend.h):
  // no zeroing pass. dx: with `out`, only S of its rows get the residual's gradient, so it is
  // zeroed first and the rest accumulate; else the first op writes all of it.
  const Act d_x1 = s.d_res1;  // grad of x1 (LN1's output)
  // y = LN2(r2), r2 = x1 + drop(fcp(gelu(fc(x1)))): d_x1 = d_r2 (the residual), d_c1 = drop'(d_r2)
  // (s.d_c2: the default's scratch for d_r2)
  be.layernorm_dropout_backward(overwrite(d_x1), s.d_c1, s.d_c2, gw.ln2_w, gw.ln2_b, dout, a.res2,
                                w.ln2_w, a.ln2_mean, a.ln2_rstd, N, C, p_resid, seeds.resid2, rows);
  // d_ff1 = d fch (the GELU's input), through fcp and the GELU (s.d_ff2: the default's scratch)
  be.matmul_dgelu_backward(overwrite(s.d_ff1), gw.fcp_w, gw.fcp_b, s.d_c1, a.fch_gelu, a.fch, w.fcp_w,
                           N, FF, C, c.layout, c.gelu, s.d_ff2);
  be.matmul_backward(d_x1, gw.fc_w, gw.fc_b, s.d_ff1, a.ln1, w.fc_w, N, C, FF, c.layout);
  // x1 = LN1(r1), r1 = x + drop(proj(attn(qkv(x)))): dx += d_r1, d_c1 = drop'(d_r1)
  // (out: d_r1 of the S rows in d_qkv, free until the attention, then scattered into dx)
  if (out && dx.write) {
    dx.write = false;
    be.zero_act(dx, size_t(BT) * C);
  }
  const Act d_xr = out ? overwrite(s.d_qkv) : dx;
  be.layernorm_dropout_backward(d_xr, s.d_c1, s.d_c2, gw.ln1_w, gw.ln1_b, d_x1, a.res1, w.ln1_w,
                                a.ln1_mean, a.ln1_rstd, N, C, p_resid, seeds.resid1, rows);
  dx.write = false;  // written: the products below accumulate onto it
  if (out) be.rows_scatter_add(dx, d_xr, N, C, C, out->idx);
  Act d_atty = s.d_res1;
  be.matmul_backward(overwrite(d_atty), gw.proj_w, gw.proj_b, s.d_c1, out ? a.ln2 : a.atty, w.proj_w,
                     N, C, C, c.layout);
  if (out) {  // the attention output's gradient at every position: zero but at the S rows
    be.zero_act(s.d_c2, size_t(BT) * C);
    be.rows_scatter_add(s.d_c2, d_atty, N, C, C, out->idx);
    d_atty = s.d_c2;
  }
  // (a.atty: the attention's output at every position, which the forward left as it wrote it)
  be.attention_backward(overwrite(s.d_qkv), s.d_att, d_atty, a.atty, a.qkv, a.att, attn_mask, c.causal,
                        p_attn, seeds.attn, B, T, c.NH, HS, seeds.T_key, seeds.token_key,
                        seeds.examples);
  be.matmul_backward(dx, gw.qkv_w, gw.qkv_b, s.d_qkv, x, w.qkv_w, BT, C, 3 * C, c.layout);
}

}  // namespace

void block_forward(Backend& be, const BlockConfig& c, const BlockWeights& w, BlockActs& a,
                   CAct x, const int32_t* attn_mask, bool training, BlockSeeds seeds,
                   int B, int T, const OutRows* out_rows) {
  const int BT = B * T, C = c.C, FF = c.FF, HS = C / c.NH;
  const float p_attn = training ? c.attn_pdrop : 0.f;
  const float p_resid = training ? c.resid_pdrop : 0.f;
  const size_t n = size_t(BT) * C;
  if (!c.pre_ln) {
    post_ln_forward(be, c, w, a, x, attn_mask, p_attn, p_resid, seeds, B, T, out_rows);
    return;
  }
  NLP_ASSERT(!out_rows);  // OutRows: post-LN blocks only (no model asks for it on a pre-LN stack)
  const DropRows rows = drop_rows(T, seeds.T_key, C, seeds.token_key);

  // attention sub-block: res1[BT,C] = x + drop(proj(attn(LN1(x))))
  be.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b, BT, C, c.ln_eps);
  be.matmul_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, BT, C, 3 * C, c.layout);
  be.attention_forward(a.atty, a.att, a.qkv, attn_mask, c.causal, p_attn, seeds.attn, B, T, c.NH,
                       HS, seeds.T_key, seeds.token_key, seeds.examples);
  be.matmul_forward(a.res1, a.atty, w.proj_w, w.proj_b, BT, C, C, c.layout);

  // MLP sub-block: out[BT,C] = res1 + drop(fcp(gelu(fc(LN2(res1))))), LN2 fused with the residual above
  be.residual_layernorm_forward(a.res1, a.ln2, a.ln2_mean, a.ln2_rstd, x, a.res1, w.ln2_w, w.ln2_b, BT,
                                C, c.ln_eps, p_resid, seeds.resid1, rows);
  be.matmul_gelu_forward(a.fch_gelu, a.fch, a.ln2, w.fc_w, w.fc_b, BT, C, FF, c.layout, c.gelu);
  be.matmul_forward(a.out, a.fch_gelu, w.fcp_w, w.fcp_b, BT, FF, C, c.layout);
  be.dropout_forward(a.out, a.out, n, p_resid, seeds.resid2, rows);
  be.add(a.out, a.out, a.res1, n);
}

void block_backward(Backend& be, const BlockConfig& c, const BlockWeights& w,
                    const BlockWeights& gw, const BlockActs& a, BlockScratch& s, Act dx,
                    Act dout, CAct x, const int32_t* attn_mask, bool training,
                    BlockSeeds seeds, int B, int T, const OutRows* out_rows) {
  const int BT = B * T, C = c.C, FF = c.FF, HS = C / c.NH;
  const float p_attn = training ? c.attn_pdrop : 0.f;
  const float p_resid = training ? c.resid_pdrop : 0.f;
  const size_t n = size_t(BT) * C;
  if (!c.pre_ln) {
    post_ln_backward(be, c, w, gw, a, s, dx, dout, x, attn_mask, p_attn, p_resid, seeds, B, T, out_rows);
    return;
  }
  NLP_ASSERT(!out_rows);
  const DropRows rows = drop_rows(T, seeds.T_key, C, seeds.token_key);

  // Every op that is the first to write a gradient overwrites it (overwrite(), backend.h): no
  // zeroing pass.
  // out = res1 + drop(mlp): d_res1 = dout + d(LN2 path)
  be.copy_view(s.d_res1, dout, n);
  be.dropout_backward(overwrite(s.d_c1), dout, n, p_resid, seeds.resid2, rows);
  be.matmul_dgelu_backward(overwrite(s.d_ff1), gw.fcp_w, gw.fcp_b, s.d_c1, a.fch_gelu, a.fch, w.fcp_w,
                           BT, FF, C, c.layout, c.gelu, s.d_ff2);
  be.matmul_backward(overwrite(s.d_c2), gw.fc_w, gw.fc_b, s.d_ff1, a.ln2, w.fc_w, BT, C, FF, c.layout);
  be.layernorm_backward(s.d_res1, gw.ln2_w, gw.ln2_b, s.d_c2, a.res1, w.ln2_w, a.ln2_mean,
                        a.ln2_rstd, BT, C);

  // res1 = x + drop(proj(attn(LN1(x))))
  if (dx.write)
    be.copy_view(dx, s.d_res1, n);
  else
    be.accumulate(dx, s.d_res1, n);
  dx.write = false;  // written: LN1's gradient below accumulates onto it
  be.dropout_backward(overwrite(s.d_c1), s.d_res1, n, p_resid, seeds.resid1, rows);
  be.matmul_backward(overwrite(s.d_c2), gw.proj_w, gw.proj_b, s.d_c1, a.atty, w.proj_w, BT, C, C,
                     c.layout);
  be.attention_backward(overwrite(s.d_qkv), s.d_att, s.d_c2, a.atty, a.qkv, a.att, attn_mask, c.causal,
                        p_attn, seeds.attn, B, T, c.NH, HS, seeds.T_key, seeds.token_key,
                        seeds.examples);
  be.matmul_backward(overwrite(s.d_c1), gw.qkv_w, gw.qkv_b, s.d_qkv, a.ln1, w.qkv_w, BT, C, 3 * C,
                     c.layout);
  be.layernorm_backward(dx, gw.ln1_w, gw.ln1_b, s.d_c1, x, w.ln1_w, a.ln1_mean, a.ln1_rstd, BT,
                        C);
}

size_t BlockStack::numel(Backend& be, int B, int T) const {
  const AttnSizes att = attn_sizes(be, config, B, T);
  const size_t scratch = block_scratch_numel(config, att, B, T);
  if (recompute && !layers.empty())  // one output per block + one shared working set
    return layers.size() * act_floats(size_t(B) * T * config.C, config.act) +
           block_acts_numel(config, att, B, T) + scratch;
  return layers.size() * block_acts_numel(config, att, B, T) + scratch;
}

void BlockStack::carve(Backend& be, float* base, int B, int T) {
  const AttnSizes att = attn_sizes(be, config, B, T);
  carved_att_ = att;
  acts_.clear();
  if (recompute && !layers.empty()) {
    const size_t out_n = act_floats(size_t(B) * T * config.C, config.act);
    float* outs = base;
    base += layers.size() * out_n;
    work_ = carve_block_acts(base, config, att, B, T);
    base += block_acts_numel(config, att, B, T);
    for (size_t l = 0; l < layers.size(); ++l) {
      BlockActs a = work_;
      a.out = Act(outs + l * out_n, config.act, size_t(B) * T * config.C);  // kept: the input of block l+1 (the stack's output for the last)
      acts_.push_back(a);
    }
    scratch_ = carve_block_scratch(base, config, att, B, T);
    return;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    acts_.push_back(carve_block_acts(base, config, att, B, T));
    base += block_acts_numel(config, att, B, T);
  }
  scratch_ = carve_block_scratch(base, config, att, B, T);
}

namespace {
BlockSeeds keyed(BlockSeeds s, const int32_t* token_key, int examples) {
  s.token_key = token_key;
  s.examples = token_key ? examples : 0;
  return s;
}
}  // namespace

CAct BlockStack::forward(Backend& be, ParamStore& ps, CAct x0, const int32_t* mask,
                                 bool training, uint64_t seed, int B, int T, int T_key,
                                 const int32_t* token_key, int examples, const OutRows* out_rows) {
  check_fits(be, token_key ? std::max(B, examples) : B, T);
  CAct x = x0;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (before_block) before_block(int(l));
    block_forward(be, config, block_weights(ps, layers[l], false), acts_[l], x, mask, training,
                  keyed(block_seeds(seed, int(l), T_key), token_key, examples), B, T,
                  l + 1 == layers.size() ? out_rows : nullptr);
    x = acts_[l].out;
  }
  return x;
}

void BlockStack::check_fits(Backend& be, int B, int T) const {
  if (layers.empty()) return;
  const AttnSizes need = attn_sizes(be, config, B, T);
  if (need.saved > carved_att_.saved || need.scratch > carved_att_.scratch)
    throw Error(cat("attention state for a batch of ", B, " x ", T, " (", need.saved, " + ", need.scratch,
                    " floats) does not fit the activation arena carved for the largest batch (",
                    carved_att_.saved, " + ", carved_att_.scratch, "): the ", be.name(),
                    " backend sizes this shape by another path (e.g. cuDNN declined the largest shape); "
                    "run with data.padding = max_length"));
}

namespace {
std::vector<int> layer_indices(const BlockParamIdx& i) {
  return {i.ln1_w, i.ln1_b, i.qkv_w, i.qkv_b, i.proj_w, i.proj_b,
          i.ln2_w, i.ln2_b, i.fc_w,  i.fc_b,  i.fcp_w,  i.fcp_b};
}
}  // namespace

size_t BlockStack::layer_begin(const ParamStore& ps, int l) const {
  size_t lo = ps.total();
  for (int i : layer_indices(layers[l])) lo = std::min(lo, ps.specs()[i].offset);
  return lo;
}

size_t BlockStack::layer_end(const ParamStore& ps, int l) const {
  size_t hi = 0;
  for (int i : layer_indices(layers[l]))
    hi = std::max(hi, ps.specs()[i].offset + ps.specs()[i].numel);
  return hi;
}

void BlockStack::backward(Backend& be, ParamStore& ps, Act& da, Act& db, CAct x0,
                          const int32_t* mask, bool training, uint64_t seed, int B, int T,
                          int T_key, const std::function<void(size_t)>* ready,
                          const int32_t* token_key, int examples, const OutRows* out_rows) {
  for (int l = int(layers.size()) - 1; l >= 0; --l) {
    const CAct x = l > 0 ? CAct(acts_[l - 1].out) : x0;
    const OutRows* rows = l + 1 == int(layers.size()) ? out_rows : nullptr;
    if (before_block) before_block(l);
    if (recompute) {
      // Rerun block l's forward into the shared working set (its output into the working set's own
      // buffer, so the kept outputs stay untouched); same seeds, so the same dropout masks.
      BlockActs a = work_;
      block_forward(be, config, block_weights(ps, layers[l], false), a, x, mask, training,
                    keyed(block_seeds(seed, l, T_key), token_key, examples), B, T, rows);
    }
    block_backward(be, config, block_weights(ps, layers[l], false), block_weights(ps, layers[l], true),
                   acts_[l], scratch_, overwrite(db), da, x, mask, training,
                   keyed(block_seeds(seed, l, T_key), token_key, examples),
                   B, T, rows);
    std::swap(da, db);
    if (ready && *ready) (*ready)(layer_begin(ps, l));
  }
}

size_t block_decode_scratch_numel(const BlockConfig& c, int B) {
  return size_t(B) * (7 * size_t(c.C) + 2 * size_t(c.FF) + 2);
}

void block_decode(Backend& be, const BlockConfig& c, const BlockWeights& w, const float* x,
                  float* out, float* kcache, float* vcache, float* scratch, int B, int pos,
                  int Tmax) {
  NLP_ASSERT(c.pre_ln && c.causal);
  const int C = c.C, FF = c.FF, HS = C / c.NH;
  const size_t n = size_t(B) * C;
  float* ln = scratch;          // [B,C]
  float* qkv = ln + n;          // [B,3C]
  float* atty = qkv + 3 * n;    // [B,C]
  float* tmp = atty + n;        // [B,C]
  float* res = tmp + n;         // [B,C]
  float* fch = res + n;         // [B,FF]
  float* fchg = fch + size_t(B) * FF;  // [B,FF]
  float* mean = fchg + size_t(B) * FF; // [B]
  float* rstd = mean + B;              // [B]

  be.layernorm_forward(ln, mean, rstd, x, w.ln1_w, w.ln1_b, B, C, c.ln_eps);
  be.matmul_forward(qkv, ln, w.qkv_w, w.qkv_b, B, C, 3 * C, c.layout);
  be.attention_decode(atty, qkv, kcache, vcache, B, pos, Tmax, c.NH, HS);
  be.matmul_forward(tmp, atty, w.proj_w, w.proj_b, B, C, C, c.layout);
  be.add(res, tmp, x, n);
  be.layernorm_forward(ln, mean, rstd, res, w.ln2_w, w.ln2_b, B, C, c.ln_eps);
  be.matmul_forward(fch, ln, w.fc_w, w.fc_b, B, C, FF, c.layout);
  be.gelu_forward(fchg, fch, size_t(B) * FF, c.gelu);
  be.matmul_forward(tmp, fchg, w.fcp_w, w.fcp_b, B, FF, C, c.layout);
  be.add(out, tmp, res, n);
}

}  // namespace nlp
