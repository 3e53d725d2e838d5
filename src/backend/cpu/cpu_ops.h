// Private to the CPU backend: the op implementations behind CpuBackend, one family per .cpp file.
// Signatures and conventions are those of core/backend.h (row-major float32 host memory; backward ops
// accumulate into non-null gradients). Every op is deterministic: OpenMP loops use static schedules and
// each output element is produced by one thread in a fixed order, so results do not depend on timing
// (and, apart from the OpenBLAS GEMMs, not on the thread count either).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/gemm.h"
#include "core/backend.h"

namespace nlp::cpu {

// Dropout scale 1/(1-p); 0 when p >= 1 (everything dropped).
inline float dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

// embedding.cpp
void embedding_forward(float* out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                       const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                       const int32_t* pos_ids = nullptr);
void embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout,
                        const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                        int pos_offset, const int32_t* pos_ids = nullptr);

// matmul.cpp (T = float, or bf16 for native bf16 operands; outputs and gradients fp32)
template <class T>
void matmul_forward(GemmLib lib, float* out, const T* inp, const T* w, const float* bias, int M,
                    int K, int N, WLayout layout);
template <class T>
void matmul_backward(GemmLib lib, float* dinp, float* dw, const T* dout, const T* inp, const T* w,
                     int M, int K, int N, WLayout layout);
void matmul_dbias(float* dbias, const float* dout, int M, int N);

// layernorm.cpp
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, float eps);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);
// The fused residual forms of Backend (core/backend.h), rows keyed as DropRows {row, row_key, token_key, C}
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* x,
                                const float* delta, const float* w, const float* b, int N, int C,
                                float eps, float p, uint64_t seed, size_t row, size_t row_key,
                                const int32_t* token_key);
void layernorm_dropout_backward(float* dinp, float* ddelta, float* dw, float* db, const float* dout,
                                const float* inp, const float* w, const float* mean, const float* rstd,
                                int N, int C, float p, uint64_t seed, size_t row, size_t row_key,
                                const int32_t* token_key);

// rows.cpp
void tanh_forward(float* out, const float* inp, size_t N);
void tanh_backward(float* dinp, const float* out, const float* dout, size_t N);
void rows_gather(float* out, const float* inp, int n, int C, size_t stride, const int32_t* idx);
void rows_scatter_add(float* dinp, const float* dout, int n, int C, size_t stride, const int32_t* idx);

// gelu.cpp
void gelu_forward(float* out, const float* inp, size_t N, Gelu form);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, Gelu form);

// elementwise.cpp
void add(float* out, const float* a, const float* b, size_t N);
void accumulate(float* dst, const float* src, size_t N);
void scale(float* x, float s, size_t N);
void dropout_forward(float* out, const float* inp, size_t N, float p, uint64_t seed,
                     size_t row = 0, size_t row_key = 0, const int32_t* token_key = nullptr,
                     size_t width = 0);
void dropout_backward(float* dinp, const float* dout, size_t N, float p, uint64_t seed,
                      size_t row = 0, size_t row_key = 0, const int32_t* token_key = nullptr,
                      size_t width = 0);

// attention.cpp: `stats` holds attention_stats_floats(B, T, NH) floats (two per query row), written
// by the forward for the backward
inline size_t attention_stats_floats(int B, int T, int NH) { return size_t(2) * B * NH * T; }
void attention_forward(float* out, float* stats, const float* qkv, const int32_t* attn_mask,
                       bool causal, float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                       int T_key = 0, const int32_t* token_key = nullptr);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* stats, const int32_t* attn_mask, bool causal, float dropout_p,
                        uint64_t seed, int B, int T, int NH, int HS, int T_key = 0,
                        const int32_t* token_key = nullptr);
void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                      int pos, int Tmax, int NH, int HS);

// crossentropy.cpp
// row_mx/row_se: optional per-row statistics written by the forward and reused by the backward
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                          int V, float* row_mx = nullptr, double* row_se = nullptr);
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           float dloss, int M, int V, const float* row_mx = nullptr,
                           const double* row_se = nullptr);
// The fused head's in-place loss over logits[M, ld] (V real columns); grad: the row's dlogits
// written over it
void crossentropy_rows(float* losses, float* logits, int ld, const int32_t* targets, float dloss,
                       int M, int V, bool grad);
// segments e < E of x: x[first[e] .. first[e] + len[e]), target relative to first[e]
void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                  const int32_t* len, const int32_t* targets, int E);
void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first, const int32_t* len,
                                   const int32_t* targets, float dloss, int E);

// optimizer.cpp
double sum(const float* x, size_t N);
double sumsq(const float* x, size_t N);
// zero_grad: nullptr, or grad itself (writable), whose elements are set to 0 as they are read.
// bf16_param: nullptr, or N bf16 patterns that receive the updated weights rounded (to_bf16_bits).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                  int t, float* zero_grad = nullptr,
                  uint16_t* bf16_param = nullptr);

}  // namespace nlp::cpu
