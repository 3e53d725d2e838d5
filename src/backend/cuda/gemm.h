// Row-major fp32 GEMMs for the CUDA backend through cuBLASLt (cuBLAS sgemm as the fallback when the
// heuristic offers no algorithm, e.g. for odd alignments). Private to src/backend/cuda/.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "backend/cuda/device_workspace.h"
#include "core/backend.h"
#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)

namespace nlp::cuda {

// Operand arithmetic: train.precision (core/backend.h).
using GemmMode = Precision;

// How Bf16 mode gets its bf16 operands (NLPTRAIN_CUDA_BF16_CAST, cuda_backend_cuda.cpp): the cast
// kernel's choice, kern::Bf16Cast (kernels.cuh): Vector (8 elements a thread, the default) or Scalar
// (one element a thread, the kernel the earlier GPU runs verified).
// (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF on the fp32 operands, without copies, was 18% faster on the
// packed BERT-base step on an H200, but its products were not those of bf16-rounded operands, neither
// to nearest nor by truncation, and its losses left the bf16 run's by 2e-2: removed, docs/performance.md,
// "Tried and dropped".)
using Bf16Operands = kern::Bf16Cast;

// A matrix in device memory and its storage type: CUDA_R_32F (float) or CUDA_R_16BF
// (__nv_bfloat16). The typed calls below read and write activations in either.
struct GemmIn {
  const void* p;
  cudaDataType_t t;
};
struct GemmOut {
  void* p;
  cudaDataType_t t;
};
// A view's storage type (core/tensor.h) as cuBLAS names it.
inline cudaDataType_t gemm_type(DType d) { return d == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }
inline GemmIn gemm_in(CAct v) { return GemmIn{v.p, gemm_type(v.dt)}; }
inline GemmOut gemm_out(Act v) { return GemmOut{v.p, gemm_type(v.dt)}; }

// The cuBLASLt epilogues the typed calls may ask for, each switchable off (then the plain product
// and separate kernels, kernels/gemm_epilogue.cu, give the same values up to fp32 summation order):
//   bias      BIAS (forward bias)                 gelu_aux  GELU_AUX_BIAS / GELU_AUX (forward)
//   dgelu     DGELU (backward input gradient)     bgrad     BGRADA / BGRADB (dense bias gradient)
struct GemmEpilogues {
  bool bias = true;
  bool gelu_aux = true;
  bool dgelu = true;
  bool bgrad = true;
};
// NLPTRAIN_CUDA_GEMM_EPILOGUES, read by the Gemm constructor: unset or "bias" = BIAS only (the
// epilogue the fp32 path runs); "all" = every epilogue above (not yet run on a GPU: docs/gpu.md's status table); "none" = the
// plain products and separate kernels; or a comma list of kinds switched on, e.g. "bias,bgrad" (each
// of bias, gelu_aux, dgelu, bgrad; at least one). Another value throws nlp::Error naming the variable
// and the allowed values.
GemmEpilogues gemm_epilogues_from_env();
// The same from a value (null = unset); `gemm_epilogues_from_env` reads the variable into it.
GemmEpilogues parse_gemm_epilogues(const char* value);

class Gemm {
 public:
  Gemm(cudaStream_t s, GemmMode mode, Bf16Operands operands = Bf16Operands::Vector);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Y[M,P] (row-major, leading dimension P) = opX(X)[M,Q] @ opZ(Z)[Q,P] + beta * Y (+ bias[P]).
  // X is stored [M,Q] (trans_x false) or [Q,M] (true); Z is stored [Q,P] or [P,Q].
  // beta is 0 (overwrite) or 1 (accumulate). Fp32 mode: strict fp32 (CUBLAS_COMPUTE_32F, no TF32);
  // Bf16 mode: X and Z are first rounded to bf16 copies in a scratch buffer.
  // bias (nullable) only with beta == 0: the cuBLASLt BIAS epilogue where an algorithm accepts its
  // alignment, else the rows are first filled with the bias and the product accumulated onto them.
  // z16 (nullable, Bf16 mode): Z's bf16 rounding already in memory (the persistent copy of the
  // weights), read instead of casting Z.
  void run(float* Y, const float* X, bool trans_x, const float* Z, bool trans_z, int M, int P, int Q,
           float beta, const float* bias, const void* z16 = nullptr);

