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

#include "core/backend.h"
#include "../../../kernels/kernels.cuh"  // the repository root is not an include directory

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

  // Reallocations of the bf16 operand scratch so far: a CUDA graph recorded before the last one
  // points into freed memory. While the stream is being captured the scratch does not grow: the
  // call throws nlp::Error instead.
  size_t grows() const { return bf16_grows_; }
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

  void* bf16_scratch(size_t bytes);
  bool copies() const { return mode_ == GemmMode::Bf16; }
  cudaDataType_t operand_type() const { return copies() ? CUDA_R_16BF : CUDA_R_32F; }
  cublasComputeType_t compute_type() const;

  cudaStream_t stream_;
  GemmMode mode_;
  Bf16Operands operands_;
  void* bf16_ = nullptr;  // bf16 copies of the operands (Bf16 mode)
  size_t bf16_bytes_ = 0;
  size_t bf16_grows_ = 0;  // grows()
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::function<void()> after_cast_;
};

}  // namespace nlp::cuda
