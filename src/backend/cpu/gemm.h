// The CPU backend's GEMM libraries behind one call, chosen by measurement (docs/performance.md,
// "CPU GEMM libraries"): OpenBLAS (Debian's OpenMP build) or oneDNN (Debian's libdnnl, OpenMP
// runtime: both share nlptrain's OpenMP threads). oneDNN also multiplies bf16 operands natively
// (AMX or AVX512-BF16), accumulating in fp32, which OpenBLAS 0.3.21 cannot (no sbgemm export).
//
// Every call is row-major:  C[M,N] = beta * C + op(A) @ op(B)
//   op(A) [M,K]: A stored [M,K] (ta = false, lda >= K) or [K,M] (ta = true, lda >= M)
//   op(B) [K,N]: B stored [K,N] (tb = false, ldb >= N) or [N,K] (tb = true, ldb >= K)
// beta is 0 (C overwritten) or 1 (accumulate).
#pragma once
#include <cstdint>
#include <string>

namespace nlp::cpu {

// OneDnnOpenBlasTA: oneDNN, except the fp32 products whose A is transposed (the weight gradients,
// dW = inp^T dout), which go to OpenBLAS: what run.cpu_gemm = auto picks on CPUs without AVX-512 where
// OpenBLAS has kernels for the core (auto_gemm_lib). On a Zen 3 (AVX2) oneDNN 2.6's transposed-A
// sgemm ran at half OpenBLAS's rate at BERT 4 x 256's shapes, its other products as fast or faster
// (docs/performance.md, "CPU GEMM libraries").
enum class GemmLib { OpenBlas, OneDnn, OneDnnOpenBlasTA };

// The library run.cpu_gemm = auto picks: OpenBLAS in a build without oneDNN; oneDNN on CPUs with
// AVX-512 (where Debian's OpenBLAS 0.3.21 may not know the core: generic kernels, 5-7x slower) or
// where OpenBLAS has no AVX2 kernels for the core; else OneDnnOpenBlasTA. openblas_core is
// openblas_get_corename() ("Zen", "Haswell", "Prescott", ...).
GemmLib auto_gemm_lib(bool have_onednn, bool cpu_has_avx512, const std::string& openblas_core);
// The same from this machine's libraries.
GemmLib auto_gemm_lib();

// bf16 as its bit pattern (the top half of an fp32)
struct bf16 {
  uint16_t bits;
};

// Whether this build has oneDNN; when it does not, `why` says so.
bool onednn_available(std::string* why = nullptr);
// Whether this CPU multiplies bf16 natively through oneDNN (AMX-BF16 or AVX512-BF16 enabled by the
// OS); `what` names the instruction set found, or why there is none.
bool native_bf16_available(std::string* what = nullptr);

// The bf16 arithmetic oneDNN can use here (its effective instruction set: the CPU has it and the OS
// enables it): AVX512-BF16 (dot products on vector registers), AMX-BF16 (tile multiplies, which
// implies AVX512-BF16); isa: oneDNN's name for the set, or why there is none (no oneDNN in the build).
struct Bf16Isa {
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
  std::string isa;
};
Bf16Isa bf16_isa();
// What run.cpu_bf16 = auto picks on a CPU with that arithmetic: native only with AMX-BF16, where
// oneDNN's bf16 GEMMs were measured 2-4x its fp32 sgemm (xeon-amx, docs/performance.md "CPU GEMM
// libraries"); else emulate, also with AVX512-BF16 alone, where native bf16 training was measured
// 2.1x slower than fp32 (xeon without AMX, RoBERTa NSMC). why: the choice and its reason, for the log.
bool auto_native_bf16(const Bf16Isa& hw, std::string* why = nullptr);
// "OpenBLAS (core Prescott)" / "oneDNN 2.6.3 (isa avx512_core_amx)" / "oneDNN 2.6.3 (isa avx2),
// weight gradients OpenBLAS (core Zen)": for the log.
std::string gemm_lib_description(GemmLib lib);

void gemm(GemmLib lib, bool ta, bool tb, int M, int N, int K, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
// bf16 operands, fp32 accumulation and output (oneDNN only: throws nlp::Error without it), plus
// bias[N] broadcast over the rows when not null: C = beta * C + op(A) @ op(B) + bias, one rounding
// of the accumulated product and the bias, as when C starts as the bias and beta is 1.
void gemm(GemmLib lib, bool ta, bool tb, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias = nullptr);

}  // namespace nlp::cpu
