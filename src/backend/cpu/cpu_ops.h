// Private to the CPU backend: the fp32 functions that a file other than their own calls (another
// family's op, a test, a benchmark). Each op's function is defined in its family's .cpp file beside
// CpuBackend's op that calls it (cpu_backend_impl.h), and is declared here only once another file
// needs it. Signatures and conventions are those of core/backend.h (row-major float32 host memory;
// backward ops accumulate into non-null gradients). Every op is deterministic: OpenMP loops use static
// schedules and each output element is produced by one thread in a fixed order, so results do not
// depend on timing (and, apart from the OpenBLAS GEMMs, not on the thread count either).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/backend.h"

namespace nlp::cpu {

// Dropout scale 1/(1-p); 0 when p >= 1 (everything dropped).
inline float dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

// elementwise.cpp (also called by layernorm.cpp's fused residual forms)
void add(float* out, const float* a, const float* b, size_t N);
void accumulate(float* dst, const float* src, size_t N);
void dropout_forward(float* out, const float* inp, size_t N, float p, uint64_t seed,
                     size_t row = 0, size_t row_key = 0, const int32_t* token_key = nullptr,
                     size_t width = 0);
void dropout_backward(float* dinp, const float* dout, size_t N, float p, uint64_t seed,
                      size_t row = 0, size_t row_key = 0, const int32_t* token_key = nullptr,
                      size_t width = 0);

// attention.cpp (also called by bench/cpu_attention.cpp): `stats` holds attention_stats_floats(B, T,
// NH) floats (two per query row), written by the forward for the backward
inline size_t attention_stats_floats(int B, int T, int NH) { return size_t(2) * B * NH * T; }
void attention_forward(float* out, float* stats, const float* qkv, const int32_t* attn_mask,
                       bool causal, float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                       int T_key = 0, const int32_t* token_key = nullptr);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* stats, const int32_t* attn_mask, bool causal, float dropout_p,
                        uint64_t seed, int B, int T, int NH, int HS, int T_key = 0,
                        const int32_t* token_key = nullptr);

// crossentropy.cpp (also called by tests/unit/test_ops_cpu.cpp: CrossEntropy.BackwardReusesForward...)
// row_mx/row_se: optional per-row statistics written by the forward and reused by the backward
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                          int V, float* row_mx = nullptr, double* row_se = nullptr);
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           float dloss, int M, int V, const float* row_mx = nullptr,
                           const double* row_se = nullptr);

}  // namespace nlp::cpu
