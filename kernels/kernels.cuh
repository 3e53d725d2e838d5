// Host-side launchers of the hand-written CUDA kernels (kernels/*.cu), called by the CUDA backend
// (src/backend/cuda/cuda_backend_cuda.cpp). Declarations only, no device code: this header is
// included from C++20 host code as well as from the .cu files (compiled as C++17).
//
// Conventions are those of core/backend.h: row-major float32 device memory; backward launchers
// ACCUMULATE into gradients; null gradient pointers are skipped by the caller. Every launcher
// enqueues on `s` and returns cudaGetLastError() of its launches (cudaSuccess when nothing was
// launched). Launchers that need scratch take a device workspace of at least *_ws_bytes() bytes.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace nlp {
namespace kern {

// ---- elementwise.cu ------------------------------------------------------------------------------
cudaError_t add(float* out, const float* a, const float* b, size_t n, cudaStream_t s);
cudaError_t accumulate(float* dst, const float* src, size_t n, cudaStream_t s);
cudaError_t scale(float* x, float f, size_t n, cudaStream_t s);
cudaError_t tanh_forward(float* out, const float* inp, size_t n, cudaStream_t s);
cudaError_t tanh_backward(float* dinp, const float* out, const float* dout, size_t n,
                          cudaStream_t s);
// row r(i) = idx ? idx[i] : i; scatter: the rows must be distinct
cudaError_t rows_gather(float* out, const float* inp, int n, int C, size_t stride,
                        const int32_t* idx, cudaStream_t s);
cudaError_t rows_scatter_add(float* dinp, const float* dout, int n, int C, size_t stride,
                             const int32_t* idx, cudaStream_t s);
// p > 0 only (the caller copies for p <= 0)
// element i draws its mask at keyed_index(i, row, row_key) (core/rng.h; row = 0: i), or with
// token_key (packed rows, core/backend.h DropRows) at token_key[i / width] * width + i % width.
// Seed slots: every launcher that takes a `seed` also takes `seed_slot` (nullable, device memory);
// when set, the kernel reads the seed from *seed_slot when it runs instead (a replayed CUDA graph's
// value table, Backend::bind_slot), and `seed` is ignored. Likewise `dloss_slot` (a float) for dloss.
cudaError_t dropout_forward(float* out, const float* inp, size_t n, float p, uint64_t seed,
                            const uint64_t* seed_slot, size_t row, size_t row_key,
                            const int32_t* token_key, size_t width, cudaStream_t s);
cudaError_t dropout_backward(float* dinp, const float* dout, size_t n, float p, uint64_t seed,
                             const uint64_t* seed_slot, size_t row, size_t row_key,
                             const int32_t* token_key, size_t width, cudaStream_t s);
// out[M,N] = bias[N] broadcast over rows
cudaError_t broadcast_rows(float* out, const float* bias, int M, int N, cudaStream_t s);
// x[n] = v
cudaError_t fill(float* x, float v, size_t n, cudaStream_t s);
// dst[n] (__nv_bfloat16) = round-to-nearest-even of src[n]   (bf16 GEMM operands)
cudaError_t to_bf16(void* dst, const float* src, size_t n, cudaStream_t s);
// The same for up to kMax arrays in one launch (the bf16 GEMM's operands): dst[k][n[k]] = src[k].
struct Bf16Copies {
  static constexpr int kMax = 3;
  void* dst[kMax] = {};
  const float* src[kMax] = {};
  size_t n[kMax] = {};
  int count = 0;
  void add(void* d, const float* s, size_t elems) {  // the caller adds at most kMax
    dst[count] = d;
    src[count] = s;
    n[count++] = elems;
  }
};
// Vector: 8 elements a thread, 16-byte loads and stores where an array's pointers are 16-byte
// aligned (the default; not yet run on a GPU: docs/gpu.md's status table). Scalar: one element a thread over the concatenation
// (the kernel the 2026-11-23 and -28 GPU runs verified). Both give the same bits.
enum class Bf16Cast { Vector, Scalar };
cudaError_t to_bf16_many(const Bf16Copies& c, cudaStream_t s, Bf16Cast cast = Bf16Cast::Vector);

// ---- convert.cu ----------------------------------------------------------------------------------
// dst[n] = float(src[n]) and dst[n] += float(src[n]); src is __nv_bfloat16[n]
cudaError_t from_bf16(float* dst, const void* src, size_t n, cudaStream_t s);
cudaError_t accumulate_bf16(float* dst, const void* src, size_t n, cudaStream_t s);

// ---- bf16 storage (bf16_elementwise.cu, bf16_layernorm.cu, bf16_embedding.cu) ---------------------
// The ops above with their activations (inputs, outputs and the gradients of both) stored in bf16:
// each `void*` / `const void*` is __nv_bfloat16[...]; weights, their gradients and layer norm's
// mean/rstd stay float*. Each element is loaded to fp32, computed as the fp32 launcher of the same
// name computes it, and rounded to nearest even once, on store. Gradient outputs take `accumulate`:
// true: dst = bf16(float(dst) + v); false: dst = bf16(v), the prior contents neither read nor needed
// (the op is the tensor's only writer). Fp32 gradient outputs (dw, db, the table gradients)
// accumulate as the fp32 launchers do. Arrays 16-byte aligned (and, for row ops, rows of a multiple
// of 8 elements) move 8 elements at a time; any alignment is accepted. Deterministic, no atomics.
// The dropout arguments are dropout_forward's (the same mask bits for the same arguments).
// Not yet run on a GPU (tests/unit/test_ops_cuda_bf16.cpp checks them against a CPU reference).
cudaError_t gelu_forward_bf16(void* out, const void* inp, size_t n, bool tanh_form, cudaStream_t s);
cudaError_t gelu_backward_bf16(void* dinp, bool accumulate, const void* inp, const void* dout,
                               size_t n, bool tanh_form, cudaStream_t s);
// out = a + b (out may alias a or b); dst += src (both bf16); x *= f
cudaError_t add_bf16(void* out, const void* a, const void* b, size_t n, cudaStream_t s);
cudaError_t accumulate_bf16_bf16(void* dst, const void* src, size_t n, cudaStream_t s);
cudaError_t scale_bf16(void* x, float f, size_t n, cudaStream_t s);
// p > 0 only (the caller copies or adds for p <= 0); out may alias inp
cudaError_t dropout_forward_bf16(void* out, const void* inp, size_t n, float p, uint64_t seed,
                                 const uint64_t* seed_slot, size_t row, size_t row_key,
                                 const int32_t* token_key, size_t width, cudaStream_t s);
// dropped elements: unchanged (accumulate) or 0
cudaError_t dropout_backward_bf16(void* dinp, bool accumulate, const void* dout, size_t n, float p,
                                  uint64_t seed, const uint64_t* seed_slot, size_t row,
                                  size_t row_key, const int32_t* token_key, size_t width,
                                  cudaStream_t s);
// rows_gather / rows_scatter_add's row map; scatter with accumulate = false writes the scattered
// rows only (the other rows of dinp are not touched)
cudaError_t rows_gather_bf16(void* out, const void* inp, int n, int C, size_t stride,
                             const int32_t* idx, cudaStream_t s);
cudaError_t rows_scatter_add_bf16(void* dinp, bool accumulate, const void* dout, int n, int C,
                                  size_t stride, const int32_t* idx, cudaStream_t s);
// dst (bf16) = src (fp32), or dst += src (accumulate); rounded once. (bf16 -> fp32: from_bf16 and
// accumulate_bf16 above.)
cudaError_t store_f32_bf16(void* dst, bool accumulate, const float* src, size_t n, cudaStream_t s);
cudaError_t accumulate_f32_into_bf16(void* dst, const float* src, size_t n, cudaStream_t s);
// out bf16, mean/rstd fp32 (nullable), from float(inp) as layernorm_forward
cudaError_t layernorm_forward_bf16(void* out, float* mean, float* rstd, const void* inp,
                                   const float* w, const float* b, int N, int C, float eps,
                                   cudaStream_t s);
size_t layernorm_backward_bf16_ws_bytes(int N, int C);
// dinp (nullable) bf16 with accumulate; dw, db (nullable) fp32 +=, deterministic as
// layernorm_backward (ws of layernorm_backward_bf16_ws_bytes)
cudaError_t layernorm_backward_bf16(void* dinp, bool accumulate, float* dw, float* db,
                                    const void* dout, const void* inp, const float* w,
                                    const float* mean, const float* rstd, int N, int C, void* ws,
                                    cudaStream_t s);
// res = bf16(x + dropout(delta)) (delta may alias res; any p), out = bf16(layernorm(res)) with the
// statistics from the stored, rounded res (the values the backward reads)
cudaError_t residual_layernorm_forward_bf16(void* res, void* out, float* mean, float* rstd,
                                            const void* x, const void* delta, const float* w,
                                            const float* b, int N, int C, float eps, float p,
                                            uint64_t seed, const uint64_t* seed_slot, size_t row,
                                            size_t row_key, const int32_t* token_key, size_t width,
                                            cudaStream_t s);
// out bf16 [B,T,C]; tables fp32; the backward reads dout (bf16) and accumulates into the fp32
// table gradients as embedding_backward does (ws of embedding_backward_bf16_ws_bytes)
cudaError_t embedding_forward_bf16(void* out, const int32_t* ids, const int32_t* type_ids,
                                   const float* wte, const float* wpe, const float* wtt, int B,
                                   int T, int C, int pos_offset, const int32_t* pos_ids,
                                   cudaStream_t s);
size_t embedding_backward_bf16_ws_bytes(int BT, int C);
cudaError_t embedding_backward_bf16(float* dwte, float* dwpe, float* dwtt, const void* dout,
                                    const int32_t* ids, const int32_t* type_ids, int B, int T,
                                    int C, int pos_offset, const int32_t* pos_ids, void* ws,
                                    size_t ws_bytes, cudaStream_t s);

// ---- sdpa_io.cu (the cuDNN fused-attention path) -------------------------------------------------
// From the mask[B,T] (segment ids or 0/1, 0 = padding): bias (__nv_bfloat16 [B, rows, ld], ld >= T;
// rows = 1 for a [B,1,1,T] bias: key padding; T for [B,1,T,T]: backend.h's segment rule, which for a
// 0/1 mask is key padding too) = 0 where the query sees the key, -1e9 where not, and first[B] = the
// first unmasked key of each sequence (T when none).
cudaError_t sdpa_mask_bias(void* bias, int32_t* first, const int32_t* mask, int B, int T, int rows,
                           int ld, cudaStream_t s);
// out[B,T,C] (fp32) = float(o) (__nv_bfloat16), zero on query rows with no visible key (first
// nullable: no mask, plain conversion); causal: query t sees keys <= t.
cudaError_t sdpa_out_from_bf16(float* out, const void* o, const int32_t* first, bool causal, int B,
                               int T, int C, cudaStream_t s);
// dst[B,T,C] (__nv_bfloat16) = bf16(dout), zero on query rows with no visible key (first nullable)
cudaError_t sdpa_dout_to_bf16(void* dst, const float* dout, const int32_t* first, bool causal,
                              int B, int T, int C, cudaStream_t s);
// Packed rows as cuDNN's ragged (THD) sequences, from the segment ids mask[B,T] (0 = padding): the
// e-th run of equal non-zero ids (token order) is sequence e < E, with off_qkv[e] = its first token
// * 3C (elements of the q|k|v buffer), off_o[e] = first * C, seqlen[e] = its length; off_*[E] = the
// buffers' end. Fewer runs than E: the slots past them get length 0; more: the extra runs are
// dropped. off_* int64 [E+1], seqlen int32 [E], all device memory.
cudaError_t sdpa_ragged_offsets(int64_t* off_qkv, int64_t* off_o, int32_t* seqlen,
                                const int32_t* mask, int B, int T, int E, int C, cudaStream_t s);
// out[tokens, C] (fp32) = float(o) (__nv_bfloat16) where mask[token] != 0, else 0
cudaError_t sdpa_out_from_bf16_tokens(float* out, const void* o, const int32_t* mask, size_t tokens,
                                      int C, cudaStream_t s);
// dst[tokens, W] += float(src) (__nv_bfloat16) where mask[token] != 0 (other tokens untouched)
cudaError_t sdpa_accumulate_bf16_tokens(float* dst, const void* src, const int32_t* mask,
                                        size_t tokens, int W, cudaStream_t s);
// bf16 I/O (__nv_bfloat16 buffers; no fp32 copy of the activations):
// dst[B,T,C] = live(b,t) ? src : 0, live as in sdpa_out_from_bf16 (first nullable: every row live, a
// copy). dst == src is allowed: the dead rows are zeroed in place, the live ones left as they are.
cudaError_t sdpa_rows_bf16(void* dst, const void* src, const int32_t* first, bool causal, int B,
                           int T, int C, cudaStream_t s);
// Per token of tokens x W (mask nullable: every token live; else live where mask[token] != 0):
//   accumulate = false: dst = live ? src : 0        (dst == src allowed: zeroes the dead tokens)
//   accumulate = true:  dst = bf16(float(dst) + float(src)) where live; dead tokens untouched
// (dst != src when accumulating)
cudaError_t sdpa_tokens_bf16(void* dst, const void* src, const int32_t* mask, size_t tokens, int W,
                             bool accumulate, cudaStream_t s);
// dst[0] = seed_slot ? *seed_slot : seed, dst[1] = offset (int64, device): cuDNN's Philox dropout
// arguments
cudaError_t sdpa_philox_args(int64_t* dst, uint64_t seed, const uint64_t* seed_slot,
                             uint64_t offset, cudaStream_t s);

// ---- gelu.cu -------------------------------------------------------------------------------------
cudaError_t gelu_forward(float* out, const float* inp, size_t n, bool tanh_form, cudaStream_t s);
cudaError_t gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                          bool tanh_form, cudaStream_t s);