  // The dense layer's two backward products, accumulated (beta = 1), with each operand rounded once
  // in Bf16 mode (dout feeds both products):
  //   dinp[M,K] += dout[M,N] @ W^T   (skipped when dinp is null)
  //   dW += inp^T @ dout in W's layout: inout ? [K,N] : [N,K]   (skipped when dw is null)
  // w16 (nullable, Bf16 mode): W's bf16 rounding already in memory, read instead of casting W.
  void backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, int M,
                int K, int N, bool inout, const void* w16 = nullptr);

  // ---- typed operands (bf16 activations) ----
  // Operand arithmetic as for run(): bf16 products (fp32 accumulation, CUBLAS_COMPUTE_32F) in Bf16
  // mode, fp32 (or TF32) otherwise. An activation already in the operand type is read where it
  // lies; one in the other type is converted into scratch first (fp32 -> bf16 rounds to nearest
  // even, bf16 -> fp32 is exact). The fp32 weights are rounded as in run(), or read from z16/w16.
  // Outputs are stored in their own type, each element rounded once from the fp32 result.
  // Scratch (run()'s grow-only buffer): the converted operands, plus the fp32 result [M,P] where
  // cuBLAS does not write the output itself (fp32 operands with a bf16 output, and the fallbacks of
  // GELU_AUX and DGELU).

  // Y[M,P] = opX(X)[M,Q] @ opZ(Z)[Q,P] + beta * Y (+ bias[P]); shapes, transposes and beta as run().
  // bias (fp32, nullable) only with beta == 0.
  // gelu_aux (nullable; Y's type, [M,P], beta == 0): the tanh-form GELU layer in one call,
  //   gelu_aux = X @ Z + bias (the pre-activation, which the backward reads) and
  //   Y = gelu_tanh(X @ Z + bias) computed from the fp32 pre-activation.
  // The epilogue's bias has D's type (cuBLASLt's BIAS_DATA_TYPE): with a bf16 Y it adds the bias
  // rounded to bf16, read from bias16 (nullable: the bias's bf16 rounding already in memory, the
  // persistent weight copy) or else rounded into scratch; the fallback adds the fp32 bias.
  void forward(GemmOut Y, GemmIn X, bool trans_x, const float* Z, bool trans_z, int M, int P, int Q,
               float beta, const float* bias, const void* z16 = nullptr, void* gelu_aux = nullptr,
               const void* bias16 = nullptr);

  // The dense layer's backward on typed activations (dout [M,N], inp [M,K]; W as backward()):
  //   dinp[M,K] = dout @ W^T + dinp_beta * dinp     (dinp.p null: skipped; dinp_beta 0 or 1)
  //     with gelu_aux (dinp's type, [M,K], the GELU's pre-activation; dinp_beta 0):
  //     dinp = (dout @ W^T) * gelu_tanh'(gelu_aux), the gradient at the GELU's input
  //   dW += inp^T @ dout in W's layout (fp32; null: skipped)
  //   dbias[N] += column sums of dout as stored (fp32; null: skipped), from the dW product's
  //     epilogue where that product reads dout as stored and a cuBLASLt algorithm takes it, else a
  //     separate deterministic column sum
  void backward(GemmOut dinp, float dinp_beta, float* dw, float* dbias, GemmIn dout, GemmIn inp,
                const float* w, int M, int K, int N, bool inout, const void* w16 = nullptr,
                const void* gelu_aux = nullptr);

  void set_epilogues(GemmEpilogues e) { epilogues_ = e; }
  GemmEpilogues epilogues() const { return epilogues_; }
  // Products so far that ran with a cuBLASLt epilogue, and that asked for one but took the plain
  // product and separate kernels: in all (the tests print them) and per epilogue kind (the
  // backend's path_counts). The fp32 run() counts its BIAS epilogue too.
  size_t fused() const { return size_t(sum(fused_)); }
  size_t unfused() const { return size_t(sum(fallback_)); }
  const PathCounts::Epilogues& fused_by_kind() const { return fused_; }
  const PathCounts::Epilogues& fallback_by_kind() const { return fallback_; }
  // fp32 <-> bf16 conversions launched so far (one per array: operand casts, rounded stores).
  int64_t casts_to_bf16() const { return to16_; }
  int64_t casts_to_fp32() const { return to32_; }

