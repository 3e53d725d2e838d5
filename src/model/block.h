// The transformer block shared by GPT-2 and BERT, parameterised by what differs between them:
//   pre-LN (GPT-2): x1 = x  + drop(attn(LN1(x)));  y = x1 + drop(mlp(LN2(x1)))
//   post-LN (BERT): x1 = LN1(x + drop(attn(x)));   y = LN2(x1 + drop(mlp(x1)))
// attention: qkv = in @ Wqkv + bqkv (fused q|k|v), multi-head softmax(q k^T/sqrt(HS)) v, out projection;
// mlp: gelu(in @ Wfc + bfc) @ Wproj + bproj. Weight layout per BlockConfig::layout (Conv1D or Linear).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/backend.h"
#include "model/params.h"

namespace nlp {

struct BlockConfig {
  int C = 0, NH = 0, FF = 0;  // channels, heads, MLP hidden
  bool pre_ln = true;
  bool causal = true;
  Gelu gelu = Gelu::Tanh;
  WLayout layout = WLayout::InOut;
  float ln_eps = 1e-5f;
  float attn_pdrop = 0.f, resid_pdrop = 0.f;
  // How the block's activations and their gradients are stored (run.bf16_activations: bf16); the
  // layer-norm statistics and the attention op's saved state stay fp32 whatever this says.
  DType act = DType::F32;
};

// Pointers to one block's tensors (parameters, or their gradients: same struct).
struct BlockWeights {
  float *ln1_w, *ln1_b;    // [C]
  float *qkv_w, *qkv_b;    // [C,3C] (InOut) or [3C,C] (OutIn); [3C]
  float *proj_w, *proj_b;  // [C,C]; [C]
  float *ln2_w, *ln2_b;    // [C]
  float *fc_w, *fc_b;      // [C,FF] or [FF,C]; [FF]
  float *fcp_w, *fcp_b;    // [FF,C] or [C,FF]; [C]
};

// Saved activations of one block for B*T rows (owned by the model's activation arena).
struct BlockActs {
  Act ln1;                  // [BT,C]   LN1 output (pre-LN) or LN1 output = x1 (post-LN)
  float *ln1_mean, *ln1_rstd;  // [BT]
  Act qkv;                  // [BT,3C]
  float* att;               // the attention op's saved state (AttnSizes::saved floats; native CUDA: [B,NH,T,T] probabilities, CPU: 2 per query row)
  Act atty;                 // [BT,C]   attention output before the projection
  Act res1;                 // [BT,C]   x + drop(proj)  (the residual stream after attention)
  Act ln2;                  // [BT,C]
  float *ln2_mean, *ln2_rstd;  // [BT]
  Act fch;                  // [BT,FF]  before GELU
  Act fch_gelu;             // [BT,FF]
  Act res2;                 // [BT,C]   x1 + drop(mlp)  (post-LN: LN2's input)
  Act out;                  // [BT,C]   block output
};

// Scratch for backward, shared by all blocks (sized for one block).
struct BlockScratch {
  Act d_res1, d_c1, d_c2;  // [BT,C]
  Act d_qkv;               // [BT,3C]
  Act d_ff1, d_ff2;        // [BT,FF]
  float* d_att;                 // attention backward scratch (AttnSizes::scratch floats; native CUDA: [B,NH,T,T], CPU: none)
};

// Floats of the attention op's saved state (BlockActs::att, per block) and backward scratch
// (BlockScratch::d_att, shared) for a B x T batch: the backend decides (Backend::attention_saved_floats
// and attention_scratch_floats; B*NH*T*T each on the native CUDA path, far less on the CPU and with fused attention).
struct AttnSizes {
  size_t saved = 0, scratch = 0;
};
AttnSizes attn_sizes(Backend& be, const BlockConfig& c, int B, int T);

// Floats (Carver: bf16 activations take about half) of one block's activations and the shared scratch.
size_t block_acts_numel(const BlockConfig& c, const AttnSizes& att, int B, int T);
size_t block_scratch_numel(const BlockConfig& c, const AttnSizes& att, int B, int T);
// Carve BlockActs / BlockScratch out of a buffer of the sizes above.
BlockActs carve_block_acts(float* base, const BlockConfig& c, const AttnSizes& att, int B, int T);
BlockScratch carve_block_scratch(float* base, const BlockConfig& c, const AttnSizes& att, int B,
                                 int T);

// Per-block dropout seeds: attention probabilities, residual after attention, residual after MLP;
// and T_key, the untrimmed row length the masks are keyed by (core/backend.h: a batch trimmed to
// T < T_key positions draws the masks of the padded batch; T_key = T: the flat index).
struct BlockSeeds {
  uint64_t attn, resid1, resid2;
  int T_key = 0;
  const int32_t* token_key = nullptr;  // packed rows: each token's key (backend.h DropRows)
  int examples = 0;  // packed rows: examples in the batch (backend.h attention_forward; 0 = uncounted)
};
// The seeds of block `layer` in a forward pass seeded by `seed` (same derivation for every model).
BlockSeeds block_seeds(uint64_t seed, int layer, int T_key);

// The rows of a post-LN block's output that are needed (BERT's last block: the [CLS] rows that the
// doc_cls/pair_cls pooler reads, the masked positions that the MLM head scores): idx[S] distinct flat
// positions b*T+t, key[S] their dropout keys (example * T_key + position, backend.h DropRows; both
// backend memory). The block then computes q, k, v and the attention at every position (the keys and
// values of all positions feed the S queries) but the output projection, both residual + LayerNorms
// and the MLP on the S rows only, and writes its output compact, [S,C]. Every other row of the output
// would reach no loss, so the result and every gradient equal the full block's.
struct OutRows {
  const int32_t* idx = nullptr;
  const int32_t* key = nullptr;
  int S = 0;
};

// Indices of one block's tensors in the model's ParamStore, and their pointers (params or grads).
struct BlockParamIdx {
  int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b;
};
BlockWeights block_weights(ParamStore& ps, const BlockParamIdx& i, bool grad);

// x[BT,C] -> a.out[BT,C] (rows non-null: a.out[S,C], the rows only; post-LN blocks). attn_mask
// [B,T] nullable. training=false disables dropout.
void block_forward(Backend& be, const BlockConfig& c, const BlockWeights& w, BlockActs& a,
                   CAct x, const int32_t* attn_mask, bool training, BlockSeeds seeds,
                   int B, int T, const OutRows* rows = nullptr);
// dout[BT,C] (rows: [S,C]; consumed, may be overwritten) -> dx[BT,C] += ..., gw += ...
// (dx overwrite(): dx = ..., its prior contents ignored; backend.h)
void block_backward(Backend& be, const BlockConfig& c, const BlockWeights& w,
                    const BlockWeights& gw, const BlockActs& a, BlockScratch& s, Act dx,
                    Act dout, CAct x, const int32_t* attn_mask, bool training,
                    BlockSeeds seeds, int B, int T, const OutRows* rows = nullptr);

// The stack of blocks of a model (GPT-2 and BERT alike): the layers' parameter indices, their saved
// activations and the backward scratch shared by the layers; forward and backward loop over them.
class BlockStack {
 public:
  BlockConfig config;
  std::vector<BlockParamIdx> layers;
  // train.recompute = block: keep only each block's output (the next block's input) and one working
  // set of intermediates shared by all blocks; backward() reruns block l's forward (same inputs,
  // same dropout seeds: bitwise the same activations) just before block l's backward.
  // Set before carve() (the models re-carve when it changes).
  bool recompute = false;
  // train.zero = 3 (train/param_shards.h): called with l just before block l's parameters are read
  // (its forward, its recomputed forward, its backward), to gather them; empty: not called.
  std::function<void(int)> before_block;