// ---- layernorm.cu --------------------------------------------------------------------------------
cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* w, const float* b, int N, int C, float eps,
                              cudaStream_t s);
size_t layernorm_backward_ws_bytes(int N, int C);
cudaError_t layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                               const float* inp, const float* w, const float* mean,
                               const float* rstd, int N, int C, void* ws, cudaStream_t s);
// Backend::residual_layernorm_forward in one launch: res = x + dropout(delta) (delta may alias res;
// the mask as dropout_forward's, any p), out = layernorm(res), mean/rstd saved. The bits of
// dropout_forward, add and layernorm_forward in turn.
cudaError_t residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                       const float* x, const float* delta, const float* w,
                                       const float* b, int N, int C, float eps, float p,
                                       uint64_t seed, const uint64_t* seed_slot, size_t row,
                                       size_t row_key, const int32_t* token_key, size_t width,
                                       cudaStream_t s);
// Backend::layernorm_dropout_backward: g = layernorm's input gradient of dout, dinp += g,
// ddelta = dropout_backward of g (overwritten), dw/db += (nullable; ws of
// layernorm_backward_ws_bytes). The bits of Backend's default sequence; no scratch.
cudaError_t layernorm_dropout_backward(float* dinp, float* ddelta, float* dw, float* db,
                                       const float* dout, const float* inp, const float* w,
                                       const float* mean, const float* rstd, int N, int C, float p,
                                       uint64_t seed, const uint64_t* seed_slot, size_t row,
                                       size_t row_key, const int32_t* token_key, size_t width,
                                       void* ws, cudaStream_t s);

