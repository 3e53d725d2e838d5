// The backend interface: memory plus a table of ops, each a forward/backward pair.
// The CPU backend (backend/cpu/) is the reference; the CUDA backend (backend/cuda/) implements the same table.
//
// Conventions (every backend, every op):
//  - All pointers are backend memory (host for CPU, device for CUDA), float32 unless typed otherwise.
//    Activations and their gradients are typed views (core/tensor.h: Act, CAct), fp32 or bf16, each
//    argument its own dtype; a float* is an fp32 view. Parameters, their gradients, the optimizer
//    state, layer-norm statistics, losses, logits and the attention op's saved state are float*.
//    Every backend takes every dtype combination (the CPU as the reference: cpu/staged.h).
//  - Row-major. Shapes are given in the comment of each op; B batch, T sequence, C channels,
//    NH heads, HS head size (C = NH*HS), V vocabulary, M rows, K inner dim, N output dim.
//  - Backward ops ACCUMULATE (+=) into every gradient they write. The caller zeroes gradients, or
//    passes an activation gradient as overwrite(view) when the op is its only writer: the op then
//    overwrites it (where an op below says so; rows_scatter_add and the defaults' scratch do not).
//    A null gradient pointer means "not needed" and is skipped.
//  - Dropout masks come from core/rng.h: keep(i) = uniform01(seed, key(i)) >= p, scaled by 1/(1-p).
//    Backward regenerates the mask from the same seed, so nothing is stored. key(i) is the element's
//    index in the example's untrimmed layout (DropRows; attention's T_key), so a batch trimmed to its
//    longest row (data.padding = longest) draws exactly the masks of the padded batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/path_counts.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace nlp {

enum class Gelu { Tanh, Erf };  // Tanh: HF "gelu_new" (GPT-2); Erf: exact GELU (BERT)

// Weight layout of a dense layer computing out = inp @ W + b.
//   InOut: W is [K, N] (HF Conv1D, GPT-2).  OutIn: W is [N, K] (torch nn.Linear, BERT).
enum class WLayout { InOut, OutIn };

constexpr int32_t kIgnoreIndex = -100;

