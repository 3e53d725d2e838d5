// The CPU backend's GEMM libraries behind one call, chosen by measurement (bench/NOTES.md, "GEMM
// library"): OpenBLAS (Debian's OpenMP build) or oneDNN (Debian's libdnnl, OpenMP runtime: both share
// nlptrain's OpenMP threads). oneDNN also multiplies bf16 operands natively (AMX or AVX512-BF16),
// accumulating in fp32, which OpenBLAS 0.3.21 cannot (no sbgemm export).
//
// Every call is row-major:  C[M,N] = beta * C + op(A) @ op(B)
//   op(A) [M,K]: A stored [M,K] (ta = false, lda >= K) or [K,M] (ta = true, lda >= M)
//   op(B) [K,N]: B stored [K,N] (tb = false, ldb >= N) or [N,K] (tb = true, ldb >= K)
// beta is 0 (C overwritten) or 1 (accumulate).
#pragma once
#include <cstdint>
#include <string>

namespace nlp::cpu {

enum class GemmLib { OpenBlas, OneDnn };

// bf16 as its bit pattern (the top half of an fp32)
struct bf16 {
  uint16_t bits;
};

// Whether this build has oneDNN; when it does not, `why` says so.
bool onednn_available(std::string* why = nullptr);
// Whether this CPU multiplies bf16 natively through oneDNN (AMX-BF16 or AVX512-BF16 enabled by the
// OS); `what` names the instruction set found, or why there is none.
bool native_bf16_available(std::string* what = nullptr);
// "OpenBLAS 0.3.21 (core Prescott)" / "oneDNN 2.6.3 (isa avx512_core_amx)": for the log.
std::string gemm_lib_description(GemmLib lib);

void gemm(GemmLib lib, bool ta, bool tb, int M, int N, int K, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
// bf16 operands, fp32 accumulation and output (oneDNN only: throws nlp::Error without it), plus
// bias[N] broadcast over the rows when not null: C = beta * C + op(A) @ op(B) + bias, one rounding
// of the accumulated product and the bias, as when C starts as the bias and beta is 1.
void gemm(GemmLib lib, bool ta, bool tb, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias = nullptr);

}  // namespace nlp::cpu