// ---- reductions.cu -------------------------------------------------------------------------------
size_t colsum_ws_bytes(int M, int N);
// dst[N] += sum over rows of x[M,N] (deterministic two-stage column reduction)
cudaError_t colsum_accumulate(float* dst, const float* x, int M, int N, void* ws, cudaStream_t s);
// Rows per chunk of the two-stage column reductions, and the second stage: dst[N] += sum over
// k < nchunks of partial[k,N], in order (shared by colsum_accumulate and layernorm_backward); with
// dst1/partial1 the same for a second pair in the same launch (layer norm's dw and db). Either dst
// may be null (its pair skipped).
constexpr int kColsumChunk = 256;
cudaError_t colsum_finish(float* dst, const float* partial, int nchunks, int N, cudaStream_t s,
                          float* dst1 = nullptr, const float* partial1 = nullptr);
size_t sum_ws_bytes(size_t n);
// *result (device double) = sum(x) or sum(x^2), in double, deterministic
cudaError_t sum_double(double* result, const float* x, size_t n, bool square, void* ws,
                       cudaStream_t s);
// *acc = *acc + scale * *x (device doubles), the product and the sum each rounded (no fused
// multiply-add), as the host computes them
cudaError_t add_scaled_double(double* acc, const double* x, double scale, cudaStream_t s);