  // floats of activations + scratch for a B x T batch (the attention parts sized by `be`)
  size_t numel(Backend& be, int B, int T) const;
  void carve(Backend& be, float* base, int B, int T);  // lay them out in base (numel(be, B, T) floats)
  // x0[BT,C] -> the last block's output xL[BT,C] (x0 itself when there are no layers).
  // T_key: the row length dropout masks are keyed by (DeviceBatch::T_key).
  // token_key (nullable): packed rows' per-token dropout keys (DeviceBatch::token_key); examples:
  // then the batch's examples (DeviceBatch::E), which may exceed the B rows (the arena must have been
  // carved for max(B, examples) rows).
  // out_rows (nullable; post-LN stacks): the last block computes only these rows, and xL is [S,C].
  CAct forward(Backend& be, ParamStore& ps, CAct x0, const int32_t* mask,
                       bool training, uint64_t seed, int B, int T, int T_key,
                       const int32_t* token_key = nullptr, int examples = 0,
                       const OutRows* out_rows = nullptr);
  // *da holds d xL on entry (consumed; [S,C] with out_rows, the forward's) and d x0 on return; *db
  // is workspace; both buffers [BT,C].
  // ready (nullable): called with layer_begin(ps, l) after block l's backward (its gradients are final).
  void backward(Backend& be, ParamStore& ps, Act& da, Act& db, CAct x0,
                const int32_t* mask, bool training, uint64_t seed, int B, int T, int T_key,
                const std::function<void(size_t)>* ready = nullptr, const int32_t* token_key = nullptr,
                int examples = 0, const OutRows* out_rows = nullptr);
  // The range [begin, end) of block l's tensors in the parameter/gradient arenas (the tensors of a
  // block are registered one after the other, so the range holds only that block's tensors).
  size_t layer_begin(const ParamStore& ps, int l) const;
  size_t layer_end(const ParamStore& ps, int l) const;

 private:
  // The attention state of a B x T batch must fit the slots carved for the arena's shape (a trimmed
  // batch is smaller; but a backend may size a shorter batch by another path, e.g. cuDNN declining a
  // shape): throws a clear error rather than overrun.
  void check_fits(Backend& be, int B, int T) const;
  AttnSizes carved_att_{};  // the attention slot sizes of the carve
  std::vector<BlockActs> acts_;  // recompute: the shared working set, with out = that layer's output
  BlockActs work_{};             // recompute: the shared working set (its own out: recomputed output)
  BlockScratch scratch_{};
};

// One decoding position for B sequences with KV caches [B,NH,Tmax,HS] (pre-LN only, no dropout).
// x[B,C] -> out[B,C]; scratch holds block_decode_scratch_numel(c, B) floats.
size_t block_decode_scratch_numel(const BlockConfig& c, int B);
void block_decode(Backend& be, const BlockConfig& c, const BlockWeights& w, const float* x,
                  float* out, float* kcache, float* vcache, float* scratch, int B, int pos,
                  int Tmax);

}  // namespace nlp