// A float as a value-table word (Backend::bind_slot): its bits in the low 32 bits; slot_float is
// the inverse.
inline uint64_t slot_word(float f) {
  uint32_t u;
  static_assert(sizeof u == sizeof f);
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float slot_float(uint64_t word) {
  const uint32_t u = static_cast<uint32_t>(word);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Where a dropout op over a [B, T, C] tensor draws element i's mask: rows of `row` = T*C elements
// (one example) are keyed as if they had `row_key` = T_key*C elements, i.e. at index
// (i / row) * row_key + i % row, the index of the same (example, position, channel) in the batch
// padded to T_key. row == 0 (the default) or row == row_key: the flat index i.
// Packed rows (several examples to a row) give each token its key instead: token_key[B*T] (backend
// memory) = example * T_key + position in the example, and element i of token r = i / width is keyed
// at token_key[r] * width + i % width: again the index of the same element in the padded batch.
struct DropRows {
  size_t row = 0, row_key = 0;
  const int32_t* token_key = nullptr;
  size_t width = 0;
};
// The DropRows of a [B, T, C] tensor whose examples are keyed at T_key positions (0 = T), or by
// token_key (packed rows; nullable).
inline DropRows drop_rows(int T, int T_key, int C, const int32_t* token_key = nullptr) {
  if (token_key) return DropRows{0, 0, token_key, size_t(C)};
  return DropRows{size_t(T) * C, size_t(key_length(T, T_key)) * C};
}

// Arithmetic of the dense-layer GEMMs (matmul_forward/backward), train.precision. Parameters,
// gradients, the optimizer state and every other op stay fp32; accumulation is fp32 in every mode.
//   Fp32: strict fp32.  Tf32: operands rounded to TF32 (10-bit mantissa), as the tensor cores read them.
//   Bf16: operands rounded to bf16 (7-bit mantissa). The CPU backend rounds the operands the same way
//   (round to nearest even) before an fp32 GEMM, so both backends compute the same function.
enum class Precision { Fp32, Tf32, Bf16 };
// "fp32" | "tf32" | "bf16" | "auto" (bf16 on cuda, fp32 on cpu) -> Precision; throws on anything else.
Precision parse_precision(const std::string& value, const std::string& backend);
const char* precision_name(Precision p);
// model.attention: "auto" | "cudnn" | "native" -> whether attention runs through cuDNN's fused SDPA
// (BackendOptions::fused_attention). auto: yes on the cuda backend when `precision` is bf16. The cpu
// backend has only its own attention, so it always gets false (a caller may log that "cudnn" is
// ignored there). Throws nlp::Error on any other value.
bool parse_fused_attention(const std::string& value, const std::string& backend, Precision precision);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What the log should know of how this backend computes (the cpu backend: its GEMM library and bf16
  // path); empty when there is nothing to say.
  virtual std::string details() const { return {}; }

  // ---- memory ----------------------------------------------------------------------------------
  virtual void* alloc(size_t bytes) = 0;  // zero-initialised
  virtual void release(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  // The n elements of a view set to zero (zero() over their bytes).
  void zero_act(Act a, size_t n) { zero(a.p, n * dtype_bytes(a.dt)); }
  // Host memory for staging copies (page-locked on GPU backends, so copies run at full rate).
  virtual void* host_alloc(size_t bytes) { return ::operator new(bytes); }
  virtual void host_release(void* p) { ::operator delete(p); }
  virtual void synchronize() {}
  // run.profile: time every op (CUDA events; no extra synchronisation) and report a per-op table.
  virtual void set_profiling(bool /*on*/) {}
  virtual std::string profile_report() { return {}; }
  // run.profile's account (backend/op_account.h): ops enqueued from now on are timed under `label`
  // (null: under their own names); a backend that splits an op (the bf16 operand casts of a GEMM)
  // times the parts under "<label>" and "cast: <label>". profile_times: the time so far per label.
  virtual void profile_label(const char* /*label*/) {}
  struct ProfileTime {
    std::string label;
    double ms = 0;
    long calls = 0;
  };
  virtual std::vector<ProfileTime> profile_times() { return {}; }
  // What ran so far (core/path_counts.h: fused and fallback GEMM epilogues, staged ops, fp32<->bf16
  // conversions), counted since the backend was made; false (the default: the CPU backend) when the
  // backend keeps no such counts. Callers take differences over the steps they report.
  virtual bool path_counts(PathCounts* /*out*/) const { return false; }

  // ---- the persistent bf16 copy of the weights (BackendOptions::bf16_weights) -------------------
  // With the option on and Precision::Bf16, the dense-layer GEMMs read a weight that lies inside the
  // registered arena from a bf16 copy kept beside it (2 bytes an element) instead of rounding it at
  // every call. The copy is the round-to-nearest-even of the fp32 weights at every op: adamw_update
  // and adamw_update_spans write the weight and its rounding in one pass; to_device, copy and zero
  // into the arena round the part they wrote again; a write from outside the backend (a collective:
  // the ZeRO all-gather) must be followed by weights_written over what it wrote.
  // Off (the default, and any other precision): these do nothing and bf16_weights() is null.
  // Once, before any write; (arena, 0) forgets that arena (its owner frees it).
  virtual void register_weights(const float* /*arena*/, size_t /*n*/) {}
  virtual void weights_written(const float* /*p*/, size_t /*n*/) {}
  // The copy (backend memory, the bf16 bit patterns of the n arena elements), or null when off.
  virtual const uint16_t* bf16_weights() const { return nullptr; }

  // ---- embeddings --------------------------------------------------------------------------------
  // out[B,T,C] = wte[ids[b,t]] + wpe[p(b,t)] (+ wtt[type_ids[b,t]] when type_ids and wtt non-null),
  // p(b,t) = pos_ids[b,t] when pos_ids is non-null (packed rows: positions restart in each example),
  // else pos_offset + t.  wte [V,C], wpe [P,C], wtt [TT,C]
  virtual void embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids,
                                 const float* wte, const float* wpe, const float* wtt, int B, int T,
                                 int C, int pos_offset, const int32_t* pos_ids = nullptr) = 0;
  // dwte[V,C] += scatter(dout), dwpe[P,C] += scatter by p(b,t), dwtt[TT,C] += scatter by type (nullable)
  virtual void embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout,
                                  const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                                  int pos_offset, const int32_t* pos_ids = nullptr) = 0;

  // ---- dense layer ---------------------------------------------------------------------------------
  // out[M,N] = inp[M,K] @ W + bias[N]   (W per layout; bias nullable)
  virtual void matmul_forward(Act out, CAct inp, const float* w, const float* bias,
                              int M, int K, int N, WLayout layout) = 0;
  // dinp[M,K] += dout @ W^T (overwrite: =);  dw += inp^T @ dout (in W's layout);
  // dbias[N] += colsum(dout)
  virtual void matmul_backward(Act dinp, float* dw, float* dbias, CAct dout, CAct inp, const float* w, int M, int K, int N,
                               WLayout layout) = 0;
  // The dense layer fused with its GELU (GPT-2's MLP: fc then gelu):
  //   pre[M,N] = inp[M,K] @ W + bias[N] (bias nullable), out[M,N] = gelu(pre)
  // Default: matmul_forward into pre, then gelu_forward(out, pre): the same ops as calling them in
  // turn. A backend may compute both from the fp32 product in one GEMM epilogue (the CUDA backend
  // with bf16 views: cuBLASLt's GELU_AUX), so out is then gelu of the unrounded pre.
  virtual void matmul_gelu_forward(Act out, Act pre, CAct inp, const float* w, const float* bias,
                                   int M, int K, int N, WLayout layout, Gelu form) {
    matmul_forward(pre, inp, w, bias, M, K, N, layout);
    gelu_forward(out, pre, size_t(M) * N, form);
  }
  // The backward of the dense layer that follows such a GELU (GPT-2's fcp): out = h @ W + b with
  // h[M,K] = gelu(pre[M,K]), dout[M,N]:
  //   dw += h^T @ dout (in W's layout), dbias[N] += colsum(dout) (both nullable),
  //   dpre[M,K] += (dout @ W^T) * gelu'(pre) (overwrite: =)
  // scratch [M,K] (its own dtype; contents undefined after) is workspace. Default: matmul_backward
  // with dinp = overwrite(scratch), then gelu_backward(dpre, pre, scratch): the same ops in turn.
  // A backend may compute dpre in the GEMM's epilogue (the CUDA backend with bf16 views: cuBLASLt's
  // DGELU), from the unrounded product, and leave scratch alone.
  virtual void matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h, CAct pre,
                                     const float* w, int M, int K, int N, WLayout layout, Gelu form,
                                     Act scratch) {
    matmul_backward(overwrite(scratch), dw, dbias, dout, h, w, M, K, N, layout);
    gelu_backward(dpre, pre, scratch, size_t(M) * K, form);
  }

  // ---- layer norm over the last dimension ---------------------------------------------------------
  // out[N,C] = (inp - mean) * rstd * w + b; saves mean[N], rstd[N] (rstd = 1/sqrt(var + eps), biased var)
  virtual void layernorm_forward(Act out, float* mean, float* rstd, CAct inp,
                                 const float* w, const float* b, int N, int C, float eps) = 0;
  // dinp[N,C] += (overwrite: =), dw[C] +=, db[C] +=
  virtual void layernorm_backward(Act dinp, float* dw, float* db, CAct dout, CAct inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  // The residual add and its layer norm (a transformer block's "x + dropout(sublayer)" then LN):
  // res[N,C] = x + dropout(delta) (delta may alias res; mask keyed by `rows` as dropout_forward),
  // out[N,C] = layernorm(res), mean/rstd[N]. The default runs the three ops; a backend may fuse them
  // (the CPU's is one pass, bitwise the same).
  virtual void residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x,
                                          CAct delta, const float* w,
                                          const float* b, int N, int C, float eps, float p,
                                          uint64_t seed, DropRows rows) {
    dropout_forward(res, delta, size_t(N) * C, p, seed, rows);
    add(res, res, x, size_t(N) * C);
    layernorm_forward(out, mean, rstd, res, w, b, N, C, eps);
  }
  // Its backward for a post-LN block: g = the input gradient of layernorm_backward from dout;
  // dinp[N,C] += g; ddelta[N,C] = dropout_backward of g (overwritten); dw[C] +=, db[C] +=. `scratch`
  // ([N,C], contents undefined after) holds g in the default, which runs the ops in turn; the CPU's
  // is one pass, bitwise the same, and leaves scratch alone.
  // (dinp accumulates, or overwrites when it says so; ddelta is always overwritten.)
  virtual void layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db,
                                          CAct dout, CAct inp, const float* w, const float* mean, const float* rstd,
                                          int N, int C, float p, uint64_t seed, DropRows rows) {
    const size_t n = size_t(N) * C;
    zero_act(scratch, n);
    layernorm_backward(scratch, dw, db, dout, inp, w, mean, rstd, N, C);
    if (dinp.write)
      copy_view(dinp, scratch, n);
    else
      accumulate(dinp, scratch, n);
    zero_act(ddelta, n);
    dropout_backward(ddelta, scratch, n, p, seed, rows);
  }

  // ---- elementwise ---------------------------------------------------------------------------------
  // out[N] = gelu(inp)
  virtual void gelu_forward(Act out, CAct inp, size_t N, Gelu form) = 0;
  // dinp[N] += gelu'(inp) * dout (overwrite: =)
  virtual void gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) = 0;
  // out[N] = a + b   (out may alias a or b)
  virtual void add(Act out, CAct a, CAct b, size_t N) = 0;
  // dst[N] += src
  virtual void accumulate(Act dst, CAct src, size_t N) = 0;
  // x[N] *= s
  virtual void scale(Act x, float s, size_t N) = 0;
  // dst[N] = src, converted to dst's dtype (a plain copy when the dtypes agree)
  virtual void copy_view(Act dst, CAct src, size_t N) = 0;
  // out[N] = tanh(inp)   (BERT pooler)
  virtual void tanh_forward(Act out, CAct inp, size_t N) = 0;
  // dinp[N] += (1 - out^2) * dout, from the forward output (overwrite: =)
  virtual void tanh_backward(Act dinp, CAct out, CAct dout, size_t N) = 0;
  // Row gather: out[i,C] = inp[r(i)*stride, 0..C) for i < n, where r(i) = idx[i], or i when idx is
  // null (e.g. the [CLS] row of each sequence: stride T*C; the masked positions for MLM: stride C).
  virtual void rows_gather(Act out, CAct inp, int n, int C, size_t stride,
                           const int32_t* idx = nullptr) = 0;
  // Its adjoint: dinp[r(i)*stride, 0..C) += dout[i,C]; the rows r(i) must be distinct.
  virtual void rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                                const int32_t* idx = nullptr) = 0;
  // out[N] = inp * keep / (1-p); p == 0 copies. out may alias inp. keep of element i is drawn at
  // the index DropRows says (the flat index by default).
  virtual void dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed,
                               DropRows rows = {}) = 0;
  // dinp[N] += dout * keep / (1-p) (overwrite: =)
  virtual void dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                                DropRows rows = {}) = 0;

  // ---- attention -----------------------------------------------------------------------------------
  // qkv[B,T,3C] holds q | k | v per row (head h uses columns h*HS..h*HS+HS of each part).
  // att holds attention_saved_floats(B, T, NH, HS) floats: the state attention_forward saves for
  // attention_backward, opaque to the caller. The native CUDA kernels save the softmax probabilities
  // (before dropout) as att[B,NH,T,T]; the CPU (two floats per query row, recomputing the
  // probabilities in the backward) and the fused cuDNN path save far less.
  // Masking: causal (key j > query i masked) and/or attn_mask[B,T] (nullable): a segment id per token,
  // 0 = padding. Query i attends key j iff attn_mask[j] != 0 and (attn_mask[i] == attn_mask[j] or
  // attn_mask[i] == 0): with a 0/1 mask that is the key-padding mask (a padding query sees every real
  // key, as in transformers); with packed rows (ids 1, 2, ... per example) attention stays within
  // each example (block-diagonal). The CPU and native CUDA kernels follow this rule; the cuDNN fused
  // path follows it for calls with token_key (packed rows; but see `examples` below) and reads any
  // other mask as key padding.
  // Scores are scaled by 1/sqrt(HS); masked scores are -inf (a fully masked row gives zeros).
  // Attention dropout on the probabilities uses mask element index ((b*NH + h)*Tk + i)*Tk + j on the
  // native paths, Tk = T_key (0 = T): the example's untrimmed length, so that a batch trimmed to its
  // longest row draws the padded batch's mask (a fused path draws its own mask: same seed, same
  // mask, but not this one). Packed rows pass token_key[B,T] (DropRows): b, i and j are then the
  // example and the positions in it that token_key gives (example * Tk + position), so a packed
  // batch draws the padded batch's mask too.
  // examples (packed rows; 0 = not counted): the number of segment runs in attn_mask, i.e. of
  // examples in the B rows. The cuDNN fused path then runs each example as its own sequence (ragged
  // layout, attention_cudnn.h), which leaves the output of padding tokens 0 rather than this rule's;
  // it lays att and scratch out for max(B, examples) rows, so a packed call sizes them with
  // attention_saved_floats(max(B, examples), T, ...). The other paths ignore it.
  // out[B,T,C] = (dropout(att) @ v) with heads concatenated.
  virtual void attention_forward(Act out, float* att, CAct qkv,
                                 const int32_t* attn_mask, bool causal, float dropout_p,
                                 uint64_t seed, int B, int T, int NH, int HS, int T_key = 0,
                                 const int32_t* token_key = nullptr, int examples = 0) = 0;
  // dqkv[B,T,3C] += ... (overwrite: =); att as saved by attention_forward with the same arguments;
  // out[B,T,C]: the output that forward wrote, unchanged since (the cuDNN path with bf16 I/O reads
  // O from it instead of keeping a copy in att; the CPU and the native kernels ignore it);
  // scratch (attention_scratch_floats(B, T, NH, HS) floats) is caller-provided workspace (contents
  // undefined after)
  virtual void attention_backward(Act dqkv, float* scratch, CAct dout, CAct out, CAct qkv,
                                  const float* att, const int32_t* attn_mask, bool causal,
                                  float dropout_p, uint64_t seed, int B, int T, int NH,
                                  int HS, int T_key = 0, const int32_t* token_key = nullptr,
                                  int examples = 0) = 0;
  // Sizes in floats of attention_forward's `att` and attention_backward's `scratch` for a call of
  // this shape (the model's activation arena asks before carving), whose q|k|v, output and their
  // gradients are stored as `act`. Default (the native CUDA kernels): B*NH*T*T each, the
  // probabilities and their gradient.
  virtual size_t attention_saved_floats(int B, int T, int NH, int HS, DType act = DType::F32) {
    (void)HS, (void)act;
    return size_t(B) * NH * T * T;
  }
  virtual size_t attention_scratch_floats(int B, int T, int NH, int HS, DType act = DType::F32) {
    (void)HS, (void)act;
    return size_t(B) * NH * T * T;
  }
  // Incremental decoding with a KV cache, one new position `pos` per sequence, no dropout:
  // writes k,v of qkv_new[B,3C] into kcache/vcache[B,NH,Tmax,HS] at pos, then
  // out[B,C] = softmax(q k[0..pos]^T / sqrt(HS)) v[0..pos]
  virtual void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache,
                                int B, int pos, int Tmax, int NH, int HS) = 0;

  // ---- losses --------------------------------------------------------------------------------------
  // Fused softmax + cross-entropy over logits[M,V]: losses[M] = -log softmax(logits)[target],
  // 0 where targets[m] == kIgnoreIndex.
  virtual void crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                    int M, int V) = 0;
  // dlogits[M,V] += (softmax(logits) - onehot(target)) * dloss; rows with ignored targets get nothing.
  // The logits must be those of the last crossentropy_forward on the same pointer, M and V, unchanged
  // since (a backend may reuse the forward's row statistics: the CUDA backend does).
  virtual void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                     float dloss, int M, int V) = 0;
  // The same over E segments of one vector (packed qa: each example's positions in the packed rows).
  // Segment e is x[first[e] .. first[e] + len[e]) (len >= 1); targets[e] is relative to first[e].
  // losses[E] = -log softmax(segment)[target] (0 where ignored);
  // dx[first[e] + j] += (softmax(segment)_j - [j == target]) * dloss (ignored segments untouched).
  // first, len, targets in backend memory; segments with a target must not overlap.
  virtual void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                            const int32_t* len, const int32_t* targets, int E) = 0;
  virtual void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                             const int32_t* len, const int32_t* targets, float dloss,
                                             int E) = 0;

  // ---- the tied LM head fused with its cross-entropy (model.fused_head) ---------------------------
  // Rows x[M,C], the embedding w[V,C] (the head's weight, OutIn), targets[M]; by chunks of at most
  // `chunk` rows, so that no [M,V] tensor exists: for each chunk of rows r,
  //   logits[r, 0..V) = x[r] @ w^T                   (fp32 accumulation; operands per train.precision)
  //   losses[r] = -log softmax(logits[r])[target]    (0 where ignored; as crossentropy_forward)
  // and with dx or dw non-null (the backward; both null: the losses only):
  //   dlogits[r] = (softmax(logits[r]) - onehot(target)) * dloss, written over the chunk's logits in
  //   place (rows with an ignored target: 0), then dx[r,C] += dlogits @ w (overwrite: =),
  //   dw[V,C] += dlogits^T @ x[r].
  // Vp >= V (model.pad_vocab): the chunk's logits are stored with row stride Vp, and a backend may run
  // the GEMMs over Vp rows of a copy of w whose rows V..Vp are zero; columns V..Vp never reach the
  // loss or a gradient, so the results do not depend on Vp (bitwise on the CPU). scratch:
  // lm_head_scratch_floats(chunk, C, V, Vp) floats of backend memory (contents undefined after).
  // The default composes the unfused ops (matmul_forward, crossentropy_forward/backward,
  // matmul_backward) over a chunk's [rows, V] logits and dlogits.
  virtual size_t lm_head_scratch_floats(int chunk, int C, int V, int Vp) {
    (void)C, (void)Vp;
    return 2 * size_t(chunk) * V;
  }
  virtual void lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w, const int32_t* targets, float dloss, int M,
                                    int C, int V, int Vp, int chunk, float* scratch) {
    (void)Vp;
    const bool bwd = bool(dx) || dw;
    for (int r0 = 0; r0 < M; r0 += chunk) {
      const int rows = M - r0 < chunk ? M - r0 : chunk;
      float* logits = scratch;
      float* dlogits = scratch + size_t(chunk) * V;
      const CAct xr = x.at(size_t(r0) * C);
      matmul_forward(logits, xr, w, nullptr, rows, C, V, WLayout::OutIn);
      crossentropy_forward(losses + r0, logits, targets + r0, rows, V);
      if (!bwd) continue;
      zero(dlogits, size_t(rows) * V * sizeof(float));
      crossentropy_backward(dlogits, logits, targets + r0, dloss, rows, V);
      matmul_backward(dx.at(size_t(r0) * C), dw, nullptr, dlogits, xr, w, rows, C, V,
                      WLayout::OutIn);
    }
  }

  // ---- reductions and the optimizer ---------------------------------------------------------------
  virtual double sum(const float* x, size_t N) = 0;    // in double precision
  virtual double sumsq(const float* x, size_t N) = 0;  // in double precision
  // acc[0] (one double in backend memory) += scale * sum(x), the sum as sum() gives it and the
  // product and the addition each rounded, as the host's `acc += scale * sum(x, N)` would be, but
  // without reading the sum back (a GPU runs on).
  virtual void sum_into(double* acc, const float* x, size_t N, double scale) = 0;
  // torch.optim.AdamW step t (1-based) on one tensor, gradient multiplied by grad_scale first:
  //   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t N,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float grad_scale, int t) = 0;
  // The same step on many tensors of one arena at once (every parameter of a model): span i is the
  // elements [offset, offset + numel) of param/grad/m/v with its own weight decay. Bitwise the same
  // as one adamw_update per span; a backend may do it in one pass (CUDA: one launch).
  // zero_grad: every span's gradient is zero afterwards, so that the next step accumulates onto it
  // without a zeroing pass of its own (the CPU zeroes each element as the update reads it).
  struct AdamWSpan {
    size_t offset, numel;
    float weight_decay;
  };
  virtual void adamw_update_spans(float* param, float* grad, float* m, float* v,
                                  const std::vector<AdamWSpan>& spans, float lr, float beta1,
                                  float beta2, float eps, float grad_scale, int t, bool zero_grad) {
    for (const AdamWSpan& sp : spans) {
      adamw_update(param + sp.offset, grad + sp.offset, m + sp.offset, v + sp.offset, sp.numel, lr,
                   beta1, beta2, eps, sp.weight_decay, grad_scale, t);
      if (zero_grad) zero(grad + sp.offset, sp.numel * sizeof(float));
    }
  }

  // ---- replayed micro-batches (run.cuda_graph; backend/step_graph.h drives these) ---------------
  // A backend that can record the ops enqueued between capture_begin() and capture_end() without
  // running them, and launch the recording later as often as asked (CUDA graphs), says so in
  // can_capture(); otherwise *why (nullable) says why not, and step_graph.h emulates a recording by
  // keeping the calls themselves (how the CPU tests check the recording's bookkeeping).
  // Values that differ between launches of one recording (dropout seeds, the loss scale dloss) come
  // from the recording's table of `slots` 64-bit words in backend memory: bind_slot(k), k < slots,
  // before an op that takes a seed (dropout_*, residual_layernorm_forward,
  // layernorm_dropout_backward, attention_forward/backward) or dloss (crossentropy_backward,
  // segment_crossentropy_backward) makes that op read it from word k when the recording runs (dloss:
  // the float's bits in the word's low 32 bits, `slot_word(dloss)`); bind_slot(-1) after the op.
  // Ops between capture_begin and capture_end must not synchronise, allocate or read back.
  class Recording {
   public:
    virtual ~Recording() = default;
  };
  virtual bool can_capture(std::string* why) const {
    if (why) *why = "backend '" + name() + "' records no graphs";
    return false;
  }
  virtual void capture_begin(size_t /*slots*/) {}
  virtual void bind_slot(int /*k*/) {}
  // Ends the recording, also after an op threw during it: the recording, or null with the reason in
  // *why (an op that synchronised, allocated, grew a scratch buffer or failed while recording); the
  // backend is then as it was at capture_begin.
  virtual std::shared_ptr<Recording> capture_end(std::string* why) {
    if (why) *why = "backend '" + name() + "' records no graphs";
    return nullptr;
  }
  // Runs a recording with its table set to values[0 .. n) (n = its slots), enqueued as the recorded
  // ops would be.
  virtual void replay(Recording& /*r*/, const uint64_t* /*values*/, size_t /*n*/) {}
};

// How a backend is built (make_backend); every field has the default of a plain fp32 backend.
struct BackendOptions {
  Precision precision = Precision::Fp32;  // train.precision: dense-layer GEMM arithmetic
  bool sync_check = false;  // cuda: synchronise and check for errors after every op (names the op)
  bool fused_attention = false;  // cuda: attention through cuDNN's fused SDPA (model.attention)
  std::string cpu_gemm = "auto";     // cpu: run.cpu_gemm (auto | openblas | onednn)
  std::string cpu_bf16 = "emulate";  // cpu, train.precision = bf16: run.cpu_bf16 (auto | emulate | native)
  bool bf16_weights = false;  // run.bf16_weights: the persistent bf16 copy of the weights (Bf16 only)
};

// Factory: "cpu" or "cuda". Throws nlp::Error naming the backend when it is unavailable.
// The CPU backend uses options.precision and the cpu_* options.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int local_rank,
                                      const BackendOptions& options = {});

}  // namespace nlp