// ---- embedding.cu --------------------------------------------------------------------------------
// pos_ids (nullable, [B,T]): the position of each token (packed rows), else pos_offset + t
cudaError_t embedding_forward(float* out, const int32_t* ids, const int32_t* type_ids,
                              const float* wte, const float* wpe, const float* wtt, int B, int T,
                              int C, int pos_offset, const int32_t* pos_ids, cudaStream_t s);
size_t embedding_backward_ws_bytes(int BT, int C);
cudaError_t embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout,
                               const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                               int pos_offset, const int32_t* pos_ids, void* ws, size_t ws_bytes,
                               cudaStream_t s);

// ---- attention.cu --------------------------------------------------------------------------------
// attn_mask: segment ids (core/backend.h); token_key (nullable, [B,T]): packed rows' dropout keys
cudaError_t attention_forward(float* out, float* att, const float* qkv, const int32_t* attn_mask,
                              bool causal, float dropout_p, uint64_t seed,
                              const uint64_t* seed_slot, int B, int T, int NH, int HS, int T_key,
                              const int32_t* token_key, cudaStream_t s);
cudaError_t attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* att, const int32_t* attn_mask, bool causal,
                               float dropout_p, uint64_t seed, const uint64_t* seed_slot, int B,
                               int T, int NH, int HS, int T_key, const int32_t* token_key,
                               cudaStream_t s);