  // Reallocations of the bf16 operand scratch so far: a CUDA graph recorded before the last one
  // points into freed memory. While the stream is being captured the scratch does not grow: the
  // call throws nlp::Error instead.
  size_t grows() const { return bf16_.grows(); }
  // Called after each launch of the bf16 operand casts (run.profile times them apart); null = none.
  void set_after_cast(std::function<void()> f) { after_cast_ = std::move(f); }

 private:
  // Y = opX(X) @ opZ(Z) + beta Y (+ bias) on operands already in operand_type().
  void run_typed(float* Y, const void* X, bool trans_x, const void* Z, bool trans_z, int M, int P,
                 int Q, float beta, const float* bias);

  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // an algorithm was found
  };
  // opA, opB, m, n, k, bias epilogue, alignments of A, B, C, bias
  using Key = std::tuple<int, int, int, int, int, bool, uint32_t, uint32_t, uint32_t, uint32_t>;
  Plan& plan(const Key& key, const float* bias);
  // The set-up both plan kinds share (gemm_cuda.cpp): the descriptor with its transposes, then,
  // after the epilogue's attributes, the layouts and the heuristic's algorithm.
  void begin_plan(Plan& p, int opa, int opb, cublasComputeType_t compute) const;
  void end_plan(Plan& p, int opa, int opb, int m, int n, int k, cudaDataType_t ab, cudaDataType_t c,
                uint32_t ala, uint32_t alb, uint32_t alc) const;

  // ---- typed path ----
  enum class Epi { None, Bias, GeluAux, GeluAuxBias, DGelu, BGradA, BGradB };
  // opA, opB, m, n, k, A/B type, C/D type, epilogue, alignments of A, B, C, bias, aux
  using TKey = std::tuple<int, int, int, int, int, int, int, int, uint32_t, uint32_t, uint32_t,
                          uint32_t, uint32_t>;
  Plan& typed_plan(const TKey& key, const void* bias, const void* aux);
  // D (type yt) = opX(X) @ opZ(Z) + beta D through cuBLASLt with `epi` (operands in operand_type();
  // bias: the BIAS input or the BGRAD output, aux: GELU's pre-activation); false when no algorithm
  // takes it (nothing was computed).
  bool lt(void* Y, cudaDataType_t yt, const void* X, bool trans_x, const void* Z, bool trans_z,
          int M, int P, int Q, float beta, Epi epi, const void* bias, const void* aux,
          bool probe_only = false);
  // forward() and backward(); allow_epilogue false: the plain products and separate kernels
  void forward_impl(GemmOut Y, GemmIn X, bool trans_x, const float* Z, bool trans_z, int M, int P,
                    int Q, float beta, const float* bias, const void* z16, void* gelu_aux,
                    const void* bias16, bool allow_epilogue);
  void backward_impl(GemmOut dinp, float dinp_beta, float* dw, float* dbias, GemmIn dout,
                     GemmIn inp, const float* w, int M, int K, int N, bool inout, const void* w16,
                     const void* gelu_aux, bool allow_epilogue);
  // The plain product (no epilogue): cuBLASLt, else cublasGemmEx; yt fp32, or bf16 with bf16 operands.
  void plain(void* Y, cudaDataType_t yt, const void* X, bool trans_x, const void* Z, bool trans_z,
             int M, int P, int Q, float beta);

  void* bf16_scratch(size_t bytes);
  bool copies() const { return mode_ == GemmMode::Bf16; }
  cudaDataType_t operand_type() const { return copies() ? CUDA_R_16BF : CUDA_R_32F; }
  cublasComputeType_t compute_type() const;

  cudaStream_t stream_;
  GemmMode mode_;
  Bf16Operands operands_;
  DeviceWorkspace bf16_{"bf16 scratch"};  // bf16 copies of the operands (Bf16 mode); grows()
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::map<TKey, Plan> tplans_;
  GemmEpilogues epilogues_;
  static int64_t sum(const PathCounts::Epilogues& e) { return e.bias + e.gelu_aux + e.dgelu + e.bgrad; }
  PathCounts::Epilogues fused_, fallback_;  // fused_by_kind(), fallback_by_kind()
  int64_t to16_ = 0, to32_ = 0;             // casts_to_bf16(), casts_to_fp32()
  std::function<void()> after_cast_;
};

}  // namespace nlp::cuda