size_t attention_decode_ws_bytes(int B, int pos, int NH);
cudaError_t attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache,
                             int B, int pos, int Tmax, int NH, int HS, void* ws, cudaStream_t s);

// ---- crossentropy.cu -----------------------------------------------------------------------------
// *bad_row (device int) is lowered (atomicMin) to the first row whose target is neither in [0, V)
// nor the ignore index; the caller sets it to INT_MAX before and reads it after.
// row_max[M] / row_sumexp[M] (nullable): the forward saves each row's max and sum of exp there, and
// the backward reads them instead of recomputing (pass the forward's, unchanged logits).
cudaError_t crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                 int M, int V, int* bad_row, float* row_max, double* row_sumexp,
                                 cudaStream_t s);
cudaError_t crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                  float dloss, const float* dloss_slot, int M, int V, int* bad_row,
                                  const float* row_max, const double* row_sumexp, cudaStream_t s);
// lm_head.cu: the fused head's loss over a chunk's logits[M, ld] (V real columns): losses[M], and with
// grad the rows' dlogits written over the logits (columns V..ld and ignored rows: 0). A bad target
// lowers *bad_row to row_base + its row. online: the row's max and sum of exp in one pass (the
// NLPTRAIN_CUDA_HEAD_SOFTMAX=online kernel, lm_head.cu) instead of two (false: the first kernel).
cudaError_t lm_head_crossentropy(float* losses, float* logits, int ld, const int32_t* targets,
                                 float dloss, const float* dloss_slot, int M, int V, int row_base,
                                 int* bad_row, bool grad, cudaStream_t s, bool online = false);
// The same with grad, the logits only read and the dlogits written to dlogits[M, ld]
// (__nv_bfloat16, each rounded to nearest even; columns V..ld and ignored rows: 0): the bf16 operand
// of the backward GEMMs (NLPTRAIN_CUDA_HEAD_DLOGITS=bf16). Losses and *bad_row as above.
cudaError_t lm_head_crossentropy_bf16(float* losses, const float* logits, void* dlogits, int ld,
                                      const int32_t* targets, float dloss, const float* dloss_slot,
                                      int M, int V, int row_base, int* bad_row, cudaStream_t s,
                                      bool online = false);
// The same over E segments of x (core/backend.h segment_crossentropy_*): segment e at first[e],
// len[e] wide; *bad_row as above, the first segment whose target is outside [0, len[e]).
cudaError_t segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                         const int32_t* len, const int32_t* targets, int E, int* bad_row,
                                         cudaStream_t s);
cudaError_t segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                          const int32_t* len, const int32_t* targets, float dloss,
                                          const float* dloss_slot, int E, int* bad_row,
                                          cudaStream_t s);

// ---- gemm_epilogue.cu (the typed GEMM's epilogue fallbacks, src/backend/cuda/gemm.h) -----------
// r[n] is the GEMM's fp32 result (scratch); with bf16 true, y, aux and d are __nv_bfloat16[n],
// else float[n].
// y (bf16) = bf16(r)  (accumulate false: prior contents ignored)  or  bf16(float(y) + r)  (true)
cudaError_t gemm_store_bf16(void* y, const float* r, size_t n, bool accumulate,
                            cudaStream_t s);
// y = gelu_tanh(r), aux = r (the pre-activation the backward reads), each rounded once
cudaError_t gemm_gelu_aux_bf16(void* y, void* aux, const float* r, size_t n, bool bf16,
                               cudaStream_t s);
// d = r * gelu_tanh'(aux)  (written, not accumulated)
cudaError_t gemm_dgelu_aux_bf16(void* d, const float* r, const void* aux, size_t n, bool bf16,
                                cudaStream_t s);
// dst[N] += column sums of x[M,N] (__nv_bfloat16), fp32, deterministic (two stages, chunks of
// kColsumChunk rows as colsum_accumulate; ws of colsum_ws_bytes(M, N))
cudaError_t gemm_colsum_bf16(float* dst, const void* x, int M, int N, void* ws, cudaStream_t s);

// ---- adamw.cu ------------------------------------------------------------------------------------
// Per-element AdamW with host-computed constants (see CudaBackend::adamw_update).
cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                         float step_size, float bc2_sqrt, float decay, float beta1, float beta2,
                         float eps, float grad_scale, cudaStream_t s, void* bf16_param = nullptr);
// bf16_param (both; nullable): __nv_bfloat16[n] beside param that receives each updated weight
// rounded to nearest even in the same pass (the persistent bf16 copy of the weights).
// The same over the spans of one arena in one launch: span k is [start[k], end[k]) with decay
// factor decay_on when decays[k] != 0, else decay_off (starts ascending, spans disjoint); elements
// outside every span are not touched. n_total = end of the last span.
cudaError_t adamw_update_spans(float* param, const float* grad, float* m, float* v,
                               const uint64_t* start, const uint64_t* end, const uint8_t* decays,
                               int nspans, size_t n_total, float step_size, float bc2_sqrt,
                               float decay_on, float decay_off, float beta1, float beta2,
                               float eps, float grad_scale, cudaStream_t s,
                               void* bf16_param = nullptr);

}  // namespace kern
}  // namespace nlp
